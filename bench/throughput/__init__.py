"""How fast do updates and rows move through client and server, beside raw pyzmq moving the same
frames? ``python -m bench.throughput`` (see ``__main__``; its ``--peer`` children are the baselines)."""

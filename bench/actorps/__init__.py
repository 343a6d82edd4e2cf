"""The plain PS workload a user might try first, beside an actor parameter server written in a few
lines of Ray: ``python -m bench.actorps`` (see ``__main__``). Our workers are ``python -m
bench.actorps.worker SPEC_JSON`` (``worker``); Ray's PS and workers are actors (``rayps``).
"""

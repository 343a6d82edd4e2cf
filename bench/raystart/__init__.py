"""What ``bosen launch --ray`` costs at start-up against the plain launch (``python -m bench.raystart``)."""

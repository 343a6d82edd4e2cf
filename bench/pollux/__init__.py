"""Pollux's checks in miniature (issue 33): ``python -m bench.pollux``."""

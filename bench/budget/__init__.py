"""Does egress track the configured bandwidth budget? ``python -m bench.budget`` (see ``__main__``)."""

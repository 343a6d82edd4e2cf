"""Memory and throughput against table size (issue 29): ``python -m bench.tablesize`` (see ``__main__``)."""

"""A DLRM embedding table no process holds whole (issue 29): ``python -m bench.torchsparse`` (see ``__main__``)."""

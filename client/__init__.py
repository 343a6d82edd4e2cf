"""The Bösen client library: ``Client.connect(config)`` in every worker process."""

from bosen.client.client import Client, Worker
from bosen.client.table import Table

__all__ = ["Client", "Table", "Worker"]

"""The Bösen client library: ``Client.connect(config)`` in every worker process."""

from bosen.client.client import Client
from bosen.client.table import Table
from bosen.client.worker import Worker

__all__ = ["Client", "Table", "Worker"]

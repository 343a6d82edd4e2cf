"""The Bösen server daemon (``bosen-server``): shards, SSP clocks, pushes."""

from bosen.server.daemon import Server

__all__ = ["Server"]

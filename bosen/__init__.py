"""Bösen-py: a bounded-staleness parameter server with managed communication.

This package is the vocabulary shared by server and client (config, wire, row math, partitioning,
stored-procedure interface) plus the command-line tools. It runs no event loop of its own.
"""

from bosen.errors import BosenError, ConfigError, ProtocolError, ReadTimeout, ServerError

__version__ = "0.1.0"
__all__ = ["BosenError", "ConfigError", "ProtocolError", "ReadTimeout", "ServerError", "__version__"]

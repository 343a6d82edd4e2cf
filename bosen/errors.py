"""Exception types shared by server, client and tools.

Every error a user can trigger derives from BosenError, so one ``except`` catches them all, while the
subclasses say which layer complained.
"""


class BosenError(Exception):
    """Base class of every error raised by bosen."""


class ConfigError(BosenError, ValueError):
    """A configuration file or override is invalid; the message names the key and the file."""


class DataError(BosenError, ValueError):
    """An input data file is missing, unreadable or malformed. The message starts with ``FILE:LINE:``
    (or ``FILE:`` when no line is at fault). A ValueError too: bad input, like a bad config."""


class ProtocolError(BosenError):
    """A wire message is malformed or inconsistent with the job's tables."""


class NotOwned(ProtocolError):
    """A message names rows of partitions another server owns (after a partition move, a reader
    that asked under the old map is told to ask again)."""


class Moving(NotOwned):
    """A read names rows a partition move has exported from this server, before its new map is in:
    asked again under the new map (versioned tables send such rows to nobody meanwhile)."""


class ServerError(BosenError):
    """A server rejected one of our messages; carries the server's explanation."""


class ServerLost(ServerError):
    """The connection to a server broke (it stopped, crashed or stopped answering heartbeats)."""


class ReadTimeout(BosenError, TimeoutError):
    """A read could not be satisfied by a fresh enough row in time (names table, row and clocks)."""


class ClientClosed(BosenError):
    """The client was used after close()."""


class UsageError(BosenError, RuntimeError):
    """An API called out of order or on the wrong object (e.g. ``step()`` before ``backward()``)."""

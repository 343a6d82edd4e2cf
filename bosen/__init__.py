"""Bösen-py: a bounded-staleness parameter server with managed communication.

This package is the vocabulary shared by server and client (config, wire, row math, partitioning,
stored-procedure interface) plus the command-line tools. It runs no event loop of its own.
"""

from typing import Any

from bosen.errors import BosenError, ConfigError, ProtocolError, ReadTimeout, ServerError

__version__ = "0.1.0"
__all__ = ["BosenError", "ConfigError", "ProtocolError", "ReadTimeout", "ServerError", "__version__", "scale"]


def scale(run_dir: str, workers: int | None = None, servers: int | None = None, **kwargs: Any) -> float:
    """``bosen scale RUN_DIR --workers M`` from Python: the running job of ``run_dir`` (started by
    ``bosen launch``) moves to M workers; returns the seconds the step took (bosen/jobs/scale.py)."""
    from bosen.jobs.scale import scale as _scale

    return _scale(run_dir, workers=workers, servers=servers, **kwargs)

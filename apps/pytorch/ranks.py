"""Which worker this process is, from the environment users already have: Bösen's own launcher
(``BOSEN_RANK``), torchrun (``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``) or Slurm (``SLURM_PROCID``,
``SLURM_NTASKS``, ``SLURM_LOCALID``), in that order, so a script moves between them unchanged."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from bosen.errors import ConfigError

# (rank, world size, local rank) variables per launcher, first match wins
SOURCES = (
    ("BOSEN_RANK", None, None),  # bosen launch: the world size is the config's cluster.workers
    ("RANK", "WORLD_SIZE", "LOCAL_RANK"),
    ("SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID"),
)


@dataclass(frozen=True)
class Ranks:
    """This process's place in the job; ``None`` where the environment does not say."""

    rank: int | None
    world_size: int | None
    local_rank: int | None
    source: str  # the variable the rank came from, or "" when none is set

    def device(self, cuda_available: bool | None = None) -> str:
        """``cuda:LOCAL_RANK`` where CUDA is available (``cuda:0`` without a local rank), else ``cpu``."""
        if cuda_available is None:
            import torch
            cuda_available = torch.cuda.is_available()
        return f"cuda:{self.local_rank or 0}" if cuda_available else "cpu"


def ranks_from_env(env: Mapping[str, str] | None = None) -> Ranks:
    """The first launcher whose rank variable is set; a value that is not a non-negative integer, or a
    rank outside the world size, is a ConfigError naming the variable."""
    env = os.environ if env is None else env
    for rank_var, size_var, local_var in SOURCES:
        if rank_var in env:
            rank = _int(env, rank_var)
            size = _int(env, size_var) if size_var is not None and size_var in env else None
            local = _int(env, local_var) if local_var is not None and local_var in env else None
            if size is not None and rank is not None and rank >= size:
                raise ConfigError(f"{rank_var}={rank} is outside {size_var}={size}")
            return Ranks(rank, size, local, rank_var)
    return Ranks(None, None, None, "")


def _int(env: Mapping[str, str], var: str) -> int:
    text = env[var]
    try:
        value = int(text)
    except ValueError:
        raise ConfigError(f"{var}={text!r}: expected a non-negative integer") from None
    if value < 0:
        raise ConfigError(f"{var}={text!r}: expected a non-negative integer")
    return value


def connect(config: Any = None, *, env: Mapping[str, str] | None = None, **kwargs: Any) -> Any:
    """``bosen.client.Client.connect`` with the rank from the environment (``ranks_from_env``) and the
    config from ``$BOSEN_CONFIG`` when not given; a world size that differs from the config's
    ``cluster.workers`` is a ConfigError, since the job would wait for workers that never come."""
    from bosen.client import Client

    env = os.environ if env is None else env
    ranks = ranks_from_env(env)
    config = config if config is not None else env.get("BOSEN_CONFIG")
    if config is None:
        raise ConfigError("no config: pass one to connect() or set BOSEN_CONFIG")
    client = Client.connect(config, rank=ranks.rank, **kwargs)
    if ranks.world_size is not None and ranks.world_size != client.num_workers:
        client.abort()
        raise ConfigError(f"{client.config.source}: cluster.workers is {client.num_workers}, but the environment "
                          f"says {ranks.world_size} workers (from the variables beside {ranks.source})")
    return client

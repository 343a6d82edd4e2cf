"""Stored procedures the server can run per table, found by built-in name or ``module:Class`` path."""

from __future__ import annotations

import importlib

from bosen.config import TableConfig
from bosen.errors import ConfigError
from bosen.procedure import StoredProcedure

BUILTINS: dict[str, str] = {
    "add": "bosen.procedure:StoredProcedure",
    "sgd": "bosen.server.procedures.sgd:SGD",
    "adagrad": "bosen.server.procedures.adagrad:AdaGrad",
    "adarevision": "bosen.server.procedures.adarevision:AdaRevision",
}


def load(table: TableConfig, source: str = "config") -> StoredProcedure:
    """Instantiate the table's procedure; any problem is a ConfigError naming table and key."""
    key = f"{source}: tables.{table.name}.update"
    if table.backup is not None:  # a synchronous table with backup workers steps by its own rule
        from bosen.server.backup import BackupStep
        return BackupStep(table)
    path = BUILTINS.get(table.update, table.update)
    mod_name, sep, cls_name = path.partition(":")
    if not sep or not mod_name or not cls_name:
        raise ConfigError(f"{key}: {table.update!r} is neither a built-in ({', '.join(BUILTINS)}) "
                          "nor an import path like 'mypkg.rules:MyRule'")
    try:
        cls = getattr(importlib.import_module(mod_name), cls_name)
    except (ImportError, AttributeError) as e:
        raise ConfigError(f"{key}: cannot load {path!r}: {e}") from None
    if not (isinstance(cls, type) and issubclass(cls, StoredProcedure)):
        raise ConfigError(f"{key}: {path!r} is not a bosen.procedure.StoredProcedure subclass")
    if cls.float_only and not table.dtype.startswith("float"):
        raise ConfigError(f"{key}: {table.update!r} needs a float table; tables.{table.name}.dtype is {table.dtype}")
    if cls.versioned and table.read_my_writes:
        raise ConfigError(f"{source}: tables.{table.name}.read_my_writes: cannot be true with {table.update!r}: "
                          "the server turns updates into steps, so a client cannot show its own writes")
    try:
        return cls(table, **dict(table.update_args))
    except (TypeError, ValueError) as e:
        raise ConfigError(f"{source}: tables.{table.name}.update_args: {e}") from None


def read_my_writes(table: TableConfig, procedure: StoredProcedure) -> bool:
    """Whether clients may show their own writes: the YAML's read_my_writes, else the procedure's."""
    return procedure.read_my_writes if table.read_my_writes is None else table.read_my_writes

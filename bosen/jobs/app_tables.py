"""Tables an app declares from its model (``app.tables``), merged into the job's config.

A PyTorch app's tables follow from the model (``bosen.apps.pytorch.declare``): their shapes, their
stored procedure and the model's initial values. ``app.tables: package.module:function`` names a
function ``(args, out_dir) -> {name: table settings}`` that builds them; ``resolve`` calls it once, in
the launcher or in ``bosen tables``, and every server and worker then starts from the resolved config.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from bosen import config as config_mod
from bosen.config import Config
from bosen.errors import ConfigError


def resolve(config: Config, out_dir: str | Path) -> Config:
    """``config`` with the app's declared tables added (initial values and layouts in ``out_dir``)."""
    path = config.app.tables
    if not path:
        return config
    key = f"{config.source}: app.tables"
    fn = _load(path, key)
    out = Path(out_dir)
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise ConfigError(f"{key}: cannot write {out}: {e.strerror or e}") from None
    try:
        declared = fn(dict(config.app.args), out)
    except (ValueError, TypeError) as e:  # ConfigError is a ValueError too
        raise ConfigError(f"{key}: {path} failed: {e}") from None
    if not isinstance(declared, Mapping) or not declared:
        raise ConfigError(f"{key}: {path} returned {type(declared).__name__}, expected a mapping of table name "
                          "to its settings")
    data: dict[str, Any] = config.to_dict()
    clash = sorted(set(declared) & set(data["tables"]))
    if clash:
        raise ConfigError(f"{config.source}: tables.{clash[0]}: declared both in the YAML and by app.tables ({path})")
    data["tables"] = {**data["tables"], **{str(k): dict(v) for k, v in declared.items()}}
    return config_mod.build(data, config.source)


def _load(path: str, key: str) -> Any:
    mod_name, sep, fn_name = path.partition(":")
    if not sep or not mod_name or not fn_name:
        raise ConfigError(f"{key}: {path!r} is not an import path like 'mypkg.model:tables'")
    try:
        fn = getattr(importlib.import_module(mod_name), fn_name)
    except (ImportError, AttributeError) as e:
        raise ConfigError(f"{key}: cannot load {path!r}: {e}") from None
    if not callable(fn):
        raise ConfigError(f"{key}: {path!r} is not a function")
    return fn

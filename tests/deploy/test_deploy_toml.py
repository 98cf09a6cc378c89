"""deploy/nvllm.toml, the config file install.sh ships: it loads to exactly the defaults, and every setting
is written down in it with a comment (those without a TOML value commented out)."""

from __future__ import annotations

import dataclasses
import re

from helpers.deploy_files import TOML
from nvllm.config import Settings, load_settings


def test_deploy_config_loads_to_exactly_the_defaults() -> None:
    assert load_settings(TOML) == Settings()


KEY_LINE = re.compile(r"#?\s*(\w+)\s*=.*")


def documented_keys(text: str) -> dict[tuple[str, str], bool]:
    """(section, key) -> whether a comment line stands right above it. '# key = ...' counts as a key."""
    found: dict[tuple[str, str], bool] = {}
    section = ""
    previous = ""
    for raw in text.splitlines():
        line = raw.strip()
        header = re.fullmatch(r"\[(\w+)\]", line)
        key = KEY_LINE.fullmatch(line)
        if header:
            section = header.group(1)
        elif key:
            found[(section, key.group(1))] = previous.startswith("#") and not KEY_LINE.fullmatch(previous)
        previous = line
    return found


def test_every_setting_is_written_down_with_a_comment() -> None:
    expected = set()
    for f in dataclasses.fields(Settings):
        value = getattr(Settings(), f.name)
        if dataclasses.is_dataclass(value):
            expected |= {(f.name, sub.name) for sub in dataclasses.fields(value)}
        else:
            expected.add(("", f.name))
    found = documented_keys(TOML.read_text())
    assert set(found) == expected
    assert [k for k, commented in found.items() if not commented] == []


def test_settings_without_a_toml_value_are_commented_out() -> None:
    # TOML has no null: a None default can only be shown as a commented line.
    text = TOML.read_text()
    assert re.search(r"^# num_blocks = \d+$", text, re.M)
    assert Settings().cache.num_blocks is None


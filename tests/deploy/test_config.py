"""Settings are checked strictly: every field against its annotation and its declared range.

The fields are found by introspection, so a field added to nvllm.config is covered here without an edit.
A wrong value is one ConfigError line naming the dotted key, the value given and what is expected.
"""

from __future__ import annotations

import dataclasses
import subprocess
import sys
import types
import typing
from pathlib import Path
from typing import Any, Union

import pytest

from helpers.paths import ROOT
from nvllm.config import ConfigError, Settings, load_settings, validate
from nvllm.config_values import RANGE


def leaf_fields() -> list[tuple[str, str, Any, dataclasses.Field]]:
    """(section, key, annotation, field) of every setting; section "" for top-level keys."""
    out = []
    top_hints = typing.get_type_hints(Settings)
    for f in dataclasses.fields(Settings):
        hint = top_hints[f.name]
        if dataclasses.is_dataclass(hint):
            hints = typing.get_type_hints(hint)
            out += [(f.name, sub.name, hints[sub.name], sub) for sub in dataclasses.fields(hint)]
        else:
            out.append(("", f.name, hint, f))
    return out


FIELDS = leaf_fields()
IDS = [f"{section}.{key}" if section else key for section, key, _, _ in FIELDS]


def dotted(section: str, key: str) -> str:
    return f"{section}.{key}" if section else key


def toml_with(section: str, key: str, text: str) -> str:
    return f"{key} = {text}\n" if not section else f"[{section}]\n{key} = {text}\n"


def load_text(tmp_path: Path, text: str) -> Settings:
    path = tmp_path / "bad.toml"
    path.write_text(text)
    return load_settings(path)


def refused(tmp_path: Path, text: str) -> str:
    with pytest.raises(ConfigError) as e:
        load_text(tmp_path, text)
    msg = str(e.value)
    assert "\n" not in msg
    return msg


def base_types(hint: Any) -> set[Any]:
    """The types a field takes, None left out (int | None -> {int})."""
    if typing.get_origin(hint) in (Union, types.UnionType):
        return {a for a in typing.get_args(hint) if a is not type(None)}
    return {hint}


# TOML text of a value -> the types that would accept it. Test-side on purpose: not config's own logic.
CANDIDATES: dict[str, set[type]] = {
    '"abc"': {str},
    "7": {int, float},
    "2.5": {float},
    "true": {bool},
    "[1, 2]": {list, tuple},
    "{a = 1}": {dict},
}


def wrong_values(hint: Any) -> list[str]:
    takes = {typing.get_origin(t) or t for t in base_types(hint)}
    return [text for text, fits in CANDIDATES.items() if not fits & takes]


def test_there_are_fields_of_every_kind() -> None:
    # The introspection above must see the real settings (a broken walk would make the tests below vacuous).
    assert len(FIELDS) >= 25
    kinds = {t for _, _, hint, _ in FIELDS for t in base_types(hint)}
    assert {int, float, bool, str} <= kinds
    assert ("cache", "num_blocks") in [(s, k) for s, k, _, _ in FIELDS]


@pytest.mark.parametrize(("section", "key", "hint", "f"), FIELDS, ids=IDS)
def test_every_field_refuses_a_wrong_type(tmp_path: Path, section: str, key: str, hint: Any,
                                          f: dataclasses.Field) -> None:
    wrongs = wrong_values(hint)
    assert len(wrongs) >= 3
    for text in wrongs:
        msg = refused(tmp_path, toml_with(section, key, text))
        assert msg.startswith(f"{tmp_path / 'bad.toml'}: {dotted(section, key)} must be "), msg
        assert msg.endswith(f", got {text}"), msg


@pytest.mark.parametrize(("section", "key", "hint", "f"), FIELDS, ids=IDS)
def test_every_field_default_passes_its_own_check(section: str, key: str, hint: Any,
                                                  f: dataclasses.Field) -> None:
    default = getattr(getattr(Settings(), section) if section else Settings(), key)
    settings = load_settings(None, {section: {key: default}} if section else {key: default})
    assert getattr(getattr(settings, section) if section else settings, key) == default


def out_of_range(rng: Any, hint: Any) -> list[Any]:
    """Values just outside a declared range, of the field's own type."""
    if rng.choices:
        bad = [c + 1 for c in rng.choices if isinstance(c, int) and c + 1 not in rng.choices]
        return bad[:1] or ["not-" + "-".join(map(str, rng.choices))]
    if rng.non_empty:
        return [""]
    step = 1 if int in base_types(hint) else 1e-6
    bad = []
    if rng.lo is not None:
        bad.append(rng.lo if rng.lo_open else rng.lo - step)
    if rng.hi is not None:
        bad.append(rng.hi + step)
    return bad


RANGED = [(s, k, h, f) for s, k, h, f in FIELDS if RANGE in f.metadata]


@pytest.mark.parametrize(("section", "key", "hint", "f"), RANGED,
                         ids=[dotted(s, k) for s, k, _, _ in RANGED])
def test_every_declared_range_is_enforced(section: str, key: str, hint: Any, f: dataclasses.Field) -> None:
    bad_values = out_of_range(f.metadata[RANGE], hint)
    assert bad_values
    for value in bad_values:
        with pytest.raises(ConfigError, match=rf"^flags: {dotted(section, key)} must be .*, got "):
            load_settings(None, {section: {key: value}} if section else {key: value})


@pytest.mark.parametrize(("text", "message"), [
    ("[cache]\nblock_size = 24", 'cache.block_size must be one of 8, 16, 32, 64 or 128, got 24'),
    ("[cache]\nnum_blocks = 0", "cache.num_blocks must be an integer >= 1 (or left out), got 0"),
    ('[cache]\nnum_blocks = "abc"', 'cache.num_blocks must be an integer >= 1 (or left out), got "abc"'),
    ("[cache]\nmemory_fraction = 0.96", "cache.memory_fraction must be a finite number in (0, 0.95], got 0.96"),
    ("[cache]\nmemory_fraction = 0", "cache.memory_fraction must be a finite number in (0, 0.95], got 0"),
    ("[cache]\nreserve_mb = -1", "cache.reserve_mb must be an integer >= 0, got -1"),
    ("[scheduler]\nmax_model_len = 1", "scheduler.max_model_len must be an integer >= 2 (or left out), got 1"),
    ("[server]\nunix_socket_mode = 0o1000", "server.unix_socket_mode must be an integer permission mode "
                                            "in [0o000, 0o777] (e.g. 0o660), got 512"),
    ("[server]\nmax_message_bytes = 1023", "server.max_message_bytes must be an integer in [1024, 2147483647], "
                                           "got 1023"),
    ("[server]\ndrain_grace_s = inf", "server.drain_grace_s must be a finite number >= 0, got inf"),
    ("[watchdog]\ninterval_s = nan", "watchdog.interval_s must be a finite number > 0, got nan"),
    ("[watchdog]\ninterval_s = 0", "watchdog.interval_s must be a finite number > 0, got 0"),
    ('[server]\nlisten = ""', 'server.listen must be a non-empty string, got ""'),
    ('log_level = "verbose"', 'log_level must be one of "debug", "info", "warning" or "error", got "verbose"'),
])
def test_out_of_range_values_are_refused_with_one_line(tmp_path: Path, text: str, message: str) -> None:
    assert refused(tmp_path, text + "\n") == f"{tmp_path / 'bad.toml'}: {message}"


def test_bools_are_not_integers_or_numbers(tmp_path: Path) -> None:
    msg = refused(tmp_path, "[scheduler]\nmax_num_seqs = true\n")
    assert msg.endswith("scheduler.max_num_seqs must be an integer >= 1, got true")
    msg = refused(tmp_path, "[cache]\nmemory_fraction = true\n")
    assert msg.endswith("cache.memory_fraction must be a finite number in (0, 0.95], got true")
    with pytest.raises(ConfigError,
                       match=r"^flags: cache.num_blocks must be an integer >= 1 \(or left out\), got false$"):
        load_settings(None, {"cache": {"num_blocks": False}})


def test_bool_fields_take_only_bools(tmp_path: Path) -> None:
    assert refused(tmp_path, "[cache]\nenable_prefix_caching = 1\n").endswith(
        "cache.enable_prefix_caching must be true or false, got 1")
    assert refused(tmp_path, '[cache]\nenable_prefix_caching = "false"\n').endswith('got "false"')
    assert load_text(tmp_path, "[cache]\nenable_prefix_caching = false\n").cache.enable_prefix_caching is False


def test_pin_threads_is_a_bool_off_by_default(tmp_path: Path) -> None:
    assert Settings().model.pin_threads is False
    assert load_text(tmp_path, "[model]\npin_threads = true\n").model.pin_threads is True
    assert refused(tmp_path, '[model]\npin_threads = "yes"\n').endswith(
        'model.pin_threads must be true or false, got "yes"')
    assert refused(tmp_path, "[model]\npin_threads = 1\n").endswith("model.pin_threads must be true or false, got 1")


def test_integers_are_not_taken_for_floats_the_other_way(tmp_path: Path) -> None:
    assert refused(tmp_path, "[cache]\nblock_size = 16.0\n").endswith("got 16.0")


def test_ints_are_accepted_for_floats_and_become_floats(tmp_path: Path) -> None:
    s = load_text(tmp_path, "[server]\ndrain_grace_s = 30\n[watchdog]\ninterval_s = 2\n")
    assert s.server.drain_grace_s == 30.0 and type(s.server.drain_grace_s) is float
    assert s.watchdog.interval_s == 2.0 and type(s.watchdog.interval_s) is float
    assert s == load_text(tmp_path, "[server]\ndrain_grace_s = 30.0\n[watchdog]\ninterval_s = 2.0\n")


def test_optional_ints_may_be_absent_or_none(tmp_path: Path) -> None:
    s = load_text(tmp_path, "[cache]\nblock_size = 32\n")
    assert s.cache.num_blocks is None
    assert load_text(tmp_path, "[cache]\nnum_blocks = 64\n").cache.num_blocks == 64
    # A None flag is a flag not given: the file's value stays.
    assert load_settings(None, {"cache": {"num_blocks": None}}).cache.num_blocks is None
    (tmp_path / "n.toml").write_text("[cache]\nnum_blocks = 64\n")
    assert load_settings(tmp_path / "n.toml", {"cache": {"num_blocks": None}}).cache.num_blocks == 64
    s = Settings()
    s.scheduler.max_model_len = None     # the model's own limit
    validate(s)


def test_unknown_keys_and_sections_are_refused(tmp_path: Path) -> None:
    path = tmp_path / "bad.toml"
    msg = refused(tmp_path, "[cache]\nnum_block = 5\n")
    assert msg.startswith(f"{path}: unknown setting cache.num_block (known in [cache]: block_size, ")
    assert "num_blocks" in msg
    msg = refused(tmp_path, "[caches]\nnum_blocks = 5\n")
    assert msg.startswith(f"{path}: unknown setting caches (known at the top level: bundles, cache, ")
    assert refused(tmp_path, "verbose = true\n").startswith(f"{path}: unknown setting verbose ")
    assert refused(tmp_path, "cache = 5\n") == f"{path}: cache must be a table ([cache]), got 5"
    assert refused(tmp_path, "log_level = {a = 1}\n") == \
        f'{path}: log_level must be one of "debug", "info", "warning" or "error", got {{a = 1}}'


def test_flags_go_through_the_same_checks() -> None:
    with pytest.raises(ConfigError, match=r"^flags: cache.num_blocks must be an integer >= 1 \(or left out\), got 0$"):
        load_settings(None, {"cache": {"num_blocks": 0}})
    with pytest.raises(ConfigError, match=r"^flags: scheduler.max_model_len must be .*, got 1$"):
        load_settings(None, {"scheduler": {"max_model_len": 1}})
    with pytest.raises(ConfigError, match=r"^flags: unknown setting model.size "):
        load_settings(None, {"model": {"size": 1}})
    with pytest.raises(ConfigError, match=r'^flags: server.listen must be a non-empty string, got 50051$'):
        load_settings(None, {"server": {"listen": 50051}})
    s = load_settings(None, {"model": {"path": "m"}, "cache": {"num_blocks": 64}, "scheduler": {"max_model_len": 128}})
    assert (s.model.path, s.cache.num_blocks, s.scheduler.max_model_len) == ("m", 64, 128)


def test_cross_field_checks_hold_across_file_and_flags(tmp_path: Path) -> None:
    assert refused(tmp_path, "[watchdog]\nlow_mb = 600\nhigh_mb = 512\n") == \
        "watchdog.low_mb (600) must be <= watchdog.high_mb (512)"
    assert refused(tmp_path, "[cache]\nblock_size = 64\n[scheduler]\nmax_num_batched_tokens = 32\n") == \
        "scheduler.max_num_batched_tokens must be >= cache.block_size (64), got 32"
    assert load_text(tmp_path, "[watchdog]\nlow_mb = 512\nhigh_mb = 512\n").watchdog.low_mb == 512
    assert refused(tmp_path, "[power]\nthrottle_c = 80\nresume_c = 82.5\n") == \
        "power.resume_c (82.5) must be <= power.throttle_c (80)"
    assert load_text(tmp_path, "[power]\nthrottle_c = 70\nresume_c = 70\n").power.resume_c == 70.0
    path = tmp_path / "ok.toml"
    path.write_text("[cache]\nblock_size = 128\n")
    with pytest.raises(ConfigError, match="max_num_batched_tokens must be >= cache.block_size"):
        load_settings(path, {"scheduler": {"max_num_batched_tokens": 64}})


def test_validate_checks_settings_built_in_code() -> None:
    s = Settings()
    s.cache.num_blocks = "abc"     # type: ignore[assignment]
    with pytest.raises(ConfigError, match=r'^cache.num_blocks must be an integer >= 1 \(or left out\), got "abc"$'):
        validate(s)
    s = Settings()
    s.scheduler.max_num_seqs = True
    with pytest.raises(ConfigError, match="^scheduler.max_num_seqs must be an integer >= 1, got true$"):
        validate(s)
    validate(Settings())


def test_file_problems_are_one_line(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="does not exist"):
        load_settings(tmp_path / "none.toml")
    with pytest.raises(ConfigError, match=r"^config file .*: "):
        load_settings(tmp_path)                          # a directory
    (tmp_path / "bin.toml").write_bytes(b"log_level = \"\xff\"\n")
    with pytest.raises(ConfigError, match="not UTF-8"):
        load_settings(tmp_path / "bin.toml")
    msg = refused(tmp_path, "[cache\nblock_size = 16\n")
    assert msg.startswith(f"config file {tmp_path / 'bad.toml'}: ")


def test_a_long_value_is_cut_in_the_message(tmp_path: Path) -> None:
    msg = refused(tmp_path, f'[cache]\nblock_size = "{"x" * 5000}"\n')
    assert msg.endswith(', got "' + "x" * 76 + "...")


@pytest.mark.parametrize(("text", "needle"), [
    ('[cache]\nnum_blocks = "abc"\n', 'cache.num_blocks must be an integer >= 1 (or left out), got "abc"'),
    ("[scheduler]\nmax_num_seqs = true\n", "scheduler.max_num_seqs must be an integer >= 1, got true"),
    ("[cache]\nnum_blockz = 4\n", "unknown setting cache.num_blockz (known in [cache]: block_size, "),
])
def test_serve_with_a_bad_config_prints_one_line_and_exits_2(tmp_path: Path, text: str, needle: str) -> None:
    cfg = tmp_path / "bad.toml"
    cfg.write_text(text)
    r = subprocess.run([sys.executable, "-m", "nvllm.cli", "serve", "--config", str(cfg)],
                       cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert r.returncode == 2, r.stderr
    assert "Traceback" not in r.stderr
    lines = r.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"nvllm serve: {cfg}: {needle}"), r.stderr
    assert r.stdout == ""


def test_serve_checks_flags_the_same_way(tmp_path: Path) -> None:
    cfg = tmp_path / "ok.toml"
    cfg.write_text("[cache]\nblock_size = 16\n")
    r = subprocess.run([sys.executable, "-m", "nvllm.cli", "serve", "--config", str(cfg), "--num-blocks", "0"],
                       cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
    assert r.stderr.splitlines() == [
        "nvllm serve: flags: cache.num_blocks must be an integer >= 1 (or left out), got 0"]


def test_a_renamed_setting_still_works_with_a_warning(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    # model.threads was model.blas_threads: old files and LLM(blas_threads=...) keep working.
    with caplog.at_level("WARNING", logger="nvllm.config"):
        s = load_text(tmp_path, "[model]\nblas_threads = 3\n")
    assert s.model.threads == 3
    assert [r.getMessage() for r in caplog.records] == [
        f"{tmp_path / 'bad.toml'}: model.blas_threads is deprecated: it is now model.threads (the value 3 is used)"]
    caplog.clear()
    with caplog.at_level("WARNING", logger="nvllm.config"):
        assert load_settings(None, {"model": {"blas_threads": 2}}).model.threads == 2
    assert "flags: model.blas_threads is deprecated" in caplog.text
    assert load_text(tmp_path, "[model]\nthreads = 4\n").model.threads == 4


def test_a_renamed_setting_is_checked_under_the_name_given(tmp_path: Path) -> None:
    assert refused(tmp_path, "[model]\nblas_threads = -1\n") == \
        f"{tmp_path / 'bad.toml'}: model.blas_threads must be an integer >= 0, got -1"
    assert refused(tmp_path, '[model]\nblas_threads = "2"\n').endswith('model.blas_threads must be an integer >= 0, '
                                                                        'got "2"')
    assert refused(tmp_path, "[model]\nthreads = 2\nblas_threads = 2\n") == \
        f"{tmp_path / 'bad.toml'}: model.blas_threads is the old name of model.threads: give model.threads alone"


def test_the_threads_flag_and_its_old_name() -> None:
    from nvllm import cli

    parser = cli.build_parser()
    for command in (["serve"], ["generate", "hi"], ["bench"]):
        listed = command == ["bench"]   # the bench takes a list of counts, one run each
        assert parser.parse_args(command + ["--threads", "3"]).threads == ([3] if listed else 3)
        assert parser.parse_args(command + ["--blas-threads", "2"]).threads == ([2] if listed else 2)
    assert parser.parse_args(["serve"]).threads is None      # not given: the file's value stays
    assert parser.parse_args(["bench"]).threads == [0]

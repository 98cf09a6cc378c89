"""Which models a daemon serves, from its settings (server/models/served_models.py): [[models]] tables with their
own settings over the [model], [cache] and [scheduler] ones, several --model flags, --models-dir's files
and folders in sorted order, model.path alone otherwise; the default model; and what is refused (a name
served twice, a default that is not served, a bad key or keep_alive named in its table). And the budget."""

from __future__ import annotations

from pathlib import Path

import pytest

from nvllm import cli
from nvllm.cli.serve import settings_from_args
from nvllm.config import ConfigError, load_settings
from nvllm.engine.assembly.memory import GiB, MemoryReading, MiB
from nvllm.server.models.served_models import memory_budget, model_specs


def toml(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "nvllm.toml"
    path.write_text(text)
    return path


def test_models_tables_with_their_own_settings(tmp_path: Path) -> None:
    config = toml(tmp_path, '''
[model]
keep_alive = "10m"
threads = 2
[cache]
dtype = "f16"
persist_dir = "prefix-cache"
[scheduler]
max_model_len = 2048
[speculative]
method = "ngram"
[[models]]
path = "models/chat.gguf"
pinned = true
[[models]]
name = "embed"
path = "models/bge-small-en-v1.5"
task = "embed"
keep_alive = "0"
max_model_len = 512
kv_cache_dtype = "f32"
threads = 1
''')
    specs, default = model_specs(load_settings(config))
    chat, embed = specs
    assert default == "chat" and [s.name for s in specs] == ["chat", "embed"]
    assert chat.pinned and chat.keep_alive_s == 600 and chat.settings.model.path == "models/chat.gguf"
    assert chat.settings.scheduler.max_model_len == 2048 and chat.settings.cache.dtype == "f16"
    assert chat.settings.model.threads == 2 and chat.settings.speculative.method == "ngram"
    assert chat.settings.cache.persist_dir == "prefix-cache"
    assert not embed.pinned and embed.keep_alive_s == 0 and embed.settings.model.task == "embed"
    assert embed.settings.scheduler.max_model_len == 512 and embed.settings.cache.dtype == "f32"
    assert embed.settings.model.threads == 1
    # What only one model can own stays with the default one.
    assert embed.settings.speculative.method == "none" and embed.settings.cache.persist_dir == ""


def test_several_model_flags_come_first_and_the_first_is_the_default(tmp_path: Path) -> None:
    config = toml(tmp_path, '[[models]]\npath = "models/c.gguf"\n')
    args = cli.build_parser().parse_args(["serve", "--config", str(config), "--model", "models/a.gguf",
                                          "--model", "models/b", "--keep-alive", "-1"])
    specs, default = model_specs(settings_from_args(args))
    assert [s.name for s in specs] == ["a", "b", "c"] and default == "a"
    assert all(s.keep_alive_s == -1 for s in specs)
    one = settings_from_args(cli.build_parser().parse_args(["serve", "--model", "models/a.gguf"]))
    assert one.model.path == "models/a.gguf" and one.models == []          # one --model: model.path, as ever
    assert [s.name for s in model_specs(one)[0]] == ["a"]


def test_a_models_dir_serves_its_files_and_folders_in_sorted_order(tmp_path: Path) -> None:
    root = tmp_path / "models"
    (root / "b-folder").mkdir(parents=True)
    (root / "b-folder" / "config.json").write_text("{}")
    (root / "a.gguf").write_bytes(b"GGUF")
    (root / "notes.txt").write_text("not a model")
    (root / "empty-folder").mkdir()
    args = cli.build_parser().parse_args(["serve", "--models-dir", str(root)])
    specs, default = model_specs(settings_from_args(args))
    assert [s.name for s in specs] == ["a", "b-folder"] and default == "a"
    # an empty one (models are pulled into it later, Ollama's /api/pull): model.path alone, as without one
    empty = cli.build_parser().parse_args(["serve", "--models-dir", str(root / "empty-folder"), "--model", "x.gguf"])
    assert [s.name for s in model_specs(settings_from_args(empty))[0]] == ["x"]


def test_the_default_model_and_what_is_refused(tmp_path: Path) -> None:
    two = '[[models]]\npath = "models/a.gguf"\n[[models]]\nname = "b"\npath = "models/x.gguf"\n'
    assert model_specs(load_settings(toml(tmp_path, "[server]\ndefault_model = \"b\"\n" + two)))[1] == "b"
    with pytest.raises(ConfigError, match=r"server.default_model 'c' is not served \(served: a, b\)"):
        model_specs(load_settings(toml(tmp_path, "[server]\ndefault_model = \"c\"\n" + two)))
    with pytest.raises(ConfigError, match="two models are served as 'a'"):
        same = '[[models]]\npath = "models/a.gguf"\n[[models]]\npath = "x/a.gguf"\n'
        model_specs(load_settings(toml(tmp_path, same)))
    with pytest.raises(ConfigError, match=r"unknown setting models\[1\].temperature"):
        load_settings(toml(tmp_path, two + "temperature = 1\n"))
    with pytest.raises(ConfigError, match=r'models\[0\].keep_alive must be a duration such as "5m"'):
        load_settings(toml(tmp_path, '[[models]]\npath = "a.gguf"\nkeep_alive = "soon"\n'))
    with pytest.raises(ConfigError, match=r"models\[0\]: give path \(a folder or .gguf file\) or source \(a Hugging "
                                          r"Face Hub reference such as ORG/REPO:Q4_K_M\), one of them; got neither"):
        load_settings(toml(tmp_path, '[[models]]\nname = "a"\n'))
    with pytest.raises(ConfigError, match=r"models\[0\]: give path .* one of them; got both"):
        load_settings(toml(tmp_path, '[[models]]\npath = "a.gguf"\nsource = "org/repo:Q4_0"\n'))
    with pytest.raises(ConfigError, match='model.keep_alive must be a duration'):
        load_settings(toml(tmp_path, '[model]\nkeep_alive = "5 minutes"\n'))
    with pytest.raises(ConfigError, match=r"models must be tables \(\[\[models\]\]\)"):
        load_settings(toml(tmp_path, 'models = ["a.gguf"]\n'))


def test_the_memory_budget() -> None:
    reading = MemoryReading(9 * GiB, "host (psutil)")
    default = load_settings()
    assert memory_budget(default, reading) == int((9 * GiB - 1024 * MiB) * 0.5)
    fixed = load_settings(overrides={"cache": {"budget_gb": 1.5}})
    assert memory_budget(fixed, reading) == int(1.5 * GiB)

"""Which models a daemon serves, from its settings: every `--model`, every [[models]] table, every .gguf
file and model folder in model.serve_dir (sorted; hidden ones, such as a pull's partial files, left out),
or, with none of those (an empty serve_dir too: models pulled through the daemon land there), model.path
alone. Each gets its own Settings (model.path and the per-model
settings of its table over the [model], [cache] and [scheduler] defaults), its name, keep_alive and pin.
The default model is server.default_model, else the first named. And the memory budget they share.

A model pulled through the daemon or `nvllm models pull` from the Hugging Face Hub has a sidecar record
beside it (`DIR/.NAME.gguf.nvllm-pull.json` for a GGUF, `DIR/NAME/.nvllm-pull.json` for a folder): its
"aliases" (the reference it was pulled by, "hf.co/ORG/REPO:QUANT"...) become names it answers to, and its
"files" sha256 its digest (Ollama's /api/tags). `pulled_record` reads it, plain JSON (no model_files import).

What only one model can have stays with the default one: speculation (its draft model shares its
tokenizer) and the persisted prefix cache (one file per daemon).
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

from nvllm.config import ConfigError, ModelEntry, Settings
from nvllm.config_values import duration_seconds
from nvllm.engine.assembly.memory import GiB, MemoryReading, MiB
from nvllm.server.models.model_set import ModelSpec


def name_of(path: Path) -> str:
    """A model's name from its path: a GGUF file's without .gguf, a folder's own."""
    return path.stem if path.suffix.lower() == ".gguf" else path.name


def pull_record_path(path: Path) -> Path:
    """Where a pulled model's sidecar record lies: beside a GGUF file, inside a folder."""
    return path.parent / f".{path.name}.nvllm-pull.json" if path.suffix.lower() == ".gguf" else \
        path / ".nvllm-pull.json"


def pulled_record(path: Path) -> dict[str, Any]:
    """The model's pull record ({} when it has none, or one that is not a JSON object)."""
    try:
        record = json.loads(pull_record_path(path).read_text())
    except (OSError, ValueError):
        return {}
    return record if isinstance(record, dict) else {}


def pulled_aliases(path: Path) -> tuple[str, ...]:
    aliases = pulled_record(path).get("aliases")
    return tuple(a for a in aliases if isinstance(a, str) and a) if isinstance(aliases, list) else ()


def served_name(settings: Settings) -> str:
    """model.served_name, else the folder's name or the GGUF file's without .gguf (so the default model
    keeps its name, smollm2-135m-instruct, whether its GGUF or its folder is served)."""
    path = settings.model_path().resolve()
    return settings.model.served_name or name_of(path)


def model_entries(settings: Settings) -> list[ModelEntry]:
    """The models named, in order, then model.serve_dir's; model.path alone when there are none."""
    entries = list(settings.models)
    folder = settings.model.serve_dir
    if folder:
        root = Path(folder)
        if not root.is_dir():
            raise ConfigError(f"model.serve_dir (--models-dir) {folder}: not a folder")
        found = [p for p in sorted(root.iterdir()) if not p.name.startswith(".") and (
                 (p.suffix.lower() == ".gguf" and p.is_file()) or (p / "config.json").is_file())]
        entries += [ModelEntry(path=str(p)) for p in found]     # none yet: model.path alone, pulls go there
    if not entries:
        m = settings.model
        entries = [ModelEntry(path=m.path, name=m.served_name, pinned=m.pinned)]
    return entries


def model_specs(settings: Settings) -> tuple[list[ModelSpec], str]:
    """(every model served, the default one's name); ConfigError for two models of one name or a default
    that is none of them."""
    specs: list[ModelSpec] = []
    for entry in model_entries(settings):
        s = _settings_of(settings, entry)
        name = entry.name or (settings.model.served_name if entry.path == settings.model.path else "") or \
            name_of(s.model_path())
        keep = duration_seconds(entry.keep_alive or settings.model.keep_alive)
        assert keep is not None       # the settings were checked
        if any(spec.name == name for spec in specs):
            raise ConfigError(f"two models are served as {name!r}: give one of them a name ([[models]] name)")
        # model.path's own settings (its name, its pin) go with it however it is named (--model, [[models]])
        pinned = entry.pinned or (entry.path == settings.model.path and settings.model.pinned)
        specs.append(ModelSpec(name, s, keep, pinned, pulled_aliases(s.model_path())))
    default = settings.server.default_model or specs[0].name
    if default not in {s.name for s in specs}:
        raise ConfigError(f"server.default_model {default!r} is not served (served: "
                          f"{', '.join(s.name for s in specs)})")
    speech = settings.server.speech_model
    if speech and speech not in {s.name for s in specs}:
        raise ConfigError(f"server.speech_model {speech!r} is not served (served: {', '.join(s.name for s in specs)})")
    names = {s.name for s in specs}
    for i, spec in enumerate(specs):
        aliases = tuple(a for a in spec.aliases if a not in names)   # a served name wins over an alias
        if spec.name != default:    # speculation and the persisted cache: the default model's alone
            specs[i] = dataclasses.replace(spec, settings=not_default(spec.settings), aliases=aliases)
        else:
            specs[i] = dataclasses.replace(spec, aliases=aliases)
    return specs, default


def not_default(s: Settings) -> Settings:
    """A model's settings when it is not the default model: no speculation, no persisted prefix cache."""
    return dataclasses.replace(s, speculative=dataclasses.replace(s.speculative, method="none"),
                               cache=dataclasses.replace(s.cache, persist_dir=""))


def pulled_spec(settings: Settings, name: str, path: Path, aliases: list[str]) -> ModelSpec:
    """A model pulled while the daemon serves: the [model], [cache] and [scheduler] defaults, the daemon's
    keep_alive, never pinned, never the default."""
    s = not_default(_settings_of(settings, ModelEntry(path=str(path), name=name)))
    keep = duration_seconds(settings.model.keep_alive)
    assert keep is not None       # the settings were checked
    return ModelSpec(name, s, keep, False, tuple(a for a in aliases if a != name))


def models_dir(settings: Settings) -> Path:
    """Where models pulled through the daemon go: model.serve_dir when set (so the next start serves them
    too), else model.models_dir (where `nvllm models pull` puts them)."""
    return Path(settings.model.serve_dir or settings.model.models_dir)


def _settings_of(settings: Settings, entry: ModelEntry) -> Settings:
    m, c, sch = settings.model, settings.cache, settings.scheduler
    model = dataclasses.replace(m, path=entry.path, served_name=entry.name, task=entry.task or m.task,
                                threads=m.threads if entry.threads is None else entry.threads)
    cache = dataclasses.replace(c, dtype=entry.kv_cache_dtype or c.dtype)
    scheduler = dataclasses.replace(sch, max_model_len=entry.max_model_len or sch.max_model_len)
    return dataclasses.replace(settings, model=model, cache=cache, scheduler=scheduler, models=[])


def memory_budget(settings: Settings, reading: MemoryReading) -> int:
    """The bytes every model's weights and page pool share: cache.budget_gb, else the memory available at
    start less cache.reserve_mb, times cache.memory_fraction."""
    c = settings.cache
    if c.budget_gb:
        return int(c.budget_gb * GiB)
    return int(max(0, reading.available_bytes - c.reserve_mb * MiB) * c.memory_fraction)

"""Models of the Hugging Face Hub for `nvllm serve`: each [[models]] table's `source` pulled into
model.models_dir at start when no earlier pull left it there (model_files/hub.py's record says so; nothing
is asked of the Hub then), and served as the path it was pulled to; and the puller a daemon's /api/pull is
given (server/ never imports model_files: this module hands it a function)."""

from __future__ import annotations

import dataclasses
import logging
import sys
from collections.abc import Callable
from pathlib import Path

from nvllm.config import ConfigError, Settings

log = logging.getLogger("nvllm.serve")

Progress = Callable[[dict], None]
Puller = Callable[[str, Progress], tuple[str, Path, list[str]]]


def resolve_sources(settings: Settings) -> dict[str, list[str]]:
    """Each [[models]] source replaced by the path of its pull (pulled now if it is not in models_dir);
    returns each such model's served name -> the names its pull gives it (hf.co/ORG/REPO:QUANT...).
    ConfigError naming the table and the cause when a pull fails."""
    aliases: dict[str, list[str]] = {}
    if not any(entry.source for entry in settings.models):
        return aliases            # nothing of model_files imported: the daemon's start stays as light as it was
    from nvllm.model_files import hub

    root = Path(settings.model.models_dir)
    for i, entry in enumerate(settings.models):
        if not entry.source:
            continue
        where = f"[[models]] source {entry.source!r}"
        if hub.parse_ref(entry.source) is None:
            raise ConfigError(f"{where} is not a Hugging Face Hub reference (ORG/REPO, ORG/REPO:QUANT, "
                              "ORG/REPO/FILE.gguf, hf.co/ORG/REPO:QUANT)")
        pulled = hub.find_pulled(entry.source, root)
        if pulled is None:
            log.info("pulling %s into %s", entry.source, root)
            try:
                pulled = hub.pull_from_hub(entry.source, root, _StatusLog(entry.source),
                                           show_bar=sys.stderr.isatty())
            except hub.HubError as e:
                raise ConfigError(f"{where}: {e}") from None
        log.info("%s is %s", entry.source, pulled.path)
        settings.models[i] = dataclasses.replace(entry, path=str(pulled.path), source="")
        aliases[entry.name or pulled.name] = pulled.aliases
    return aliases


def hub_puller(models_dir: Path | str) -> Puller:
    """(ref, progress) -> (name, path, aliases): a pull into models_dir, for the daemon's /api/pull: a Hub
    reference, or a model the registry knows by name. Its failures are RuntimeErrors (registry.RegistryError,
    hub.HubError) whose message names the cause."""
    def pull(ref: str, progress: Progress) -> tuple[str, Path, list[str]]:
        from nvllm.model_files import hub, registry

        name = ref.removesuffix(":latest")
        if name in registry.KNOWN_MODELS:
            progress({"status": "pulling manifest"})
            path = registry.pull(name, models_dir, progress=False)
            progress({"status": "success"})
            return name, path, [name]
        pulled = hub.pull_from_hub(ref, models_dir, progress)
        return pulled.name, pulled.path, pulled.aliases

    return pull


class _StatusLog:
    """A start-time pull's statuses in the log, once each."""

    def __init__(self, ref: str) -> None:
        self.ref, self.last = ref, ""

    def __call__(self, event: dict) -> None:
        status = event.get("status", "")
        if status != self.last:
            self.last = status
            log.info("%s: %s", self.ref, status)

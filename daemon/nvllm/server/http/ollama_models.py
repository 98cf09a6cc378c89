"""Ollama's model listings, shaped: a model's details, its /api/tags and /api/ps entries, and /api/show's
body, from what engine/assembly/describe.py reads of its files (never its weights) and the model set's state.

- modified_at: the file's (a folder's newest file's) mtime, RFC 3339 in UTC.
- size: the bytes of its files (a folder's, every file in it); /api/ps's size is what it holds of the memory
  budget (weights and page pool), size_vram 0 (no GPU).
- digest: the sha256 of the GGUF file the pull record names (the Hub's, checked at the pull); a folder's: the
  sha256 of its record's "name sha256" lines, sorted; a model with no record: the sha256 of its resolved
  path, size and mtime (stable while the files are unchanged, never a hash of the bytes: hashing gigabytes
  to list models is not worth it).
- capabilities: "completion" for a generator, with "tools" where its chat template reads `tools` and
  "thinking" where it thinks (the daemon's reasoning parser is set, or the template has <think> or
  enable_thinking); "embedding" for an embedder; a reranker or a speech model has none Ollama knows.
"""

from __future__ import annotations

import datetime
import hashlib
from pathlib import Path
from typing import Any

from nvllm.engine.assembly.factory import ModelDescription, human_count
from nvllm.server.models.served_models import pulled_record

FAR_FUTURE = "2318-01-01T00:00:00Z"     # a model never unloaded expires then (Ollama's far date, too)


def rfc3339(t: float) -> str:
    return datetime.datetime.fromtimestamp(t, datetime.timezone.utc).isoformat().replace("+00:00", "Z")


def files_of(path: Path) -> list[Path]:
    if path.is_dir():
        return sorted(p for p in path.rglob("*") if p.is_file())
    return [path] if path.is_file() else []


def stat_of(path: Path) -> tuple[int, float]:
    """(the bytes of its files, the newest mtime)."""
    stats = [p.stat() for p in files_of(path)]
    return sum(s.st_size for s in stats), max((s.st_mtime for s in stats), default=0.0)


def digest(path: Path) -> str:
    """The model's digest, 64 hex digits (see the module's docstring)."""
    files = pulled_record(path).get("files")
    if isinstance(files, dict) and files and all(isinstance(v, str) for v in files.values()):
        if path.suffix.lower() == ".gguf":
            own = files.get(path.name) or (next(iter(files.values())) if len(files) == 1 else None)
            if own:
                return own.removeprefix("sha256:")
        else:
            lines = "".join(f"{k} {v}\n" for k, v in sorted(files.items()))
            return hashlib.sha256(lines.encode()).hexdigest()
    size, mtime = stat_of(path)
    return hashlib.sha256(f"{path.resolve()}\0{size}\0{mtime!r}".encode()).hexdigest()


def details(d: ModelDescription | None) -> dict[str, Any]:
    if d is None:
        return {"parent_model": "", "format": "", "family": "", "families": [], "parameter_size": "",
                "quantization_level": ""}
    return {"parent_model": "", "format": d.format, "family": d.architecture, "families": [d.architecture],
            "parameter_size": human_count(d.parameter_count), "quantization_level": d.quantization}


def tags_entry(name: str, path: Path, d: ModelDescription | None) -> dict[str, Any]:
    size, mtime = stat_of(path)
    return {"name": name, "model": name, "modified_at": rfc3339(mtime), "size": size, "digest": digest(path),
            "details": details(d)}


def ps_entry(name: str, path: Path, d: ModelDescription | None, held_bytes: int, expires_in: float | None,
             context_length: int, now: float) -> dict[str, Any]:
    return {"name": name, "model": name, "size": held_bytes, "size_vram": 0, "digest": digest(path),
            "details": details(d),
            "expires_at": FAR_FUTURE if expires_in is None else rfc3339(now + expires_in),
            "context_length": context_length}


def capabilities(d: ModelDescription, thinks: bool) -> list[str]:
    if d.task == "embed":
        return ["embedding"]
    if d.task != "generate":
        return []
    t = d.chat_template
    return ["completion", *(["tools"] if d.takes_tools else []),
            *(["thinking"] if thinks or "<think>" in t or "enable_thinking" in t else [])]


def model_info(d: ModelDescription) -> dict[str, Any]:
    arch = d.architecture
    return {"general.architecture": arch, "general.file_type": d.quantization,
            "general.parameter_count": d.parameter_count, f"{arch}.context_length": d.context_length,
            f"{arch}.embedding_length": d.embedding_length, f"{arch}.block_count": d.block_count,
            f"{arch}.attention.head_count": d.head_count, f"{arch}.attention.head_count_kv": d.head_count_kv}


def parameters_text(parameters: dict[str, Any]) -> str:
    """Ollama's parameters: one "name value" line each, the name padded as its Modelfile shows them."""
    return "\n".join(f"{k:<30} {v}" for k, v in parameters.items())


def show_body(name: str, path: Path, d: ModelDescription, thinks: bool, template: str | None) -> dict[str, Any]:
    """/api/show's answer. template: the loaded engine's chat template (None: the files')."""
    _, mtime = stat_of(path)
    return {"license": "", "modelfile": f"# served by nvllm as {name}\nFROM {path}\n",
            "parameters": parameters_text(d.parameters), "template": d.chat_template if template is None
            else template, "details": details(d), "model_info": model_info(d),
            "capabilities": capabilities(d, thinks), "modified_at": rfc3339(mtime)}

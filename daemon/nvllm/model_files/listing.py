"""What a models folder holds (`nvllm models list`): folders and GGUF files, each described from its files
without loading it; the known models (registry.py) checked for a complete pull."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np

from nvllm.model.weights.gguf_encoder import is_gguf_encoder, read_gguf_encoder
from nvllm.model.weights.gguf_file import GGUFFile, open_gguf, read_gguf
from nvllm.model.weights.gguf_reader import GGUFError
from nvllm.model_files.hub import read_sidecar
from nvllm.model_files.registry import KNOWN_MODELS, PathLike, is_complete


def _safetensors_header(path: Path) -> dict:
    """The JSON header of a safetensors file (8-byte little-endian length, then JSON)."""
    with open(path, "rb") as f:
        n = int.from_bytes(f.read(8), "little")
        if n <= 0 or n > 100_000_000:
            raise ValueError(f"{path} is not a safetensors file")
        return json.loads(f.read(n))


def _weight_files(folder: Path) -> list[Path] | None:
    """The checkpoint's files, or None when it is missing or its index names absent files."""
    index = folder / "model.safetensors.index.json"
    if index.is_file():
        try:
            names = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        except (OSError, ValueError, KeyError):
            return None
        files = [folder / n for n in names]
        return files if all(f.is_file() for f in files) else None
    single = folder / "model.safetensors"
    return [single] if single.is_file() else None


def _count_parameters(files: list[Path]) -> int | None:
    total = 0
    try:
        for f in files:
            for k, v in _safetensors_header(f).items():
                if k != "__metadata__":
                    total += int(np.prod(v["shape"], dtype=np.int64))
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return total


def describe_folder(folder: Path) -> dict:
    """One row of `nvllm models list`."""
    name = folder.name
    try:
        cfg = json.loads((folder / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        cfg = {}
    files = _weight_files(folder)
    size = sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())
    if name in KNOWN_MODELS:
        complete = is_complete(name, folder)
    else:
        complete = bool(cfg) and files is not None and all(
            (folder / f).is_file() for f in ("tokenizer.json", "tokenizer_config.json"))
    return {
        "name": name,
        "path": str(folder),
        "format": "folder",
        "architecture": (cfg.get("architectures") or [None])[0],
        "num_parameters": _count_parameters(files) if files else None,
        "size_bytes": size,
        "complete": complete,
        "known": name in KNOWN_MODELS,
        "description": KNOWN_MODELS[name].description if name in KNOWN_MODELS else "",
    }


def describe_gguf(path: Path) -> dict:
    """One row of `nvllm models list` for a GGUF file, from its header (model/weights/gguf_file.py checks
    it as loading would, nothing is dequantized); a file nvllm cannot load is listed with the reason in
    `error`."""
    src = KNOWN_MODELS.get(path.name[: -len(".gguf")])
    row: dict[str, Any] = {
        "name": path.name,
        "path": str(path),
        "format": "gguf",
        "architecture": None,
        "num_parameters": None,
        "size_bytes": path.stat().st_size,
        "tensor_types": {},
        "complete": False,
        "known": src is not None,
        "description": f"{src.original} as published in {src.package}=={src.version}" if src else "",
        "error": None,
    }
    try:
        f = open_gguf(path)
        gguf: GGUFFile = read_gguf_encoder(f).file if is_gguf_encoder(f.metadata) else read_gguf(f)
    except GGUFError as e:  # a broken or unsupported file is a row with its error, never a crash
        row["error"] = str(e)
        return row
    types = Counter(fmt.name for fmt, _, _ in gguf.tensors.values())
    row.update(
        architecture=gguf.metadata.get("general.architecture"),
        num_parameters=sum(int(np.prod(shape, dtype=np.int64)) for _, _, shape in gguf.tensors.values()),
        tensor_types=dict(types.most_common()),
        complete=True,
    )
    return row


def list_models(models_dir: PathLike = "models") -> list[dict]:
    """Every model folder and GGUF file under models_dir (hidden and temporary ones skipped), by name; one
    pulled from the Hub with its `source` (hub.py's record)."""
    root = Path(models_dir)
    if not root.is_dir():
        return []
    rows = []
    for p in sorted(root.iterdir()):
        if p.name.startswith("."):
            continue
        if p.is_dir() and ((p / "config.json").is_file() or p.name in KNOWN_MODELS):
            rows.append(describe_folder(p))
        elif p.is_file() and p.name.endswith(".gguf"):
            rows.append(describe_gguf(p))
        else:
            continue
        record = read_sidecar(p)
        if record is not None:
            rows[-1]["source"] = record.get("source")
    return rows

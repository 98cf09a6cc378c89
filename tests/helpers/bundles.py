"""Model bundles for the import tests: small models of random bytes, bundles written member by member (so a
test can put any member, link or manifest in them), and a models folder's whole state to compare."""

from __future__ import annotations

import hashlib
import io
import json
import os
import tarfile
from collections.abc import Sequence
from pathlib import Path


def make_models(models: Path, seed: int = 0) -> Path:
    """models/a.gguf (random bytes: the import never parses it) and the folder models/fold with two files."""
    rng = __import__("random").Random(seed)
    (models / "fold" / "sub").mkdir(parents=True, exist_ok=True)
    (models / "a.gguf").write_bytes(rng.randbytes(70_000))
    (models / "fold" / "config.json").write_text(json.dumps({"seed": seed}))
    (models / "fold" / "sub" / "w.bin").write_bytes(rng.randbytes(5_000))
    return models


def state(root: Path) -> dict[str, object]:
    """Every entry under root (hidden ones too): a file's sha256, a link's target, a folder as 'dir'."""
    out: dict[str, object] = {}
    if not root.exists():
        return out
    for dirpath, dirs, files in os.walk(root):
        for d in dirs:
            p = Path(dirpath) / d
            out[str(p.relative_to(root))] = f"-> {os.readlink(p)}" if p.is_symlink() else "dir"
        for f in files:
            p = Path(dirpath) / f
            out[str(p.relative_to(root))] = (f"-> {os.readlink(p)}" if p.is_symlink()
                                             else hashlib.sha256(p.read_bytes()).hexdigest())
    return out


def manifest_of(files: dict[str, bytes], models: list[tuple[str, str]]) -> dict:
    """A manifest dict for models [(name, kind)] whose members are files {member: bytes}."""
    out = []
    for name, kind in models:
        prefix = "" if kind == "gguf" else f"{name}/"
        entries = [{"path": m[len(prefix):], "size": len(b), "sha256": hashlib.sha256(b).hexdigest()}
                   for m, b in files.items() if (m == f"{name}.gguf" if kind == "gguf" else m.startswith(prefix))]
        out.append({"name": name, "kind": kind, "files": entries})
    return {"format": "nvllm-bundle", "format_version": 1, "created": "2026-12-08T00:00:00Z",
            "nvllm_version": "test", "models": out}


Member = tarfile.TarInfo | tuple[str, bytes]


def write_tar(path: Path, manifest: dict | bytes | None, members: Sequence[Member]) -> Path:
    """A tar of the manifest (first, unless None) then members: (name, bytes) regular files, or TarInfo as
    given (links, devices, folders)."""
    data = manifest if isinstance(manifest, bytes) else json.dumps(manifest).encode()
    with tarfile.open(path, "w", format=tarfile.PAX_FORMAT) as tar:
        if manifest is not None:
            ti = tarfile.TarInfo("nvllm-bundle.json")
            ti.size = len(data)
            tar.addfile(ti, io.BytesIO(data))
        for m in members:
            if isinstance(m, tarfile.TarInfo):
                tar.addfile(m)
            else:
                ti = tarfile.TarInfo(m[0])
                ti.size = len(m[1])
                tar.addfile(ti, io.BytesIO(m[1]))
    return path


def link(name: str, target: str, kind: bytes = tarfile.SYMTYPE) -> tarfile.TarInfo:
    ti = tarfile.TarInfo(name)
    ti.type, ti.linkname = kind, target
    return ti

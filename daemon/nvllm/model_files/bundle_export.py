"""`nvllm models export`: models of a models folder written into one uncompressed tar, the manifest first.

Each file is read twice, in chunks: once to hash it for the manifest (which must come first in the tar, so
that an import can check each member as it streams by), and once to copy it into the tar, hashed again on
the way: a file that changed in between fails the export rather than ship bytes the manifest does not
describe. Nothing is held in memory but a chunk. The tar is written to a temporary name beside FILE and
renamed when whole (or streamed to stdout when FILE is '-'). Uncompressed: weights do not compress, and a
plain tar streams both ways.
"""

from __future__ import annotations

import hashlib
import io
import os
import sys
import tarfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import BinaryIO

import nvllm
from nvllm.model_files.bundle_manifest import (
    MANIFEST_NAME,
    BundleError,
    BundleFile,
    BundleModel,
    Manifest,
    check_name,
    check_relative,
)

CHUNK = 1 << 20


def resolve_model(name: str, models_dir: Path) -> tuple[str, str, Path]:
    """(served name, kind, path) of NAME: a path to a .gguf file or a folder (one with a '/' in it), else
    NAME.gguf or the folder NAME in models_dir (NAME.gguf and NAME/ say which when both are there)."""
    base = name.rstrip("/")
    if "/" in base or Path(name).is_absolute():
        candidates = [Path(base)] if Path(base).exists() else []
    elif name.endswith(".gguf") or name.endswith("/"):
        candidates = [p for p in (models_dir / base,) if p.exists()]
    else:
        candidates = [p for p in (models_dir / f"{base}.gguf", models_dir / base) if p.exists()]
    if not candidates and Path(base).exists():
        candidates = [Path(base)]
    if not candidates:
        raise BundleError(f"{name}: no model {base}.gguf nor folder {base} in {models_dir}")
    if len(candidates) > 1:
        raise BundleError(f"{name}: both {base}.gguf and the folder {base} are in {models_dir}: "
                          f"give {base}.gguf or {base}/")
    path = candidates[0]
    if path.is_file() and path.name.endswith(".gguf"):
        served, kind = path.name[: -len(".gguf")], "gguf"
    elif path.is_dir():
        served, kind = path.resolve().name if path.name in ("", ".", "..") else path.name, "folder"
    else:
        raise BundleError(f"{name}: {path} is neither a .gguf file nor a model folder")
    check_name(served)
    return served, kind, path


def _folder_files(folder: Path) -> list[tuple[str, Path]]:
    """(relative path, file) of every regular file under folder (symlinks followed), sorted."""
    out = []
    for root, dirs, files in os.walk(folder, followlinks=True):
        dirs.sort()
        for f in sorted(files):
            p = Path(root) / f
            if p.is_file():
                out.append((p.relative_to(folder).as_posix(), p))
    return out


def _hash(path: Path) -> tuple[int, str]:
    h, n = hashlib.sha256(), 0
    with open(path, "rb") as f:
        while chunk := f.read(CHUNK):
            h.update(chunk)
            n += len(chunk)
    return n, h.hexdigest()


class _HashingReader:
    """A file read through while hashing what is read."""

    def __init__(self, f: BinaryIO) -> None:
        self.f, self.h, self.n = f, hashlib.sha256(), 0

    def read(self, size: int = -1) -> bytes:
        data = self.f.read(size)
        self.h.update(data)
        self.n += len(data)
        return data


def build_manifest(names: list[str], models_dir: Path,
                   progress: Callable[[str], None] | None = None) -> tuple[Manifest, dict[str, Path]]:
    """The manifest of the named models and, for each tar member, the file it is read from."""
    models: list[BundleModel] = []
    sources: dict[str, Path] = {}
    for name in names:
        served, kind, path = resolve_model(name, models_dir)
        files = [(path.name, path)] if kind == "gguf" else _folder_files(path)
        if not files:
            raise BundleError(f"{name}: the folder {path} holds no files")
        entries = []
        for rel, src in files:
            check_relative(rel)
            if progress:
                progress(f"hashing {served}: {rel}")
            try:
                size, sha = _hash(src)
            except OSError as e:
                raise BundleError(f"{src}: {e.strerror or e}") from None
            entries.append(BundleFile(rel, size, sha))
        model = BundleModel(served, kind, tuple(entries))
        if any(m.target == model.target for m in models):
            raise BundleError(f"{name}: a model named {model.target} is already in the bundle")
        models.append(model)
        sources.update({model.member(f): src for f, (_, src) in zip(entries, files)})
    created = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    return Manifest(created, nvllm.__version__, tuple(models)), sources


def _info(name: str, size: int, mtime: float) -> tarfile.TarInfo:
    ti = tarfile.TarInfo(name)
    ti.size, ti.mtime, ti.mode = size, int(mtime), 0o644
    ti.uid = ti.gid = 0
    ti.uname = ti.gname = ""
    return ti


def write_bundle(manifest: Manifest, sources: dict[str, Path], out: BinaryIO,
                 progress: Callable[[str], None] | None = None) -> bytes:
    """The tar into out (written forward only: a pipe will do); returns the manifest's bytes."""
    data = manifest.to_bytes()
    mtime = time.time()
    with tarfile.open(fileobj=out, mode="w|", format=tarfile.PAX_FORMAT, bufsize=CHUNK) as tar:
        tar.addfile(_info(MANIFEST_NAME, len(data), mtime), io.BytesIO(data))
        for member, (_, f) in manifest.members().items():
            if progress:
                progress(f"writing {member} ({f.size} bytes)")
            try:
                with open(sources[member], "rb") as fin:
                    reader = _HashingReader(fin)
                    tar.addfile(_info(member, f.size, mtime), reader)
                    if reader.n != f.size or fin.read(1):
                        raise BundleError(f"{sources[member]}: changed size while exporting")
            except OSError as e:
                raise BundleError(f"{sources[member]}: {e.strerror or e}") from None
            if reader.h.hexdigest() != f.sha256:
                raise BundleError(f"{sources[member]}: changed while exporting (sha256 differs)")
    return data


def export_bundle(names: list[str], out: str | Path, models_dir: str | Path = "models",
                  progress: Callable[[str], None] | None = None) -> bytes:
    """Write the bundle of the named models to out ('-': stdout); returns the manifest's bytes."""
    manifest, sources = build_manifest(names, Path(models_dir), progress)
    if str(out) == "-":
        data = write_bundle(manifest, sources, sys.stdout.buffer, progress)
        sys.stdout.buffer.flush()
        return data
    dest = Path(out)
    tmp = dest.with_name(f".{dest.name}.partial-{os.getpid()}")
    try:
        with open(tmp, "wb") as f:
            data = write_bundle(manifest, sources, f, progress)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, dest)
    except OSError as e:
        tmp.unlink(missing_ok=True)
        raise BundleError(f"cannot write {dest}: {e.strerror or e}") from None
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return data

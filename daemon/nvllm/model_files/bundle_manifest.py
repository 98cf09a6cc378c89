"""A model bundle's manifest, `nvllm-bundle.json`: the first member of the tar `nvllm models export` writes.

It names every model the bundle carries (its served name and kind: one GGUF file, or a folder of files) and
every file's path relative to the model, size and sha256. `nvllm models import` checks each member of the tar
against it, and a signature (bundle_signature.py) covers the manifest's bytes: every file's sha256 is in
them, so a signed manifest covers the whole bundle.

    {"format": "nvllm-bundle", "format_version": 1, "created": "2026-12-08T00:00:00Z",
     "nvllm_version": "0.1.0",
     "models": [{"name": "smollm2-135m-instruct", "kind": "gguf",
                 "files": [{"path": "smollm2-135m-instruct.gguf", "size": 98000000, "sha256": "..."}]},
                {"name": "whisper-tiny.en", "kind": "folder",
                 "files": [{"path": "config.json", "size": 2200, "sha256": "..."}, ...]}]}

A GGUF model's one file is NAME.gguf and is the tar member NAME.gguf; a folder's files are the members
NAME/PATH. Names and paths are checked here the same way whether they come from a manifest being written or
one being read: one model's files stay inside that model's own file or folder.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

MANIFEST_NAME = "nvllm-bundle.json"
FORMAT = "nvllm-bundle"
FORMAT_VERSION = 1
MAX_MANIFEST_BYTES = 16 << 20      # a manifest lists files, it is never large; a bigger first member is refused
KINDS = ("gguf", "folder")
_SHA256 = re.compile(r"[0-9a-f]{64}")


class BundleError(RuntimeError):
    """A bundle refused or not written; the message is one line naming the member or file and the reason."""


@dataclass(frozen=True)
class BundleFile:
    path: str      # relative to the model: NAME.gguf for a GGUF, a path inside the folder for a folder
    size: int
    sha256: str


@dataclass(frozen=True)
class BundleModel:
    name: str
    kind: str      # "gguf" or "folder"
    files: tuple[BundleFile, ...]

    def member(self, f: BundleFile) -> str:
        """The tar member (and the path under the models folder) holding file f."""
        return f.path if self.kind == "gguf" else f"{self.name}/{f.path}"

    @property
    def target(self) -> str:
        """What the model is under the models folder: NAME.gguf or the folder NAME."""
        return f"{self.name}.gguf" if self.kind == "gguf" else self.name

    @property
    def size(self) -> int:
        return sum(f.size for f in self.files)


@dataclass(frozen=True)
class Manifest:
    created: str
    nvllm_version: str
    models: tuple[BundleModel, ...]

    def members(self) -> dict[str, tuple[BundleModel, BundleFile]]:
        """tar member name -> its model and file."""
        return {m.member(f): (m, f) for m in self.models for f in m.files}

    @property
    def size(self) -> int:
        return sum(m.size for m in self.models)

    def to_bytes(self) -> bytes:
        return (json.dumps({
            "format": FORMAT, "format_version": FORMAT_VERSION, "created": self.created,
            "nvllm_version": self.nvllm_version,
            "models": [{"name": m.name, "kind": m.kind,
                        "files": [{"path": f.path, "size": f.size, "sha256": f.sha256} for f in m.files]}
                       for m in self.models],
        }, indent=1, ensure_ascii=False) + "\n").encode("utf-8")


def check_name(name: str) -> None:
    """A model's name: one path component, not hidden (hidden names are the models folder's own files)."""
    if (not isinstance(name, str) or not name or name in (".", "..") or name.startswith(".")
            or any(c in name for c in "/\\\0") or name != name.strip()):
        raise BundleError(f"model name {name!r} is not a plain file name (no '/', '..', leading '.')")


def check_relative(path: str) -> None:
    """A path inside a model's folder: relative, no '..', '.' or empty components, no backslash or NUL."""
    if not isinstance(path, str) or not path:
        raise BundleError(f"file path {path!r} is empty")
    if path.startswith("/"):
        raise BundleError(f"file path {path!r} is absolute")
    parts = path.split("/")
    if ".." in parts:
        raise BundleError(f"file path {path!r} leads out of its model ('..')")
    if any(p in ("", ".") for p in parts) or "\\" in path or "\0" in path:
        raise BundleError(f"file path {path!r} is not a plain relative path")


def _field(obj: dict, key: str, kind: type, where: str) -> Any:
    v = obj.get(key)
    if not isinstance(v, kind) or isinstance(v, bool):
        raise BundleError(f"{MANIFEST_NAME}: {where}{key} must be a {kind.__name__}, got {v!r}")
    return v


def parse_manifest(data: bytes) -> Manifest:
    """The manifest in data, every name and path checked; BundleError says what is wrong."""
    try:
        obj = json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as e:
        raise BundleError(f"{MANIFEST_NAME}: not JSON ({e})") from None
    if not isinstance(obj, dict) or obj.get("format") != FORMAT:
        raise BundleError(f"{MANIFEST_NAME}: not an nvllm bundle manifest (format is not {FORMAT!r})")
    if obj.get("format_version") != FORMAT_VERSION:
        raise BundleError(f"{MANIFEST_NAME}: format_version {obj.get('format_version')!r} is not "
                          f"{FORMAT_VERSION}: made by another nvllm version")
    models = []
    for i, m in enumerate(_field(obj, "models", list, "")):
        if not isinstance(m, dict):
            raise BundleError(f"{MANIFEST_NAME}: models[{i}] is not an object")
        name = _field(m, "name", str, f"models[{i}].")
        try:
            check_name(name)
        except BundleError as e:
            raise BundleError(f"{MANIFEST_NAME}: models[{i}]: {e}") from None
        kind = m.get("kind")
        if kind not in KINDS:
            raise BundleError(f"{MANIFEST_NAME}: model {name}: kind {kind!r} is not gguf or folder")
        files = []
        for j, f in enumerate(_field(m, "files", list, f"models[{i}].")):
            if not isinstance(f, dict):
                raise BundleError(f"{MANIFEST_NAME}: model {name}: files[{j}] is not an object")
            path = _field(f, "path", str, f"{name}.files[{j}].")
            size = _field(f, "size", int, f"{name}.files[{j}].")
            sha = _field(f, "sha256", str, f"{name}.files[{j}].")
            try:
                check_relative(path)
            except BundleError as e:
                raise BundleError(f"{MANIFEST_NAME}: model {name}: {e}") from None
            if size < 0 or not _SHA256.fullmatch(sha):
                raise BundleError(f"{MANIFEST_NAME}: model {name}: {path}: bad size or sha256")
            files.append(BundleFile(path, size, sha))
        model = BundleModel(name, kind, tuple(files))
        _check_model(model)
        models.append(model)
    manifest = Manifest(str(obj.get("created", "")), str(obj.get("nvllm_version", "")), tuple(models))
    _check_models(manifest)
    return manifest


def _check_model(m: BundleModel) -> None:
    if not m.files:
        raise BundleError(f"{MANIFEST_NAME}: model {m.name} has no files")
    if m.kind == "gguf" and [f.path for f in m.files] != [f"{m.name}.gguf"]:
        raise BundleError(f"{MANIFEST_NAME}: model {m.name}: a gguf model is the one file {m.name}.gguf")
    paths = [f.path for f in m.files]
    if len(set(paths)) != len(paths):
        raise BundleError(f"{MANIFEST_NAME}: model {m.name} lists a file twice")
    # a file that is also a folder of another file (a and a/b) cannot both be written
    dirs = {"/".join(p.split("/")[:k]) for p in paths for k in range(1, p.count("/") + 1)}
    clash = dirs & set(paths)
    if clash:
        raise BundleError(f"{MANIFEST_NAME}: model {m.name}: {sorted(clash)[0]} is both a file and a folder")


def _check_models(manifest: Manifest) -> None:
    if not manifest.models:
        raise BundleError(f"{MANIFEST_NAME}: the bundle carries no models")
    targets = [m.target for m in manifest.models]
    if len(set(targets)) != len(targets) or MANIFEST_NAME in targets:
        raise BundleError(f"{MANIFEST_NAME}: two models share a name ({sorted(targets)})")

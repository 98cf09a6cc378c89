"""One file of a Hub repository downloaded and checked: huggingface_hub's `http_get` (its retries, its resume
by Range after a cut connection, HF_HUB_DOWNLOAD_TIMEOUT, its progress bar) into DEST.<hash>.part, which a
later pull resumes from where this one stopped; the whole file then checked against the Hub's hash (the LFS
sha256 of the repository's listing, or the git blob id of a small file kept in git) before it is renamed
DEST. A file that fails its check is deleted."""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from nvllm.model_files.registry import RegistryError

Report = Callable[[int, "int | None"], None]    # (bytes so far, total or None)


class HubError(RegistryError):
    """A pull from the Hub failed; the message (one line) names the cause."""


@dataclass(frozen=True)
class RemoteFile:
    """A file as the repository's listing gives it."""
    path: str                 # inside the repository
    size: int | None
    sha256: str = ""          # an LFS file's
    blob_id: str = ""         # the git blob id (a small file kept in git: its only hash)

    @property
    def digest(self) -> str:
        return f"sha256:{self.sha256}" if self.sha256 else ""


def file_hashes(path: Path) -> tuple[str, str]:
    """(sha256, git blob sha1) of a file, read once."""
    sha256, sha1 = hashlib.sha256(), hashlib.sha1()
    sha1.update(f"blob {path.stat().st_size}\0".encode())
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            sha256.update(chunk)
            sha1.update(chunk)
    return sha256.hexdigest(), sha1.hexdigest()


def check(path: Path, rf: RemoteFile) -> tuple[str | None, str]:
    """(None when path holds exactly rf (its sha256, else its blob id), else the mismatch in words; the file's
    sha256)."""
    sha256, blob = file_hashes(path)
    if rf.sha256:
        return (None if sha256 == rf.sha256 else f"sha256 {sha256}, the Hub says {rf.sha256}"), sha256
    if rf.blob_id:
        return (None if blob == rf.blob_id else f"git blob id {blob}, the Hub says {rf.blob_id}"), sha256
    return "no hash in the Hub's listing to check it against", sha256


def part_path(dest: Path, rf: RemoteFile) -> Path:
    """Where dest's bytes gather until they are whole: named by the expected hash, so that a pull of another
    revision never resumes from these bytes."""
    return dest.with_name(f"{dest.name}.{(rf.sha256 or rf.blob_id)[:16]}.part")


def fetch(url: str, dest: Path, rf: RemoteFile, headers: dict[str, str], bar: type | None) -> str:
    """dest holds rf, checked, afterwards (kept as it is when it already does); its sha256. Resumes an
    earlier part."""
    from huggingface_hub.file_download import http_get

    if dest.is_file():
        wrong, sha256 = check(dest, rf)
        if wrong is None:
            return sha256
    dest.unlink(missing_ok=True)
    dest.parent.mkdir(parents=True, exist_ok=True)
    part = part_path(dest, rf)
    have = part.stat().st_size if part.is_file() else 0
    if rf.size is not None and have > rf.size:
        part.unlink()
        have = 0
    try:
        with open(part, "ab") as f:
            kw: dict[str, Any] = {"tqdm_class": bar} if bar is not None else {}
            http_get(url, f, resume_size=have, headers=headers, expected_size=rf.size,
                     displayed_filename=rf.path.rsplit("/", 1)[-1], **kw)
    except OSError as e:
        if getattr(e, "errno", None) is not None:   # a local write failed (the disk): drop the bytes
            part.unlink(missing_ok=True)
        raise
    wrong, sha256 = check(part, rf)
    if wrong is not None:
        part.unlink(missing_ok=True)
        raise HubError(f"{rf.path} downloaded with {wrong}; the file was deleted (run the pull again; "
                       "if it fails the same way, the Hub or the mirror at HF_ENDPOINT serves a wrong file)")
    os.replace(part, dest)
    return sha256


def progress_bar(report: Report | None, show: bool) -> type:
    """A tqdm class for http_get: the Hub library's bar (drawn on a terminal only, and not at all when show
    is false) that also tells report each count."""
    from huggingface_hub.utils import tqdm as hf_tqdm

    class Bar(hf_tqdm):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            if not show:
                kwargs["disable"] = True
            super().__init__(*args, **kwargs)
            self._done = int(kwargs.get("initial") or 0)
            self._whole = kwargs.get("total")
            if report is not None:
                report(self._done, self._whole)

        def update(self, n: float | None = 1) -> bool | None:
            self._done += int(n or 0)
            if report is not None:
                report(self._done, self._whole)
            return super().update(n)

    return Bar

"""`nvllm models import`: a bundle checked member by member, and its models installed only when all are good.

The tar is read forward once (a file or a pipe alike). Its first member must be the manifest; the signature
is checked against it before anything is written (bundle_signature.py); then each member is streamed in
chunks into a staging folder inside the models folder while it is hashed, and checked against the manifest:
its name (only the manifest's, each once), its type (a regular file: links and devices are refused), its
size and its sha256. Every file the manifest lists must have come. Only then are the models put in place,
each by one rename on the same file system: a GGUF by os.replace over the old file, a folder by exchanging
it with the old one (renameat2 RENAME_EXCHANGE where the kernel has it). A daemon that has the old file open
keeps its mapping of the old bytes until it loads the new ones. A model already there with the same files
is left as it is. Anything wrong: BundleError naming the member and the reason, the staging folder removed,
nothing installed.
"""

from __future__ import annotations

import ctypes
import errno
import hashlib
import os
import shutil
import sys
import tarfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import IO, BinaryIO

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from nvllm.model_files.bundle_manifest import (
    MANIFEST_NAME,
    MAX_MANIFEST_BYTES,
    BundleError,
    BundleFile,
    BundleModel,
    Manifest,
    parse_manifest,
)
from nvllm.model_files.bundle_signature import read_signature, signature_path, verify

CHUNK = 1 << 20
STAGING_PREFIX = ".nvllm-import-"


class InstallError(BundleError):
    """The bundle checked out but a rename into the models folder failed: the models before it are in place."""


@dataclass(frozen=True)
class Imported:
    name: str
    kind: str
    path: Path
    action: str     # "installed" (new), "replaced" (different files were there), "unchanged"


@dataclass(frozen=True)
class Trust:
    """Which signatures an import accepts: with keys, a signature present must verify against one of them;
    with require_signature, one must be present (and keys given)."""
    keys: tuple[Ed25519PublicKey, ...] = ()
    require_signature: bool = False


Progress = Callable[[str], None]


def _check_signature(manifest: bytes, sig_file: Path | None, trust: Trust, progress: Progress | None) -> str:
    """The signer's fingerprint, "" when unsigned or unchecked; BundleError when the policy refuses."""
    if trust.require_signature and not trust.keys:
        raise BundleError("signatures are required but no trusted key is given "
                          "(bundles.trusted_keys or --trusted-key)")
    if sig_file is None:
        if trust.require_signature:
            raise BundleError(f"{MANIFEST_NAME}: the bundle is unsigned and signatures are required")
        return ""
    sig = read_signature(sig_file)
    if not trust.keys:
        if progress:
            progress(f"signature {sig_file} not checked: no trusted key is given")
        return ""
    return verify(manifest, sig, list(trust.keys), f"{MANIFEST_NAME} ({sig_file.name})")


def read_manifest(tar: tarfile.TarFile) -> bytes:
    """The first member's bytes, which must be the manifest (not yet parsed)."""
    first = tar.next()
    if first is None or first.name != MANIFEST_NAME:
        raise BundleError(f"{first.name if first else 'the bundle'}: the first member must be {MANIFEST_NAME}")
    if not first.isreg() or first.size > MAX_MANIFEST_BYTES:
        raise BundleError(f"{MANIFEST_NAME}: not a regular file under {MAX_MANIFEST_BYTES} bytes")
    f = tar.extractfile(first)
    data = f.read() if f is not None else b""
    if len(data) != first.size:
        raise BundleError(f"{MANIFEST_NAME}: cut short")
    return data


def manifest_bytes(bundle: Path) -> bytes:
    """The manifest of the bundle file, checked (what `nvllm models sign` signs); the members not read."""
    try:
        with tarfile.open(bundle, mode="r|") as tar:
            data = read_manifest(tar)
    except (OSError, tarfile.TarError, EOFError) as e:
        raise BundleError(f"{bundle}: not a bundle ({e})") from None
    parse_manifest(data)
    return data


def _member_problem(m: tarfile.TarInfo, expected: dict, allowed_dirs: set[str]) -> str | None:
    """Why member m may not be staged, or None. Directory entries above listed files are let through."""
    name = m.name
    if name.startswith("/") or ".." in name.split("/"):
        return "path leads outside its model (absolute or '..')"
    if m.issym():
        return f"is a symbolic link (to {m.linkname!r}): refused"
    if m.islnk():
        return f"is a hard link (to {m.linkname!r}): refused"
    if m.isdir():
        return None if name.rstrip("/") in allowed_dirs else "is a folder the manifest does not list"
    if not m.isreg():
        return "is a device, fifo or other special file: refused"
    if name not in expected:
        return "is not listed in the manifest"
    return None


def _copy_member(tar: tarfile.TarInfo, src: IO[bytes] | None, dest: Path, f: BundleFile) -> None:
    """Stream one member into dest, hashing it; BundleError when it is short, long or its sha256 differs."""
    if tar.size != f.size:
        raise BundleError(f"{tar.name}: size {tar.size}, the manifest says {f.size}")
    if src is None:
        raise BundleError(f"{tar.name}: cannot be read")
    dest.parent.mkdir(parents=True, exist_ok=True)
    h, n = hashlib.sha256(), 0
    with open(dest, "xb") as out:
        while chunk := src.read(CHUNK):
            h.update(chunk)
            out.write(chunk)
            n += len(chunk)
        out.flush()
        os.fsync(out.fileno())
    if n != f.size:
        raise BundleError(f"{tar.name}: cut short ({n} of {f.size} bytes)")
    if h.hexdigest() != f.sha256:
        raise BundleError(f"{tar.name}: sha256 {h.hexdigest()} differs from the manifest's {f.sha256}")


def _stage(tar: tarfile.TarFile, manifest: Manifest, staging: Path, progress: Progress | None) -> None:
    expected = manifest.members()
    allowed_dirs = {"/".join(p.split("/")[:k]) for p in expected for k in range(1, p.count("/") + 1)}
    seen: set[str] = set()
    current = MANIFEST_NAME
    try:
        while (m := tar.next()) is not None:
            current = m.name
            if m.name in seen:
                raise BundleError(f"{m.name}: appears twice in the bundle")
            problem = _member_problem(m, expected, allowed_dirs)
            if problem:
                raise BundleError(f"{m.name}: {problem}")
            if m.isdir():
                continue
            seen.add(m.name)
            if progress:
                progress(f"checking {m.name} ({m.size} bytes)")
            _copy_member(m, tar.extractfile(m), staging / m.name, expected[m.name][1])
    except (tarfile.TarError, EOFError) as e:
        raise BundleError(f"{current}: the bundle is cut short or damaged ({e})") from None
    missing = [name for name in expected if name not in seen]
    if missing:
        raise BundleError(f"{missing[0]}: missing from the bundle (cut short?)")


def _same_file(path: Path, f: BundleFile) -> bool:
    try:
        if not path.is_file() or path.stat().st_size != f.size:
            return False
        h = hashlib.sha256()
        with open(path, "rb") as fin:
            while chunk := fin.read(CHUNK):
                h.update(chunk)
        return h.hexdigest() == f.sha256
    except OSError:
        return False


def _same_model(dest: Path, m: BundleModel) -> bool:
    if m.kind == "gguf":
        return _same_file(dest, m.files[0])
    return dest.is_dir() and all(_same_file(dest / f.path, f) for f in m.files)


def _exchange(a: Path, b: Path) -> bool:
    """Swap a and b in one step (Linux renameat2 RENAME_EXCHANGE); False where the system cannot."""
    try:
        fn = ctypes.CDLL(None, use_errno=True).renameat2
    except (OSError, AttributeError):
        return False
    at_fdcwd, rename_exchange = -100, 2
    if fn(at_fdcwd, os.fsencode(a), at_fdcwd, os.fsencode(b), rename_exchange) == 0:
        return True
    err = ctypes.get_errno()
    if err in (errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP):
        return False
    raise OSError(err, os.strerror(err), str(b))


def _install(models_dir: Path, staging: Path, manifest: Manifest) -> list[Imported]:
    """Each staged model renamed into place; the plan (and its refusals) made before the first rename."""
    plan = []
    for m in manifest.models:
        dest = models_dir / m.target
        there = dest.exists() or dest.is_symlink()
        if there and m.kind == "gguf" and dest.is_dir():
            raise BundleError(f"{m.target}: a folder of that name is in {models_dir}; not replaced by a file")
        if there and m.kind == "folder" and not dest.is_dir():
            raise BundleError(f"{m.target}: a file of that name is in {models_dir}; not replaced by a folder")
        action = ("unchanged" if _same_model(dest, m) else "replaced") if there else "installed"
        plan.append((m, dest, action))
    for dirpath, _, _ in os.walk(staging):
        _fsync_dir(Path(dirpath))
    done: list[Imported] = []
    for m, dest, action in plan:
        staged = staging / m.target
        try:
            if action == "replaced" and m.kind == "gguf":
                os.replace(staged, dest)     # the old inode lives on for whoever has it open or mapped
            elif action == "replaced" and not _exchange(staged, dest):
                old = staging / f".old-{m.target}"
                dest.rename(old)
                staged.rename(dest)
            elif action == "installed":
                staged.rename(dest)
        except OSError as e:
            put = ", ".join(d.name for d in done if d.action != "unchanged") or "none"
            raise InstallError(f"{m.target}: every file checked, but it could not be put in place: "
                               f"{e.strerror or e} (models already put in place: {put})") from None
        done.append(Imported(m.name, m.kind, dest, action))
    _fsync_dir(models_dir)
    return done


def _fsync_dir(path: Path) -> None:
    """Make path's entries durable (a board may lose power right after an import)."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _remove_stale_staging(models_dir: Path) -> None:
    """Staging folders left by imports whose process is gone."""
    for p in models_dir.glob(STAGING_PREFIX + "*"):
        try:
            os.kill(int(p.name[len(STAGING_PREFIX):].split("-")[0]), 0)
            continue
        except (ValueError, ProcessLookupError):
            pass
        except PermissionError:
            continue
        shutil.rmtree(p, ignore_errors=True)


def import_bundle(source: str | Path, models_dir: str | Path = "models", trust: Trust = Trust(),
                  signature: str | Path | None = None, progress: Progress | None = None) -> list[Imported]:
    """Check the bundle at source ('-': stdin) against its manifest and signature, then install its models
    into models_dir. signature: the detached .sig (default FILE.sig beside FILE, when it is there)."""
    models_dir = Path(models_dir)
    sig_file: Path | None = Path(signature) if signature is not None else None
    if sig_file is None and str(source) != "-" and signature_path(Path(source)).is_file():
        sig_file = signature_path(Path(source))
    if sig_file is not None and not sig_file.is_file():
        raise BundleError(f"signature {sig_file} does not exist")
    try:
        stream: BinaryIO = sys.stdin.buffer if str(source) == "-" else open(source, "rb")
    except OSError as e:
        raise BundleError(f"cannot read {source}: {e.strerror or e}") from None
    try:
        try:
            tar = tarfile.open(fileobj=stream, mode="r|", bufsize=CHUNK)
            data = read_manifest(tar)
        except (tarfile.TarError, EOFError) as e:
            raise BundleError(f"{source}: not a bundle, or cut short before its manifest ({e})") from None
        signer = _check_signature(data, sig_file, trust, progress)
        manifest = parse_manifest(data)
        if progress:
            progress(f"manifest: {len(manifest.models)} model(s), {manifest.size} bytes"
                     + (f", signed by {signer}" if signer else ""))
        models_dir.mkdir(parents=True, exist_ok=True)
        free = shutil.disk_usage(models_dir).free
        if free < manifest.size:
            raise BundleError(f"{models_dir}: {free} bytes free, the bundle needs {manifest.size}")
        _remove_stale_staging(models_dir)
        staging = models_dir / f"{STAGING_PREFIX}{os.getpid()}-{os.urandom(4).hex()}"
        staging.mkdir()
        try:
            _stage(tar, manifest, staging, progress)
            return _install(models_dir, staging, manifest)
        except OSError as e:
            raise BundleError(f"{models_dir}: {e.strerror or e}"
                              + (f" ({e.filename})" if e.filename else "")) from None
        finally:
            shutil.rmtree(staging, ignore_errors=True)
    finally:
        if stream is not sys.stdin.buffer:
            stream.close()

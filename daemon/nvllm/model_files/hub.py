"""Models pulled from the Hugging Face Hub (`nvllm models pull ORG/REPO[:QUANT]`, a [[models]] table's
`source`, and the daemon's /api/pull through the puller cli/serve.py gives it), through the `huggingface_hub`
library: HF_ENDPOINT (a mirror) and HF_TOKEN (a gated or private repository) as it reads them, its timeouts
(HF_HUB_ETAG_TIMEOUT for the listing, HF_HUB_DOWNLOAD_TIMEOUT for each read of a file), its retries and its
resume after a cut connection.

Where files land, in models_dir (default `models`):
- a GGUF as DIR/<file>.gguf, beside its record DIR/.<file>.gguf.nvllm-pull.json;
- a folder as DIR/<repo name>/, its record DIR/<repo name>/.nvllm-pull.json (registry.MARKER_FILE).
A record (JSON, read by the daemon without this module) holds at least "source" (hf.co/ORG/REPO[:QUANT]),
"aliases" (the names a client may use for it) and "files" ({path: sha256}), with "repo", "revision" and
"commit". While a pull runs, its files gather under DIR/.hub-partial/<key>/ (a folder no daemon looks in),
each as NAME.<hash>.part until it is whole and checked; a pull cut short is resumed by the next one. A
model appears under its name only whole: the GGUF by os.replace, the folder by a rename (its record
written last).
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import re
import shutil
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import quote

from nvllm.model_files import hub_download
from nvllm.model_files.hub_download import HubError, RemoteFile
from nvllm.model_files.hub_ref import HubRef, is_split, parse_ref, pick_gguf, quant_of, quants_of
from nvllm.model_files.registry import MARKER_FILE, _swap_into_place, _write_json

__all__ = ["HubError", "HubRef", "PulledModel", "find_pulled", "parse_ref", "pull_from_hub", "sidecar_path"]

FORMAT_VERSION = 1
PARTIAL_DIR = ".hub-partial"
Progress = Callable[[dict], None]

# The files of a folder the daemon reads (nothing else is downloaded): the weights, the configuration, the
# tokenizer, the chat template, and sentence-transformers' modules (modules.json, N_Pooling/config.json...).
FOLDER_FILES = {"config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json",
                "special_tokens_map.json", "added_tokens.json", "chat_template.jinja", "chat_template.json",
                "modules.json", "sentence_bert_config.json", "config_sentence_transformers.json",
                "model.safetensors.index.json", "preprocessor_config.json"}
_MODULE_DIR = re.compile(r"\d+_[A-Za-z]+")


@dataclass
class PulledModel:
    """A model pulled into models_dir: served as `name` from `path`, pulled from `source`."""
    name: str
    path: Path
    source: str
    aliases: list[str] = field(default_factory=list)


def sidecar_path(model: Path) -> Path:
    """A pulled model's record: DIR/.NAME.gguf.nvllm-pull.json beside a GGUF, FOLDER/.nvllm-pull.json in a
    folder."""
    if model.suffix.lower() == ".gguf":
        return model.with_name(f".{model.name}.nvllm-pull.json")
    return model / MARKER_FILE


def read_sidecar(model: Path) -> dict | None:
    """The record of a model pulled from the Hub, None for anything else."""
    try:
        rec = json.loads(sidecar_path(model).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return rec if isinstance(rec, dict) and rec.get("repo") and isinstance(rec.get("files"), dict) else None


def _whole(model: Path, rec: dict) -> bool:
    """The files the record names are all there, each of its recorded size."""
    sizes = rec.get("sizes") or {}
    if model.suffix.lower() == ".gguf":
        paths = {n: model for n in rec["files"]}
    else:
        paths = {n: model / n for n in rec["files"]}
    return bool(paths) and all(p.is_file() and (n not in sizes or p.stat().st_size == sizes[n])
                               for n, p in paths.items())


def _key(text: str) -> str:
    return text.strip().lower()


def find_pulled(ref: str | HubRef, models_dir: Path | str) -> PulledModel | None:
    """The model an earlier pull of ref left whole in models_dir (its record says so), without the network."""
    r = parse_ref(ref) if isinstance(ref, str) else ref
    root = Path(models_dir)
    if r is None or not root.is_dir():
        return None
    want = _key(r.canonical())
    for p in sorted(root.iterdir()):
        if p.name.startswith("."):
            continue
        rec = read_sidecar(p) if (p.is_dir() or p.suffix.lower() == ".gguf") else None
        if rec is None or not _whole(p, rec):
            continue
        names = [rec.get("source", "")] + list(rec.get("aliases") or [])
        parsed = [parse_ref(n) for n in names if isinstance(n, str)]
        if any(x is not None and _key(x.canonical()) == want for x in parsed):
            return _pulled(p, rec)
    return None


def _pulled(path: Path, rec: dict) -> PulledModel:
    name = path.stem if path.suffix.lower() == ".gguf" else path.name
    return PulledModel(name=name, path=path, source=rec["source"], aliases=list(rec.get("aliases") or []))


# ---------------------------------------------------------------- what to pull

@dataclass
class _Plan:
    files: list[RemoteFile]
    final: Path           # DIR/NAME.gguf or DIR/NAME
    source: str
    aliases: list[str]
    gguf: bool


def _plan(r: HubRef, listing: dict[str, RemoteFile], models_dir: Path) -> _Plan:
    names = list(listing)
    ggufs = quants_of(names)
    if r.file:
        if r.file not in listing:
            raise HubError(f"{r.repo} has no file {r.file}" + (f" (its GGUFs: {', '.join(ggufs)})" if ggufs else ""))
        chosen = [r.file]
    elif r.quant:
        chosen = pick_gguf(names, r.quant)
        if not chosen:
            have = f"it has {', '.join(ggufs)}" if ggufs else "it has no GGUF files"
            raise HubError(f"{r.repo} has no {r.quant} GGUF: {have}")
    elif any(n.lower().endswith(".safetensors") and "/" not in n for n in names):
        return _folder_plan(r, listing, models_dir)
    else:
        chosen = pick_gguf(names, "")
        if not chosen:
            raise HubError(f"{r.repo} has neither safetensors weights nor GGUF files: nvllm serves one of those")
    if len(chosen) > 1 or is_split(chosen[0]):
        raise HubError(f"{chosen[0]} of {r.repo} is a split GGUF ({len(chosen)} parts); nvllm loads one file: "
                       "join the parts with llama.cpp's llama-gguf-split --merge and serve the result")
    file = chosen[0]
    quant = quant_of(file)
    source = f"hf.co/{r.repo}:{quant}" if quant and pick_gguf(names, quant) == [file] else f"hf.co/{r.repo}/{file}"
    aliases = _dedup([r.given, source, source[len("hf.co/"):], f"hf.co/{r.repo}/{file}"])
    return _Plan([listing[file]], models_dir / file.rsplit("/", 1)[-1], source, aliases, gguf=True)


def _folder_plan(r: HubRef, listing: dict[str, RemoteFile], models_dir: Path) -> _Plan:
    keep = [f for n, f in listing.items() if _folder_file(n)]
    if any(f.path.endswith(".safetensors") and not f.path.startswith("consolidated") for f in keep):
        keep = [f for f in keep if not f.path.startswith("consolidated")]   # Mistral's second copy of the weights
    if "config.json" not in {f.path for f in keep}:
        raise HubError(f"{r.repo} has no config.json: not a model folder nvllm can serve")
    source = f"hf.co/{r.repo}"
    return _Plan(keep, models_dir / r.repo.split("/")[1], source, _dedup([r.given, source, r.repo]), gguf=False)


def _folder_file(path: str) -> bool:
    parts = path.split("/")
    name = parts[-1]
    if len(parts) == 1:
        return name in FOLDER_FILES or name.endswith(".safetensors")
    return len(parts) == 2 and bool(_MODULE_DIR.fullmatch(parts[0])) and (
        name.endswith(".json") or name.endswith(".safetensors"))


def _dedup(items: list[str]) -> list[str]:
    out: list[str] = []
    for i in items:
        if i and i not in out:
            out.append(i)
    return out


# ---------------------------------------------------------------- pull

def _endpoint() -> str:
    from huggingface_hub import constants

    return (os.environ.get("HF_ENDPOINT") or constants.ENDPOINT).rstrip("/")


def _offline() -> bool:
    from huggingface_hub import constants

    return constants.is_offline_mode() or any((os.environ.get(v) or "").upper() in ("1", "ON", "YES", "TRUE")
                                              for v in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"))


def _timeout(var: str) -> float:
    try:
        return float(os.environ.get(var) or 10)
    except ValueError:
        return 10.0


def pull_from_hub(ref: str | HubRef, models_dir: Path | str = "models", progress: Progress | None = None, *,
                  revision: str | None = None, show_bar: bool = False) -> PulledModel:
    """Pull ref into models_dir (see the module's doc); a model already pulled from the same commit is kept
    as it is. progress receives Ollama's pull-stream dicts; show_bar draws the Hub library's progress bar on
    a terminal. HubError (one line) on any failure, with nothing half-written left where a daemon looks."""
    from huggingface_hub import HfApi, get_token
    from huggingface_hub.utils import build_hf_headers

    r = parse_ref(ref) if isinstance(ref, str) else ref
    if r is None:
        raise HubError(f"{ref!r} is not a Hugging Face Hub reference (ORG/REPO, ORG/REPO:QUANT, "
                       "ORG/REPO/FILE.gguf or hf.co/ORG/REPO:QUANT)")
    emit = progress or (lambda d: None)
    root = Path(models_dir)
    endpoint = _endpoint()
    emit({"status": "pulling manifest"})
    if _offline():          # HF_HUB_OFFLINE: what an earlier pull left, or nothing
        found = find_pulled(r, root)
        if found is None:
            raise HubError(f"HF_HUB_OFFLINE is set and no earlier pull of {r} is in {root}: unset it to pull")
        emit({"status": "success"})
        return found
    with _errors(r, endpoint, root):
        info = HfApi(endpoint=endpoint).model_info(r.repo, revision=revision, files_metadata=True,
                                                   timeout=_timeout("HF_HUB_ETAG_TIMEOUT"))
        if info.gated and not get_token():
            raise _gated(r)
        commit = info.sha or revision or "main"
        listing = {s.rfilename: RemoteFile(s.rfilename, s.size if s.lfs is None else s.lfs.size,
                                           s.lfs.sha256 if s.lfs is not None else "", s.blob_id or "")
                   for s in info.siblings or []}
        plan = _plan(r, listing, root)
        old = read_sidecar(plan.final)
        if plan.final.exists() and (old is None or _key(old.get("source", "")) != _key(plan.source)):
            what = f"holds {old['source']}" if old else "exists and was not pulled from the Hub"
            raise HubError(f"{plan.final} {what}; remove it or pull into another folder (--dir)")
        if old is not None and _whole(plan.final, old) and (old.get("commit") == commit or _unchanged(plan, old)):
            rec = {**old, "aliases": _dedup(list(old.get("aliases") or []) + plan.aliases), "commit": commit,
                   "revision": revision or "main"}
            if rec != old:            # another commit with the same files, or new names: the record alone
                tmp = sidecar_path(plan.final).with_name(f".{plan.final.name}.record-{os.getpid()}")
                _write_json(tmp, rec)
                os.replace(tmp, sidecar_path(plan.final))
            emit({"status": "success"})
            return _pulled(plan.final, rec)
        stage = root / PARTIAL_DIR / re.sub(r"[^A-Za-z0-9._-]", "_", plan.source[len("hf.co/"):].replace("/", "--"))
        with _lock(stage):
            _check_space(root, stage, plan.files)
            if old is not None and not plan.gguf:
                _link_unchanged(plan, old, stage)
            headers = build_hf_headers()
            sha256 = {}
            for rf in plan.files:
                url = f"{endpoint}/{r.repo}/resolve/{quote(commit, safe='')}/{quote(rf.path)}"   # hf_hub_url's
                sha256[rf] = hub_download.fetch(url, stage / rf.path, rf, headers, _bar(rf, emit, show_bar))
            emit({"status": "verifying sha256 digest"})     # each file was, as it was whole
            name = {rf: plan.final.name if plan.gguf else rf.path for rf in plan.files}
            rec = {"format_version": FORMAT_VERSION, "source": plan.source, "aliases": plan.aliases,
                   "repo": r.repo, "revision": revision or "main", "commit": commit,
                   "files": {name[rf]: sha256[rf] for rf in plan.files},
                   "sizes": {name[rf]: (stage / rf.path).stat().st_size for rf in plan.files}}
            emit({"status": "writing manifest"})
            _place(plan, stage, rec)
    emit({"status": "success"})
    return _pulled(plan.final, rec)


def _unchanged(plan: _Plan, old: dict) -> bool:
    """The files an earlier pull left are the plan's (another commit that did not change them): its record's
    sha256 for an LFS file, the git blob id of a small one."""
    files = old["files"]
    if plan.gguf:
        rf = plan.files[0]
        return bool(rf.sha256) and files.get(plan.final.name) == rf.sha256
    if set(files) != {rf.path for rf in plan.files}:
        return False
    return all(files[rf.path] == rf.sha256 if rf.sha256 else
               hub_download.file_hashes(plan.final / rf.path)[1] == rf.blob_id for rf in plan.files)


def _link_unchanged(plan: _Plan, old: dict, stage: Path) -> None:
    """A folder pulled again from a new commit: the LFS files it did not change are linked from the old
    folder into the new one rather than downloaded again (fetch still checks them)."""
    for rf in plan.files:
        src, dst = plan.final / rf.path, stage / rf.path
        if rf.sha256 and old["files"].get(rf.path) == rf.sha256 and src.is_file() and not dst.exists():
            dst.parent.mkdir(parents=True, exist_ok=True)
            with contextlib.suppress(OSError):
                os.link(src, dst)


def _place(plan: _Plan, stage: Path, rec: dict) -> None:
    """The checked files under their final name: the GGUF's record first, then the GGUF by os.replace; a
    folder's record written in it, then the folder renamed into place."""
    if plan.gguf:
        tmp = stage / ".record.json"
        _write_json(tmp, rec)
        os.replace(tmp, sidecar_path(plan.final))
        os.replace(stage / plan.files[0].path, plan.final)
        shutil.rmtree(stage, ignore_errors=True)
    else:
        _write_json(stage / MARKER_FILE, rec)
        _swap_into_place(stage, plan.final)


def _bar(rf: RemoteFile, emit: Progress, show: bool) -> type:
    status = f"pulling {rf.sha256[:12]}" if rf.sha256 else f"pulling {rf.path}"
    extra = {"digest": rf.digest} if rf.digest else {}

    def report(done: int, total: int | None) -> None:
        emit({"status": status, **extra, "total": total if total is not None else rf.size, "completed": done})

    return hub_download.progress_bar(report, show)


def _disk_free(path: Path) -> int:
    return shutil.disk_usage(path).free


def _check_space(root: Path, stage: Path, files: list[RemoteFile]) -> None:
    need = 0
    for rf in files:
        have = hub_download.part_path(stage / rf.path, rf)
        need += max(0, (rf.size or 0) - (have.stat().st_size if have.is_file() else 0))
    free = _disk_free(root)
    if need > free:
        raise HubError(f"not enough space in {root}: the pull needs {need / 1e6:.1f} MB, {free / 1e6:.1f} MB "
                       "are free")


@contextlib.contextmanager
def _lock(stage: Path) -> Iterator[None]:
    """One pull of a model at a time (the CLI and a daemon's /api/pull may race)."""
    stage.mkdir(parents=True, exist_ok=True)
    with open(stage.with_name(stage.name + ".lock"), "w") as f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            raise HubError(f"another pull of {stage.name} is running") from None
        yield


@contextlib.contextmanager
def _errors(r: HubRef, endpoint: str, root: Path) -> Iterator[None]:
    """The library's and the system's errors as one line each naming the cause."""
    import httpx2
    from huggingface_hub import errors as e

    try:
        yield
    except HubError:
        raise
    except e.GatedRepoError:
        raise _gated(r) from None
    except e.RepositoryNotFoundError:
        raise HubError(f"no repository {r.repo} on {endpoint} (or it is private: set HF_TOKEN)") from None
    except e.RevisionNotFoundError:
        raise HubError(f"{r.repo} has no such revision") from None
    except e.RemoteEntryNotFoundError as x:
        raise HubError(f"{r.repo}: a file it lists is not there ({_first_line(x)})") from None
    except e.OfflineModeIsEnabled:
        raise HubError("HF_HUB_OFFLINE is set: unset it to pull from the Hub") from None
    except e.HfHubHTTPError as x:
        code = x.response.status_code if x.response is not None else 0
        if code == 401:
            raise HubError(f"{endpoint} refused HF_TOKEN (401): check the token") from None
        raise HubError(f"the Hub at {endpoint} answered {code} for {r.repo}"
                       + (": try again later" if code >= 500 else f": {_first_line(x)}")) from None
    except httpx2.TimeoutException:
        raise HubError(f"the Hub at {endpoint} did not answer in time (HF_HUB_ETAG_TIMEOUT="
                       f"{_timeout('HF_HUB_ETAG_TIMEOUT'):g} s, HF_HUB_DOWNLOAD_TIMEOUT="
                       f"{_timeout('HF_HUB_DOWNLOAD_TIMEOUT'):g} s); run the pull again to resume") from None
    except httpx2.ConnectError as x:
        raise HubError(f"cannot reach the Hub at {endpoint} ({_first_line(x)}); set HF_ENDPOINT for a "
                       "mirror") from None
    except httpx2.HTTPError as x:
        raise HubError(f"the connection to {endpoint} failed ({type(x).__name__}: {_first_line(x)}); run the "
                       "pull again to resume") from None
    except OSError as x:
        if x.errno == errno.ENOSPC:
            raise HubError(f"no space left on the disk of {root} (the partial file was deleted)") from None
        if x.errno is None:     # huggingface_hub's consistency check: the size differs
            raise HubError(f"{r.repo}: {_first_line(x)}") from None
        raise HubError(f"cannot write into {root}: {x.strerror or x}") from None


def _gated(r: HubRef) -> HubError:
    from huggingface_hub import get_token

    how = ("the token (HF_TOKEN) has no access to it: accept its terms on its page" if get_token()
           else "accept its terms on its page and set HF_TOKEN")
    return HubError(f"{r.repo} is gated: {how}")


def _first_line(x: BaseException) -> str:
    lines = [s.strip() for s in str(x).splitlines() if s.strip()]
    return lines[0] if lines else type(x).__name__

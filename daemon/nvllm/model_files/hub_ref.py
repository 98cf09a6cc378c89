"""A model reference on the Hugging Face Hub, as users write it, and which files of a repository it means.

Spellings (hub.py pulls them):
- `ORG/REPO`: the repository's folder of safetensors, config and tokenizer files; a repository of GGUF files
  alone means its default GGUF, as below.
- `ORG/REPO:QUANT`: one GGUF file of the repository, the one whose name holds QUANT (case-insensitive, as
  llama-server's `-hf` picks it); `:latest` (what Ollama's clients add) is the default: Q4_K_M, else the
  first GGUF.
- `ORG/REPO/FILE.gguf` (FILE may sit in a subfolder): that file.
- Ollama's `hf.co/ORG/REPO[:QUANT]`, `huggingface.co/...` and `https://huggingface.co/...` are the same.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

DEFAULT_QUANTS = ("Q4_K_M", "Q4_0")     # llama-server's -hf default, then its fallback; else the first GGUF
_PREFIXES = ("https://", "http://")
_HOSTS = ("hf.co/", "huggingface.co/", "www.huggingface.co/")
# The Hub's rule for an owner's and a repository's name: letters, digits, '-', '_', '.'; no '--' or '..'.
_NAME = re.compile(r"[A-Za-z0-9](?:[A-Za-z0-9._-]{0,94}[A-Za-z0-9])?")
_QUANT = re.compile(r"[A-Za-z0-9_]{1,32}")
# A quantization's name inside a GGUF file's name: Q4_K_M, IQ4_XS, Q8_0, F16, BF16, TQ1_0, MXFP4...
_QUANT_IN_NAME = re.compile(r"(?i)(?<![A-Za-z0-9])(I?Q\d(?:_[A-Z0-9]+)*|TQ\d_\d|MXFP4(?:_MOE)?|BF16|F16|F32)"
                            r"(?=[-._]|$)")
_SPLIT = re.compile(r"(?i)-\d{5}-of-\d{5}\.gguf$")


@dataclass(frozen=True)
class HubRef:
    """ORG/REPO with what of it: a quantization (quant), one file (file), or neither (the folder, or the
    default GGUF of a repository of GGUFs)."""
    repo: str
    quant: str = ""
    file: str = ""
    given: str = ""

    def __str__(self) -> str:
        return self.given or self.canonical()

    def canonical(self) -> str:
        if self.file:
            return f"hf.co/{self.repo}/{self.file}"
        return f"hf.co/{self.repo}" + (f":{self.quant}" if self.quant else "")


def parse_ref(text: str) -> HubRef | None:
    """The Hub reference `text` spells, or None when it is not one (a known model's name, a path)."""
    given = text.strip()
    s = given
    if not s or s.startswith((".", "/", "~")) or "\\" in s or any(c.isspace() for c in s):
        return None
    low = s.lower()
    for p in _PREFIXES:
        if low.startswith(p):
            s, low = s[len(p):], low[len(p):]
            if not low.startswith(_HOSTS):
                return None         # a URL of another host
    for h in _HOSTS:
        if low.startswith(h):
            s = s[len(h):]
            break
    quant = ""
    if ":" in s:
        s, quant = s.rsplit(":", 1)
        if not _QUANT.fullmatch(quant):
            return None
        if quant.lower() == "latest":
            quant = ""
    parts = s.split("/")
    if len(parts) < 2 or not all(_valid_name(p) for p in parts[:2]):
        return None
    repo, file = "/".join(parts[:2]), "/".join(parts[2:])
    if file:
        if quant or not file.lower().endswith(".gguf") or any(p in ("", ".", "..") for p in parts[2:]):
            return None
    return HubRef(repo=repo, quant=quant, file=file, given=given)


def _valid_name(part: str) -> bool:
    return bool(_NAME.fullmatch(part)) and "--" not in part and ".." not in part


def is_split(filename: str) -> bool:
    """A part of a split GGUF (NAME-00001-of-00003.gguf)."""
    return bool(_SPLIT.search(filename))


def quant_of(filename: str) -> str:
    """The quantization a GGUF file's name says (upper case), "" when it says none."""
    stem = filename.rsplit("/", 1)[-1]
    stem = _SPLIT.sub("", stem) if is_split(stem) else stem[: -len(".gguf")] if stem.lower().endswith(".gguf") \
        else stem
    found = _QUANT_IN_NAME.findall(stem)
    return found[-1].upper() if found else ""


def gguf_files(files: list[str]) -> list[str]:
    """The model GGUFs of a repository's files (a vision projector, mmproj-*.gguf, is not a model)."""
    return sorted(f for f in files if f.lower().endswith(".gguf") and "mmproj" not in f.rsplit("/", 1)[-1].lower())


def quants_of(files: list[str]) -> list[str]:
    """The quantizations a repository offers, by its GGUF files' names, in order, once each."""
    seen: list[str] = []
    for f in gguf_files(files):
        q = quant_of(f) or f
        if q not in seen:
            seen.append(q)
    return seen


def _matches(filename: str, quant: str) -> bool:
    name = filename.rsplit("/", 1)[-1]
    return re.search(rf"(?i)(?<![A-Za-z0-9]){re.escape(quant)}(?=[-.])", name) is not None


def pick_gguf(files: list[str], quant: str) -> list[str]:
    """The files of the GGUF `quant` names among a repository's files (quant "": the default one): one file,
    or every part of a split GGUF; [] when there is none. Whole files come before split ones."""
    ggufs = gguf_files(files)
    for q in ([quant] if quant else list(DEFAULT_QUANTS)):
        hits = [f for f in ggufs if _matches(f, q)]
        if hits:
            return _first_model(hits)
    if quant or not ggufs:
        return []
    return _first_model(ggufs)


def _first_model(hits: list[str]) -> list[str]:
    whole = [f for f in hits if not is_split(f)]
    if whole:
        return whole[:1]
    first = _SPLIT.sub("", hits[0])
    return [f for f in hits if _SPLIT.sub("", f) == first]

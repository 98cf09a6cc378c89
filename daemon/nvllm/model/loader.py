"""A Hugging Face model folder -> ModelConfig + float32 arrays laid out for the matmuls.

Only JSON and safetensors are read; a folder holding a pickle checkpoint is refused, never opened.
Each file is validated by safetensors and memory-mapped; every weight is copied once, from the mapping
into its final float32 layout (see _MappedFile).
"""

from __future__ import annotations

import json
import math
import mmap
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import numpy as np
from safetensors import safe_open

from nvllm.model.linear import Weight, weight_nbytes
from nvllm.model.quants import QuantizedWeight

SUPPORTED_ARCHITECTURES = ("LlamaForCausalLM", "Qwen2ForCausalLM", "Qwen3ForCausalLM")
# transformers' Qwen3Config defaults head_dim to 128 rather than hidden_size / num_attention_heads.
_DEFAULT_HEAD_DIM = {"Qwen3ForCausalLM": 128}
PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".ckpt", ".pkl", ".pickle")


class ModelLoadError(ValueError):
    pass


@dataclass
class ModelConfig:
    architecture: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float
    rope_theta: float
    max_position_embeddings: int
    tie_word_embeddings: bool
    attention_bias: bool
    rope_scaling: dict[str, Any] | None = None
    qk_norm: bool = False      # Qwen3: an RMSNorm over each head of q and of k, before rope
    bos_token_id: int | None = None
    eos_token_ids: list[int] = field(default_factory=list)

    @classmethod
    def from_dict(cls, cfg: dict[str, Any], where: str = "config.json") -> "ModelConfig":
        archs = cfg.get("architectures") or []
        arch = archs[0] if archs else None
        if arch not in SUPPORTED_ARCHITECTURES:
            raise ModelLoadError(
                f"{where}: architecture {arch!r} is not supported (supported: {', '.join(SUPPORTED_ARCHITECTURES)})")

        def need(key: str) -> Any:
            if key not in cfg:
                raise ModelLoadError(f"{where}: missing {key!r}")
            return cfg[key]

        hidden = int(need("hidden_size"))
        heads = int(need("num_attention_heads"))
        # Newer configs keep rope settings in rope_parameters; older ones put rope_theta at the top
        # and the scaling in rope_scaling.
        rope = dict(cfg.get("rope_parameters") or {})
        theta = rope.pop("rope_theta", cfg.get("rope_theta", 10000.0))
        scaling = rope or cfg.get("rope_scaling") or None
        if scaling is not None:
            kind = scaling.get("rope_type", scaling.get("type", "default"))
            if kind == "default":
                scaling = None
            elif kind != "llama3":
                raise ModelLoadError(f"{where}: rope type {kind!r} is not supported (supported: default, llama3)")
        eos = cfg.get("eos_token_id")
        qk_norm = arch == "Qwen3ForCausalLM"
        attention_bias = bool(cfg.get("attention_bias", arch == "Qwen2ForCausalLM"))
        if attention_bias and arch != "Qwen2ForCausalLM":
            # Llama's and Qwen3's attention_bias also put a bias on o_proj (Qwen2's biases are q/k/v
            # only), which nvllm does not carry: refused rather than computed wrong.
            raise ModelLoadError(f"{where}: attention_bias true is not supported for {arch} "
                                 f"(it adds an o_proj bias)")
        return cls(
            architecture=arch,
            vocab_size=int(need("vocab_size")),
            hidden_size=hidden,
            intermediate_size=int(need("intermediate_size")),
            num_layers=int(need("num_hidden_layers")),
            num_heads=heads,
            num_kv_heads=int(cfg.get("num_key_value_heads") or heads),
            head_dim=int(cfg.get("head_dim") or _DEFAULT_HEAD_DIM.get(arch, hidden // heads)),
            rms_norm_eps=float(cfg.get("rms_norm_eps", 1e-6)),
            rope_theta=float(theta),
            max_position_embeddings=int(cfg.get("max_position_embeddings", 2048)),
            tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)),
            attention_bias=attention_bias,
            rope_scaling=scaling,
            qk_norm=qk_norm,
            bos_token_id=cfg.get("bos_token_id"),
            eos_token_ids=[] if eos is None else ([eos] if isinstance(eos, int) else list(eos)),
        )

    @property
    def num_params(self) -> int:
        h, i, d = self.hidden_size, self.intermediate_size, self.head_dim
        attn = h * (self.num_heads + 2 * self.num_kv_heads) * d + self.num_heads * d * h
        per_layer = attn + 3 * h * i + 2 * h + (2 * d if self.qk_norm else 0)
        heads = self.vocab_size * h * (1 if self.tie_word_embeddings else 2)
        return self.num_layers * per_layer + heads + h

    @property
    def weight_bytes(self) -> int:
        """Bytes of the float32 weights as load_weights lays them out (ModelWeights.nbytes, q/k/v biases
        and q/k norms included), from the shapes alone: what `nvllm serve --dry-run` plans with before
        loading anything."""
        bias = (self.num_heads + 2 * self.num_kv_heads) * self.head_dim if self.attention_bias else 0
        return 4 * (self.num_params + self.num_layers * bias)


@dataclass
class LayerWeights:
    """A layer's weights. The matrices are model/linear.py Weights: float32 [in, out] as the shapes below
    say (a folder's, and a GGUF's without the in-place kernels; each the transposed view of a C-contiguous
    [out, in], linear.py's layout), or a GGUF's blocks kept in their format as a QuantizedWeight (out, in);
    the norms and biases are always float32."""
    input_norm: np.ndarray     # [H]
    qkv: Weight                # [H, (nh + 2*nkv) * hd], q then k then v
    qkv_bias: np.ndarray | None  # [(nh + 2*nkv) * hd]
    o: Weight                  # [nh * hd, H]
    post_norm: np.ndarray      # [H]
    gate_up: Weight            # [H, 2 * I], gate then up
    down: Weight               # [I, H]
    q_norm: np.ndarray | None = None  # [hd], Qwen3: every q head is RMS-normed with it before rope
    k_norm: np.ndarray | None = None  # [hd], likewise every k head


@dataclass
class ModelWeights:
    embed: np.ndarray | QuantizedWeight   # [V, H] (QuantizedWeight (V, H): its rows are gathered in place)
    layers: list[LayerWeights]
    norm: np.ndarray           # [H]
    lm_head: Weight            # [H, V]; for tied embeddings a transposed view of embed (or embed itself
                               # when quantized), no copy

    @property
    def nbytes(self) -> int:
        """Bytes the weights hold in memory, each shared buffer once (a tied lm_head is embed's)."""
        total = weight_nbytes(self.embed) + self.norm.nbytes
        total += sum(weight_nbytes(w) for layer in self.layers for w in vars(layer).values())
        if not _same_memory(self.lm_head, self.embed):
            total += weight_nbytes(self.lm_head)
        return total


def _same_memory(a: Weight, b: Weight) -> bool:
    def buffer(w: Weight) -> np.ndarray | None:
        return w.blocks if isinstance(w, QuantizedWeight) else w if isinstance(w, np.ndarray) else None

    x, y = buffer(a), buffer(b)
    return x is not None and y is not None and np.shares_memory(x, y)


def read_json(path: Path) -> dict[str, Any]:
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except FileNotFoundError:
        raise ModelLoadError(f"{path}: file not found") from None
    except json.JSONDecodeError as e:
        raise ModelLoadError(f"{path}: not valid JSON ({e})") from None


def check_folder(model_dir: Path) -> None:
    """Refuse pickle checkpoints and links that lead outside the folder before anything is read."""
    if not model_dir.is_dir():
        raise ModelLoadError(f"{model_dir}: not a model folder (it does not exist or is not a directory)")
    root = model_dir.resolve()
    for p in sorted(model_dir.rglob("*")):
        if p.is_symlink() and not p.resolve().is_relative_to(root):
            raise ModelLoadError(f"{p}: a link leading outside the model folder ({p.resolve()}); refused")
        if p.suffix.lower() in PICKLE_SUFFIXES:
            raise ModelLoadError(
                f"{p}: pickle checkpoints are never opened (they can run code); "
                "convert the model to safetensors")


def load_config(model_dir: str | Path) -> ModelConfig:
    model_dir = Path(model_dir)
    return ModelConfig.from_dict(read_json(model_dir / "config.json"), str(model_dir / "config.json"))


def _safetensors_files(model_dir: Path) -> list[Path]:
    index = model_dir / "model.safetensors.index.json"
    if index.exists():
        weight_map = read_json(index).get("weight_map")
        if not isinstance(weight_map, dict):
            raise ModelLoadError(f"{index}: no 'weight_map'")
        files = sorted({model_dir / name for name in weight_map.values()})
        for f in files:
            if not f.exists():
                raise ModelLoadError(f"{index} names {f.name}, which is missing")
        return files
    single = model_dir / "model.safetensors"
    if single.exists():
        return [single]
    found = sorted(model_dir.glob("*.safetensors"))
    if found:
        return found
    raise ModelLoadError(f"{model_dir}: no model.safetensors (nor an index of shards)")


# Storage dtypes the loader widens to float32; BF16 is read as its raw 16 bits (NumPy has no bfloat16).
_STORAGE = {"F32": np.dtype("<f4"), "F16": np.dtype("<f2"), "BF16": np.dtype("<u2"), "F64": np.dtype("<f8")}
_PAGE = mmap.PAGESIZE
_CHUNK_BYTES = 16 << 20    # mapped bytes copied before their pages are dropped from the resident set


@dataclass
class _Entry:
    dtype: str
    shape: tuple[int, ...]
    begin: int                 # byte offsets of the data in the file (header included)
    end: int
    file: "_MappedFile"


class _MappedFile:
    """One .safetensors file, validated by safetensors and memory-mapped read-only.

    safetensors (safe_open) checks the file and gives each tensor's dtype and shape; the 8-byte length
    and the JSON header that follow it give the data offsets, which safetensors' Python API does not
    expose. The data region is the format's raw little-endian arrays: they are viewed in place through
    the mapping, never read into an intermediate buffer, and each tensor is copied exactly once, into
    its final float32 layout. Only safetensors and JSON are read: no pickle, no other parser.
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        try:
            with safe_open(str(path), framework="numpy") as f:
                meta = {n: (f.get_slice(n).get_dtype(), tuple(f.get_slice(n).get_shape())) for n in f.keys()}
        except Exception as e:  # safetensors raises its own error types for corrupt files
            raise ModelLoadError(f"{path}: cannot read as safetensors ({e})") from None
        with open(path, "rb") as fh:
            size = os.fstat(fh.fileno()).st_size
            n = int.from_bytes(fh.read(8), "little")
            if not 0 < n <= size - 8:
                raise ModelLoadError(f"{path}: cannot read as safetensors (header length {n})")
            try:
                header = json.loads(fh.read(n))
            except ValueError as e:
                raise ModelLoadError(f"{path}: cannot read as safetensors (header: {e})") from None
            self.mm = mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) if size else None
        self.entries: dict[str, _Entry] = {}
        for name, (dtype, shape) in meta.items():
            info = header.get(name) or {}
            b, e = (info.get("data_offsets") or (0, -1))
            if (info.get("dtype"), tuple(info.get("shape", ()))) != (dtype, shape) or not 0 <= b <= e <= size - 8 - n:
                raise ModelLoadError(f"{path}: tensor {name!r}: the header disagrees with safetensors' reading")
            self.entries[name] = _Entry(dtype, shape, 8 + n + b, 8 + n + e, self)

    def view(self, entry: _Entry, name: str) -> np.ndarray:
        """The tensor in its storage dtype, viewed in the mapping (no copy)."""
        dt = _STORAGE.get(entry.dtype)
        if dt is None:
            raise ModelLoadError(f"{self.path.name}: tensor {name!r} has dtype {entry.dtype}; "
                                 f"supported: {', '.join(_STORAGE)}")
        count = math.prod(entry.shape)
        if count * dt.itemsize != entry.end - entry.begin:
            raise ModelLoadError(f"{self.path.name}: tensor {name!r}: {entry.end - entry.begin} bytes "
                                 f"for shape {list(entry.shape)} of {entry.dtype}")
        if count == 0:
            return np.zeros(entry.shape, dtype=dt)
        return np.frombuffer(self.mm, dtype=dt, count=count, offset=entry.begin).reshape(entry.shape)

    def release(self, begin: int, end: int) -> None:
        """Drop bytes [begin, end) of the file from this process's resident set (the page cache keeps
        them), so a mapped tensor and its copy are not both resident for longer than one chunk."""
        if self.mm is not None and hasattr(self.mm, "madvise") and end > begin:
            start = begin - begin % _PAGE
            self.mm.madvise(mmap.MADV_DONTNEED, start, end - start)


def _fill(dst: np.ndarray, src: np.ndarray, dtype: str) -> None:
    """dst[...] = src widened to float32, in one pass over the mapped bytes."""
    if dtype == "BF16":
        bits = dst.view(np.uint32)   # bf16 is float32's top half: place the 16 bits, then shift them up
        bits[...] = src
        bits <<= 16
    else:
        dst[...] = src


class _Tensors:
    """Every tensor of the checkpoint's files, by name; arrays come out as float32 copies in their final
    layout, each made in one pass from the mapped file. With `matrix` (load_weights' quantization), each
    2-D tensor (a matrix, the embedding) is handed to matrix(float32 [out, in], name, storage dtypes of
    its parts), and what that returns, unless None, comes out instead: the float32 copy is dropped as
    soon as it returns."""

    def __init__(self, files: list[Path], model_dir: Path,
                 matrix: Callable[[np.ndarray, str, set[str]], Any] | None = None) -> None:
        self.model_dir = model_dir
        self.matrix = matrix
        self.entries: dict[str, _Entry] = {}
        for path in files:
            self.entries.update(_MappedFile(path).entries)

    def __contains__(self, name: str) -> bool:
        return name in self.entries

    def close(self) -> None:
        """Unmap the files now (entries and files refer to each other, so this is not left to the GC)."""
        for f in {id(e.file): e.file for e in self.entries.values()}.values():
            if f.mm is not None:
                try:
                    f.mm.close()
                except BufferError:   # an error's traceback still holds a view: the GC unmaps it later
                    pass
        self.entries.clear()

    def _entry(self, name: str, shape: tuple[int, ...]) -> _Entry:
        if name not in self.entries:
            raise ModelLoadError(f"{self.model_dir}: tensor {name!r} is missing from the checkpoint")
        e = self.entries[name]
        if e.shape != shape:
            raise ModelLoadError(
                f"{e.file.path.name}: tensor {name!r} has shape {list(e.shape)}, expected {list(shape)}")
        return e

    def get(self, name: str, shape: tuple[int, ...], transpose: bool = False) -> np.ndarray:
        """The tensor as float32, C-contiguous; transposed when asked ([N, K] -> [K, N]), as a view of
        the C-contiguous [N, K] (see joined)."""
        return self.joined([(name, shape)], transpose)

    def joined(self, parts: list[tuple[str, tuple[int, ...]]], transpose: bool = False) -> np.ndarray:
        """Tensors concatenated along their first axis, in one copy: [a, K] + [b, K] -> [a+b, K],
        C-contiguous. Transposed when asked: [K, a+b], the transposed view of that array, so the rows
        stay one after the other in memory as linear.py's C tile reads them, and BLAS multiplies by the
        view as a transposed operand."""
        entries = [self._entry(n, s) for n, s in parts]
        rows = sum(e.shape[0] for e in entries)
        out = np.empty((rows,) + entries[0].shape[1:], dtype=np.float32)
        at = 0
        for (name, _), e in zip(parts, entries):
            src = e.file.view(e, name)
            k = e.shape[0]
            row_bytes = (e.end - e.begin) // k if k else 0
            step = max(1, _CHUNK_BYTES // max(1, row_bytes))
            for r in range(0, k, step):                      # a chunk of rows at a time, then drop its pages
                part = src[r:r + step]
                _fill(out[at + r:at + r + len(part)], part, e.dtype)
                e.file.release(e.begin + r * row_bytes, e.begin + (r + len(part)) * row_bytes)
            at += k
        if self.matrix is not None and out.ndim == 2:
            name = parts[0][0] + (f" (+{len(parts) - 1} fused)" if len(parts) > 1 else "")
            kept = self.matrix(out, name, {e.dtype for e in entries})
            if kept is not None:
                return kept
        return out.T if transpose else out


def load_weights(model_dir: str | Path, config: ModelConfig | None = None,
                 quantization: str = "") -> tuple[ModelConfig, ModelWeights]:
    """Read and lay out every weight; each ends in its own float32 array, copied once from the mapped
    file (q|k|v and gate|up are fused in that same copy; a matrix is [out, in] in memory, handed out as
    its transposed view [in, out]). The mappings are closed when this returns, so the resident set holds
    the weights once.

    quantization is model.quantization. "" (as stored): a matrix whose parts are all stored as bfloat16,
    or all as float16, stays in those 16 bits (a QuantizedWeight BF16 / F16, exactly the file's values,
    multiplied in place by the C kernels: half the memory of float32 and no rounding), the others
    float32; without the C kernels every matrix is float32. "f32": every matrix float32. q8_0, q4_0, q4_k,
    bf16, f16: every matrix and the embedding (with a tied lm_head, the same one) a QuantizedWeight of
    that kind (model/quantize.py). Each is converted as soon as it is laid out: loading peaks at the
    weights as held plus one float32 matrix, not at the float32 model. Norms and biases stay float32."""
    model_dir = Path(model_dir)
    check_folder(model_dir)
    config = config or load_config(model_dir)
    t = _Tensors(_safetensors_files(model_dir), model_dir, _matrix_rule(quantization))
    try:
        return config, _lay_out(t, config, model_dir)
    finally:
        t.close()


# model.quantization "" keeps a matrix whose parts are all stored in one of these, in that format
_KEPT_16 = {"BF16": "bf16", "F16": "f16"}


def _kept_kind(dtypes: set[str]) -> str:
    """The 16-bit kind a matrix stored as `dtypes` keeps under model.quantization "" ("": float32)."""
    return _KEPT_16.get(next(iter(dtypes)), "") if len(dtypes) == 1 else ""


def _matrix_rule(quantization: str) -> Callable[[np.ndarray, str, set[str]], Any] | None:
    """What _Tensors does with each matrix for model.quantization (load_weights says)."""
    if quantization == "f32":
        return None
    from nvllm.model import matmul_kernels
    from nvllm.model.quantize import quantize_weight   # imported here: quantize.py builds on this module

    if quantization:
        return lambda w, name, dtypes: quantize_weight(w, quantization, name)
    if matmul_kernels.lib is None:   # BF16/F16 would go to the NumPy twin: float32 is faster there
        return None

    def as_stored(w: np.ndarray, name: str, dtypes: set[str]) -> Any:
        kind = _kept_kind(dtypes)
        return quantize_weight(w, kind, name) if kind else None   # exact: the values came from that kind
    return as_stored


def _layer_matrices(config: ModelConfig, n: int) -> dict[str, list[tuple[str, tuple[int, ...]]]]:
    """Layer n's matrices as the tensors fused into each, [out, in] each: q|k|v, o, gate|up, down."""
    h, i, d = config.hidden_size, config.intermediate_size, config.head_dim
    a, p = f"model.layers.{n}.self_attn.", f"model.layers.{n}."
    kv = config.num_kv_heads * d
    return {"qkv": [(a + "q_proj.weight", (config.num_heads * d, h)), (a + "k_proj.weight", (kv, h)),
                    (a + "v_proj.weight", (kv, h))],
            "o": [(a + "o_proj.weight", (h, config.num_heads * d))],
            "gate_up": [(p + "mlp.gate_proj.weight", (i, h)), (p + "mlp.up_proj.weight", (i, h))],
            "down": [(p + "mlp.down_proj.weight", (h, i))]}


def stored_weights(model_dir: str | Path, config: ModelConfig) -> tuple[int, dict[str, int]]:
    """What load_weights(model_dir, config) holds with model.quantization "" (as stored), from the files'
    headers alone: its bytes (float32 less half of every matrix kept in 16 bits) and its matrices by
    format ({"BF16": 120, "float32": 1}). A folder without weight files (config.json only, for planning)
    is planned as float32."""
    groups = [parts for n in range(config.num_layers) for parts in _layer_matrices(config, n).values()]
    groups.append([("model.embed_tokens.weight", (config.vocab_size, config.hidden_size))])
    if not config.tie_word_embeddings:
        groups.append([("lm_head.weight", (config.vocab_size, config.hidden_size))])
    model_dir = Path(model_dir)
    try:
        files = _safetensors_files(model_dir) if _matrix_rule("") is not None else []
    except ModelLoadError:
        files = []
    t = _Tensors(files, model_dir)
    try:
        saved, formats = 0, {}
        for parts in groups:
            kind = ""
            if all(name in t for name, _ in parts):
                kind = _kept_kind({t.entries[name].dtype for name, _ in parts})
            if kind:
                saved += 2 * sum(math.prod(shape) for _, shape in parts)
            name = kind.upper() if kind else "float32"
            formats[name] = formats.get(name, 0) + 1
        return config.weight_bytes - saved, formats
    finally:
        t.close()


def _lay_out(t: _Tensors, config: ModelConfig, model_dir: Path) -> ModelWeights:
    """The weights in the decoder's layout, from `t` (a folder's _Tensors, or gguf_file's readers with the
    same get / joined / `in`). A folder's matrices come out float32 ([in, out] when transposed); a GGUF
    reader may give any matrix, the embedding too, as a QuantizedWeight (out, in) instead."""
    h, d = config.hidden_size, config.head_dim
    nh, nkv, v = config.num_heads, config.num_kv_heads, config.vocab_size

    layers = []
    for n in range(config.num_layers):
        p = f"model.layers.{n}."
        a = p + "self_attn."
        m = _layer_matrices(config, n)
        bias = None
        if config.attention_bias:
            bias = t.joined([(a + "q_proj.bias", (nh * d,)), (a + "k_proj.bias", (nkv * d,)),
                             (a + "v_proj.bias", (nkv * d,))])
        q_norm = k_norm = None
        if config.qk_norm:
            q_norm, k_norm = t.get(a + "q_norm.weight", (d,)), t.get(a + "k_norm.weight", (d,))
        layers.append(LayerWeights(
            input_norm=t.get(p + "input_layernorm.weight", (h,)),
            qkv=t.joined(m["qkv"], transpose=True),                                   # [H, (nh+2nkv)*d]
            qkv_bias=bias,
            o=t.joined(m["o"], transpose=True),                                       # [nh*d, H]
            post_norm=t.get(p + "post_attention_layernorm.weight", (h,)),
            gate_up=t.joined(m["gate_up"], transpose=True),                           # [H, 2I]
            down=t.joined(m["down"], transpose=True),                                 # [I, H]
            q_norm=q_norm,
            k_norm=k_norm,
        ))
    embed = t.get("model.embed_tokens.weight", (v, h))                                # [V, H]
    if config.tie_word_embeddings or "lm_head.weight" not in t:
        if not config.tie_word_embeddings:
            raise ModelLoadError(f"{model_dir}: tensor 'lm_head.weight' is missing and embeddings are not tied")
        # [H, V] view; a quantized table multiplies as (V, H) itself
        lm_head = embed.T if isinstance(embed, np.ndarray) else embed
    else:
        lm_head = t.get("lm_head.weight", (v, h), transpose=True)                     # [H, V]
    norm = t.get("model.norm.weight", (h,))
    return ModelWeights(embed=embed, layers=layers, norm=norm, lm_head=lm_head)


def rope_inv_freq(config: ModelConfig) -> np.ndarray:
    """Inverse frequencies [head_dim/2] in float32, as transformers computes them."""
    d = config.head_dim
    inv = (1.0 / (np.float32(config.rope_theta) ** (np.arange(0, d, 2, dtype=np.float32) / np.float32(d)))).astype(np.float32)
    s = config.rope_scaling
    if s is None:
        return inv
    # llama3: long wavelengths slowed by `factor`, short ones kept, a smooth blend between.
    factor = float(s["factor"])
    low, high = float(s.get("low_freq_factor", 1.0)), float(s.get("high_freq_factor", 4.0))
    old_len = float(s.get("original_max_position_embeddings", 8192))
    wavelen = 2 * math.pi / inv
    scaled = np.where(wavelen > old_len / low, inv / factor, inv)
    smooth = (old_len / wavelen - low) / (high - low)
    blended = (1 - smooth) * scaled / factor + smooth * scaled
    medium = (wavelen >= old_len / high) & (wavelen <= old_len / low)
    return np.where(medium, blended, scaled).astype(np.float32)

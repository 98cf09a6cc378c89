"""A GGUF's hyperparameters -> the ModelConfig a folder's config.json gives, and the tensors that config
needs, checked by name and shape."""
from __future__ import annotations

import math
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from nvllm.model.config import ModelConfig, rope_inv_freq
from nvllm.model.weights.gguf_names import ROPE_FACTORS, ROPE_FREQS
from nvllm.model.weights.gguf_reader import GGUFError, SkippedStrings, TensorInfo


def f32_float(x: float) -> float:
    """A float32 metadata value as the short decimal it was written from (1e-05, not 9.99e-06)."""
    return float(str(np.float32(x)))



# Encoders (embeddings, reranking) llama.cpp reads: served from a GGUF by gguf_encoder.py, the others
# refused there by name.
ENCODER_ARCHITECTURES = ("bert", "nomic-bert")
REFUSED_ENCODERS = ("nomic-bert-moe", "neo-bert", "jina-bert-v2", "jina-bert-v3", "modern-bert", "t5encoder")
ARCHITECTURES = {"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM", "qwen3": "Qwen3ForCausalLM",
                 "phi3": "Phi3ForCausalLM", "smollm3": "SmolLM3ForCausalLM", "gemma3": "Gemma3ForCausalLM"}
# llama.cpp makes every 4th smollm3 layer NoPE (its n_no_rope_layer_step, set in its C++ model loader): the
# converter writes no key for it, and neither the gguf package nor transformers' GGUF loader names it.
SMOLLM3_NO_ROPE_LAYER_STEP = 4
MAX_CONTEXT = 1 << 31
# llama.cpp's gemma3 loader: every 6th layer global, the rest sliding, whatever the file says.
GEMMA3_SLIDING_PATTERN = 6


class Meta:
    """Typed access to `{arch}.*` metadata with errors naming the file and the key."""

    def __init__(self, metadata: dict[str, Any], arch: str, path: Path) -> None:
        self.m, self.arch, self.path = metadata, arch, path

    def fail(self, what: str) -> GGUFError:
        return GGUFError(f"{self.path}: {what}")

    def get(self, key: str, kind: type, default: Any = None, required: bool = True) -> Any:
        full = key if key.startswith(("general.", "tokenizer.")) else f"{self.arch}.{key}"
        if full not in self.m:
            if required and default is None:
                raise self.fail(f"metadata {full!r} is missing")
            return default
        v = self.m[full]
        if kind is int and (isinstance(v, bool) or not isinstance(v, int)):
            raise self.fail(f"metadata {full!r} is {v!r}, not an integer")
        if kind is float and (isinstance(v, bool) or not isinstance(v, (int, float))):
            raise self.fail(f"metadata {full!r} is {v!r}, not a number")
        if kind is str and not isinstance(v, str):
            raise self.fail(f"metadata {full!r} is {v!r}, not a string")
        return v

    def positive(self, key: str, default: int | None = None, limit: int = MAX_CONTEXT) -> int:
        v = self.get(key, int, default)
        if not 0 < v <= limit:
            raise self.fail(f"metadata '{self.arch}.{key}' is {v}, out of range (1 to {limit})")
        return v

    def finite(self, key: str, default: float | None = None) -> float:
        v = float(self.get(key, float, default))
        if not (math.isfinite(v) and v > 0):
            raise self.fail(f"metadata '{self.arch}.{key}' is {v}, not a positive number")
        return f32_float(v)


def gguf_config(metadata: dict[str, Any], infos: dict[str, TensorInfo], path: Path) -> ModelConfig:
    arch = metadata.get("general.architecture")
    if arch is None:
        raise GGUFError(f"{path}: metadata 'general.architecture' is missing")
    if arch in ENCODER_ARCHITECTURES or arch in REFUSED_ENCODERS:
        raise GGUFError(f"{path}: architecture {arch!r} is an encoder (embeddings, reranking), not a model that "
                        "generates text")
    if arch not in ARCHITECTURES:
        raise GGUFError(f"{path}: architecture {arch!r} is not supported "
                        f"(supported: {', '.join(ARCHITECTURES)})")
    m = Meta(metadata, arch, path)
    hidden = m.positive("embedding_length")
    heads = m.positive("attention.head_count")
    kv_heads = m.positive("attention.head_count_kv", heads)
    head_dim = m.positive("attention.key_length", hidden // heads if hidden % heads == 0 else None)
    if heads % kv_heads:
        raise m.fail(f"{heads} attention heads cannot share {kv_heads} key/value heads evenly")
    if head_dim % 2:
        raise m.fail(f"head dimension {head_dim} is odd; rotary embedding needs pairs")
    value_dim = m.get("attention.value_length", int, head_dim)
    rot = m.get("rope.dimension_count", int, head_dim)
    if value_dim != head_dim or (rot != head_dim and arch != "phi3"):
        raise m.fail(f"key length {head_dim}, value length {value_dim} and rope dimensions {rot} differ; "
                     "nvllm needs them equal")
    if not (0 < rot <= head_dim and rot % 2 == 0):   # phi3: Phi-4-mini ropes part of each head
        raise m.fail(f"metadata '{arch}.rope.dimension_count' is {rot}: need an even number up to {head_dim}")
    embed = infos.get("token_embd.weight")
    tokens = metadata.get("tokenizer.ggml.tokens")
    # SkippedStrings: read for planning, only counted
    listed = len(tokens) if isinstance(tokens, (list, SkippedStrings)) else None
    vocab = embed.shape[0] if embed is not None else (listed or 0)
    if not vocab:
        raise m.fail("no token_embd.weight tensor and no token list: the vocabulary size is unknown")
    if listed is not None and listed > vocab:
        raise m.fail(f"{listed} tokens but the embedding has {vocab} rows")
    bos = m.get("tokenizer.ggml.bos_token_id", int, required=False)
    eos = m.get("tokenizer.ggml.eos_token_id", int, required=False)
    for key, tid in (("bos", bos), ("eos", eos)):
        if tid is not None and not 0 <= tid < vocab:
            raise m.fail(f"metadata 'tokenizer.ggml.{key}_token_id' is {tid}, not a token id (0 to {vocab - 1})")
    bias = "blk.0.attn_q.bias" in infos
    if arch == "qwen3" and bias:
        raise m.fail("qwen3 with attention biases is not supported (it adds an o_proj bias)")
    layers = m.positive("block_count", limit=len(infos))
    config = ModelConfig(
        architecture=ARCHITECTURES[arch],
        vocab_size=vocab,
        hidden_size=hidden,
        intermediate_size=m.positive("feed_forward_length"),
        num_layers=layers,
        num_heads=heads,
        num_kv_heads=kv_heads,
        head_dim=head_dim,
        rms_norm_eps=m.finite("attention.layer_norm_rms_epsilon"),
        rope_theta=m.finite("rope.freq_base", 10000.0),
        max_position_embeddings=min(m.positive("context_length"), MAX_CONTEXT),
        tie_word_embeddings="output.weight" not in infos,
        attention_bias=bias,
        rope_scaling=None,
        qk_norm=arch == "qwen3",
        bos_token_id=bos,
        eos_token_ids=[] if eos is None else [eos],
        rotary_dim=0 if rot == head_dim else rot,
        nope_layers=(tuple(n for n in range(layers) if (n + 1) % SMOLLM3_NO_ROPE_LAYER_STEP == 0)
                     if arch == "smollm3" else ()),
    )
    if arch == "phi3":   # its window on every layer, where shorter than the context (llama.cpp: its n_swa)
        window = m.get("attention.sliding_window", int, 0, required=False)
        if window and window < config.max_position_embeddings:
            config = replace(config, sliding_window=window, sliding_layers=[True] * layers)
    return gemma3_config(config, m) if arch == "gemma3" else config


def gemma3_config(config: ModelConfig, m: Meta) -> ModelConfig:
    """A gemma3 file's config, read as llama.cpp's loader does: the sliding window from its key; the layer
    pattern fixed (GEMMA3_SLIDING_PATTERN) and the sliding layers' rope base 10000, the file having no key
    for either; scores scaled by head_dim's -0.5 power (hidden / heads for the 62-layer 27B, whose
    query_pre_attn_scalar that is); norms already 1 + w (the converter adds 1); no soft-capping."""
    n = config.num_layers
    scalar = config.hidden_size // config.num_heads if n == 62 else config.head_dim
    return replace(config, norm_offset=0.0, post_norms=True, hidden_act="gelu_pytorch_tanh", qk_norm=True,
                   embed_scale=float(np.float32(math.sqrt(config.hidden_size))), query_pre_attn_scalar=float(scalar),
                   sliding_window=m.positive("attention.sliding_window"),
                   sliding_layers=[(i + 1) % GEMMA3_SLIDING_PATTERN != 0 for i in range(n)],
                   rope_local_theta=10000.0)


# ---------------------------------------------------------------- rope scaling

def rope_scaling(config: ModelConfig, m: Meta, freqs: np.ndarray | None) -> dict[str, Any] | None:
    """llama3 rope scaling from `{arch}.rope.scaling.*`, or recovered from llama.cpp's rope_freqs.weight
    (its converter writes the per-frequency divisors instead of the parameters); anything else refused."""
    kind = m.get("rope.scaling.type", str, "none")
    scaling: dict[str, Any] | None
    if kind == "llama3":
        scaling = {
            "rope_type": "llama3",
            "factor": m.finite("rope.scaling.factor"),
            "low_freq_factor": m.finite("rope.scaling.low_freq_factor", 1.0),
            "high_freq_factor": m.finite("rope.scaling.high_freq_factor", 4.0),
            "original_max_position_embeddings": m.positive("rope.scaling.original_context_length"),
        }
        if scaling["high_freq_factor"] <= scaling["low_freq_factor"]:
            raise m.fail("rope scaling: high_freq_factor must exceed low_freq_factor")
    elif kind == "linear" and config.architecture == "Gemma3ForCausalLM":   # its global layers' (the 4B's: 8)
        factor = m.finite("rope.scaling.factor")
        scaling = None if factor == 1.0 else {"rope_type": "linear", "factor": factor}
    elif kind == "none":
        scaling = None if freqs is None else _llama3_from_freqs(config, freqs, m)
    else:
        raise m.fail(f"rope scaling type {kind!r} is not supported (supported: none, llama3)")
    if freqs is not None:
        want = _scaled_inv_freq(config, freqs)
        got = rope_inv_freq(_with_scaling(config, scaling))
        if not np.allclose(got, want, rtol=1e-5, atol=0):
            raise m.fail(f"{ROPE_FREQS} does not match llama3 rope scaling {scaling}; "
                         "this rope scaling is not supported")
    return scaling


def longrope_scaling(config: ModelConfig, m: Meta, factors: dict[str, np.ndarray]) -> dict[str, Any]:
    """phi3's longrope as llama.cpp reads it: rope_factors_long/short, `{arch}.rope.scaling.attn_factor`
    and `{arch}.rope.scaling.original_context_length`, in config.json's terms (config.py's _longrope)."""
    missing = [n for n in ROPE_FACTORS if n not in factors]
    if missing:
        raise m.fail(f"tensor {missing[0]!r} is missing beside the other longrope factors")
    for name, f in factors.items():
        if not (np.all(np.isfinite(f)) and np.all(f > 0)):
            raise m.fail(f"tensor {name!r} holds rope factors that are not positive finite numbers")
    original = m.positive("rope.scaling.original_context_length")
    factor = config.max_position_embeddings / original
    default = math.sqrt(1 + math.log(factor) / math.log(original)) if factor > 1.0 else 1.0
    return {"rope_type": "longrope", "short_factor": [float(x) for x in factors[ROPE_FACTORS[1]]],
            "long_factor": [float(x) for x in factors[ROPE_FACTORS[0]]],
            "original_max_position_embeddings": original,
            "attention_factor": m.finite("rope.scaling.attn_factor", default)}


def _with_scaling(config: ModelConfig, scaling: dict[str, Any] | None) -> ModelConfig:
    return replace(config, rope_scaling=scaling)


def _scaled_inv_freq(config: ModelConfig, freqs: np.ndarray) -> np.ndarray:
    """llama.cpp's frequencies with rope_freqs: each base frequency divided by its factor."""
    return (rope_inv_freq(_with_scaling(config, None)) / freqs).astype(np.float32)


def _tidy(x: float) -> float:
    """A fitted parameter as the round number it was made from, when it is one to float32 precision."""
    r = round(x)
    return float(r) if abs(x - r) <= 1e-4 * max(1.0, abs(x)) else float(np.float32(x))


def _llama3_from_freqs(config: ModelConfig, freqs: np.ndarray, m: Meta) -> dict[str, Any] | None:
    """The llama3 parameters that give these per-frequency divisors.

    llama3 keeps short wavelengths (divisor 1), slows long ones by `factor`, and between them blends
    with smooth = old_len / wavelength * a - b, where a = 1 / (high - low), b = low / (high - low):
    1 / divisor = (1 - smooth) / factor + smooth. Two blended frequencies fix a and b; with low = 1
    (llama 3's value; any other gives the same curve) high and old_len follow.
    """
    if not np.all(np.isfinite(freqs)) or np.any(freqs < 1.0 - 1e-6):
        raise m.fail(f"{ROPE_FREQS} holds factors below 1 or not finite; not llama3 rope scaling")
    factor = float(freqs.max())
    if factor <= 1.0 + 1e-6:
        return None
    inv = rope_inv_freq(_with_scaling(config, None)).astype(np.float64)
    wavelen = 2 * math.pi / inv
    blended = (freqs > 1.0 + 1e-6) & (freqs < factor * (1 - 1e-6))
    if blended.sum() < 2:
        raise m.fail(f"{ROPE_FREQS} has fewer than two blended frequencies: its llama3 parameters "
                     "cannot be recovered; not supported")
    smooth = (1.0 / freqs[blended].astype(np.float64) - 1.0 / factor) / (1.0 - 1.0 / factor)
    # smooth = A / wavelen - B, with A = old_len / (high - low), B = low / (high - low)
    A, negB = np.polyfit(1.0 / wavelen[blended], smooth, 1)
    B = -negB
    if not (A > 0 and B > 0):
        raise m.fail(f"{ROPE_FREQS} does not follow llama3 rope scaling; not supported")
    high = 1.0 + 1.0 / B
    return {
        "rope_type": "llama3",
        "factor": _tidy(factor),
        "low_freq_factor": 1.0,
        "high_freq_factor": _tidy(high),
        "original_max_position_embeddings": int(round(A / B)),
    }


# ---------------------------------------------------------------- shapes

def _expected_shapes(c: ModelConfig) -> dict[str, tuple[int, ...]]:
    """Every tensor the model needs (and may have), NumPy order, from the hyperparameters."""
    h, i, d, v = c.hidden_size, c.intermediate_size, c.head_dim, c.vocab_size
    q, kv = c.num_heads * d, c.num_kv_heads * d
    shapes: dict[str, tuple[int, ...]] = {"token_embd.weight": (v, h), "output_norm.weight": (h,)}
    if not c.tie_word_embeddings:
        shapes["output.weight"] = (v, h)
    for n in range(c.num_layers):
        p = f"blk.{n}."
        if c.architecture == "Phi3ForCausalLM":   # q|k|v fused, and ffn_up holding gate|up
            shapes.update({p + "attn_norm.weight": (h,), p + "ffn_norm.weight": (h,),
                           p + "attn_qkv.weight": (q + 2 * kv, h), p + "attn_output.weight": (h, q),
                           p + "ffn_up.weight": (2 * i, h), p + "ffn_down.weight": (h, i)})
            continue
        shapes.update({
            p + "attn_norm.weight": (h,), p + "ffn_norm.weight": (h,),
            p + "attn_q.weight": (q, h), p + "attn_k.weight": (kv, h), p + "attn_v.weight": (kv, h),
            p + "attn_output.weight": (h, q),
            p + "ffn_gate.weight": (i, h), p + "ffn_up.weight": (i, h), p + "ffn_down.weight": (h, i),
        })
        if c.attention_bias:
            shapes.update({p + "attn_q.bias": (q,), p + "attn_k.bias": (kv,), p + "attn_v.bias": (kv,)})
        if c.qk_norm:
            shapes.update({p + "attn_q_norm.weight": (d,), p + "attn_k_norm.weight": (d,)})
        if c.post_norms:
            shapes.update({p + "post_attention_norm.weight": (h,), p + "post_ffw_norm.weight": (h,)})
    return shapes


def check_tensors(c: ModelConfig, arch: str, infos: dict[str, TensorInfo], path: Path) -> None:
    want = _expected_shapes(c)
    if ROPE_FREQS in infos:
        want[ROPE_FREQS] = (c.head_dim // 2,)
    if arch == "phi3":
        want.update({n: (c.rope_dim // 2,) for n in ROPE_FACTORS if n in infos})
    for name, shape in want.items():
        t = infos.get(name)
        if t is None:
            raise GGUFError(f"{path}: tensor {name!r} is missing")
        if t.shape != shape:
            raise GGUFError(f"{path}: tensor {name!r} has shape {list(t.shape)}, expected {list(shape)} "
                            "from the hyperparameters")
    extra = sorted(set(infos) - set(want))
    if extra:
        raise GGUFError(f"{path}: unexpected tensor {extra[0]!r} for a {c.num_layers}-layer {arch} model")



"""A model's configuration: config.json (or a GGUF's header, model/weights/gguf_config.py) -> ModelConfig,
and what follows from it alone (rope's frequencies, the weights' size)."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

SUPPORTED_ARCHITECTURES = ("LlamaForCausalLM", "Qwen2ForCausalLM", "Qwen3ForCausalLM", "Phi3ForCausalLM",
                           "SmolLM3ForCausalLM", "Gemma3ForCausalLM")
# transformers' Qwen3Config defaults head_dim to 128 rather than hidden_size / num_attention_heads.
_DEFAULT_HEAD_DIM = {"Qwen3ForCausalLM": 128}
_DEFAULT_HEAD_DIM["Gemma3ForCausalLM"] = 256   # Gemma3TextConfig's


class ModelLoadError(ValueError):
    """A model folder or file that cannot be loaded; the message names the file and what is wrong."""


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
    rotary_dim: int = 0        # Phi-4-mini: rope over each head's first rotary_dim dims only; 0 is the whole head
    nope_layers: tuple[int, ...] = ()   # SmolLM3: the layers that take no rope at all

    @property
    def rope_dim(self) -> int:
        return self.rotary_dim or self.head_dim
    # Gemma 3 (the defaults are every other architecture's):
    norm_offset: float = 0.0        # added to every norm weight at load: Gemma's RMSNorm scales by 1 + weight
    post_norms: bool = False        # RMSNorms on the attention's and the MLP's outputs, before each residual add
    hidden_act: str = "silu"        # the MLP's gate: silu (SwiGLU) or gelu_pytorch_tanh (GeGLU)
    embed_scale: float = 1.0        # the embeddings' rows are multiplied by it
    query_pre_attn_scalar: float | None = None   # scores scaled by its -0.5 power; None: head_dim's
    sliding_window: int | None = None            # keys a sliding layer's query sees, itself included
    sliding_layers: list[bool] = field(default_factory=list)   # per layer: sliding (else global) attention
    rope_local_theta: float | None = None        # the sliding layers' rope base (unscaled)
    attn_logit_softcapping: float | None = None
    final_logit_softcapping: float | None = None

    @classmethod
    def from_dict(cls, cfg: dict[str, Any], where: str = "config.json") -> ModelConfig:
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
        gemma3 = gemma3_fields(cfg, hidden, where) if arch == "Gemma3ForCausalLM" else {}   # its own ropes
        # Newer configs keep rope settings in rope_parameters; older ones put rope_theta at the top
        # and the scaling in rope_scaling.
        rope = dict(cfg.get("rope_parameters") or {})
        theta = rope.pop("rope_theta", cfg.get("rope_theta", 10000.0))
        partial = float(rope.pop("partial_rotary_factor", cfg.get("partial_rotary_factor", 1.0)))
        scaling = rope or cfg.get("rope_scaling") or None
        if scaling is not None and not gemma3:
            kind = scaling.get("rope_type", scaling.get("type", "default"))
            if kind == "default":
                scaling = None
            elif kind in ("longrope", "su") and arch == "Phi3ForCausalLM":
                scaling = _longrope(cfg, scaling, where)
            elif kind != "llama3":
                raise ModelLoadError(f"{where}: rope_scaling type {kind!r} is not supported (supported: default, "
                                     f"llama3, and longrope/su for Phi-3)")
        if gemma3:
            theta, scaling = gemma3.pop("rope_theta"), gemma3.pop("rope_scaling")
        eos = cfg.get("eos_token_id")
        qk_norm = arch == "Qwen3ForCausalLM"
        attention_bias = bool(cfg.get("attention_bias", arch == "Qwen2ForCausalLM"))
        if attention_bias and arch != "Qwen2ForCausalLM":
            # Llama's and Qwen3's attention_bias also put a bias on o_proj (Qwen2's biases are q/k/v
            # only), which nvllm does not carry: refused rather than computed wrong.
            raise ModelLoadError(f"{where}: attention_bias true is not supported for {arch} "
                                 f"(it adds an o_proj bias)")
        head_dim = int(cfg.get("head_dim") or _DEFAULT_HEAD_DIM.get(arch, hidden // heads))
        rotary_dim = int(head_dim * partial) if partial != 1.0 else 0
        if rotary_dim % 2 or rotary_dim < 0 or rotary_dim > head_dim:
            raise ModelLoadError(f"{where}: partial_rotary_factor {partial} gives {rotary_dim} rotary dims of "
                                 f"{head_dim}; need an even number up to the head size")
        layers = int(need("num_hidden_layers"))
        config = cls(
            architecture=arch,
            vocab_size=int(need("vocab_size")),
            hidden_size=hidden,
            intermediate_size=int(need("intermediate_size")),
            num_layers=layers,
            num_heads=heads,
            num_kv_heads=int(cfg.get("num_key_value_heads") or heads),
            head_dim=head_dim,
            rms_norm_eps=float(cfg.get("rms_norm_eps", 1e-6)),
            rope_theta=float(theta),
            max_position_embeddings=int(cfg.get("max_position_embeddings", 2048)),
            tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)),
            attention_bias=attention_bias,
            rope_scaling=scaling,
            qk_norm=qk_norm,
            bos_token_id=cfg.get("bos_token_id"),
            eos_token_ids=[] if eos is None else ([eos] if isinstance(eos, int) else list(eos)),
            rotary_dim=rotary_dim,
            nope_layers=_nope_layers(cfg, arch, layers, where),
        )
        return replace(config, **gemma3) if gemma3 else replace(config, **_phi3_window(cfg, arch, layers))

    @property
    def num_params(self) -> int:
        h, i, d = self.hidden_size, self.intermediate_size, self.head_dim
        attn = h * (self.num_heads + 2 * self.num_kv_heads) * d + self.num_heads * d * h
        per_layer = attn + 3 * h * i + 2 * h + (2 * d if self.qk_norm else 0) + (2 * h if self.post_norms else 0)
        heads = self.vocab_size * h * (1 if self.tie_word_embeddings else 2)
        return self.num_layers * per_layer + heads + h

    @property
    def weight_bytes(self) -> int:
        """Bytes of the float32 weights as load_weights lays them out (ModelWeights.nbytes, q/k/v biases
        and q/k norms included), from the shapes alone: what `nvllm serve --dry-run` plans with before
        loading anything."""
        bias = (self.num_heads + 2 * self.num_kv_heads) * self.head_dim if self.attention_bias else 0
        return 4 * (self.num_params + self.num_layers * bias)


def _longrope(cfg: dict[str, Any], s: dict[str, Any], where: str) -> dict[str, Any]:
    """Phi-3's longrope ("su" in older configs) as transformers reads it: a divisor per frequency, short
    ones up to original_max_position_embeddings and long ones past it, and cos/sin scaled by
    sqrt(1 + log(factor) / log(original)), factor the context's growth unless given."""
    try:
        original = int(s.get("original_max_position_embeddings") or cfg["original_max_position_embeddings"])
        short, long = [float(f) for f in s["short_factor"]], [float(f) for f in s["long_factor"]]
    except (KeyError, TypeError, ValueError) as e:
        raise ModelLoadError(f"{where}: rope_scaling longrope needs short_factor, long_factor and "
                             f"original_max_position_embeddings ({e!r})") from None
    factor = float(s.get("factor") or int(cfg.get("max_position_embeddings", original)) / original)
    attention = s.get("attention_factor")
    if attention is None:
        attention = 1.0 if factor <= 1.0 else math.sqrt(1 + math.log(factor) / math.log(original))
    return {"rope_type": "longrope", "short_factor": short, "long_factor": long,
            "original_max_position_embeddings": original, "attention_factor": float(attention)}


def _phi3_window(cfg: dict[str, Any], arch: str, layers: int) -> dict[str, Any]:
    """Phi-3's sliding_window, on every layer as transformers' Phi-3 masks it (2047 for Phi-3-mini-4k), where
    it is shorter than the context; a longer one never masks anything."""
    window = cfg.get("sliding_window") if arch == "Phi3ForCausalLM" else None
    if not window or int(window) >= int(cfg.get("max_position_embeddings", 2048)):
        return {}
    return {"sliding_window": int(window), "sliding_layers": [True] * layers}


def _nope_layers(cfg: dict[str, Any], arch: str, layers: int, where: str) -> tuple[int, ...]:
    """SmolLM3's no_rope_layers: one 0/1 per layer, 1 where rope is used; when absent, transformers makes
    every no_rope_layer_interval-th layer (4th by default) a NoPE one."""
    if arch != "SmolLM3ForCausalLM":
        return ()
    flags = cfg.get("no_rope_layers")
    if flags is None:
        every = int(cfg.get("no_rope_layer_interval", 4))
        flags = [int((n + 1) % every != 0) for n in range(layers)]
    if len(flags) != layers:
        raise ModelLoadError(f"{where}: no_rope_layers has {len(flags)} entries for {layers} layers")
    return tuple(n for n, use in enumerate(flags) if not use)


def read_json(path: Path) -> dict[str, Any]:
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except FileNotFoundError:
        raise ModelLoadError(f"{path}: file not found") from None
    except json.JSONDecodeError as e:
        raise ModelLoadError(f"{path}: not valid JSON ({e})") from None


def load_config(model_dir: str | Path) -> ModelConfig:
    model_dir = Path(model_dir)
    return ModelConfig.from_dict(read_json(model_dir / "config.json"), str(model_dir / "config.json"))


def rope_inv_freq(config: ModelConfig, long: bool = False) -> np.ndarray:
    """Inverse frequencies [rope_dim/2] in float32, as transformers computes them (longrope's short ones,
    or with long=True its long ones)."""
    d = config.rope_dim
    s = config.rope_scaling
    if s is not None and s.get("rope_type") == "longrope":
        ext = np.asarray(s["long_factor" if long else "short_factor"], dtype=np.float32)
        if ext.shape != (d // 2,):
            raise ModelLoadError(f"rope_scaling: {ext.size} longrope factors for {d // 2} frequencies")
        base = np.float32(config.rope_theta) ** (np.arange(0, d, 2, dtype=np.float32) / np.float32(d))
        return (1.0 / (ext * base)).astype(np.float32)
    inv = (1.0 / (np.float32(config.rope_theta)
                  ** (np.arange(0, d, 2, dtype=np.float32) / np.float32(d)))).astype(np.float32)
    if s is None:
        return inv
    if s.get("rope_type") == "linear":   # Gemma 3's global layers: positions divided by factor
        return (inv / np.float32(s["factor"])).astype(np.float32)
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


def layer_rope(config: ModelConfig, sliding: bool) -> ModelConfig:
    """The config whose rope a layer takes: a sliding layer's own base, unscaled, where the model has one."""
    if not sliding or config.rope_local_theta is None:
        return config
    return replace(config, rope_theta=config.rope_local_theta, rope_scaling=None)


def gemma3_fields(cfg: dict[str, Any], hidden: int, where: str) -> dict[str, Any]:
    """Gemma3TextConfig's fields beyond Llama's, with its defaults: the layer pattern, the two ropes
    (rope_parameters per layer type, or rope_theta, rope_local_base_freq and rope_scaling), the scalings."""
    layers = int(cfg.get("num_hidden_layers", 0))
    types = cfg.get("layer_types")
    if types is None:
        pattern = int(cfg.get("sliding_window_pattern", 6))
        types = ["sliding_attention" if (i + 1) % pattern else "full_attention" for i in range(layers)]
    if len(types) != layers or not set(types) <= {"sliding_attention", "full_attention"}:
        raise ModelLoadError(f"{where}: layer_types must give sliding_attention or full_attention for each of "
                             f"the {layers} layers")
    if cfg.get("use_bidirectional_attention"):
        raise ModelLoadError(f"{where}: use_bidirectional_attention is not supported")
    rope = cfg.get("rope_parameters") or {}
    full = dict(rope.get("full_attention") or {})
    local = dict(rope.get("sliding_attention") or {})
    theta = float(full.pop("rope_theta", cfg.get("rope_theta", 1_000_000.0)))
    local_theta = float(local.pop("rope_theta", cfg.get("rope_local_base_freq", 10_000.0)))
    scaling = full or cfg.get("rope_scaling") or None
    for which, s in (("full_attention", scaling), ("sliding_attention", local or None)):
        kind = (s or {}).get("rope_type", (s or {}).get("type", "default"))
        if kind not in ("default", "linear") or (kind == "linear" and which == "sliding_attention"):
            raise ModelLoadError(f"{where}: {which} rope type {kind!r} is not supported (supported: default, "
                                 f"and linear on full_attention)")
    if scaling is not None:
        kind = scaling.get("rope_type", scaling.get("type", "default"))
        scaling = None if kind == "default" else {"rope_type": "linear", "factor": float(scaling["factor"])}
    act = cfg.get("hidden_activation") or cfg.get("hidden_act") or "gelu_pytorch_tanh"
    if act != "gelu_pytorch_tanh":
        raise ModelLoadError(f"{where}: hidden_activation {act!r} is not supported (supported: gelu_pytorch_tanh)")
    window = cfg.get("sliding_window", 4096)
    sliding = [t == "sliding_attention" for t in types]
    final_cap, attn_cap = cfg.get("final_logit_softcapping"), cfg.get("attn_logit_softcapping")
    return {"rope_theta": theta, "rope_scaling": scaling, "rope_local_theta": local_theta,
            "norm_offset": 1.0, "post_norms": True, "hidden_act": "gelu_pytorch_tanh", "qk_norm": True,
            # transformers casts sqrt(hidden) to the weights' dtype; nvllm computes in float32, as transformers
            # does on float32 weights (the goldens) and llama.cpp always does
            "embed_scale": float(np.float32(math.sqrt(hidden))),
            "query_pre_attn_scalar": float(cfg.get("query_pre_attn_scalar", 256)),
            "sliding_window": int(window) if window and any(sliding) else None, "sliding_layers": sliding,
            "final_logit_softcapping": None if final_cap is None else float(final_cap),
            "attn_logit_softcapping": None if attn_cap is None else float(attn_cap),
            "tie_word_embeddings": bool(cfg.get("tie_word_embeddings", True))}


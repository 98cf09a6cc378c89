"""A Hugging Face model folder -> ModelConfig + float32 arrays laid out for the matmuls.

Only JSON and safetensors are read; a folder holding a pickle checkpoint is refused, never opened.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from safetensors import deserialize, safe_open

SUPPORTED_ARCHITECTURES = ("LlamaForCausalLM", "Qwen2ForCausalLM")
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
        return cls(
            architecture=arch,
            vocab_size=int(need("vocab_size")),
            hidden_size=hidden,
            intermediate_size=int(need("intermediate_size")),
            num_layers=int(need("num_hidden_layers")),
            num_heads=heads,
            num_kv_heads=int(cfg.get("num_key_value_heads") or heads),
            head_dim=int(cfg.get("head_dim") or hidden // heads),
            rms_norm_eps=float(cfg.get("rms_norm_eps", 1e-6)),
            rope_theta=float(theta),
            max_position_embeddings=int(cfg.get("max_position_embeddings", 2048)),
            tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)),
            attention_bias=bool(cfg.get("attention_bias", arch == "Qwen2ForCausalLM")),
            rope_scaling=scaling,
            bos_token_id=cfg.get("bos_token_id"),
            eos_token_ids=[] if eos is None else ([eos] if isinstance(eos, int) else list(eos)),
        )

    @property
    def num_params(self) -> int:
        h, i, d = self.hidden_size, self.intermediate_size, self.head_dim
        attn = h * (self.num_heads + 2 * self.num_kv_heads) * d + self.num_heads * d * h
        per_layer = attn + 3 * h * i + 2 * h
        heads = self.vocab_size * h * (1 if self.tie_word_embeddings else 2)
        return self.num_layers * per_layer + heads + h


@dataclass
class LayerWeights:
    input_norm: np.ndarray     # [H]
    qkv: np.ndarray            # [H, (nh + 2*nkv) * hd], q then k then v
    qkv_bias: np.ndarray | None  # [(nh + 2*nkv) * hd]
    o: np.ndarray              # [nh * hd, H]
    post_norm: np.ndarray      # [H]
    gate_up: np.ndarray        # [H, 2 * I], gate then up
    down: np.ndarray           # [I, H]


@dataclass
class ModelWeights:
    embed: np.ndarray          # [V, H]
    layers: list[LayerWeights]
    norm: np.ndarray           # [H]
    lm_head: np.ndarray        # [H, V]; for tied embeddings a transposed view of embed, no copy

    @property
    def nbytes(self) -> int:
        arrays = [self.embed, self.norm] + [a for l in self.layers for a in vars(l).values() if a is not None]
        if not np.shares_memory(self.lm_head, self.embed):
            arrays.append(self.lm_head)
        return sum(a.nbytes for a in arrays)


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


def _bf16_to_f32(raw: bytes | bytearray, shape: list[int]) -> np.ndarray:
    bits = np.frombuffer(raw, dtype=np.uint16).astype(np.uint32) << 16  # bf16 is float32's top half
    return bits.view(np.float32).reshape(shape)


def read_tensors(files: list[Path]) -> dict[str, tuple[np.ndarray, Path]]:
    """Every tensor of every file as float32, with the file it came from (for error messages)."""
    out: dict[str, tuple[np.ndarray, Path]] = {}
    for path in files:
        try:
            with safe_open(str(path), framework="numpy") as f:
                names = list(f.keys())
                dtypes = {n: f.get_slice(n).get_dtype() for n in names}
                for n in names:
                    if dtypes[n] != "BF16":
                        out[n] = (f.get_tensor(n).astype(np.float32, copy=False), path)
            if "BF16" in dtypes.values():
                # NumPy has no bfloat16: take the raw bytes through safetensors and widen them.
                for n, info in deserialize(path.read_bytes()):
                    if info["dtype"] == "BF16":
                        out[n] = (_bf16_to_f32(info["data"], info["shape"]), path)
        except ModelLoadError:
            raise
        except Exception as e:  # safetensors raises its own error types for corrupt files
            raise ModelLoadError(f"{path}: cannot read as safetensors ({e})") from None
    return out


class _Tensors:
    def __init__(self, tensors: dict[str, tuple[np.ndarray, Path]], model_dir: Path) -> None:
        self.tensors = tensors
        self.model_dir = model_dir

    def get(self, name: str, shape: tuple[int, ...]) -> np.ndarray:
        if name not in self.tensors:
            raise ModelLoadError(f"{self.model_dir}: tensor {name!r} is missing from the checkpoint")
        arr, path = self.tensors[name]
        if tuple(arr.shape) != shape:
            raise ModelLoadError(
                f"{path.name}: tensor {name!r} has shape {list(arr.shape)}, expected {list(shape)}")
        return arr


def load_weights(model_dir: str | Path, config: ModelConfig | None = None) -> tuple[ModelConfig, ModelWeights]:
    model_dir = Path(model_dir)
    check_folder(model_dir)
    config = config or load_config(model_dir)
    t = _Tensors(read_tensors(_safetensors_files(model_dir)), model_dir)
    h, i, d = config.hidden_size, config.intermediate_size, config.head_dim
    nh, nkv, v = config.num_heads, config.num_kv_heads, config.vocab_size

    def contiguous(a: np.ndarray) -> np.ndarray:
        return np.ascontiguousarray(a, dtype=np.float32)

    layers = []
    for n in range(config.num_layers):
        p = f"model.layers.{n}."
        q = t.get(p + "self_attn.q_proj.weight", (nh * d, h))
        k = t.get(p + "self_attn.k_proj.weight", (nkv * d, h))
        vv = t.get(p + "self_attn.v_proj.weight", (nkv * d, h))
        bias = None
        if config.attention_bias:
            bias = contiguous(np.concatenate([
                t.get(p + "self_attn.q_proj.bias", (nh * d,)),
                t.get(p + "self_attn.k_proj.bias", (nkv * d,)),
                t.get(p + "self_attn.v_proj.bias", (nkv * d,)),
            ]))
        gate = t.get(p + "mlp.gate_proj.weight", (i, h))
        up = t.get(p + "mlp.up_proj.weight", (i, h))
        layers.append(LayerWeights(
            input_norm=contiguous(t.get(p + "input_layernorm.weight", (h,))),
            qkv=contiguous(np.concatenate([q, k, vv]).T),                  # [H, (nh+2nkv)*d]
            qkv_bias=bias,
            o=contiguous(t.get(p + "self_attn.o_proj.weight", (h, nh * d)).T),  # [nh*d, H]
            post_norm=contiguous(t.get(p + "post_attention_layernorm.weight", (h,))),
            gate_up=contiguous(np.concatenate([gate, up]).T),             # [H, 2I]
            down=contiguous(t.get(p + "mlp.down_proj.weight", (h, i)).T),     # [I, H]
        ))
    embed = contiguous(t.get("model.embed_tokens.weight", (v, h)))
    if config.tie_word_embeddings or "lm_head.weight" not in t.tensors:
        if not config.tie_word_embeddings:
            raise ModelLoadError(f"{model_dir}: tensor 'lm_head.weight' is missing and embeddings are not tied")
        lm_head = embed.T                                                  # [H, V] view
    else:
        lm_head = contiguous(t.get("lm_head.weight", (v, h)).T)
    norm = contiguous(t.get("model.norm.weight", (h,)))
    return config, ModelWeights(embed=embed, layers=layers, norm=norm, lm_head=lm_head)


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

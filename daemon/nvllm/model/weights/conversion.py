"""model.quantization at load: each float32 matrix a folder's reader lays out becomes the storage asked for
(quantized by model/quant/quantize.py, or kept in the 16 bits it was stored in), and the bytes that will
hold, from the shapes alone, for planning."""
from __future__ import annotations

import logging
from collections.abc import Callable

import numpy as np

from nvllm.model.config import ModelConfig
from nvllm.model.kernels import matmul
from nvllm.model.matrix.packed import in_kernel_layout
from nvllm.model.matrix.quantized import QuantizedWeight
from nvllm.model.matrix.weight import Weight
from nvllm.model.quant.quantize import choose_format, quantize

log = logging.getLogger(__name__)

# model.quantization "" keeps a matrix whose parts are all stored in one of these, in that format
KEPT_16 = {"BF16": "bf16", "F16": "f16"}


def kept_kind(dtypes: set[str]) -> str:
    """The 16-bit kind a matrix stored as `dtypes` keeps under model.quantization "" ("": float32)."""
    return KEPT_16.get(next(iter(dtypes)), "") if len(dtypes) == 1 else ""


def matrix_rule(quantization: str) -> Callable[[np.ndarray, str, set[str]], Weight | None] | None:
    """What the folder's reader does with each float32 matrix [out, in] for model.quantization
    (weights.folder.load_weights says): None keeps it float32."""
    if quantization == "f32":
        return None
    if quantization:
        return lambda w, name, dtypes: in_kernel_layout(quantize_weight(w, quantization, name))
    if matmul.lib is None:   # BF16/F16 would go to the NumPy twin: float32 is faster there
        return None

    def as_stored(w: np.ndarray, name: str, dtypes: set[str]) -> Weight | None:
        kind = kept_kind(dtypes)
        # exact: the values came from that kind
        return in_kernel_layout(quantize_weight(w, kind, name)) if kind else None
    return as_stored


def quantize_weight(w_out_in: np.ndarray, kind: str, name: str = "weight") -> QuantizedWeight:
    """A linear layer's float32 weight [out, in] (Hugging Face's layout: each row is one output's
    weights, quantized along `in` as llama.cpp does) as a QuantizedWeight of model.quantization `kind`
    (q8_0, q4_0, q4_k, bf16, f16), falling back per choose_format with a log line naming `name`."""
    w = np.asarray(w_out_in)
    if w.ndim != 2:
        raise ValueError(f"{name}: a weight to quantize is 2-D [out, in], got shape {w.shape}")
    fmt, reason = choose_format(kind, int(w.shape[1]))
    if reason:
        log.info("%s %s: %s", name, list(w.shape), reason)
    blocks = quantize(fmt, np.ascontiguousarray(w, dtype=np.float32))
    return QuantizedWeight(fmt, blocks, (int(w.shape[0]), int(w.shape[1])))


def matrix_shapes(config: ModelConfig) -> list[tuple[str, int, int]]:
    """(name, rows, row length) of every matrix model.quantization quantizes (weights.folder.load_weights),
    as it lays them out: each linear layer as [out, in], the embedding [V, H], an untied lm_head [V, H]."""
    h, i, d = config.hidden_size, config.intermediate_size, config.head_dim
    per_layer = [("qkv", (config.num_heads + 2 * config.num_kv_heads) * d, h), ("o", h, config.num_heads * d),
                 ("gate_up", 2 * i, h), ("down", h, i)]
    shapes = [(f"layers.{n}.{field}", rows, cols) for n in range(config.num_layers) for field, rows, cols in per_layer]
    shapes.append(("embed", config.vocab_size, h))
    if not config.tie_word_embeddings:
        shapes.append(("lm_head", config.vocab_size, h))
    return shapes


def quantized_weight_bytes(config: ModelConfig, kind: str) -> int:
    """Bytes a folder's weights hold when loaded with quantization `kind`, from the shapes alone (`nvllm
    serve --dry-run --memory-gb` plans with it): each matrix in the format choose_format gives its rows,
    the norms and biases float32 as before."""
    total = config.weight_bytes
    for _, rows, cols in matrix_shapes(config):
        fmt, _ = choose_format(kind, cols)
        total += rows * (cols // fmt.block_elems * fmt.block_bytes) - 4 * rows * cols
    return total

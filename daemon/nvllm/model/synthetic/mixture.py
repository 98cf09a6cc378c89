"""Which block format each tensor gets, as llama.cpp's quantize tool chooses it for a file type.

A transcription of its rules (llama_tensor_get_type in llama-quant.cpp) for the file types synthesize
writes. For Q4_K_M: Q4_K, but Q6_K for the output matrix (the embedding when the two are tied), and for
attn_v and ffn_down in the layers use_more_bits picks; a matrix whose rows do not split into its type's
blocks falls back (Q4_K -> Q5_0, Q6_K -> Q8_0, then F16), so on a 896-wide model most of Q4_K_M is Q5_0
and Q8_0. Norms, biases and every 1-D tensor stay F32.
"""

from __future__ import annotations

from dataclasses import dataclass

from nvllm.model.quant.formats import FORMATS

FILE_TYPES: dict[str, int] = {"F16": 1, "Q8_0": 7, "Q4_K_M": 15}  # llama_ftype's values, for general.file_type
_DEFAULT = {"F16": "F16", "Q8_0": "Q8_0", "Q4_K_M": "Q4_K"}
_FALLBACK = {"Q4_K": "Q5_0", "Q6_K": "Q8_0"}
_BLOCK = {f.name: f.block_elems for f in FORMATS.values()}


@dataclass(frozen=True)
class TensorSpec:
    """A tensor to write: its GGUF name, its role (token_embd, output, attn_q, attn_k, attn_v,
    attn_output, ffn_gate, ffn_up, ffn_down, or norm and bias for vectors) and its shape [rows, row length]
    (a vector is [n])."""

    name: str
    role: str
    shape: tuple[int, ...]


def _more_bits(i: int, n: int) -> bool:
    """use_more_bits: the first and last eighth of the layers, and every third one between."""
    return i < n // 8 or i >= 7 * n // 8 or (i - n // 8) % 3 == 2


def tensor_types(file_type: str, tensors: list[TensorSpec], layers: int) -> list[str]:
    """The GGUF type name of each tensor, in order (the order counts: attn_v's rule numbers the attn_v
    tensors as they come, as llama.cpp does)."""
    if file_type not in FILE_TYPES:
        raise ValueError(f"--type must be one of {', '.join(FILE_TYPES)}, got {file_type!r}")
    tied = not any(t.role == "output" for t in tensors)
    n_v = sum(t.role == "attn_v" for t in tensors)
    i_v = i_down = 0
    out = []
    for t in tensors:
        if len(t.shape) < 2 or t.role in ("norm", "bias"):
            out.append("F32")
            continue
        new = _DEFAULT[file_type]
        row = t.shape[-1]
        if file_type != "F16":
            if t.role == "output" or (tied and t.role == "token_embd"):
                if row % _BLOCK[new]:
                    new = "Q8_0"
                elif new != "Q8_0":
                    new = "Q6_K"
            elif t.role == "attn_v":
                if file_type == "Q4_K_M" and _more_bits(i_v, n_v):
                    new = "Q6_K"
                i_v += 1
            elif t.role == "ffn_down":
                if file_type == "Q4_K_M" and _more_bits(i_down, layers):
                    new = "Q6_K"
                i_down += 1
            if row % _BLOCK[new]:
                new = _FALLBACK.get(new, new)
                if row % _BLOCK[new]:
                    new = "F16"
        out.append(new)
    return out

"""Which block format each tensor gets, as llama.cpp's quantize tool chooses it for a file type.

A transcription of its rules (llama_tensor_get_type in llama-quant.cpp, for dense models without an
importance matrix) for the file types synthesize and requantize write. For Q4_K_M: Q4_K, but Q6_K for
the output matrix (the embedding when the two are tied), and for attn_v and ffn_down in the layers
use_more_bits picks. Q3_K_M: Q3_K, with Q5_K for the first two attn_v and the first sixteenth of
ffn_down, Q4_K for the other attn_v and ffn_down and every attn_output. Q2_K: Q2_K, with Q3_K for
ffn_down and attn_output, and for attn_v Q3_K, or Q4_K where four or more heads share a KV head. IQ4_NL
and IQ4_XS: their own type, with Q5_K for the first eighth of ffn_down and, where four or more heads
share a KV head, every attn_v. A fused attn_qkv (phi3) is counted and typed as an attn_v.
Q5_0: Q5_0. All but F32, F16 and Q8_0 take Q6_K for the output matrix.
A matrix whose rows do not split into its type's blocks falls back (IQ4_XS -> IQ4_NL, Q2_K and Q3_K ->
Q4_0, Q4_K -> Q5_0, Q5_K -> Q5_1, Q6_K -> Q8_0, then F16), so on a 896-wide model most of Q4_K_M is Q5_0
and Q8_0. Norms, biases and every 1-D tensor stay F32, and so do a BERT's position embeddings and token-type
embeddings (roles pos_embd and token_types): its converter writes them F32 and llama-quantize leaves them be.
"""

from __future__ import annotations

from dataclasses import dataclass

from nvllm.model.quant.formats import FORMATS

# llama_ftype's values, for general.file_type
FILE_TYPES: dict[str, int] = {"F32": 0, "F16": 1, "Q8_0": 7, "Q5_0": 8, "Q4_K_M": 15, "Q3_K_M": 12, "Q2_K": 10,
                              "IQ4_XS": 30, "IQ4_NL": 25}
_DEFAULT = {"F32": "F32", "F16": "F16", "Q8_0": "Q8_0", "Q5_0": "Q5_0", "Q4_K_M": "Q4_K", "Q3_K_M": "Q3_K",
            "Q2_K": "Q2_K", "IQ4_XS": "IQ4_XS", "IQ4_NL": "IQ4_NL"}
_FALLBACK = {"IQ4_XS": "IQ4_NL", "Q2_K": "Q4_0", "Q3_K": "Q4_0", "Q4_K": "Q5_0", "Q5_K": "Q5_1", "Q6_K": "Q8_0"}
_BLOCK = {f.name: f.block_elems for f in FORMATS.values()}
_IQ4 = ("IQ4_NL", "IQ4_XS")
_F32_ROLES = ("norm", "bias", "pos_embd", "token_types")


@dataclass(frozen=True)
class TensorSpec:
    """A tensor to write: its GGUF name, its role (token_embd, output, attn_q, attn_k, attn_v, attn_qkv,
    attn_output, ffn_gate, ffn_up, ffn_down, pos_embd, token_types, or norm and bias for vectors) and its
    shape [rows, row length] (a vector is [n])."""

    name: str
    role: str
    shape: tuple[int, ...]


def _more_bits(i: int, n: int) -> bool:
    """use_more_bits: the first and last eighth of the layers, and every third one between."""
    return i < n // 8 or i >= 7 * n // 8 or (i - n // 8) % 3 == 2


def _attn_v(file_type: str, new: str, i: int, n: int, gqa: int) -> str:
    """attn_v number i of n, in a model whose heads share a KV head gqa at a time."""
    if file_type == "Q2_K":
        return "Q4_K" if gqa >= 4 else "Q3_K"
    if file_type == "Q3_K_M":
        return "Q5_K" if i < 2 else "Q4_K"
    if file_type in _IQ4 and gqa >= 4:
        return "Q5_K"
    if file_type == "Q4_K_M" and _more_bits(i, n):
        return "Q6_K"
    return new


def _ffn_down(file_type: str, new: str, i: int, n: int) -> str:
    """ffn_down of layer i of n."""
    if file_type == "Q2_K":
        return "Q3_K"
    if file_type == "Q3_K_M":
        return "Q5_K" if i < n // 16 else "Q4_K"   # (Q3_K only in Falcon's layers use_more_bits skips)
    if file_type == "Q4_K_M" and _more_bits(i, n):
        return "Q6_K"
    if file_type in _IQ4 and i < n // 8:
        return "Q5_K"
    return new


def tensor_types(file_type: str, tensors: list[TensorSpec], layers: int, gqa: int = 1) -> list[str]:
    """The GGUF type name of each tensor, in order (the order counts: attn_v's rule numbers the attn_v
    tensors as they come, as llama.cpp does); gqa is the heads per KV head (n_gqa)."""
    if file_type not in FILE_TYPES:
        raise ValueError(f"--type must be one of {', '.join(FILE_TYPES)}, got {file_type!r}")
    tied = not any(t.role == "output" for t in tensors)
    n_v = sum(t.role in ("attn_v", "attn_qkv") for t in tensors)
    i_v = i_down = 0
    out = []
    for t in tensors:
        if len(t.shape) < 2 or t.role in _F32_ROLES:
            out.append("F32")
            continue
        new = _DEFAULT[file_type]
        row = t.shape[-1]
        if file_type not in ("F32", "F16"):
            if t.role == "output" or (tied and t.role == "token_embd"):
                if row % _BLOCK[new]:
                    new = "Q8_0"
                elif new != "Q8_0":
                    new = "Q6_K"
            elif t.role in ("attn_v", "attn_qkv"):   # phi3's fused q|k|v: counted and typed as attn_v
                new = _attn_v(file_type, new, i_v, n_v, gqa)
                i_v += 1
            elif t.role == "ffn_down":
                new = _ffn_down(file_type, new, i_down, layers)
                i_down += 1
            elif t.role == "attn_output" and file_type in ("Q2_K", "Q3_K_M"):
                new = "Q3_K" if file_type == "Q2_K" else "Q4_K"
            if row % _BLOCK[new]:
                new = _FALLBACK.get(new, new)
                if row % _BLOCK[new]:
                    new = "F16"
        out.append(new)
    return out

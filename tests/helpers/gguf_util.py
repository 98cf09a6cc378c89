"""Tiny GGUF files for tests, made here rather than downloaded.

`write_gguf` turns a tiny random HF folder (models/make_test_models.py) into the GGUF llama.cpp's
converter would write for it: the architecture's hyperparameters, the tokenizer.ggml.* keys, llama's
Q/K rows permuted for its adjacent-pair rope, llama3 rope scaling as a rope_freqs.weight tensor, norms in
F32 and the matrices in the chosen type (F32, F16, BF16, or a type gguf.quants.quantize writes).
`write_random_gguf` writes a model of random blocks in any block format, the K-quants included (gguf
cannot quantize to them), with finite scales.
"""
from __future__ import annotations

import json
import math
from pathlib import Path

import gguf
import numpy as np
from gguf import GGMLQuantizationType as T

from nvllm.model.weights.folder import _safetensors_files, _Tensors
from nvllm.model_files.synthetic.writer import llama3_rope_divisors

ARCH = {"LlamaForCausalLM": "llama", "Qwen2ForCausalLM": "qwen2", "Qwen3ForCausalLM": "qwen3",
        "Phi3ForCausalLM": "phi3", "SmolLM3ForCausalLM": "smollm3", "Gemma3ForCausalLM": "gemma3"}
PRE = {"llama": "smollm", "qwen2": "qwen2", "qwen3": "qwen2",   # tokenizer.ggml.pre of the tiny models
       "phi3": "smollm", "smollm3": "smollm", "gemma3": "smollm"}
# general.name of the tiny GGUFs. tiny-phi3 is laid out as Phi-4-mini (byte-level BPE, no </s>), whose files
# are named "Phi 4 Mini Instruct": a name holding "phi3" would take llama.cpp's Phi-3 rule (every special
# token rstrip, text/gguf_strip.py), which llama.cpp could not even apply to a vocabulary without </s>.
NAMES = {"phi3": "tiny-phi4-mini"}
PERMUTED = ("llama", "smollm3")   # the archs whose converter is Llama's, Q/K rows permuted
QUANTIZABLE = (T.Q8_0, T.Q4_0, T.Q4_1, T.Q5_0, T.Q5_1)        # what gguf.quants.quantize writes
K_QUANTS = (T.Q4_K, T.Q5_K, T.Q6_K)
LOW_BIT = (T.Q2_K, T.Q3_K, T.IQ4_NL, T.IQ4_XS)                 # nor to these: random blocks too
# Byte offsets of each K-quant block's float16 scales (ggml-common.h's block_q*_K).
_K_SCALE_OFFSETS = {T.Q2_K: (80, 82), T.Q3_K: (108,), T.Q4_K: (0, 2), T.Q5_K: (0, 2), T.Q6_K: (208,)}

_HF_TO_GGUF = {
    "input_layernorm": "attn_norm", "post_attention_layernorm": "ffn_norm",
    "self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v",
    "self_attn.o_proj": "attn_output", "self_attn.q_norm": "attn_q_norm", "self_attn.k_norm": "attn_k_norm",
    "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up", "mlp.down_proj": "ffn_down",
    "self_attn.qkv_proj": "attn_qkv", "mlp.gate_up_proj": "ffn_up",   # phi3: fused as its checkpoint
}
# Gemma 3's four norms per layer, under the converter's names.
_GEMMA3_TO_GGUF = {**_HF_TO_GGUF, "post_attention_layernorm": "post_attention_norm",
                   "pre_feedforward_layernorm": "ffn_norm", "post_feedforward_layernorm": "post_ffw_norm"}
_HF_GLOBAL = {"model.embed_tokens.weight": "token_embd.weight", "model.norm.weight": "output_norm.weight",
              "lm_head.weight": "output.weight"}


def gguf_name(hf_name: str, arch: str = "") -> str:
    """Hugging Face tensor name -> llama.cpp's (the converter's map, for the tensors nvllm reads)."""
    if hf_name in _HF_GLOBAL:
        return _HF_GLOBAL[hf_name]
    _, _, n, rest = hf_name.split(".", 3)               # model.layers.N.self_attn.q_proj.weight
    module, suffix = rest.rsplit(".", 1)
    return f"blk.{n}.{(_GEMMA3_TO_GGUF if arch == 'gemma3' else _HF_TO_GGUF)[module]}.{suffix}"


def permute_rope_rows(w: np.ndarray, n_heads: int) -> np.ndarray:
    """llama.cpp's converter: each head's rows [first half; second half] interleaved pairwise."""
    # [H*d, in] -> [H, 2, d/2, in] -> [H, d/2, 2, in] -> [H*d, in]
    return np.ascontiguousarray(w.reshape(n_heads, 2, w.shape[0] // n_heads // 2, -1)
                                .swapaxes(1, 2).reshape(w.shape))


def hf_tensors(folder: Path) -> dict[str, np.ndarray]:
    """Every tensor of the folder as float32 in HF orientation (the loader's own widening)."""
    t = _Tensors(_safetensors_files(folder), folder)
    try:
        return {name: t.array([(name, e.shape)]) for name, e in sorted(t.entries.items())}
    finally:
        t.close()


def encode(w: np.ndarray, qtype: T) -> np.ndarray:
    """float32 -> the array GGUFWriter.add_tensor takes for that type (raw bytes for block formats)."""
    if qtype == T.F32:
        return np.ascontiguousarray(w, dtype=np.float32)
    if qtype == T.F16:
        return np.ascontiguousarray(w, dtype=np.float16)
    return gguf.quants.quantize(np.ascontiguousarray(w, dtype=np.float32), qtype)


def file_type(qtype: T) -> int:
    if qtype == T.F32:
        return int(gguf.LlamaFileType.ALL_F32)
    name = {T.Q4_K: "Q4_K_M", T.Q5_K: "Q5_K_M", T.Q3_K: "Q3_K_M"}.get(qtype, qtype.name)
    return int(getattr(gguf.LlamaFileType, f"MOSTLY_{name}"))


def _add_tensor(w: gguf.GGUFWriter, name: str, data: np.ndarray, qtype: T) -> None:
    if qtype in (T.F32, T.F16):
        w.add_tensor(name, data)
    else:
        w.add_tensor(name, data, raw_dtype=qtype)


# ---------------------------------------------------------------- from a folder

def llama3_rope_factors(cfg: dict, head_dim: int) -> np.ndarray:
    """The rope_freqs.weight llama.cpp's converter writes for llama3 rope scaling (here from the
    scaling's own original_max_position_embeddings: the converter reads a top-level key that configs
    rarely have and falls back to 8192)."""
    return llama3_rope_divisors(float(cfg.get("rope_theta", 10000.0)), head_dim, cfg["rope_scaling"])


def add_hparams(w: gguf.GGUFWriter, cfg: dict, arch: str, qtype: T) -> None:
    heads = cfg["num_attention_heads"]
    rope = cfg.get("rope_parameters") or {}
    rope = rope.get("full_attention", rope)   # gemma3's, per layer type: the file keeps the global layers'
    w.add_name(NAMES.get(arch, f"tiny-{arch}"))
    w.add_file_type(file_type(qtype))
    w.add_quantization_version(gguf.GGML_QUANT_VERSION)
    w.add_block_count(cfg["num_hidden_layers"])
    w.add_context_length(cfg["max_position_embeddings"])
    w.add_embedding_length(cfg["hidden_size"])
    w.add_feed_forward_length(cfg["intermediate_size"])
    w.add_head_count(heads)
    w.add_head_count_kv(cfg.get("num_key_value_heads") or heads)
    w.add_rope_freq_base(float(rope.get("rope_theta", cfg.get("rope_theta", 10000.0))))
    w.add_layer_norm_rms_eps(float(cfg["rms_norm_eps"]))
    if cfg.get("head_dim"):
        w.add_key_length(cfg["head_dim"])
        w.add_value_length(cfg["head_dim"])
    if arch in ("llama", "smollm3"):
        w.add_vocab_size(cfg["vocab_size"])
        w.add_rope_dimension_count(cfg.get("head_dim") or cfg["hidden_size"] // heads)
    if arch == "phi3":
        add_phi3_hparams(w, cfg)
    if arch == "gemma3":   # the converter's Gemma3Model: no key for the layer pattern nor the local rope base
        w.add_sliding_window(cfg["sliding_window"])
        if rope.get("rope_type") == "linear":
            w.add_rope_scaling_type(gguf.RopeScalingType.LINEAR)
            w.add_rope_scaling_factor(float(rope["factor"]))


def add_phi3_hparams(w: gguf.GGUFWriter, cfg: dict) -> None:
    """Phi3MiniModel's keys in llama.cpp's converter: the rotary dims, the sliding window (0 for none), and
    for longrope the original context and the attention factor it computes."""
    heads = cfg["num_attention_heads"]
    w.add_rope_dimension_count(int(cfg.get("partial_rotary_factor", 1.0) * cfg["hidden_size"]) // heads)
    w.add_sliding_window(cfg.get("sliding_window") or 0)
    original = cfg.get("original_max_position_embeddings")
    if cfg.get("rope_scaling") and original:
        w.add_rope_scaling_orig_ctx_len(original)
        scale = cfg["max_position_embeddings"] / original
        w.add_rope_scaling_attn_factors(math.sqrt(1 + math.log(scale) / math.log(original)) if scale > 1 else 1.0)


def add_tokenizer(w: gguf.GGUFWriter, folder: Path, arch: str, vocab_size: int) -> None:
    """The tokenizer.ggml.* keys llama.cpp's converter writes for a byte-level BPE ("gpt2")."""
    tj = json.loads((folder / "tokenizer.json").read_text(encoding="utf-8"))
    tc = json.loads((folder / "tokenizer_config.json").read_text(encoding="utf-8"))
    cfg = json.loads((folder / "config.json").read_text(encoding="utf-8"))
    by_id = {i: t for t, i in tj["model"]["vocab"].items()}
    specials = {a["id"] for a in tj.get("added_tokens", []) if a.get("special")}
    for a in tj.get("added_tokens", []):
        by_id[a["id"]] = a["content"]
    tokens = [by_id.get(i, f"[PAD{i}]") for i in range(vocab_size)]
    types = [3 if i in specials else (5 if i not in by_id else 1) for i in range(vocab_size)]  # control, unused, normal
    merges = [m if isinstance(m, str) else " ".join(m) for m in tj["model"]["merges"]]
    ids = {t: i for i, t in enumerate(tokens)}
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre(PRE[arch])
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges(merges)
    bos = ids.get(tc.get("bos_token")) if tc.get("bos_token") else cfg.get("bos_token_id")
    eos = ids.get(tc.get("eos_token")) if tc.get("eos_token") else cfg.get("eos_token_id")
    if bos is not None:
        w.add_bos_token_id(bos)
    if eos is not None:
        w.add_eos_token_id(eos)
    if tc.get("pad_token") in ids:
        w.add_pad_token_id(ids[tc["pad_token"]])
    w.add_add_bos_token(bool(tc.get("add_bos_token", False)))
    if tc.get("chat_template"):
        w.add_chat_template(tc["chat_template"])


def write_gguf(folder: Path, out: Path, qtype: T = T.F32) -> Path:
    """The tiny folder as llama.cpp would convert it, its matrices in `qtype` (norms and biases F32)."""
    folder, out = Path(folder), Path(out)
    cfg = json.loads((folder / "config.json").read_text(encoding="utf-8"))
    arch = ARCH[cfg["architectures"][0]]
    heads = cfg["num_attention_heads"]
    kv_heads = cfg.get("num_key_value_heads") or heads
    head_dim = cfg.get("head_dim") or cfg["hidden_size"] // heads
    w = gguf.GGUFWriter(str(out), arch)
    add_hparams(w, cfg, arch, qtype)
    add_tokenizer(w, folder, arch, cfg["vocab_size"])
    scaling = cfg.get("rope_scaling") or {}
    if scaling.get("rope_type", scaling.get("type")) == "llama3":
        w.add_tensor("rope_freqs.weight", llama3_rope_factors(cfg, head_dim))
    if arch == "phi3" and scaling.get("rope_type", scaling.get("type")) in ("longrope", "su"):
        w.add_tensor("rope_factors_long.weight", np.array(scaling["long_factor"], dtype=np.float32))
        w.add_tensor("rope_factors_short.weight", np.array(scaling["short_factor"], dtype=np.float32))
    for name, a in hf_tensors(folder).items():
        if cfg.get("tie_word_embeddings") and name == "lm_head.weight":
            continue
        if arch in PERMUTED and ".q_proj." in name:
            a = permute_rope_rows(a, heads)
        elif arch in PERMUTED and ".k_proj." in name:
            a = permute_rope_rows(a, kv_heads)
        if arch == "gemma3" and name.endswith("norm.weight"):
            a = a + np.float32(1.0)   # the converter stores Gemma's RMSNorm weights as 1 + w
        t = qtype if a.ndim == 2 and not name.endswith("norm.weight") else T.F32
        _add_tensor(w, gguf_name(name, arch), encode(a, t), t)
    return _finish(w, out)


def _finish(w: gguf.GGUFWriter, out: Path) -> Path:
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return out


# ---------------------------------------------------------------- random blocks

def random_blocks(rng: np.random.Generator, qtype: T, shape: tuple) -> np.ndarray:
    """Random raw blocks [rows, row bytes] of a block format, every float16 scale small and finite."""
    block, size = gguf.GGML_QUANT_SIZES[qtype]
    rows, cols = shape
    raw = rng.integers(0, 256, (rows, cols // block, size), dtype=np.uint8)
    offsets = _K_SCALE_OFFSETS.get(qtype, (0, 2) if qtype in (T.Q4_1, T.Q5_1) else (0,))
    for off in offsets:
        scale = (rng.random((rows, cols // block)) * 0.02 + 0.001).astype(np.float16)
        raw[:, :, off:off + 2] = scale.view(np.uint8).reshape(rows, cols // block, 2)
    return raw.reshape(rows, -1)


def write_random_gguf(out: Path, qtype: T, arch: str = "llama", *, hidden: int = 256, intermediate: int = 512,
                      heads: int = 4, kv_heads: int = 2, layers: int = 1, vocab: int = 64, tied: bool = False,
                      seed: int = 0, context: int = 128, rope_theta: float = 10000.0,
                      rope_scaling: dict | None = None, tokenizer: dict | None = None) -> Path:
    """A small model of random weights: matrices in `qtype` (random blocks for block formats), norms
    and biases F32; rows are multiples of 256 by default so every K-quant fits. llama3 `rope_scaling`
    (HF's keys) goes in as llama.cpp's rope_freqs.weight. `tokenizer`: tokenizer.* keys to write instead
    of the made-up BPE (its token count must be `vocab`)."""
    rng = np.random.default_rng(seed)
    d = hidden // heads
    w = gguf.GGUFWriter(str(out), arch)
    cfg = {"num_hidden_layers": layers, "max_position_embeddings": context, "hidden_size": hidden,
           "intermediate_size": intermediate, "num_attention_heads": heads, "num_key_value_heads": kv_heads,
           "rms_norm_eps": 1e-6, "vocab_size": vocab, "rope_theta": rope_theta, "rope_scaling": rope_scaling}
    add_hparams(w, cfg, arch, qtype)
    # whole tokens t2, t3, ... and one merge (t + 3 -> t3) from ids 0 and 1: a BPE the loader can build,
    # enough to serve ids and read them back
    if tokenizer is not None:
        add_tokenizer_metadata(w, tokenizer)
    else:
        tokens: list[str] = ["t", "3"] + [f"t{i}" for i in range(2, vocab)]
        w.add_tokenizer_model("gpt2")
        w.add_tokenizer_pre(PRE[arch])
        w.add_token_list(tokens)
        w.add_token_types([1] * vocab)
        w.add_token_merges(["t 3"])
        w.add_eos_token_id(vocab - 1)

    def matrix(name: str, shape: tuple) -> None:
        if qtype in (T.F32, T.F16, T.BF16) or qtype in QUANTIZABLE:
            _add_tensor(w, name, encode((rng.standard_normal(shape) * 0.05).astype(np.float32), qtype), qtype)
        else:
            _add_tensor(w, name, random_blocks(rng, qtype, shape), qtype)

    def vector(name: str, n: int, mean: float = 1.0) -> None:
        w.add_tensor(name, (mean + 0.1 * rng.standard_normal(n)).astype(np.float32))

    if rope_scaling:
        w.add_tensor("rope_freqs.weight", llama3_rope_factors(cfg, d))
    matrix("token_embd.weight", (vocab, hidden))
    for n in range(layers):
        p = f"blk.{n}."
        vector(p + "attn_norm.weight", hidden)
        matrix(p + "attn_q.weight", (heads * d, hidden))
        matrix(p + "attn_k.weight", (kv_heads * d, hidden))
        matrix(p + "attn_v.weight", (kv_heads * d, hidden))
        if arch == "qwen2":
            for kind, rows in (("q", heads * d), ("k", kv_heads * d), ("v", kv_heads * d)):
                vector(p + f"attn_{kind}.bias", rows, 0.0)
        if arch == "qwen3":
            vector(p + "attn_q_norm.weight", d)
            vector(p + "attn_k_norm.weight", d)
        matrix(p + "attn_output.weight", (hidden, heads * d))
        vector(p + "ffn_norm.weight", hidden)
        matrix(p + "ffn_gate.weight", (intermediate, hidden))
        matrix(p + "ffn_up.weight", (intermediate, hidden))
        matrix(p + "ffn_down.weight", (hidden, intermediate))
    vector("output_norm.weight", hidden)
    if not tied:
        matrix("output.weight", (vocab, hidden))
    return _finish(w, Path(out))


def add_tokenizer_metadata(w: gguf.GGUFWriter, meta: dict) -> None:
    """tokenizer.* keys (as a golden file holds them) in the value types llama.cpp's converter writes."""
    for key, value in meta.items():
        if isinstance(value, bool):
            w.add_bool(key, value)
        elif isinstance(value, int):
            w.add_uint32(key, value)
        elif isinstance(value, str):
            w.add_string(key, value)
        elif key == "tokenizer.ggml.scores":
            w.add_array(key, [float(v) for v in value])  # float32 in the file
        elif key == "tokenizer.ggml.token_type":
            w.add_token_types(value)
        else:
            w.add_array(key, value)


def gguf_dequantized(path: Path) -> dict[str, np.ndarray]:
    """Every tensor of a GGUF as gguf.quants.dequantize gives it (NumPy order), read by gguf's reader."""
    reader = gguf.GGUFReader(str(path))
    return {t.name: np.array(gguf.quants.dequantize(t.data, t.tensor_type), dtype=np.float32)
            for t in reader.tensors}


def find(data: bytes, needle: bytes, start: int = 0) -> int:
    at = data.find(needle, start)
    assert at >= 0, needle
    return at


"""Tiny random Whisper tensors by Hugging Face name, and Whisper's real vocabulary, for writing CTranslate2 and
whisper.cpp files in the tests (helpers/ct2_writer.py, helpers/ggml_writer.py) and reading them back."""
from __future__ import annotations

import gzip
import json
from typing import Any

import numpy as np
import pytest

from helpers.paths import ROOT
from nvllm.model.weights.whisper_hf_config import WhisperDims
from nvllm.text.whisper_vocab import BYTE_CHARS

PULLED = ROOT / "models" / "whisper-tiny.en"      # `nvllm models pull whisper-tiny.en`
TOKENIZER_GZ = ROOT / "models" / "whisper-tiny.en-tokenizer.json.gz"


def dims(vocab: int = 51864, mels: int = 80, d: int = 64, enc: int = 2, dec: int = 2, heads: int = 4,
         text_ctx: int = 448) -> WhisperDims:
    return WhisperDims(vocab_size=vocab, num_mel_bins=mels, d_model=d, encoder_layers=enc,
                       encoder_attention_heads=heads, decoder_layers=dec, decoder_attention_heads=heads,
                       encoder_ffn_dim=4 * d, decoder_ffn_dim=4 * d, max_source_positions=1500,
                       max_target_positions=text_ctx)


def tiny_tensors(x: WhisperDims, seed: int = 0) -> dict[str, np.ndarray]:
    """Every tensor of WhisperForConditionalGeneration at the sizes of `x`, random float32 (no proj_out: tied)."""
    rng = np.random.default_rng(seed)
    d, ffn = x.d_model, x.encoder_ffn_dim

    def normal(*shape: int) -> np.ndarray:
        return (rng.standard_normal(shape, dtype=np.float32) * np.float32(0.2)).astype(np.float32)

    t: dict[str, np.ndarray] = {}
    e, dec = "model.encoder.", "model.decoder."
    t[e + "conv1.weight"], t[e + "conv1.bias"] = normal(d, x.num_mel_bins, 3), normal(d)
    t[e + "conv2.weight"], t[e + "conv2.bias"] = normal(d, d, 3), normal(d)
    t[e + "embed_positions.weight"] = normal(x.max_source_positions, d)
    t[dec + "embed_tokens.weight"] = normal(x.vocab_size, d)
    t[dec + "embed_positions.weight"] = normal(x.max_target_positions, d)
    for name in (e + "layer_norm", dec + "layer_norm"):
        t[name + ".weight"], t[name + ".bias"] = 1 + normal(d), normal(d)
    for side, n_layers in ((e, x.encoder_layers), (dec, x.decoder_layers)):
        for n in range(n_layers):
            p = f"{side}layers.{n}."
            for a in ("self_attn",) + (("encoder_attn",) if side == dec else ()):
                t[f"{p}{a}_layer_norm.weight"], t[f"{p}{a}_layer_norm.bias"] = 1 + normal(d), normal(d)
                for proj in ("q", "k", "v", "out"):
                    t[f"{p}{a}.{proj}_proj.weight"] = normal(d, d)
                    if proj != "k":
                        t[f"{p}{a}.{proj}_proj.bias"] = normal(d)
            t[p + "final_layer_norm.weight"], t[p + "final_layer_norm.bias"] = 1 + normal(d), normal(d)
            t[p + "fc1.weight"], t[p + "fc1.bias"] = normal(ffn, d), normal(ffn)
            t[p + "fc2.weight"], t[p + "fc2.bias"] = normal(d, ffn), normal(d)
    return t


def en_tokenizer_json() -> dict[str, Any]:
    """tiny.en's tokenizer.json (faster-whisper's: no timestamp tokens), from the copy kept in models/ or the
    pulled folder; the test skips where neither is there."""
    if TOKENIZER_GZ.is_file():
        data = json.loads(gzip.decompress(TOKENIZER_GZ.read_bytes()))
    elif (PULLED / "tokenizer.json").is_file():
        data = json.loads((PULLED / "tokenizer.json").read_text(encoding="utf-8"))
    else:
        pytest.skip("no Whisper tokenizer.json here (nvllm models pull whisper-tiny.en)")
    data["added_tokens"] = [a for a in data["added_tokens"] if not a["content"][2:3].isdigit()]   # no timestamps
    return data


def bpe_bytes(tokenizer_json: dict[str, Any], multilingual: bool = False) -> list[bytes]:
    """The byte-level BPE tokens of a tokenizer.json as bytes, in id order, as whisper.cpp's converters write
    them (a multilingual vocabulary has one more, empty, at 50256)."""
    byte_of = {c: b for b, c in enumerate(BYTE_CHARS)}
    vocab = tokenizer_json["model"]["vocab"]
    tokens = [bytes(byte_of[c] for c in t) for t in sorted((t for t in vocab if vocab[t] < 50256), key=vocab.get)]
    return tokens + [b""] if multilingual else tokens

"""nvllm.model.weights.ggml_whisper: whisper.cpp ggml files (f32, f16, q8_0, q5_0, q5_1, q4_0, q4_1) read back as
the Hugging Face tensors they were written from, the blocks kept as the file has them; the tokenizer rebuilt
from the file's bytes equal to Hugging Face's; the English-only, multilingual and large-v3 vocabularies' special
tokens; the real tiny.en converted to ggml f16 read as its CTranslate2 folder reads; and the files refused."""
from __future__ import annotations

import dataclasses
import json
import struct
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from tokenizers import Tokenizer as Backend

from helpers.ggml_writer import blocks, ggml_bytes, openai_name, tensor_type, write_ggml_whisper
from helpers.whisper_tensors import PULLED, bpe_bytes, dims, en_tokenizer_json, tiny_tensors
from nvllm.model.config import ModelLoadError
from nvllm.model.quant.dequantize import dequantize
from nvllm.model.quant.formats import FORMATS
from nvllm.model.weights.ct2_whisper import read_ct2_whisper
from nvllm.model.weights.ggml_whisper import read_ggml_whisper
from nvllm.model.weights.gguf_weights import in_place_kernels
from nvllm.model.weights.layout import Parts
from nvllm.model.weights.mapped_tensors import FileTensors
from nvllm.model_files import registry

X = dims()
TEXTS = ["And so my fellow Americans, ask not what your country can do for you.",
         " ♪♪ -- (( 「ok」 ünïcödé 日本語 123456 don't", "  two  spaces\n\nand lines"]
BY_NAME = {f.name: f for f in FORMATS.values()}


@pytest.fixture(scope="module")
def tok_json() -> dict[str, Any]:
    return en_tokenizer_json()


@pytest.fixture(scope="module")
def tensors() -> dict[str, np.ndarray]:
    return tiny_tensors(X, seed=5)


def _stored(name: str, a: np.ndarray, weights: str) -> np.ndarray:
    """The values a tensor of the tiny model holds in a file of `weights`, as float32."""
    kind = tensor_type(openai_name(name), a.reshape(-1, 1) if name.endswith(("conv1.bias", "conv2.bias")) else a,
                       weights)
    if kind == "F32":
        return a
    if kind == "F16":
        return a.astype(np.float16).astype(np.float32)
    return dequantize(BY_NAME[kind], blocks(kind, a), a.shape)


@pytest.mark.parametrize("weights", ["F32", "F16", "Q8_0", "Q5_0", "Q5_1", "Q4_0", "Q4_1"])
def test_tiny_file_reads_back_its_tensors(tmp_path: Path, tensors, tok_json, weights: str):
    path = write_ggml_whisper(tmp_path / f"ggml-tiny-{weights}.bin", tensors, X, bpe_bytes(tok_json), weights)
    reader, config, tok = read_ggml_whisper(path)
    for name, a in tensors.items():
        np.testing.assert_array_equal(reader.array([(name, a.shape)]), _stored(name, a, weights), err_msg=name)
    q: Parts = [(f"model.encoder.layers.1.self_attn.{p}_proj.weight", (X.d_model, X.d_model)) for p in "qkv"]
    fused = reader.joined(q)
    np.testing.assert_array_equal(fused.dequantize(), reader.array(q))
    if in_place_kernels():     # the file's blocks are what the kernels multiply
        assert fused.formats == (weights,)
        assert reader.get("model.decoder.embed_tokens.weight", (X.vocab_size, X.d_model)).formats == (weights,)
    assert reader.get("model.encoder.conv1.bias", (X.d_model,)).shape == (X.d_model,)   # [d, 1] in the file
    assert "model.decoder.layers.0.encoder_attn.k_proj.bias" not in reader
    assert (config.vocab_size, config.d_model, config.encoder_layers, config.decoder_layers) == (51864, 64, 2, 2)
    assert (config.decoder_attention_heads, config.decoder_ffn_dim, config.max_target_positions) == (4, 256, 448)
    assert config.alignment_heads == ((1, 0), (1, 1), (1, 2), (1, 3)) and not config.is_multilingual
    assert tok.vocab_size == 51864
    reader.close()


def test_the_tokenizer_from_the_files_bytes_is_hugging_faces(tmp_path: Path, tensors, tok_json):
    """No merges in the file: they follow from the ranks, and give tokenizer.json's ids."""
    path = write_ggml_whisper(tmp_path / "ggml.bin", tensors, X, bpe_bytes(tok_json), "F16")
    _, config, tok = read_ggml_whisper(path)
    backend = Backend.from_str(json.dumps(tok_json))
    mine = tok.backend.get_vocab(with_added_tokens=True)
    assert all(mine[t] == i for t, i in backend.get_vocab(with_added_tokens=True).items())
    for text in TEXTS:
        assert tok.encode(text, add_special_tokens=False) == backend.encode(text, add_special_tokens=False).ids
        assert tok.encode(text) == backend.encode(text).ids
        assert tok.decode(tok.encode(text, add_special_tokens=False)) == text
    assert tok.id_to_token(50363) == "<|0.00|>" and tok.id_to_token(51863) == "<|30.00|>"
    assert config.suppress_tokens[-6:] == (50257, 50357, 50358, 50359, 50360, 50361)
    assert len(config.suppress_tokens) == 90 and config.begin_suppress_tokens == (220, 50256)


def test_hugging_faces_vocab_json_order_is_read_too(tmp_path: Path, tensors, tok_json):
    """convert-h5-to-ggml.py writes vocab.json, <|endoftext|> included, as the 50257th token."""
    path = write_ggml_whisper(tmp_path / "h5.bin", tensors, X, [*bpe_bytes(tok_json), b"<|endoftext|>"], "F16")
    _, _, tok = read_ggml_whisper(path)
    assert tok.vocab_size == 51864 and tok.id_to_token(50256) == "<|endoftext|>"


@pytest.mark.parametrize("vocab, mels, languages, nospeech", [(51865, 80, 99, "<|nocaptions|>"),
                                                              (51866, 128, 100, "<|nospeech|>")])
def test_multilingual_vocabularies_place_their_specials(tmp_path: Path, tok_json, vocab: int, mels: int,
                                                         languages: int, nospeech: str):
    x = dims(vocab=vocab, mels=mels, d=32, enc=1, dec=2, heads=2)
    path = write_ggml_whisper(tmp_path / "ml.bin", tiny_tensors(x, seed=6), x, bpe_bytes(tok_json, True), "Q8_0")
    reader, config, tok = read_ggml_whisper(path)
    notimestamps = 50257 + 1 + languages + 6
    assert config.is_multilingual and len(config.lang_ids) == languages and config.num_mel_bins == mels
    assert (config.eos_token_id, config.decoder_start_token_id, config.lang_ids["en"]) == (50257, 50258, 50259)
    assert config.no_timestamps_token_id == notimestamps and config.timestamp_begin == notimestamps + 1
    assert (config.translate_token_id, config.transcribe_token_id) == (notimestamps - 5, notimestamps - 4)
    assert config.prev_sot_token_id == notimestamps - 2 and config.no_speech_token_id == notimestamps - 1
    assert tok.id_to_token(notimestamps - 1) == nospeech and tok.id_to_token(50259) == "<|en|>"
    assert ("yue" in config.lang_ids) == (languages == 100)
    assert tok.vocab_size == vocab and tok.id_to_token(vocab - 1) == "<|30.00|>"
    assert tok.decode([50258, 50259, notimestamps - 4, *tok.encode(" Hi", add_special_tokens=False)]) == " Hi"
    reader.close()


def test_the_real_tiny_en_as_ggml_reads_as_its_ctranslate2_folder(tmp_path: Path):
    if not registry.is_complete("whisper-tiny.en", PULLED):
        pytest.skip("whisper-tiny.en is not pulled (nvllm models pull whisper-tiny.en)")
    ct2, c_config, c_tok = read_ct2_whisper(PULLED)
    assert isinstance(ct2, FileTensors)
    real = {name: ct2.array([(name, shape)]) for name, (_, _, shape) in ct2.file.tensors.items()}
    ct2.close()
    x = dims(vocab=51864, d=384, enc=4, dec=4, heads=6)
    vocab = bpe_bytes(json.loads((PULLED / "tokenizer.json").read_text(encoding="utf-8")))
    path = write_ggml_whisper(tmp_path / "ggml-tiny.en.bin", real, x, vocab, "F16")
    ggml, g_config, g_tok = read_ggml_whisper(path)
    for name, a in real.items():
        np.testing.assert_array_equal(ggml.array([(name, a.shape)]), a, err_msg=name)
    ggml.close()
    # the same config but the alignment heads, which a ggml file does not carry
    assert g_config == dataclasses.replace(c_config, alignment_heads=g_config.alignment_heads)
    assert g_tok.backend.get_vocab(with_added_tokens=True) == c_tok.backend.get_vocab(with_added_tokens=True)
    for text in TEXTS:
        assert g_tok.encode(text) == c_tok.encode(text)


# ---------------------------------------------------------------- refused


def _int32(data: bytes, at: int, value: int) -> bytes:
    return data[:at] + struct.pack("<i", value) + data[at + 4:]


REFUSED = {
    "bad magic": (lambda b, t, v: b"GGUF" + b[4:], r"not a whisper.cpp model \(magic 0x46554747"),
    "no tensors": (lambda b, t, v: ggml_bytes({}, X, v), r"holds no tensors"),
    "unknown tensor": (lambda b, t, v: b + ggml_bytes({"model.decoder.proj.weight": np.zeros((4, 64), np.float32)},
                                                      X, v)[len(ggml_bytes({}, X, v)):],
                       r"unknown tensor 'decoder.proj.weight'"),
    "missing tensor": (lambda b, t, v: ggml_bytes({k: a for k, a in t.items() if "layers.1.fc2.bias" not in k}, X, v),
                       r"tensor 'encoder.blocks.1.mlp.2.bias' is missing"),
    "wrong shape": (lambda b, t, v: _int32(b, 4 + 5 * 4, 100), r"tensor 'decoder.positional_embedding' has shape "
                                                                r"\[448, 64\], expected \[100, 64\]"),
    "not whisper's vocabulary": (lambda b, t, v: _int32(b, 4, 52000), r"a vocabulary of 52000 tokens is no Whisper"),
    "states differ": (lambda b, t, v: _int32(b, 4 + 6 * 4, 32), r"n_text_state 32 differs from n_audio_state 64"),
    "short vocabulary": (lambda b, t, v: ggml_bytes(t, X, v[:-1]), r"50255 BPE tokens, but a 51864-token Whisper"),
    "repeated token": (lambda b, t, v: ggml_bytes(t, X, [*v[:-1], v[300]]), r"token 50255 repeats token 300"),
    "old block layout": (lambda b, t, v: ggml_bytes(t, X, v, "Q5_0", qnt_version=1),
                         r"is Q5_0 in ggml's block layout version 1 \(ftype 1008\); nvllm reads version 2"),
}


@pytest.mark.parametrize("case", sorted(REFUSED))
def test_refused_with_the_reason(tmp_path: Path, tensors, tok_json, case: str):
    vocab = bpe_bytes(tok_json)
    make, message = REFUSED[case]
    path = tmp_path / "bad.bin"
    path.write_bytes(make(ggml_bytes(tensors, X, vocab), tensors, vocab))
    with pytest.raises(ModelLoadError, match=message) as e:
        read_ggml_whisper(path)
    assert str(e.value).startswith(f"{path}: ") and "\n" not in str(e.value)

"""nvllm.model.weights.ct2_whisper: a CTranslate2 Whisper folder read back as the Hugging Face tensors it was
made from (float32, float16 kept float16, int8 kept as Q8_0 blocks), its WhisperConfig and tokenizer; the
real tiny.en the pull keeps; and the folders it refuses, with the reason."""
from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from tokenizers import Tokenizer as Backend

from helpers.ct2_writer import ct2_variables, model_bin, quantized, write_ct2_whisper
from helpers.whisper_tensors import PULLED, dims, en_tokenizer_json, tiny_tensors
from nvllm.model.config import ModelLoadError
from nvllm.model.weights.ct2_whisper import read_ct2_whisper
from nvllm.model.weights.gguf_weights import in_place_kernels
from nvllm.model.weights.layout import Parts
from nvllm.model_files import registry

X = dims()
TEXTS = ["And so my fellow Americans, ask not what your country can do for you.",
         " ♪♪ -- (( 「ok」 ünïcödé 日本語 123456 don't", "  two  spaces\n\nand lines"]
# tiny.en's suppress table (its CTranslate2 config.json), which openai-whisper derives from the tokenizer
TINY_EN_SUPPRESS = [1, 2, 7, 8, 9, 10, 14, 25, 26, 27, 28, 29, 31, 58, 59, 60, 61, 62, 63, 90, 91, 92, 93, 357, 366,
                    438, 532, 685, 705, 796, 930, 1058, 1220, 1267, 1279, 1303, 1343, 1377, 1391, 1635, 1782, 1875,
                    2162, 2361, 2488, 3467, 4008, 4211, 4600, 4808, 5299, 5855, 6329, 7203, 9609, 9959, 10563, 10786,
                    11420, 11709, 11907, 13163, 13697, 13700, 14808, 15306, 16410, 16791, 17992, 19203, 19510, 20724,
                    22305, 22935, 27007, 30109, 30420, 33409, 34949, 40283, 40493, 40549, 47282, 49146, 50257, 50357,
                    50358, 50359, 50360, 50361]
CT2_CONFIG = {"suppress_ids": [1, 2, 50257], "suppress_ids_begin": [220, 50256], "lang_ids": [],
              "alignment_heads": [[1, 0], [1, 3]]}


@pytest.fixture(scope="module")
def tok_json() -> dict[str, Any]:
    return en_tokenizer_json()


@pytest.fixture(scope="module")
def tensors() -> dict[str, np.ndarray]:
    return tiny_tensors(X, seed=3)


def _expected(name: str, a: np.ndarray, dtype: str, v: dict[str, np.ndarray]) -> np.ndarray:
    """What the reader must give for a tensor written as `dtype` (int8: the writer's int8 over its scale)."""
    if dtype == "float32":
        return a
    return a.astype(np.float16).astype(np.float32)


@pytest.mark.parametrize("dtype", ["float32", "float16", "int8"])
def test_tiny_folder_reads_back_its_tensors(tmp_path: Path, tensors, tok_json, dtype: str):
    folder = write_ct2_whisper(tmp_path / dtype, tensors, X, tok_json, dtype, CT2_CONFIG)
    reader, config, tok = read_ct2_whisper(folder)
    int8 = quantized(ct2_variables(tensors, X), "int8")
    for name, a in tensors.items():
        got = reader.array([(name, a.shape)])
        assert got.dtype == np.float32 and got.shape == a.shape, name
        if dtype == "int8" and name.endswith("weight") and a.ndim > 1 and "layer_norm" not in name:
            close = np.abs(got - a) <= np.abs(a).max(axis=tuple(range(1, a.ndim)), keepdims=True) / 127 * 0.5001 + 1e-3
            assert close.all(), name     # int8's rounding (half a step) and Q8_0's float16 scale
        else:
            np.testing.assert_array_equal(got, _expected(name, a, dtype, int8), err_msg=name)
    q: Parts = [(f"model.decoder.layers.1.self_attn.{p}_proj.weight", (X.d_model, X.d_model)) for p in "qkv"]
    fused = reader.joined(q)
    np.testing.assert_array_equal(fused.dequantize(), reader.array(q))
    if in_place_kernels():   # the file's storage is kept: F16 as F16, int8 as Q8_0 blocks
        assert fused.formats == {"float32": ("F32",), "float16": ("F16",), "int8": ("Q8_0",)}[dtype]
    assert "model.encoder.layers.0.self_attn.k_proj.bias" not in reader   # Whisper's k has no bias
    assert "model.encoder.layers.0.self_attn.v_proj.bias" in reader
    assert (config.vocab_size, config.d_model, config.encoder_layers, config.decoder_layers) == (51864, 64, 2, 2)
    assert (config.encoder_attention_heads, config.encoder_ffn_dim, config.num_mel_bins) == (4, 256, 80)
    assert config.suppress_tokens == (1, 2, 50257) and config.begin_suppress_tokens == (220, 50256)
    assert config.alignment_heads == ((1, 0), (1, 3)) and not config.is_multilingual and config.lang_ids == {}
    assert (config.decoder_start_token_id, config.eos_token_id, config.no_timestamps_token_id) == (50257, 50256, 50362)
    assert tok.vocab_size == 51864
    reader.close()


def test_the_tokenizer_is_tokenizer_json_with_the_timestamps(tmp_path: Path, tensors, tok_json):
    folder = write_ct2_whisper(tmp_path / "f", tensors, X, tok_json, "float16", CT2_CONFIG)
    _, _, tok = read_ct2_whisper(folder)
    backend = Backend.from_str(json.dumps(tok_json))
    for text in TEXTS:
        assert tok.encode(text, add_special_tokens=False) == backend.encode(text, add_special_tokens=False).ids
        assert tok.encode(text) == backend.encode(text).ids           # <|startoftranscript|><|notimestamps|>..
    assert [tok.id_to_token(i) for i in (50256, 50257, 50362, 50363, 50364, 51863)] == [
        "<|endoftext|>", "<|startoftranscript|>", "<|notimestamps|>", "<|0.00|>", "<|0.02|>", "<|30.00|>"]
    ids = tok.encode(" Hello", add_special_tokens=False)
    assert tok.decode([50257, 50362, *ids, 50256]) == " Hello"
    assert tok.eos_token_id == 50256


def test_vocabulary_txt_stands_in_for_tokenizer_json(tmp_path: Path, tensors, tok_json):
    with_json = write_ct2_whisper(tmp_path / "a", tensors, X, tok_json, "float16", CT2_CONFIG)
    _, _, reference = read_ct2_whisper(with_json)
    folder = write_ct2_whisper(tmp_path / "b", tensors, X, None, "float16", CT2_CONFIG)
    lines = [reference.id_to_token(i) or "" for i in range(X.vocab_size)]   # what CTranslate2's converter writes
    (folder / "vocabulary.txt").write_text("\n".join(lines) + "\n", encoding="utf-8")
    _, _, tok = read_ct2_whisper(folder)
    assert tok.backend.get_vocab(with_added_tokens=True) == reference.backend.get_vocab(with_added_tokens=True)
    for text in TEXTS:
        assert tok.encode(text, add_special_tokens=False) == reference.encode(text, add_special_tokens=False)


def test_tables_config_json_lacks_are_openai_whispers(tmp_path: Path, tensors, tok_json):
    folder = write_ct2_whisper(tmp_path / "f", tensors, X, tok_json, "float16", {})
    _, config, _ = read_ct2_whisper(folder)
    assert list(config.suppress_tokens) == TINY_EN_SUPPRESS
    assert config.begin_suppress_tokens == (220, 50256)
    assert config.alignment_heads == ((1, 0), (1, 1), (1, 2), (1, 3))   # the decoder's second half


def test_the_layout_takes_the_reader(tmp_path: Path, tensors, tok_json):
    layout = pytest.importorskip("nvllm.model.weights.whisper_layout")
    folder = write_ct2_whisper(tmp_path / "f", tensors, X, tok_json, "float16", CT2_CONFIG)
    reader, config, _ = read_ct2_whisper(folder)
    w = layout.lay_out_whisper(reader, config, str(folder))
    reader.close()
    d = X.d_model
    assert w.encoder_layers[1].attn.qkv.shape == (3 * d, d) and w.decoder_layers[0].cross.kv.shape == (2 * d, d)
    np.testing.assert_array_equal(w.decoder_positions, tensors["model.decoder.embed_positions.weight"]
                                  .astype(np.float16).astype(np.float32))


@pytest.fixture(scope="module")
def real() -> Path:
    if not registry.is_complete("whisper-tiny.en", PULLED):
        pytest.skip("whisper-tiny.en is not pulled (nvllm models pull whisper-tiny.en)")
    return PULLED


def test_real_tiny_en(real: Path):
    reader, config, tok = read_ct2_whisper(real)
    assert (config.vocab_size, config.d_model, config.encoder_layers, config.decoder_layers) == (51864, 384, 4, 4)
    assert (config.encoder_attention_heads, config.decoder_ffn_dim, config.max_target_positions) == (6, 1536, 448)
    ct2 = json.loads((real / "config.json").read_text())
    assert list(config.suppress_tokens) == ct2["suppress_ids"] == TINY_EN_SUPPRESS
    assert list(config.begin_suppress_tokens) == ct2["suppress_ids_begin"]
    assert [list(p) for p in config.alignment_heads] == ct2["alignment_heads"]
    assert not config.is_multilingual and config.lang_ids == {}
    backend = Backend.from_file(str(real / "tokenizer.json"))
    for text in TEXTS:
        assert tok.encode(text, add_special_tokens=False) == backend.encode(text, add_special_tokens=False).ids
    assert tok.vocab_size == 51864 and tok.id_to_token(51863) == "<|30.00|>"
    embed = reader.get("model.decoder.embed_tokens.weight", (51864, 384))
    if in_place_kernels():
        assert embed.formats == ("F16",)      # used as stored
    conv = reader.get("model.encoder.conv1.weight", (384, 80, 3))
    assert conv.dtype == np.float32 and np.isfinite(conv).all() and 0.01 < np.abs(conv).mean() < 1
    reader.close()


# ---------------------------------------------------------------- refused


def _folder_with(tmp_path: Path, tensors, tok_json, change) -> Path:
    """A float16 folder whose variables (name -> array) and aliases `change(v, aliases)` edits first."""
    folder = write_ct2_whisper(tmp_path / "bad", tensors, X, tok_json, "float16", CT2_CONFIG)
    v = quantized(ct2_variables(tensors, X), "float16")
    aliases = {"decoder/projection/weight": "decoder/embeddings/weight"}
    spec = change(v, aliases)
    spec = spec if isinstance(spec, dict) else {}   # the lambdas that edit return what they edit
    (folder / "model.bin").write_bytes(model_bin(v, aliases, **spec))
    return folder


REFUSED = {
    "not whisper": (lambda v, a: {"spec": "TransformerDecoderModelSpec"},
                    r"spec 'TransformerDecoderModelSpec' is not "),
    "newer revision": (lambda v, a: {"revision": 4}, r"WhisperSpec revision 4 is newer than nvllm reads \(3\)"),
    "scaled embeddings": (lambda v, a: v.update({"decoder/scale_embeddings": np.array(1, np.int8)}),
                          r"decoder/scale_embeddings is 1, Whisper's is 0"),
    "relu": (lambda v, a: v.update({"decoder/activation": np.array(0, np.int8)}), r"decoder/activation is 0"),
    "untied": (lambda v, a: (a.clear(), v.update({"decoder/projection/weight": v["decoder/embeddings/weight"] * 2})),
               r"decoder/projection/weight is not the token embeddings"),
    "missing": (lambda v, a: v.pop("decoder/layer_1/ffn/linear_1/bias"),
                r"variable 'decoder/layer_1/ffn/linear_1/bias' is missing"),
    "layer gap": (lambda v, a: v.update({"encoder/layer_7/ffn/linear_0/bias": np.zeros(4, np.float16)}),
                  r"the encoder's layers are numbered \[0, 1, 7\]"),
    "wrong fused rows": (lambda v, a: v.update({"encoder/layer_0/self_attention/linear_0/weight":
                                                np.zeros((64, 64), np.float16)}),
                         r"encoder/layer_0/self_attention/linear_0 has shape \[64, 64\]"),
    "int32 weight": (lambda v, a: v.update({"encoder/conv2/weight": np.zeros((64, 64, 3), np.int32)}),
                     r"variable 'encoder/conv2/weight' is int32 \[64, 64, 3\], not a weight"),
    "int8 without scale": (lambda v, a: v.update({"encoder/conv2/weight": np.zeros((64, 64, 3), np.int8)}),
                           r"'encoder/conv2/weight' is int8 but 'encoder/conv2/weight_scale' is missing"),
}


@pytest.mark.parametrize("case", sorted(REFUSED))
def test_refused_with_the_reason(tmp_path: Path, tensors, tok_json, case: str):
    change, message = REFUSED[case]
    folder = _folder_with(tmp_path, tensors, tok_json, change)
    with pytest.raises(ModelLoadError, match=message) as e:
        reader, _, _ = read_ct2_whisper(folder)
        layout = pytest.importorskip("nvllm.model.weights.whisper_layout")
        layout.lay_out_whisper(reader, _, str(folder))   # shapes are checked where the layout asks
    assert "\n" not in str(e.value) and str(folder) in str(e.value)


def test_a_folder_without_a_tokenizer_is_refused(tmp_path: Path, tensors, tok_json):
    folder = write_ct2_whisper(tmp_path / "f", tensors, X, None, "float16", CT2_CONFIG)
    with pytest.raises(ModelLoadError, match=r"neither tokenizer.json nor vocabulary.txt"):
        read_ct2_whisper(folder)
    cut = dict(tok_json, added_tokens=[a for a in tok_json["added_tokens"] if a["content"] != "<|notimestamps|>"])
    (folder / "tokenizer.json").write_text(json.dumps(cut), encoding="utf-8")
    with pytest.raises(ModelLoadError, match=r"tokenizer.json: the token <\|notimestamps\|> is missing"):
        read_ct2_whisper(folder)
    shutil.rmtree(folder)
    with pytest.raises(ModelLoadError, match=r"model.bin: cannot read"):
        read_ct2_whisper(folder)

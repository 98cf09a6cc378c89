"""Whisper's files: which kind a path is, the Hugging Face folder read into the layout (F16 kept, quantization at
load, the positions as float32), the tokenizer completed with the timestamps, and broken folders refused with
the file and tensor named."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

from nvllm.model.config import ModelLoadError
from nvllm.model.kernels import matmul
from nvllm.model.weights.whisper_files import is_whisper, read_whisper, whisper_kind
from nvllm.model.weights.whisper_layout import whisper_tensor_names
from nvllm.model.whisper import load_whisper


def copy(folder: Path, tmp_path: Path) -> Path:
    out = tmp_path / folder.name
    shutil.copytree(folder, out)
    return out


def test_kinds(tiny_whispers: dict[str, Path], tmp_path: Path) -> None:
    assert whisper_kind(tiny_whispers["tiny-whisper"]) == "hf" and is_whisper(tiny_whispers["tiny-whisper-multi"])
    ct2 = tmp_path / "ct2"
    ct2.mkdir()
    (ct2 / "model.bin").write_bytes(b"\0" * 16)
    (ct2 / "config.json").write_text(json.dumps({"suppress_ids": [1], "lang_ids": []}))
    assert whisper_kind(ct2) == "ct2"
    ggml = tmp_path / "ggml-tiny.en.bin"
    ggml.write_bytes(b"lmgg" + b"\0" * 60)
    assert whisper_kind(ggml) == "ggml"
    gguf = tmp_path / "model.gguf"
    gguf.write_bytes(b"GGUF" + b"\0" * 60)
    llm = tmp_path / "llm"
    llm.mkdir()
    (llm / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLM"], "model_type": "llama"}))
    for path in (gguf, llm, tmp_path / "missing", ct2 / "config.json"):
        assert not is_whisper(path), path
    with pytest.raises(ModelLoadError, match="not a Whisper model"):
        load_whisper(llm)


def test_the_folder_is_read_as_stored(tiny_whispers: dict[str, Path]) -> None:
    f32, tok = load_whisper(tiny_whispers["tiny-whisper"], quantization="f32")
    f16, _ = load_whisper(tiny_whispers["tiny-whisper-f16"])
    w, h = f32.weights, f16.weights
    assert w.embed.formats == ("F32",) and w.conv1.formats == ("F32",)
    if matmul.lib is not None:   # 16-bit matrices kept so where the kernels multiply them
        assert h.embed.formats == ("F16",) and h.conv1.formats == ("F16",) and h.conv2.formats == ("F16",)
        assert h.decoder_layers[1].cross.kv.formats == ("F16",)
        assert h.nbytes < 0.6 * w.nbytes
    assert w.conv1.shape == (64, 3 * 80) and w.conv2.shape == (64, 3 * 64)
    assert w.encoder_positions.dtype == np.float32 and w.encoder_positions.shape == (1500, 64)
    assert h.decoder_positions.dtype == np.float32 and h.decoder_positions.shape == (448, 64)
    # q|k|v fused, k with a zero bias; the cross-attention's k|v likewise
    a = w.decoder_layers[0]
    assert a.attn.qkv.shape == (192, 64) and not a.attn.qkv_bias[64:128].any() and a.attn.qkv_bias[:64].any()
    assert a.cross.kv.shape == (128, 64) and not a.cross.kv_bias[:64].any()
    assert tok.vocab_size == 51864 and tok.id_to_token(50363) == "<|0.00|>" and tok.id_to_token(51863) == "<|30.00|>"


def test_quantization_leaves_positions_and_convolutions(tiny_whispers: dict[str, Path]) -> None:
    q, _ = load_whisper(tiny_whispers["tiny-whisper-multi"], quantization="q8_0")
    ref, _ = load_whisper(tiny_whispers["tiny-whisper-multi"])
    w = q.weights
    assert w.embed.formats == ("Q8_0",) and w.encoder_layers[2].ffn.fc2.formats == ("Q8_0",)
    assert w.conv1.formats == ("F32",)
    assert np.array_equal(w.decoder_positions, ref.weights.decoder_positions)
    assert np.array_equal(w.encoder_positions, ref.weights.encoder_positions)


def test_tensor_names_are_the_checkpoints(tiny_whispers: dict[str, Path]) -> None:
    folder = tiny_whispers["tiny-whisper-multi"]
    model, _ = load_whisper(folder)
    stored = {k: v.shape for k, v in load_file(folder / "model.safetensors").items()}
    assert stored == whisper_tensor_names(model.config)


def test_a_tokenizer_without_timestamps_gets_them(tiny_whispers: dict[str, Path], tmp_path: Path) -> None:
    folder = copy(tiny_whispers["tiny-whisper-multi"], tmp_path)
    tok = json.loads((folder / "tokenizer.json").read_text())
    tok["added_tokens"] = [a for a in tok["added_tokens"] if a["id"] < 50364]
    (folder / "tokenizer.json").write_text(json.dumps(tok))
    _, _, tokenizer = read_whisper(folder)
    assert tokenizer.vocab_size == 51865 and tokenizer.id_to_token(50364) == "<|0.00|>"
    assert tokenizer.decode([50364, 1318, 51864], skip_special_tokens=True) == tokenizer.decode([1318])
    tok["added_tokens"] = tok["added_tokens"][:-3]   # neither the model's size nor the one before the timestamps
    (folder / "tokenizer.json").write_text(json.dumps(tok))
    with pytest.raises(ModelLoadError, match="tokens"):
        read_whisper(folder)


def test_without_generation_config_the_languages_come_from_the_tokenizer(tiny_whispers: dict[str, Path],
                                                                         tmp_path: Path) -> None:
    folder = copy(tiny_whispers["tiny-whisper-v3"], tmp_path)
    (folder / "generation_config.json").unlink()
    config, _, _ = read_whisper(folder)
    assert config.is_multilingual and len(config.lang_ids) == 100
    assert config.lang_ids["en"] == 50259 and config.lang_ids["yue"] == 50358
    assert config.no_speech_token_id == 50363 and config.transcribe_token_id == 50360


def test_broken_folders_are_refused(tiny_whispers: dict[str, Path], tmp_path: Path) -> None:
    folder = copy(tiny_whispers["tiny-whisper"], tmp_path)
    tensors = load_file(folder / "model.safetensors")
    name = "model.decoder.layers.1.encoder_attn.v_proj.bias"
    save_file({k: v for k, v in tensors.items() if k != name}, str(folder / "model.safetensors"))
    with pytest.raises(ModelLoadError, match="v_proj.bias' is missing"):
        load_whisper(folder)
    tensors["model.encoder.conv1.weight"] = tensors["model.encoder.conv1.weight"][:, :40]
    save_file(tensors, str(folder / "model.safetensors"))
    with pytest.raises(ModelLoadError, match=r"conv1.weight' has shape \[64, 40, 3\], expected \[64, 80, 3\]"):
        load_whisper(folder)
    (folder / "pytorch_model.bin").write_bytes(b"not opened")
    with pytest.raises(ModelLoadError, match="pickle checkpoints are never opened"):
        load_whisper(folder)
    (folder / "pytorch_model.bin").unlink()
    (folder / "config.json").write_text(json.dumps({**json.loads((folder / "config.json").read_text()),
                                                    "encoder_layers": 10 ** 6}))
    with pytest.raises(ModelLoadError, match="encoder_layers 1000000"):
        load_whisper(folder)

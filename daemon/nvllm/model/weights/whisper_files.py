"""Whisper's files -> (WhisperConfig, WhisperWeights, Tokenizer): which kind a path is, and the Hugging Face folder's
reader. Three kinds of files hold Whisper, each read into the same layout (whisper_layout.py) by the tensors'
Hugging Face names:
  a Hugging Face folder  config.json (+ generation_config.json), model.safetensors, tokenizer.json (here)
  a CTranslate2 folder   model.bin, config.json, tokenizer.json (faster-whisper's; weights/ct2_whisper.py)
  a whisper.cpp file     one ggml .bin: its header, mel filters, vocabulary and tensors (weights/ggml_whisper.py)
The forward pass (model/whisper.py's load_whisper) is built over what read_whisper returns.
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
from tokenizers import AddedToken
from tokenizers import Tokenizer as Backend

from nvllm.model.config import ModelLoadError, read_json
from nvllm.model.matrix.weight import Weight
from nvllm.model.weights.conversion import matrix_rule
from nvllm.model.weights.folder import _safetensors_files, _Tensors, check_folder
from nvllm.model.weights.layout import TensorReader
from nvllm.model.weights.whisper_layout import WhisperWeights, lay_out_whisper
from nvllm.model.whisper_config import ARCHITECTURE, SECONDS_PER_TIMESTAMP, TIMESTAMPS, WhisperConfig
from nvllm.text.tokenizer import Tokenizer

GGML_MAGIC = b"lmgg"   # whisper.cpp's 0x67676d6c, little-endian
# config.json keys a CTranslate2 Whisper folder has (and its LLM folders do not)
_CT2_KEYS = ("suppress_ids", "suppress_ids_begin", "lang_ids", "alignment_heads")


def _json(path: Path) -> dict[str, Any] | None:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def whisper_kind(path: Path) -> str:
    """"hf", "ct2" or "ggml" for a path that holds Whisper; "" for anything else."""
    path = Path(path)
    if path.is_file():
        try:
            with open(path, "rb") as f:
                return "ggml" if f.read(4) == GGML_MAGIC else ""
        except OSError:
            return ""
    if not path.is_dir():
        return ""
    cfg = _json(path / "config.json") or {}
    archs = cfg.get("architectures")
    if cfg.get("model_type") == "whisper" or (isinstance(archs, list) and archs[:1] == [ARCHITECTURE]):
        return "hf"
    if (path / "model.bin").is_file() and any(k in cfg for k in _CT2_KEYS):
        return "ct2"
    return ""


def is_whisper(path: Path) -> bool:
    return whisper_kind(path) != ""


def read_whisper(path: Path, quantization: str | None = None) -> tuple[WhisperConfig, WhisperWeights, Tokenizer]:
    """The config, the weights laid out and the tokenizer of any kind of Whisper file. quantization is
    model.quantization ("" or None: as stored, 16-bit matrices kept in their 16 bits; "f32"; q8_0, q4_k, ...)."""
    path, q = Path(path), quantization or ""
    kind = whisper_kind(path)
    reader: TensorReader
    if kind == "hf":
        reader, config, tokenizer = _read_folder(path, q)
    elif kind == "ct2":
        from nvllm.model.weights.ct2_whisper import read_ct2_whisper
        reader, config, tokenizer = read_ct2_whisper(path, q)
    elif kind == "ggml":
        from nvllm.model.weights.ggml_whisper import read_ggml_whisper
        reader, config, tokenizer = read_ggml_whisper(path, q)
    else:
        raise ModelLoadError(f"{path}: not a Whisper model (a Hugging Face folder with a Whisper config.json, a "
                             f"CTranslate2 folder with model.bin, or a whisper.cpp ggml .bin file)")
    try:
        weights = lay_out_whisper(reader, config, str(path))
    finally:
        close = getattr(reader, "close", None)
        if close is not None:
            close()
    if tokenizer.vocab_size != config.vocab_size:
        raise ModelLoadError(f"{path}: the tokenizer has {tokenizer.vocab_size} tokens, the model {config.vocab_size}")
    return with_languages(config, tokenizer), weights, tokenizer


def _read_folder(folder: Path, quantization: str) -> tuple[TensorReader, WhisperConfig, Tokenizer]:
    """A Hugging Face folder: only JSON and safetensors are read (a pickle checkpoint beside them is refused, as
    for every folder); matrices converted for quantization as the LLM's folders are, the position tables left as
    stored (they are read once into float32)."""
    check_folder(folder)
    gen_path = folder / "generation_config.json"
    generation = read_json(gen_path) if gen_path.is_file() else None
    config = WhisperConfig.from_hf(read_json(folder / "config.json"), generation, str(folder / "config.json"))
    rule = matrix_rule(quantization)

    def matrix(w: np.ndarray, name: str, dtypes: set[str]) -> Weight | None:
        return None if rule is None or "embed_positions" in name else rule(w, name, dtypes)

    try:
        tokenizer = Tokenizer.from_dir(folder)
    except (OSError, ValueError) as e:
        raise ModelLoadError(f"{folder}: the tokenizer: {e}") from None
    return _Tensors(_safetensors_files(folder), folder, matrix), config, complete_tokenizer(tokenizer, config)


def timestamp_tokens() -> list[str]:
    return [f"<|{i * SECONDS_PER_TIMESTAMP:.2f}|>" for i in range(TIMESTAMPS)]


def with_timestamp_tokens(backend: Backend, config: WhisperConfig, where: str = "tokenizer.json") -> None:
    """Add the 1501 timestamp tokens to a tokenizer that stops at <|notimestamps|> (CTranslate2's and older
    Hugging Face tokenizer.json files), as special added tokens (decode(skip_special_tokens=True) drops them, as
    the CTranslate2 and ggml readers' tokenizers do); a tokenizer that has them already is left as it is (Hugging
    Face's whisper tokenizer.json files hold them as tokens that are not special: their text is decoded)."""
    n = backend.get_vocab_size(with_added_tokens=True)
    if n == config.vocab_size:
        return
    if n != config.timestamp_begin:
        raise ModelLoadError(f"{where}: {n} tokens, neither the model's {config.vocab_size} nor the "
                             f"{config.timestamp_begin} before its timestamps")
    backend.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in timestamp_tokens()])


def complete_tokenizer(tokenizer: Tokenizer, config: WhisperConfig) -> Tokenizer:
    """tokenizer, or the same with the timestamp tokens added where its file lacks them."""
    if tokenizer.vocab_size == config.vocab_size:
        return tokenizer
    backend = tokenizer.backend
    with_timestamp_tokens(backend, config, tokenizer.source)
    return Tokenizer(backend, special_tokens=tokenizer.special_tokens, chat_template=None, source=tokenizer.source)


def with_languages(config: WhisperConfig, tokenizer: Tokenizer) -> WhisperConfig:
    """A multilingual config without lang_to_id (no generation_config.json) gets its languages from the tokens
    between <|startoftranscript|> and <|translate|>, each <|code|>."""
    if not config.is_multilingual or config.lang_ids:
        return config
    langs = {}
    for i in range(config.decoder_start_token_id + 1, config.translate_token_id):
        token = tokenizer.id_to_token(i) or ""
        if token.startswith("<|") and token.endswith("|>"):
            langs[token[2:-2]] = i
    return replace(config, lang_ids=langs)

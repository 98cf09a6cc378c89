"""Loading a speech model (Whisper: a Hugging Face folder, a CTranslate2 folder or a whisper.cpp .bin) for the
factory: its weights and tokenizer, what sizing may know of it, and the settings it runs with.

Its page pool holds the decoder's self-attention keys and values, a window's prompt and tokens at most (448
positions) per seat; beside the pool, each running window holds its cross-attention keys and values
(2 x decoder layers x 1500 x d_model float32), computed once when the window starts and dropped when it ends:
the memory plan counts a seat's worth for every seat, so that the budget holds them whether or not they are
in use."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from nvllm.config import Settings
from nvllm.engine.assembly.model_info import ModelInfo
from nvllm.model.kv_cache import KVCache
from nvllm.model.quant.kv_format import F32
from nvllm.model.weights.whisper_files import is_whisper
from nvllm.model.whisper import load_whisper
from nvllm.model.whisper_config import WhisperConfig
from nvllm.text.tokenizer import Tokenizer

TASK = "transcribe"


def is_speech(path: Path) -> bool:
    """Whether the path holds a Whisper model in any of the layouts read (checked by its files, not loaded)."""
    return is_whisper(path)


def load_speech(settings: Settings, path: Path, quantization: str) -> tuple[Any, Tokenizer, ModelInfo]:
    """(the Whisper model, its tokenizer, its ModelInfo); ValueError naming a setting it cannot honour."""
    whisper, tokenizer = load_whisper(path, quantization or None)
    words = f"{quantization} (model.quantization)" if quantization else "stored"
    info = speech_info(path, whisper.config, whisper.weights.nbytes, words, settings.scheduler.max_num_seqs)
    check_settings(settings, info)
    return whisper, tokenizer, info


def cross_bytes_per_seat(c: WhisperConfig) -> int:
    """A running window's cross-attention keys and values: every decoder layer's, over the encoder's frames."""
    return 2 * c.decoder_layers * c.max_source_positions * c.d_model * 4


def speech_info(path: Path, c: WhisperConfig, weight_bytes: int, weight_format: str, seats: int) -> ModelInfo:
    """A Whisper model as sizing sees it: the decoder's layers in the pool (float32 keys and values, as the
    reference computes them), every seat's cross-attention beside it."""
    hd = c.decoder_head_dim
    info = ModelInfo(path, c.architecture, c.decoder_layers, c.num_params, c.vocab_size, c.d_model,
                     c.max_target_positions, weight_bytes, KVCache.bytes_per_block(c.decoder_layers, 1,
                                                                                  c.decoder_attention_heads, hd, F32),
                     weight_format, weight_bytes, F32, c.decoder_attention_heads, hd, task=TASK)
    return dataclasses.replace(info, cross_bytes=seats * cross_bytes_per_seat(c))


def check_settings(settings: Settings, info: ModelInfo) -> None:
    """ValueError naming a setting a speech model cannot honour."""
    task = settings.model.task
    if task not in ("auto", TASK):
        raise ValueError(f"model.task={task!r}, but {info.architecture} is a speech model (task {TASK!r})")
    for name, on in (("speculative.method", settings.speculative.method != "none"),
                     ("cache.pinned_prompts", bool(settings.cache.pinned_prompts)),
                     ("cache.persist_dir", bool(settings.cache.persist_dir))):
        if on:
            raise ValueError(f"{name} is for models that generate text; {info.architecture} is a speech model")


def settings_for(settings: Settings, info: ModelInfo) -> Settings:
    """A window's decoder sees at most its 448 positions, and no page is worth caching: the same tokens over
    other audio have other keys and values (the cross-attention reads the window's own sound)."""
    return dataclasses.replace(
        settings, cache=dataclasses.replace(settings.cache, enable_prefix_caching=False, dtype="f32"),
        scheduler=dataclasses.replace(settings.scheduler, max_model_len=info.max_position_embeddings))

"""Loading a pooling model (an encoder: BERT, XLM-RoBERTa, embedder or cross-encoder) for the factory:
its weights, pooling and tokenizer, what sizing may know of it, and the settings that mean nothing for a
model that keeps no keys and values (refused by name rather than ignored)."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from nvllm.config import Settings
from nvllm.engine.assembly import speech_model
from nvllm.engine.assembly.memory import MemoryReading, PoolSizing
from nvllm.engine.assembly.model_info import ModelInfo
from nvllm.model.config import read_json
from nvllm.model.decoder import Model
from nvllm.model.encoder import Encoder
from nvllm.model.encoder_config import EncoderConfig, is_encoder
from nvllm.model.pooler import Pooling
from nvllm.model.weights.folder import load_encoder_weights
from nvllm.model.weights.gguf_encoder import load_gguf_encoder
from nvllm.model.weights.gguf_file import GGUFFile
from nvllm.model.weights.pooling_files import read_pooling
from nvllm.text.tokenizer import Tokenizer


def folder_is_encoder(path: Path) -> bool:
    """Whether a model folder's config.json names an encoder (served or refused by name)."""
    cfg = read_json(path / "config.json")
    return isinstance(cfg, dict) and is_encoder(cfg)


def read_encoder_config(path: Path) -> EncoderConfig:
    return EncoderConfig.from_dict(read_json(path / "config.json"), str(path / "config.json"))


def load_encoder_folder(path: Path, quantization: str) -> tuple[Encoder, Tokenizer]:
    cfg: dict[str, Any] = read_json(path / "config.json")
    config = EncoderConfig.from_dict(cfg, str(path / "config.json"))
    weights = load_encoder_weights(path, config, quantization)
    return Encoder(config, weights, read_pooling(path, "cls", cfg)), Tokenizer.from_dir(path)


def load_encoder_gguf(f: GGUFFile) -> tuple[Encoder, Tokenizer]:
    """A bert GGUF as llama.cpp reads it: its pooling from pooling_type, a reranker's head without the pooler
    the converter leaves out, and every token type 0 (llama.cpp's: such a file gives llama.cpp's scores, not
    the original model's)."""
    config, weights, pooling, metadata = load_gguf_encoder(f)
    encoder = Encoder(config, weights, pooling)
    encoder.token_types = False
    return encoder, Tokenizer.from_gguf_metadata(metadata, str(f.path))


def encoder_info(path: Path, c: EncoderConfig, weight_bytes: int, weight_format: str) -> ModelInfo:
    """No keys and values: a page costs nothing and only counts a running sequence's tokens."""
    return ModelInfo(path, c.architecture, c.num_layers, c.num_params, c.vocab_size, c.hidden_size, c.max_tokens,
                     weight_bytes, 0, weight_format, weight_bytes, task="rerank" if c.head else "embed")


def check_settings(settings: Settings, info: ModelInfo) -> None:
    """ValueError naming a setting a pooling model cannot honour."""
    task = settings.model.task
    what = "a reranker" if info.task == "rerank" else "an embedding model"
    if task not in ("auto", info.task):
        raise ValueError(f"model.task={task!r}, but {info.architecture} is {what} (task {info.task!r})")
    for name, on in (("speculative.method", settings.speculative.method != "none"),
                     ("cache.pinned_prompts", bool(settings.cache.pinned_prompts)),
                     ("cache.persist_dir", bool(settings.cache.persist_dir))):
        if on:
            raise ValueError(f"{name} is for models that generate text; {info.architecture} is {what}")


POOLING_SEQS = 32    # inputs a pooling model computes in one step at least (the token budget allowing)


def settings_for(settings: Settings, info: ModelInfo) -> Settings:
    """The settings a pooling model runs with: a sequence is computed whole in one step, so max_model_len
    is cut to the token budget, and no page is worth caching (it holds nothing). A request's inputs are
    each a sequence, short and gone the same step, so a pooling model seats at least POOLING_SEQS of them:
    scheduler.max_num_seqs counts a board's streams, not the texts of one embedding request."""
    if info.task == "generate":
        return settings
    if info.task == speech_model.TASK:
        return speech_model.settings_for(settings, info)
    budget = settings.scheduler.max_num_batched_tokens
    longest = min(settings.scheduler.max_model_len or info.max_position_embeddings, budget)
    seats = max(settings.scheduler.max_num_seqs, POOLING_SEQS)
    return dataclasses.replace(
        settings, cache=dataclasses.replace(settings.cache, enable_prefix_caching=False),
        scheduler=dataclasses.replace(settings.scheduler, max_model_len=longest, max_num_seqs=seats))


def counting_pool(settings: Settings, reading: MemoryReading, per_seq: int) -> PoolSizing:
    """A pool of pages that hold nothing (an encoder's): max_num_seqs sequences' worth, or cache.num_blocks."""
    c, seqs = settings.cache, settings.scheduler.max_num_seqs
    demand = seqs * per_seq
    return PoolSizing(c.num_blocks or demand, 0, c.block_size, reading.available_bytes, reading.source, 0,
                      c.memory_fraction, 0, 0, c.num_blocks is not None, demand, seqs)


def set_decoder_task(settings: Settings, path: Path, model: Model, tokenizer: Tokenizer,
                     pooling_type: int | None = None) -> None:
    """A decoder's task: "embed" where its folder names a pooling (sentence-transformers' modules.json, as
    Qwen3-Embedding's does), its GGUF a last-token one (pooling_type 3), or model.task asks; "rerank" only when
    model.task asks (a Qwen3-Reranker's files do not say it): the "yes" and "no" of its prompt are then its
    judgement. ValueError naming what does not fit."""
    task = settings.model.task
    folder_pools = path.is_dir() and (path / "modules.json").exists()
    if task == "auto":
        task = "embed" if folder_pools or pooling_type == 3 else "generate"
    if task == "embed":
        pooling = read_pooling(path, "last", read_json(path / "config.json")) if path.is_dir() else Pooling("last")
        if pooling.method != "last" or pooling.dense:
            raise ValueError(f"{path}: a decoder embeds with its last token's state (no Dense layers); its files "
                             f"ask for {pooling.method} pooling{' and Dense layers' if pooling.dense else ''}")
        model.pooling = pooling
    elif task == "rerank":
        no, yes = tokenizer.token_to_id("no"), tokenizer.token_to_id("yes")
        if no is None or yes is None:
            raise ValueError(f"model.task='rerank' for a decoder needs the tokens 'yes' and 'no' (a Qwen3-Reranker's "
                             f"judgement); {path}'s vocabulary lacks them")
        model.judge_tokens = (no, yes)
    model.task = task

"""A Whisper file that is not a Hugging Face folder (a CTranslate2 folder, a whisper.cpp file) described as one:
the config.json and generation_config.json transformers would hold for the same model, made from the file's
sizes and its vocabulary's special tokens, and read by WhisperConfig.from_hf like a folder's - one reading of
Whisper's configuration for every kind of file."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from nvllm.model.config import ModelLoadError
from nvllm.model.whisper_config import ARCHITECTURE, WhisperConfig
from nvllm.text.tokenizer import Tokenizer
from nvllm.text.whisper_vocab import WhisperSpecials, language_token

MAX_INITIAL_TIMESTAMP_INDEX = 50   # openai-whisper's max_initial_timestamp of 1.0 s, in 0.02-s steps


@dataclass(frozen=True)
class WhisperDims:
    """A Whisper model's sizes, as its tensors' shapes (and a whisper.cpp file's header) give them."""
    vocab_size: int
    num_mel_bins: int
    d_model: int
    encoder_layers: int
    encoder_attention_heads: int
    decoder_layers: int
    decoder_attention_heads: int
    encoder_ffn_dim: int
    decoder_ffn_dim: int
    max_source_positions: int
    max_target_positions: int


def default_alignment_heads(dims: WhisperDims) -> list[list[int]]:
    """Every head of the decoder's second half: what Hugging Face and CTranslate2 assume without a table."""
    return [[layer, head] for layer in range(dims.decoder_layers // 2, dims.decoder_layers)
            for head in range(dims.decoder_attention_heads)]


def begin_suppress(tok: Tokenizer, s: WhisperSpecials) -> list[int]:
    """The tokens never first in a transcript: a lone space and <|endoftext|>."""
    return [*tok.encode(" ", add_special_tokens=False)[:1], s.eot]


def hf_dicts(dims: WhisperDims, s: WhisperSpecials, suppress: Any, begin: Any, alignment_heads: Any,
             lang_ids: Any = None, where: str = "config.json") -> tuple[dict[str, Any], dict[str, Any]]:
    """(config.json, generation_config.json) as Hugging Face's Whisper folders hold them. The tables are
    passed as the file has them (from_hf checks them); lang_ids: the language tokens' ids a multilingual
    model detects (None: all its vocabulary has)."""
    config: dict[str, Any] = {
        "architectures": [ARCHITECTURE], "model_type": "whisper", **vars(dims),
        "activation_function": "gelu", "scale_embedding": False,
        "bos_token_id": s.eot, "eos_token_id": s.eot, "pad_token_id": s.eot, "decoder_start_token_id": s.sot,
        "suppress_tokens": suppress, "begin_suppress_tokens": begin}
    generation: dict[str, Any] = {
        "alignment_heads": alignment_heads, "suppress_tokens": suppress, "begin_suppress_tokens": begin,
        "bos_token_id": s.eot, "eos_token_id": s.eot, "pad_token_id": s.eot,
        "decoder_start_token_id": s.sot, "is_multilingual": s.is_multilingual,
        "no_timestamps_token_id": s.notimestamps, "prev_sot_token_id": s.startofprev,
        "max_initial_timestamp_index": MAX_INITIAL_TIMESTAMP_INDEX, "max_length": dims.max_target_positions}
    if s.is_multilingual:
        if lang_ids is not None and not (isinstance(lang_ids, list)
                                         and all(isinstance(i, int) and not isinstance(i, bool) for i in lang_ids)):
            raise ModelLoadError(f"{where}: lang_ids is not a list of token ids")
        wanted = set(s.languages.values()) if lang_ids is None else set(lang_ids)
        generation["lang_to_id"] = {language_token(code): i for code, i in s.languages.items() if i in wanted}
        generation["task_to_id"] = {"transcribe": s.transcribe, "translate": s.translate}
    return config, generation


def whisper_config(dims: WhisperDims, s: WhisperSpecials, suppress: Any, begin: Any, alignment_heads: Any,
                   where: str, lang_ids: Any = None) -> WhisperConfig:
    """The WhisperConfig a Hugging Face folder of the same model gives (hf_dicts, then from_hf)."""
    config, generation = hf_dicts(dims, s, suppress, begin, alignment_heads, lang_ids, where)
    return WhisperConfig.from_hf(config, generation, where)

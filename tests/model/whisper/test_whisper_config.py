"""WhisperConfig from Hugging Face's config.json and generation_config.json: every size from tiny to large-v3 and
turbo, the special ids where generation_config.json leaves them out, and malformed configs refused with the
field named before anything is sized by them."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from nvllm.model.config import ModelLoadError
from nvllm.model.whisper_config import WhisperConfig

# (d_model, layers, heads, ffn) of openai's checkpoints as their config.json files give them
SIZES = {"tiny": (384, 4, 6, 1536), "base": (512, 6, 8, 2048), "small": (768, 12, 12, 3072),
         "medium": (1024, 24, 16, 4096), "large": (1280, 32, 20, 5120)}


def hf_config(d: int, layers: int, heads: int, ffn: int, vocab: int = 51865, mels: int = 80,
              decoder_layers: int | None = None) -> dict[str, Any]:
    eot = 50256 if vocab == 51864 else 50257
    return {"architectures": ["WhisperForConditionalGeneration"], "model_type": "whisper", "d_model": d,
            "encoder_layers": layers, "decoder_layers": decoder_layers or layers, "encoder_attention_heads": heads,
            "decoder_attention_heads": heads, "encoder_ffn_dim": ffn, "decoder_ffn_dim": ffn, "num_mel_bins": mels,
            "vocab_size": vocab, "max_source_positions": 1500, "max_target_positions": 448,
            "decoder_start_token_id": eot + 1, "eos_token_id": eot, "pad_token_id": eot, "bos_token_id": eot,
            "activation_function": "gelu", "scale_embedding": False, "begin_suppress_tokens": [220, eot],
            "suppress_tokens": [1, 2, 7]}


@pytest.mark.parametrize("size", sorted(SIZES))
@pytest.mark.parametrize("vocab", [51864, 51865])
def test_every_size_parses(size: str, vocab: int) -> None:
    d, layers, heads, ffn = SIZES[size]
    c = WhisperConfig.from_hf(hf_config(d, layers, heads, ffn, vocab))
    assert (c.d_model, c.encoder_layers, c.decoder_head_dim) == (d, layers, 64)
    english = vocab == 51864
    assert c.is_multilingual is not english
    assert c.no_timestamps_token_id == (50362 if english else 50363)
    assert c.timestamp_begin + 1500 == vocab - 1
    assert (c.translate_token_id, c.transcribe_token_id) == ((50357, 50358) if english else (50358, 50359))
    assert (c.prev_sot_token_id, c.no_speech_token_id) == ((50360, 50361) if english else (50361, 50362))
    assert c.begin_suppress_tokens == (220, c.eos_token_id)
    assert c.weight_bytes > 0


def test_large_v3_and_turbo() -> None:
    v3 = WhisperConfig.from_hf(hf_config(1280, 32, 20, 5120, vocab=51866, mels=128))
    assert (v3.num_mel_bins, v3.no_timestamps_token_id, v3.transcribe_token_id) == (128, 50364, 50360)
    assert v3.decoder_start_token_id == 50258 and v3.eos_token_id == 50257
    turbo = WhisperConfig.from_hf(hf_config(1280, 32, 20, 5120, vocab=51866, mels=128, decoder_layers=4))
    assert (turbo.encoder_layers, turbo.decoder_layers) == (32, 4)


def test_generation_config_takes_precedence(tiny_whispers: dict[str, Path]) -> None:
    folder = tiny_whispers["tiny-whisper-multi"]
    cfg = json.loads((folder / "config.json").read_text())
    gen = json.loads((folder / "generation_config.json").read_text())
    c = WhisperConfig.from_hf(cfg, gen)
    assert c.lang_ids["en"] == 50259 and len(c.lang_ids) == 99 and c.lang_ids["su"] == 50357
    assert c.suppress_tokens == tuple(gen["suppress_tokens"]) and c.alignment_heads == ((1, 0), (1, 1))
    assert c.num_frames == 3000
    english = WhisperConfig.from_hf(*(json.loads((tiny_whispers["tiny-whisper"] / f).read_text())
                                      for f in ("config.json", "generation_config.json")))
    assert not english.is_multilingual and english.lang_ids == {}


BAD: list[tuple[str, dict[str, Any], dict[str, Any] | None, str]] = [
    ("missing size", {"d_model": None}, None, "missing 'd_model'"),
    ("negative", {"encoder_layers": -1}, None, "encoder_layers -1"),
    ("a float", {"decoder_layers": 2.5}, None, "decoder_layers 2.5"),
    ("a bool", {"vocab_size": True}, None, "vocab_size True"),
    ("huge vocabulary", {"vocab_size": 10 ** 9}, None, "vocab_size 1000000000"),
    ("huge width", {"d_model": 1 << 20}, None, "d_model 1048576"),
    ("huge ffn", {"encoder_ffn_dim": 1 << 30}, None, "encoder_ffn_dim"),
    ("heads", {"decoder_attention_heads": 7}, None, "decoder_attention_heads 7"),
    ("mel bins", {"num_mel_bins": 81}, None, "num_mel_bins 81"),
    ("window", {"max_source_positions": 3000}, None, "max_source_positions 3000"),
    ("positions", {"max_target_positions": 1 << 20}, None, "max_target_positions"),
    ("activation", {"activation_function": "relu"}, None, "activation_function 'relu'"),
    ("scaled embedding", {"scale_embedding": True}, None, "scale_embedding True"),
    ("not whisper", {"architectures": ["LlamaForCausalLM"]}, None, "not a Whisper model"),
    ("start outside", {"decoder_start_token_id": 60000}, None, "decoder_start_token_id 60000"),
    ("suppress outside", {"suppress_tokens": [1, 99999]}, None, "suppress_tokens[1] 99999"),
    ("suppress not a list", {}, {"suppress_tokens": "all"}, "suppress_tokens is not a list"),
    ("no room for timestamps", {}, {"no_timestamps_token_id": 51000}, "no_timestamps_token_id 51000"),
    ("language key", {}, {"lang_to_id": {"en": 50259}}, "lang_to_id key 'en'"),
    ("language id", {}, {"lang_to_id": {"<|en|>": -3}}, "<|en|> -3"),
    ("task id", {}, {"task_to_id": {"transcribe": "x"}}, "transcribe 'x'"),
    ("alignment layer", {}, {"alignment_heads": [[9, 0]]}, "layer 9"),
    ("alignment pair", {}, {"alignment_heads": [[1, 2, 3]]}, "alignment_heads[0]"),
    ("multilingual flag", {}, {"is_multilingual": "yes"}, "is_multilingual 'yes'"),
]


@pytest.mark.parametrize("change, gen, says", [b[1:] for b in BAD], ids=[b[0] for b in BAD])
def test_malformed_configs_are_refused_naming_the_field(change: dict[str, Any], gen: dict[str, Any] | None,
                                                        says: str) -> None:
    cfg = hf_config(384, 4, 6, 1536)
    for k, v in change.items():
        if v is None:
            del cfg[k]
        else:
            cfg[k] = v
    with pytest.raises(ModelLoadError, match=None) as e:
        WhisperConfig.from_hf(cfg, gen, "x/config.json")
    assert says in str(e.value), str(e.value)


def test_not_an_object_is_refused() -> None:
    with pytest.raises(ModelLoadError, match="not a JSON object"):
        WhisperConfig.from_hf([], None)   # type: ignore[arg-type]

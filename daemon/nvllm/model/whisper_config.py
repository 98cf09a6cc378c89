"""Whisper's configuration: a Hugging Face config.json (+ generation_config.json) -> WhisperConfig.

An encoder over 30 s of log-mel frames and a decoder that attends to it: the sizes of both, and the special
tokens Whisper's decoding rules are written in (start of transcript, languages, tasks, timestamps). Every size
from tiny to large-v3 (128 mel bins) and large-v3-turbo (4 decoder layers) reads from its own files; the
ids generation_config.json leaves out follow from where <|notimestamps|> sits, as the vocabularies of all of
them lay the specials out in one order (... translate, transcribe, startoflm, startofprev, nocaptions or
nospeech, notimestamps, then the 1501 timestamps <|0.00|> .. <|30.00|>).

Every number is checked against bounds before anything is sized by it: a hostile config.json cannot ask the
loader for a huge allocation, and a malformed one is refused with the field named.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from nvllm.model.config import ModelLoadError

ARCHITECTURE = "WhisperForConditionalGeneration"
TIMESTAMPS = 1501                 # <|0.00|> .. <|30.00|>, 0.02 s apart
SECONDS_PER_TIMESTAMP = 0.02
MEL_BINS = (80, 128)              # tiny .. large-v2; large-v3 and turbo
SOURCE_POSITIONS = 1500           # a 30-s window: 3000 mel frames, halved by the second convolution
LAYER_NORM_EPS = 1e-5             # torch's LayerNorm default, which Whisper keeps

# Bounds on what a config may ask for (large-v3 is d_model 1280, 32 layers, 20 heads, ffn 5120, 51866 ids).
_MAX = {"vocab_size": 1 << 18, "d_model": 8192, "encoder_layers": 128, "decoder_layers": 128,
        "encoder_attention_heads": 256, "decoder_attention_heads": 256, "encoder_ffn_dim": 65536,
        "decoder_ffn_dim": 65536, "max_target_positions": 4096}


@dataclass(frozen=True)
class WhisperConfig:
    vocab_size: int
    num_mel_bins: int
    d_model: int
    encoder_layers: int
    encoder_attention_heads: int
    decoder_layers: int
    decoder_attention_heads: int
    encoder_ffn_dim: int
    decoder_ffn_dim: int
    max_source_positions: int = SOURCE_POSITIONS
    max_target_positions: int = 448
    # the special tokens (ids in the vocabulary)
    decoder_start_token_id: int = 50257      # <|startoftranscript|>
    eos_token_id: int = 50256                # <|endoftext|>
    no_timestamps_token_id: int = 50362      # <|notimestamps|>
    transcribe_token_id: int = 50358
    translate_token_id: int = 50357
    prev_sot_token_id: int = 50360           # <|startofprev|>
    no_speech_token_id: int = 50361          # <|nocaptions|> (<|nospeech|> on large-v3)
    lang_ids: dict[str, int] = field(default_factory=dict)   # {"en": 50259, ...}; empty on an English-only model
    suppress_tokens: tuple[int, ...] = ()
    begin_suppress_tokens: tuple[int, ...] = ()
    is_multilingual: bool = False
    alignment_heads: tuple[tuple[int, int], ...] = ()        # (decoder layer, head) pairs, for word timing
    max_initial_timestamp_index: int = 50                    # the first timestamp at most 1.00 s
    architecture: str = ARCHITECTURE

    @property
    def timestamp_begin(self) -> int:
        """<|0.00|>'s id: the timestamps follow <|notimestamps|>."""
        return self.no_timestamps_token_id + 1

    @property
    def encoder_head_dim(self) -> int:
        return self.d_model // self.encoder_attention_heads

    @property
    def decoder_head_dim(self) -> int:
        return self.d_model // self.decoder_attention_heads

    @property
    def num_frames(self) -> int:
        """Mel frames of one window (the encoder's input): twice its positions."""
        return 2 * self.max_source_positions

    @property
    def num_params(self) -> int:
        d, m = self.d_model, self.num_mel_bins
        attn = 4 * d * d + 3 * d                               # q, k, v, out; biases on q, v, out
        enc = self.encoder_layers * (attn + 2 * d * self.encoder_ffn_dim + self.encoder_ffn_dim + d + 4 * d)
        dec = self.decoder_layers * (2 * attn + 2 * d * self.decoder_ffn_dim + self.decoder_ffn_dim + d + 6 * d)
        convs = 3 * m * d + 3 * d * d + 2 * d
        tables = (self.vocab_size + self.max_target_positions + self.max_source_positions) * d
        return enc + dec + convs + tables + 4 * d

    @property
    def weight_bytes(self) -> int:
        return 4 * self.num_params

    @classmethod
    def from_hf(cls, config: dict[str, Any], generation: dict[str, Any] | None = None,
                where: str = "config.json") -> WhisperConfig:
        """config.json's dict and generation_config.json's (None where the folder has none): the sizes from the
        first, the decoding tables from the second where it has them (else from the first, as older folders
        keep suppress_tokens there), the ids it leaves out derived from <|notimestamps|>'s place."""
        if not isinstance(config, dict):
            raise ModelLoadError(f"{where}: not a JSON object")
        archs = config.get("architectures") or [ARCHITECTURE]
        if config.get("model_type", "whisper") != "whisper" or not isinstance(archs, list) or archs[0] != ARCHITECTURE:
            raise ModelLoadError(f"{where}: not a Whisper model (architectures {archs!r}, model_type "
                                 f"{config.get('model_type')!r}); supported: {ARCHITECTURE}")
        gen = generation if isinstance(generation, dict) else {}
        gwhere = "generation_config.json" if generation is not None else where
        sizes = {k: _int(config, k, where, 1, top) for k, top in _MAX.items()}
        mels = _int(config, "num_mel_bins", where, 1, 256)
        if mels not in MEL_BINS:
            raise ModelLoadError(f"{where}: num_mel_bins {mels} is not supported (supported: 80, 128)")
        source = _int(config, "max_source_positions", where, 1, 1 << 16, SOURCE_POSITIONS)
        if source != SOURCE_POSITIONS:
            raise ModelLoadError(f"{where}: max_source_positions {source} is not supported (Whisper's windows are "
                                 f"30 s: {SOURCE_POSITIONS})")
        d = sizes["d_model"]
        for heads in ("encoder_attention_heads", "decoder_attention_heads"):
            if d % sizes[heads] or (d // sizes[heads]) % 2:
                raise ModelLoadError(f"{where}: d_model {d} is not an even head size times {heads} {sizes[heads]}")
        for key, want in (("activation_function", "gelu"), ("scale_embedding", False)):
            if config.get(key, want) != want:
                raise ModelLoadError(f"{where}: {key} {config[key]!r} is not supported (supported: {want!r})")
        vocab = sizes["vocab_size"]

        def token(key: str, default: int) -> int:
            """An id from generation_config.json, else config.json, else the default; inside the vocabulary."""
            src, w = (gen, gwhere) if key in gen else (config, where)
            return _int(src, key, w, 0, vocab - 1, default)

        no_ts = token("no_timestamps_token_id", vocab - TIMESTAMPS - 1)
        if no_ts + TIMESTAMPS > vocab - 1 or no_ts < 6:
            raise ModelLoadError(f"{gwhere}: no_timestamps_token_id {no_ts} leaves no room for the {TIMESTAMPS} "
                                 f"timestamps in a vocabulary of {vocab}")
        tasks = gen.get("task_to_id") or {}
        if not isinstance(tasks, dict):
            raise ModelLoadError(f"{gwhere}: task_to_id is not an object")
        langs = _lang_ids(gen.get("lang_to_id") or {}, vocab, gwhere)
        multilingual = gen.get("is_multilingual", bool(langs) or vocab >= 51865)   # .en: 51864
        if not isinstance(multilingual, bool):
            raise ModelLoadError(f"{gwhere}: is_multilingual {multilingual!r} is not true or false")
        suppress_src = gen if "suppress_tokens" in gen else config
        begin_src = gen if "begin_suppress_tokens" in gen else config
        return cls(
            vocab_size=vocab, num_mel_bins=mels, d_model=d,
            encoder_layers=sizes["encoder_layers"], encoder_attention_heads=sizes["encoder_attention_heads"],
            decoder_layers=sizes["decoder_layers"], decoder_attention_heads=sizes["decoder_attention_heads"],
            encoder_ffn_dim=sizes["encoder_ffn_dim"], decoder_ffn_dim=sizes["decoder_ffn_dim"],
            max_source_positions=source, max_target_positions=sizes["max_target_positions"],
            decoder_start_token_id=token("decoder_start_token_id", 50257 if vocab < 51865 else 50258),
            eos_token_id=_eos(*((gen, gwhere) if "eos_token_id" in gen else (config, where)), vocab),
            no_timestamps_token_id=no_ts,
            transcribe_token_id=_int(tasks, "transcribe", f"{gwhere}: task_to_id", 0, vocab - 1, no_ts - 4),
            translate_token_id=_int(tasks, "translate", f"{gwhere}: task_to_id", 0, vocab - 1, no_ts - 5),
            prev_sot_token_id=token("prev_sot_token_id", no_ts - 2),
            no_speech_token_id=no_ts - 1,
            lang_ids=langs if multilingual else {},
            suppress_tokens=_ids(suppress_src, "suppress_tokens", vocab, gwhere if suppress_src is gen else where),
            begin_suppress_tokens=_ids(begin_src, "begin_suppress_tokens", vocab,
                                       gwhere if begin_src is gen else where),
            is_multilingual=multilingual,
            alignment_heads=_heads(gen.get("alignment_heads") or (), sizes["decoder_layers"],
                                   sizes["decoder_attention_heads"], gwhere),
            max_initial_timestamp_index=_int(gen, "max_initial_timestamp_index", gwhere, 0, TIMESTAMPS - 1, 50))


def _int(src: dict[str, Any], key: str, where: str, low: int, high: int, default: int | None = None) -> int:
    """src[key] as an int in [low, high] (default where absent; required where default is None)."""
    value = src.get(key, default)
    if value is None:
        raise ModelLoadError(f"{where}: missing {key!r}")
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise ModelLoadError(f"{where}: {key} {value!r} is not an integer in [{low}, {high}]")
    return value


def _eos(src: dict[str, Any], where: str, vocab: int) -> int:
    """eos_token_id, which a generation_config.json may write as a list (its first is <|endoftext|>)."""
    value = src.get("eos_token_id", 50256 if vocab < 51865 else 50257)
    if isinstance(value, list) and value:
        value = value[0]
    return _int({"eos_token_id": value}, "eos_token_id", where, 0, vocab - 1)


def _ids(src: dict[str, Any], key: str, vocab: int, where: str) -> tuple[int, ...]:
    value = src.get(key) or []
    if not isinstance(value, list) or len(value) > vocab:
        raise ModelLoadError(f"{where}: {key} is not a list of at most {vocab} token ids")
    for i, v in enumerate(value):
        _int({f"{key}[{i}]": v}, f"{key}[{i}]", where, 0, vocab - 1)
    return tuple(value)


def _lang_ids(value: Any, vocab: int, where: str) -> dict[str, int]:
    """lang_to_id {"<|en|>": 50259, ...} -> {"en": 50259, ...}."""
    if not isinstance(value, dict) or len(value) > 1024:
        raise ModelLoadError(f"{where}: lang_to_id is not an object of at most 1024 languages")
    out = {}
    for token, i in value.items():
        if not (isinstance(token, str) and token.startswith("<|") and token.endswith("|>") and len(token) > 4):
            raise ModelLoadError(f"{where}: lang_to_id key {token!r} is not a language token like '<|en|>'")
        out[token[2:-2]] = _int({token: i}, token, f"{where}: lang_to_id", 0, vocab - 1)
    return out


def _heads(value: Any, layers: int, heads: int, where: str) -> tuple[tuple[int, int], ...]:
    if not isinstance(value, (list, tuple)) or len(value) > layers * heads:
        raise ModelLoadError(f"{where}: alignment_heads is not a list of at most {layers * heads} pairs")
    out = []
    for i, pair in enumerate(value):
        if not (isinstance(pair, (list, tuple)) and len(pair) == 2):
            raise ModelLoadError(f"{where}: alignment_heads[{i}] is not a [layer, head] pair")
        layer = _int({"layer": pair[0]}, "layer", f"{where}: alignment_heads[{i}]", 0, layers - 1)
        head = _int({"head": pair[1]}, "head", f"{where}: alignment_heads[{i}]", 0, heads - 1)
        out.append((layer, head))
    return tuple(out)

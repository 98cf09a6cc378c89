"""Whisper's vocabulary: where its special tokens sit, and a tokenizer rebuilt from a whisper.cpp file's bytes.

Every Whisper model shares one layout after its byte-level BPE tokens: <|endoftext|>, <|startoftranscript|>,
a token per language, <|translate|>, <|transcribe|>, <|startoflm|>, <|startofprev|>, <|nocaptions|> (named
<|nospeech|> from large-v3 on), <|notimestamps|>, then 1501 timestamps <|0.00|> .. <|30.00|>. The vocabulary
size alone says which: 51864 is English-only (50256 BPE tokens, 99 language tokens), 51865 multilingual
(50257 BPE tokens, the last one empty, 99 languages), 51866 large-v3 (100 languages) - the rule whisper.cpp
and openai-whisper both follow.

A whisper.cpp ggml file carries the BPE tokens as raw bytes in id order and no merges. The ids are the
tokens' ranks (the files are written from tiktoken's rank files), so the merges are recovered exactly: the
merge that makes a token is the last step of BPE by rank over its own bytes, using only lower ranks. For
tiny.en that gives the 50000 merges of Hugging Face's tokenizer.json, in order; so the rebuilt tokenizer
encodes as Hugging Face's and openai's do, prompts included (whisper.cpp's own greedy longest match does not).
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from tokenizers import AddedToken, decoders, models, pre_tokenizers, processors
from tokenizers import Tokenizer as _Backend

from nvllm.text.tokenizer import Tokenizer

# openai-whisper's language codes in token order; the 100th ("yue") is large-v3's.
LANGUAGES = (
    "en zh de es ru ko fr ja pt tr pl ca nl ar sv it id hi fi vi he uk el ms cs ro da hu ta no th ur hr bg lt la "
    "mi ml cy sk te fa lv bn sr az sl kn et mk br eu is hy ne mn bs kk sq sw gl mr pa si km sn yo so af oc ka be "
    "tg sd gu am yi lo uz fo ht ps tk nn mt sa lb my bo tl mg as tt haw ln ha ba jw su yue").split()
# Hugging Face's tokenizer files spell Hebrew's token <|iw|> (its old ISO code); the code stays "he"
TOKEN_CODES = {"he": "iw"}
N_TIMESTAMPS = 1501            # <|0.00|> .. <|30.00|>, every 0.02 s
ENGLISH_VOCAB = 51864          # below this no Whisper model exists; from 51865 a model is multilingual
_AFTER_LANGUAGES = ("translate", "transcribe", "startoflm", "startofprev", "nospeech", "notimestamps")


@dataclass(frozen=True)
class WhisperSpecials:
    """The ids of a Whisper vocabulary's special tokens, and their names as Hugging Face's tokenizer spells them."""
    vocab_size: int
    eot: int                      # <|endoftext|>
    sot: int                      # <|startoftranscript|>
    languages: dict[str, int]     # "en" -> id of <|en|>
    translate: int
    transcribe: int
    startoflm: int
    startofprev: int
    nospeech: int                 # <|nocaptions|> (<|nospeech|> on large-v3)
    notimestamps: int
    timestamp_begin: int          # <|0.00|>; the last id is <|30.00|>

    @property
    def is_multilingual(self) -> bool:
        return self.vocab_size > ENGLISH_VOCAB

    def names(self) -> dict[int, str]:
        """id -> token string of every special token and timestamp."""
        out = {self.eot: "<|endoftext|>", self.sot: "<|startoftranscript|>"}
        out.update({i: language_token(code) for code, i in self.languages.items()})
        nospeech = "<|nospeech|>" if len(self.languages) >= 100 else "<|nocaptions|>"
        out.update({self.translate: "<|translate|>", self.transcribe: "<|transcribe|>",
                    self.startoflm: "<|startoflm|>", self.startofprev: "<|startofprev|>",
                    self.nospeech: nospeech, self.notimestamps: "<|notimestamps|>"})
        first = self.timestamp_begin
        out.update({first + k: timestamp_token(k) for k in range(self.vocab_size - first)})
        return out


def language_token(code: str) -> str:
    """A language's token as Hugging Face's tokenizer names it: <|en|>, <|iw|> for "he"."""
    return f"<|{TOKEN_CODES.get(code, code)}|>"


def timestamp_token(k: int) -> str:
    """The k-th timestamp token: <|0.00|>, <|0.02|>, ..."""
    return f"<|{k * 0.02:.2f}|>"


def whisper_specials(vocab_size: int) -> WhisperSpecials:
    """The special ids a vocabulary of `vocab_size` implies; ValueError for a size no Whisper model has."""
    eot = 50256 if vocab_size <= ENGLISH_VOCAB else 50257
    n_languages = vocab_size - eot - 2 - len(_AFTER_LANGUAGES) - N_TIMESTAMPS
    if not 99 <= n_languages <= len(LANGUAGES):
        raise ValueError(f"a vocabulary of {vocab_size} tokens is no Whisper model's (51864 English-only, "
                         f"51865 multilingual, 51866 large-v3)")
    sot = eot + 1
    after = {name: sot + 1 + n_languages + k for k, name in enumerate(_AFTER_LANGUAGES)}
    return WhisperSpecials(
        vocab_size=vocab_size, eot=eot, sot=sot,
        languages={code: sot + 1 + k for k, code in enumerate(LANGUAGES[:n_languages])},
        translate=after["translate"], transcribe=after["transcribe"], startoflm=after["startoflm"],
        startofprev=after["startofprev"], nospeech=after["nospeech"], notimestamps=after["notimestamps"],
        timestamp_begin=after["notimestamps"] + 1)


def specials_from_tokenizer(tok: Tokenizer, vocab_size: int) -> WhisperSpecials:
    """The special ids as a tokenizer names them (a CTranslate2 folder's tokenizer.json); KeyError naming the
    first token it lacks."""
    def need(token: str) -> int:
        i = tok.token_to_id(token)
        if i is None:
            raise KeyError(token)
        return i

    nospeech = tok.token_to_id("<|nocaptions|>")
    languages = {}
    for code in LANGUAGES:   # Hebrew by either name
        i = tok.token_to_id(language_token(code))
        i = tok.token_to_id(f"<|{code}|>") if i is None else i
        if i is not None:
            languages[code] = i
    notimestamps = need("<|notimestamps|>")
    return WhisperSpecials(
        vocab_size=vocab_size, eot=need("<|endoftext|>"), sot=need("<|startoftranscript|>"), languages=languages,
        translate=need("<|translate|>"), transcribe=need("<|transcribe|>"), startoflm=need("<|startoflm|>"),
        startofprev=need("<|startofprev|>"), nospeech=need("<|nospeech|>") if nospeech is None else nospeech,
        notimestamps=notimestamps, timestamp_begin=notimestamps + 1)


# ---------------------------------------------------------------- the byte-level alphabet and the merges

def _byte_alphabet() -> list[str]:
    """GPT-2's printable stand-in for each byte: printable Latin-1 bytes stand for themselves, the others take
    the code points from 256 up, in byte order."""
    keep = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    out, extra = {}, 0
    for b in range(256):
        if b in keep:
            out[b] = chr(b)
        else:
            out[b] = chr(256 + extra)
            extra += 1
    return [out[b] for b in range(256)]


BYTE_CHARS = _byte_alphabet()


def byte_level(raw: bytes) -> str:
    """A token's bytes in the byte-level alphabet (what tokenizer.json's vocabulary holds)."""
    return "".join(BYTE_CHARS[b] for b in raw)


MERGE_WORK = 16_000_000   # the sum of the tokens' squared lengths: 2.5 million for Whisper's vocabularies


def rank_merges(tokens: Sequence[str]) -> list[tuple[str, str]]:
    """The BPE merges of a vocabulary whose ids are ranks: for each token longer than one symbol, in id order,
    the two parts that BPE by rank (lower ranks only) leaves of its symbols. A token BPE cannot reach in two
    parts (none in Whisper's files) makes no merge. ValueError when the tokens are so long that this would take
    more than MERGE_WORK steps (Whisper's own take a sixth of it): a hostile file's, refused in bounded time."""
    work = sum(len(t) ** 2 for t in tokens)
    if work > MERGE_WORK:
        raise ValueError(f"the tokens are far longer than a Whisper vocabulary's ({work} > {MERGE_WORK} steps "
                         "to recover their merges)")
    ranks = {t: i for i, t in enumerate(tokens)}
    merges = []
    for rank, token in enumerate(tokens):
        if len(token) < 2:
            continue
        parts = list(token)
        while len(parts) > 2:
            best, at = rank, -1
            for i in range(len(parts) - 1):
                r = ranks.get(parts[i] + parts[i + 1], rank)
                if r < best:
                    best, at = r, i
            if at < 0:
                break
            parts[at:at + 2] = [parts[at] + parts[at + 1]]
        if len(parts) == 2 and ranks.get(parts[0], rank) < rank and ranks.get(parts[1], rank) < rank:
            merges.append((parts[0], parts[1]))
    return merges


# ---------------------------------------------------------------- tokenizers

_SPECIAL_NAMES = ("bos_token", "eos_token", "unk_token", "pad_token")   # all <|endoftext|>, as Hugging Face's


def add_whisper_specials(backend: _Backend, specials: WhisperSpecials) -> None:
    """Add every special token and timestamp the backend lacks at its id (they must follow its last id: a
    tokenizer.json that stops at <|notimestamps|> gets the timestamps). The specials are special added tokens;
    the timestamps added tokens that are not special, as Hugging Face's Whisper tokenizer.json has them."""
    have = backend.get_vocab(with_added_tokens=True)
    missing = [(i, name) for i, name in sorted(specials.names().items()) if name not in have]
    size = backend.get_vocab_size(with_added_tokens=True)
    if [i for i, _ in missing] != list(range(size, size + len(missing))):
        i, name = next((i, n) for k, (i, n) in enumerate(missing) if i != size + k)
        raise ValueError(f"{name} would not get id {i}: the tokenizer has {size} tokens and lacks {len(missing)}")
    first_timestamp = specials.timestamp_begin
    backend.add_special_tokens([AddedToken(n, special=True, normalized=False) for i, n in missing
                                if i < first_timestamp])
    backend.add_tokens([AddedToken(n, special=False, normalized=False) for i, n in missing if i >= first_timestamp])


def whisper_tokenizer(backend: _Backend, specials: WhisperSpecials, source: str) -> Tokenizer:
    """nvllm's Tokenizer over a Whisper backend whose specials are complete."""
    eot = backend.id_to_token(specials.eot) or "<|endoftext|>"
    return Tokenizer(backend, special_tokens={k: eot for k in _SPECIAL_NAMES}, source=source)


def tokenizer_from_bytes(tokens: Sequence[bytes], vocab_size: int, source: str) -> Tokenizer:
    """The tokenizer of a whisper.cpp file: its BPE tokens' bytes in id order, the special tokens implied by
    the model's vocab_size (ValueError when the file's tokens do not fit that layout)."""
    specials = whisper_specials(vocab_size)
    ordinary = list(tokens)
    if len(ordinary) > specials.eot and ordinary[specials.eot] == b"<|endoftext|>":
        ordinary = ordinary[:specials.eot]          # Hugging Face's vocab.json, as convert-h5-to-ggml writes it
    if len(ordinary) != specials.eot:
        raise ValueError(f"{len(ordinary)} BPE tokens, but a {vocab_size}-token Whisper vocabulary has "
                         f"{specials.eot}")
    names = [byte_level(t) if t else f"<|unused_{i}|>" for i, t in enumerate(ordinary)]   # multilingual 50256
    vocab: dict[str, int] = {}
    for i, name in enumerate(names):
        if vocab.setdefault(name, i) != i:
            raise ValueError(f"token {i} repeats token {vocab[name]} ({ordinary[i][:40]!r})")
    missing = next((b for b in range(256) if BYTE_CHARS[b] not in vocab), None)
    if missing is not None:     # byte-level BPE spells any text with them: a vocabulary without one is no GPT-2's
        raise ValueError(f"the byte {missing:#04x} has no token of its own")
    merges = rank_merges([n if t else "" for n, t in zip(names, ordinary)])
    backend = _Backend(models.BPE(vocab=vocab, merges=merges, fuse_unk=False, byte_fallback=False))
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    backend.decoder = decoders.ByteLevel()
    backend.add_special_tokens([AddedToken(n, special=True, normalized=False)
                                for n, t in zip(names, ordinary) if not t])
    add_whisper_specials(backend, specials)
    _prefix_like_hugging_face(backend, specials)
    return whisper_tokenizer(backend, specials, source)


def _prefix_like_hugging_face(backend: _Backend, s: WhisperSpecials) -> None:
    """encode(text) with special tokens as Hugging Face's saved tokenizer.json does it:
    <|startoftranscript|> <|notimestamps|> text <|endoftext|> (the engine builds its own prompt)."""
    names = s.names()
    sot, nts, eot = names[s.sot], names[s.notimestamps], names[s.eot]
    backend.post_processor = processors.TemplateProcessing(
        single=f"{sot} {nts} $A {eot}", pair=f"{sot} {nts} $A $B:1 {eot}:1",
        special_tokens=[(sot, s.sot), (nts, s.notimestamps), (eot, s.eot)])


# ---------------------------------------------------------------- what Whisper never says

_SYMBOLS = list('"#()*+/:;<=>@[\\]^_`{|}~「」『』') + (
    "<< >> <<< >>> -- --- -( -[ (' (\" (( )) ((( ))) [[ ]] {{ }} ♪♪ ♪♪♪").split()
_MUSIC = "♩♪♫♬♭♮♯"   # always suppressed by their first token, even where they take several


def non_speech_tokens(tok: Tokenizer) -> list[int]:
    """The tokens openai-whisper suppresses as never spoken (symbols, speaker tags, music signs), as it
    finds them: each symbol alone and after a space, kept where it is one token (the music signs' first
    token always), and the first token of " -" and " '"."""
    found = {*tok.encode(" -", add_special_tokens=False)[:1], *tok.encode(" '", add_special_tokens=False)[:1]}
    for symbol in [*_SYMBOLS, *_MUSIC]:
        for text in (symbol, " " + symbol):
            ids = tok.encode(text, add_special_tokens=False)
            if len(ids) == 1 or (symbol in _MUSIC and ids):
                found.add(ids[0])
    return sorted(found)


def suppress_tokens(tok: Tokenizer, s: WhisperSpecials) -> list[int]:
    """Hugging Face's generation_config suppress_tokens (openai-whisper's "-1"): the non-speech tokens and
    the task and context tokens that are never sampled."""
    return sorted({*non_speech_tokens(tok), s.sot, s.translate, s.transcribe, s.startoflm, s.startofprev,
                   s.nospeech})

"""Whisper's special tokens, found by name in the speech model's vocabulary (every file's tokenizer spells them
alike), and the start of a window's decoder prompt built from them."""

from __future__ import annotations

from dataclasses import dataclass

from nvllm.sampling_params import InvalidParameter
from nvllm.text.tokenizer import Tokenizer

# Whisper's languages in its token order (<|en|> first): a multilingual model's language tokens follow
# <|startoftranscript|> in this order, as many as the model has (large-v3 adds Cantonese at the end).
LANGUAGES = (
    "en zh de es ru ko fr ja pt tr pl ca nl ar sv it id hi fi vi he uk el ms cs ro da hu ta no th ur hr bg lt la "
    "mi ml cy sk te fa lv bn sr az sl kn et mk br eu is hy ne mn bs kk sq sw gl mr pa si km sn yo so af oc ka be "
    "tg sd gu am yi lo uz fo ht ps tk nn mt sa lb my bo tl mg as tt haw ln ha ba jw su yue").split()
# Codes some vocabularies spell otherwise (Hugging Face's Whisper tokenizers write Hebrew's as <|iw|>).
SPELLED = {"he": ("iw",), "jw": ("jv",)}
SECONDS_PER_TIMESTAMP = 0.02   # <|0.02|> - <|0.00|>: one token is 20 ms (two mel frames)


@dataclass(frozen=True)
class WhisperTokens:
    eot: int
    sot: int
    sot_prev: int
    no_timestamps: int
    timestamp_begin: int           # <|0.00|>; every id from here up is a timestamp
    no_speech: int | None
    transcribe: int | None         # None on English-only models, whose prompt has no task
    translate: int | None
    sot_lm: int | None
    languages: dict[str, int]      # code -> token; empty on English-only models (whose vocabulary has them unused)
    suppress: tuple[int, ...]      # never sampled (generation_config's suppress_tokens, and the specials)
    begin_suppress: tuple[int, ...]   # not the first token of a window (a space, the end)

    @classmethod
    def of(cls, tokenizer: Tokenizer, multilingual: bool, suppress: tuple[int, ...] | list[int] = (),
           begin_suppress: tuple[int, ...] | list[int] = ()) -> WhisperTokens:
        """multilingual: the model's (its vocabulary of 51865 ids or more); an English-only vocabulary spells the
        language tokens too, but its model was never taught them."""
        def find(*names: str) -> int | None:
            for name in names:
                i = tokenizer.token_to_id(name)
                if i is not None:
                    return i
            return None

        def need(name: str) -> int:
            i = find(name)
            if i is None:
                raise ValueError(f"the speech model's vocabulary lacks {name}: not a Whisper tokenizer")
            return i

        languages = {code: i for code in LANGUAGES
                     if (i := find(*(f"<|{c}|>" for c in (code, *SPELLED.get(code, ()))))) is not None} \
            if multilingual else {}
        t = cls(eot=need("<|endoftext|>"), sot=need("<|startoftranscript|>"), sot_prev=need("<|startofprev|>"),
                no_timestamps=need("<|notimestamps|>"), timestamp_begin=need("<|0.00|>"),
                no_speech=find("<|nospeech|>", "<|nocaptions|>"), transcribe=find("<|transcribe|>"),
                translate=find("<|translate|>"), sot_lm=find("<|startoflm|>"), languages=languages,
                suppress=(), begin_suppress=tuple(begin_suppress))
        # Whisper never samples a task, a start or the no-speech marker, whatever generation_config lists.
        specials = [i for i in (t.transcribe, t.translate, t.sot, t.sot_prev, t.sot_lm, t.no_speech) if i is not None]
        return cls(**{**t.__dict__, "suppress": tuple(sorted(set(suppress) | set(specials)))})

    @property
    def multilingual(self) -> bool:
        return bool(self.languages)

    def language(self, code: str | None) -> int | None:
        """A request's language as its token (None: to be detected); InvalidParameter for one the model lacks."""
        if code is None:
            return None
        code = code.lower()
        if not self.multilingual:
            if code == "en":
                return None
            raise InvalidParameter("language", code, "'en': this speech model knows English only")
        if code not in self.languages:
            raise InvalidParameter("language", code, f"a language this model knows ({', '.join(self.languages)})")
        return self.languages[code]

    def code(self, token: int) -> str | None:
        return next((c for c, i in self.languages.items() if i == token), None)

    def forced(self, language: int | None, task: str, timestamps: bool) -> list[int]:
        """The tokens after <|startoftranscript|> that a window's decoding is given, not asks: the language and
        the task on multilingual models, <|notimestamps|> without timestamps. With no language (to be detected)
        this is empty: the language is sampled first, then the rest follow (Transcript.forced_after)."""
        out: list[int] = []
        if self.multilingual:
            if language is None:
                return out
            assert self.transcribe is not None and self.translate is not None
            out += [language, self.translate if task == "translate" else self.transcribe]
        if not timestamps:
            out.append(self.no_timestamps)
        return out

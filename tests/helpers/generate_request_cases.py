"""The cases of the gRPC bad-input stress test (tests/stress/test_stress_fuzz.py), as Hypothesis strategies
over GenerateRequests against the tiny Llama test model:

  good       a valid request of any shape the proto allows (prompt, chat or token ids; any subset of
             the sampling fields, extreme but valid values included; unknown fields appended):
             must be served, and when greedy or seeded its tokens must equal the offline engine's;
  bad        a good request with exactly one defect (a wrong value, a huge string, a token id outside
             the vocabulary, bytes that are not UTF-8, ...): INVALID_ARGUMENT whose message starts
             with the defective field's path;
  arbitrary  random bytes or a cut-off good request: served, or INVALID_ARGUMENT naming a field.

`Case.payload` gives the bytes to send: the serialized request, changed by `raw` where the case needs
bytes no proto3 library would produce (invalid UTF-8 in a string field, a cut-off message).
"""

from __future__ import annotations

import math
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from hypothesis import strategies as st

from helpers.daemon_util import MAX_MESSAGE_BYTES
from helpers.paths import ROOT
from nvllm.v1 import nvllm_pb2 as pb

if TYPE_CHECKING:
    from nvllm.text.tokenizer import Tokenizer

MODEL = "tiny-llama"
VOCAB = 512
MAX_MODEL_LEN = 256
MAX_STOP_STRINGS = 4
MAX_STOP_CHARS = 256
MAX_ID_CHARS = 128
MARK = "QZXQZX"            # placeholder replaced by invalid UTF-8 in the serialized bytes
ANY_FIELD = "*"            # expectation of the arbitrary cases
INVALID_UTF8 = (b"\xff", b"\xc3\x28", b"\xed\xa0\x80", b"\xe0\x80\xaf", b"\xf4\x90\x80\x80", b"\xe2\x82",
                b"\x80", b"\xc0\xaf", b"\xfe\xfe\xff\xff")


# -- cases -------------------------------------------------------------------------------------
@dataclass
class Case:
    kind: str                                   # "good", "bad", "arbitrary"
    what: str                                   # the defect or shape, for the figures
    request: pb.GenerateRequest | None
    expect: str | None = None                   # None: served; else the field path the refusal names
    raw: Callable[[bytes], bytes] | None = None  # applied to the serialized request

    def payload(self, tag: str) -> bytes:
        data = b""
        if self.request is not None:
            req = pb.GenerateRequest()
            req.CopyFrom(self.request)
            if req.request_id and self.expect != "request_id":
                req.request_id = f"{req.request_id}#{tag}"     # unique among the requests in flight
            data = req.SerializeToString()
        return self.raw(data) if self.raw is not None else data


def _tokenizer() -> Tokenizer:
    from nvllm.text.tokenizer import Tokenizer
    return Tokenizer.from_dir(ROOT / "models" / MODEL)


_TOK: list[Tokenizer] = []


def tok() -> Tokenizer:
    if not _TOK:
        _TOK.append(_tokenizer())
    return _TOK[0]


def num_prompt_tokens(req: pb.GenerateRequest) -> int:
    which = req.WhichOneof("input")
    if which == "prompt":
        return len(tok().encode(req.prompt))
    if which == "chat":
        return len(tok().encode_chat([{"role": m.role, "content": m.content} for m in req.chat.messages]))
    return len(req.prompt_token_ids.ids)


def repeated(chars: st.SearchStrategy, lo: int, hi: int) -> st.SearchStrategy:
    """A long string made cheaply: a short drawn one repeated to a length in [lo, hi]."""
    return st.builds(lambda s, n: (s * (n // len(s) + 1))[:n], chars, st.integers(lo, hi))


def fits(req: pb.GenerateRequest) -> bool:
    n = num_prompt_tokens(req)
    sp = req.sampling_params
    return 0 < n < MAX_MODEL_LEN and (not sp.HasField("max_tokens") or n + sp.max_tokens <= MAX_MODEL_LEN)


SPECIAL_TEXT = st.sampled_from(["<|im_end|>", "<|im_start|>", "<|endoftext|>", "{{ 7*7 }}", "{% for x in y %}",
                                "$(reboot)", "`id`", "../../etc/passwd", "\x00", "\u202e", "\ufffd", "\U0010ffff"])
TEXT = st.text(min_size=1, max_size=24) | SPECIAL_TEXT
SHORT = st.text(min_size=1, max_size=10) | SPECIAL_TEXT
ROLE = st.sampled_from(["system", "user", "assistant"]) | st.text(min_size=1, max_size=6)
TOKEN_IDS = st.lists(st.integers(0, VOCAB - 1), min_size=1, max_size=64)

# Valid sampling values, the extremes included.
TINY, HUGE = 5e-324, sys.float_info.max
GOOD_SAMPLING = {
    "temperature": st.sampled_from([0.0, TINY, 1e-300, 1e-3, 0.01, 1e6, 1e300, HUGE]) | st.floats(0, 2),
    "top_k": st.integers(-1, 2**31 - 1),
    "top_p": st.sampled_from([TINY, 1e-30, 1.0]) | st.floats(0, 1, exclude_min=True),
    "min_p": st.sampled_from([0.0, 1.0, TINY]) | st.floats(0, 1),
    "presence_penalty": st.sampled_from([-2.0, 2.0]) | st.floats(-2, 2),
    "frequency_penalty": st.sampled_from([-2.0, 2.0]) | st.floats(-2, 2),
    "repetition_penalty": st.sampled_from([TINY, 1e-300, 1e300, HUGE]) | st.floats(0, 10, exclude_min=True),
    "seed": st.integers(0, 2**63 - 1),
    "ignore_eos": st.booleans(),
    "include_stop_str_in_output": st.booleans(),
    "skip_special_tokens": st.booleans(),
    "logprobs": st.integers(0, 20),
}


@st.composite
def good_request(draw) -> pb.GenerateRequest:
    req = pb.GenerateRequest(request_id=draw(st.just("") | st.text(max_size=40)),
                             model=draw(st.sampled_from(["", MODEL])))
    which = draw(st.sampled_from(["prompt", "chat", "prompt_token_ids"]))
    if which == "prompt":
        req.prompt = draw(TEXT)
    elif which == "chat":
        for _ in range(draw(st.integers(1, 2))):
            req.chat.messages.add(role=draw(ROLE), content=draw(st.just("") | SHORT))
    else:
        req.prompt_token_ids.ids.extend(draw(TOKEN_IDS))
    if draw(st.integers(0, 99)) == 37:    # no sampling_params: every default, up to the context's end,
        req.ClearField(which)             # so a prompt near max_model_len keeps the answer short
        req.prompt_token_ids.ids.extend(draw(st.lists(st.integers(0, VOCAB - 1), min_size=MAX_MODEL_LEN - 24,
                                                      max_size=MAX_MODEL_LEN - 1)))
        return req
    sp = req.sampling_params
    sp.SetInParent()
    for name, value in draw(st.fixed_dictionaries({}, optional=GOOD_SAMPLING)).items():
        setattr(sp, name, value)
    sp.max_tokens = draw(st.integers(1, 4))
    if draw(st.booleans()):
        sp.min_tokens = draw(st.integers(0, sp.max_tokens))
    sp.stop.extend(draw(st.lists(SHORT | repeated(SHORT, MAX_STOP_CHARS, MAX_STOP_CHARS),
                                 max_size=MAX_STOP_STRINGS)))
    sp.stop_token_ids.extend(draw(st.lists(st.integers(0, VOCAB - 1), max_size=6)))
    return req


GOOD = good_request().filter(fits)


# The first field number GenerateRequest does not use: the fuzz's unknown fields start there (they began at
# 7 until `structured = 7` was added, when a drawn 7 with another wire type was a corrupt request, rightly).
FIRST_UNKNOWN = max(f.number for f in pb.GenerateRequest.DESCRIPTOR.fields) + 1


def _unknown_fields(draw) -> bytes:
    """Fields this version does not know (proto3 keeps and ignores them)."""
    out = b""
    for _ in range(draw(st.integers(1, 3))):
        number = draw(st.integers(FIRST_UNKNOWN, 2**20))
        kind = draw(st.sampled_from([0, 1, 2, 5]))
        key = _varint(number << 3 | kind)
        if kind == 0:
            out += key + _varint(draw(st.integers(0, 2**64 - 1)))
        elif kind == 1:
            out += key + draw(st.binary(min_size=8, max_size=8))
        elif kind == 5:
            out += key + draw(st.binary(min_size=4, max_size=4))
        else:
            blob = draw(st.binary(max_size=32))
            out += key + _varint(len(blob)) + blob
    return out


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        b, n = n & 0x7F, n >> 7
        out.append(b | (0x80 if n else 0))
        if not n:
            return bytes(out)


@st.composite
def good_case(draw) -> Case:
    req = draw(GOOD)
    if draw(st.integers(0, 9)) == 0:
        extra = _unknown_fields(draw)
        return Case("good", "unknown fields", req, raw=lambda b: b + extra)
    return Case("good", req.WhichOneof("input"), req)


# -- one defect each ------------------------------------------------------------------------------
NAN, INF = math.nan, math.inf
BAD_SAMPLING = {
    "temperature": st.floats(max_value=0, exclude_max=True) | st.sampled_from([NAN, INF, -INF, -0.0001]),
    "top_k": st.integers(-2**31, -2),
    "top_p": st.floats(max_value=0) | st.floats(min_value=1, exclude_min=True) | st.sampled_from([NAN, INF]),
    "min_p": st.floats(max_value=0, exclude_max=True) | st.floats(min_value=1, exclude_min=True)
    | st.sampled_from([NAN, INF]),
    "presence_penalty": st.floats(max_value=-2, exclude_max=True) | st.floats(min_value=2, exclude_min=True)
    | st.sampled_from([NAN]),
    "frequency_penalty": st.floats(max_value=-2, exclude_max=True) | st.floats(min_value=2, exclude_min=True)
    | st.sampled_from([NAN]),
    "repetition_penalty": st.floats(max_value=0) | st.sampled_from([NAN, INF, -TINY]),
    "seed": st.integers(-2**63, -1),
    "max_tokens": st.integers(-2**31, 0) | st.integers(MAX_MODEL_LEN + 1, 2**31 - 1) | st.just(MAX_MODEL_LEN),
    "logprobs": st.integers(-2**31, -1) | st.integers(21, 2**31 - 1),
}
HUGE_BYTES = st.integers(MAX_MESSAGE_BYTES + 1024, int(1.8 * MAX_MESSAGE_BYTES))


def _huge_text(draw) -> str:
    char = draw(st.sampled_from(["x", "é", "€", "😀", " "]))
    return char * (draw(HUGE_BYTES) // len(char.encode()))


def _ensure_sampling(req: pb.GenerateRequest) -> pb.SamplingParams:
    sp = req.sampling_params
    sp.SetInParent()
    if not sp.HasField("max_tokens"):
        sp.max_tokens = 2
    return sp


def _with_marker(req: pb.GenerateRequest, draw) -> tuple[pb.GenerateRequest, str]:
    """Put MARK into one string field; returns the field's path."""
    spots = ["request_id", "model", "prompt", "chat.content", "chat.role", "stop"]
    spot = draw(st.sampled_from(spots))
    if spot in ("request_id", "model", "prompt"):
        setattr(req, spot, MARK)
        return req, spot
    if spot.startswith("chat"):
        req.ClearField("chat")
        n = draw(st.integers(1, 3))
        i = draw(st.integers(0, n - 1))
        for _j in range(n):
            req.chat.messages.add(role="user", content="hi")
        setattr(req.chat.messages[i], spot.split(".")[1], MARK)
        return req, f"chat.messages[{i}].{spot.split('.')[1]}"
    sp = _ensure_sampling(req)
    del sp.stop[:]
    n = draw(st.integers(1, MAX_STOP_STRINGS))
    i = draw(st.integers(0, n - 1))
    sp.stop.extend([MARK if j == i else "stop" for j in range(n)])
    return req, f"sampling_params.stop[{i}]"


@st.composite
def bad_case(draw) -> Case:
    req = pb.GenerateRequest()
    req.CopyFrom(draw(GOOD))
    which = req.WhichOneof("input")
    defect = draw(st.sampled_from([
        "request_id too long", "unknown model", "no input", "empty input", "empty role", "token id outside",
        "prompt too long", "message too big", "sampling value", "min_tokens", "stop strings", "stop_token_ids",
        "invalid utf-8", "invalid utf-8", "invalid utf-8"]))
    if defect == "request_id too long":
        req.request_id = draw(repeated(SHORT, MAX_ID_CHARS + 1, 400))
        return Case("bad", defect, req, "request_id")
    if defect == "unknown model":
        req.model = draw(st.text(min_size=1, max_size=64).filter(lambda m: m != MODEL))
        return Case("bad", defect, req, "model")
    if defect == "no input":
        req.ClearField(which)
        return Case("bad", defect, req, "input")
    if defect == "empty input":
        req.ClearField(which)
        if which == "prompt":
            req.prompt = ""
            return Case("bad", "empty prompt", req, "prompt")
        if which == "chat":
            req.chat.SetInParent()
            return Case("bad", "chat without messages", req, "chat.messages")
        req.prompt_token_ids.SetInParent()
        return Case("bad", "no token ids", req, "prompt_token_ids.ids")
    if defect == "empty role":
        req.ClearField(which)
        n = draw(st.integers(1, 3))
        i = draw(st.integers(0, n - 1))
        for j in range(n):
            req.chat.messages.add(role="" if j == i else "user", content="hi")
        return Case("bad", defect, req, f"chat.messages[{i}].role")
    if defect == "token id outside":
        ids = draw(TOKEN_IDS)
        ids[draw(st.integers(0, len(ids) - 1))] = draw(st.integers(-2**63, -1) | st.integers(VOCAB, 2**63 - 1))
        req.ClearField(which)
        req.prompt_token_ids.ids.extend(ids)
        return Case("bad", defect, req, "prompt_token_ids")
    if defect == "prompt too long":
        req.ClearField(which)
        where = draw(st.sampled_from(["prompt", "chat", "prompt_token_ids"]))
        if where == "prompt_token_ids":
            ids = draw(TOKEN_IDS)
            n = draw(st.integers(MAX_MODEL_LEN, 3 * MAX_MODEL_LEN))
            req.prompt_token_ids.ids.extend((ids * (n // len(ids) + 1))[:n])
        else:
            text = draw(repeated(TEXT, 1000, 4000).filter(lambda t: len(tok().encode(t)) >= MAX_MODEL_LEN))
            if where == "prompt":
                req.prompt = text
            else:
                req.chat.messages.add(role="user", content=text)
        return Case("bad", f"{where} too long", req, where)
    if defect == "message too big":
        where = draw(st.sampled_from(["request_id", "model", "prompt", "chat", "prompt_token_ids",
                                      "sampling_params.stop", "sampling_params.stop_token_ids"]))
        if where in ("request_id", "model"):
            setattr(req, where, _huge_text(draw))
        elif where == "prompt":
            req.prompt = _huge_text(draw)
        elif where == "chat":
            req.ClearField(which)
            req.chat.messages.add(role="user", content=_huge_text(draw))
        elif where == "prompt_token_ids":
            req.ClearField(which)
            req.prompt_token_ids.ids.extend([2**62] * (draw(HUGE_BYTES) // 9))
        elif where == "sampling_params.stop":
            text = _huge_text(draw)
            quarter = len(text) // MAX_STOP_STRINGS
            sp = _ensure_sampling(req)
            del sp.stop[:]
            sp.stop.extend(text[k * quarter:(k + 1) * quarter] for k in range(MAX_STOP_STRINGS))
        else:
            _ensure_sampling(req).stop_token_ids.extend([2**62] * (draw(HUGE_BYTES) // 9))
        return Case("bad", f"{where} too big", req, where)
    if defect == "sampling value":
        name = draw(st.sampled_from(sorted(BAD_SAMPLING)))
        sp = _ensure_sampling(req)
        setattr(sp, name, draw(BAD_SAMPLING[name]))
        if name == "max_tokens":
            sp.ClearField("min_tokens")
        return Case("bad", name, req, f"sampling_params.{name}")
    if defect == "min_tokens":
        sp = _ensure_sampling(req)
        sp.min_tokens = draw(st.integers(-2**31, -1) | st.integers(sp.max_tokens + 1, 2**31 - 1))
        return Case("bad", defect, req, "sampling_params.min_tokens")
    if defect == "stop strings":
        sp = _ensure_sampling(req)
        del sp.stop[:]
        how = draw(st.sampled_from(["too many", "empty", "too long"]))
        if how == "too many":
            sp.stop.extend(draw(st.lists(SHORT, min_size=MAX_STOP_STRINGS + 1, max_size=40)))
        else:
            entries = draw(st.lists(SHORT, max_size=MAX_STOP_STRINGS - 1))
            bad = "" if how == "empty" else draw(repeated(SHORT, MAX_STOP_CHARS + 1, 2000))
            entries.insert(draw(st.integers(0, len(entries))), bad)
            sp.stop.extend(entries)
        return Case("bad", f"stop: {how}", req, "sampling_params.stop")
    if defect == "stop_token_ids":
        sp = _ensure_sampling(req)
        ids = draw(st.lists(st.integers(0, VOCAB - 1), max_size=5))
        ids.insert(draw(st.integers(0, len(ids))), draw(st.integers(-2**63, -1) | st.integers(VOCAB, 2**63 - 1)))
        del sp.stop_token_ids[:]
        sp.stop_token_ids.extend(ids)
        return Case("bad", defect, req, "sampling_params.stop_token_ids")
    # invalid UTF-8: the marker's bytes are replaced by a sequence no UTF-8 decoder accepts.
    req, path = _with_marker(req, draw)
    bad = draw(st.sampled_from(INVALID_UTF8))
    replacement = (bad + b"a" * len(MARK))[:len(MARK)]
    return Case("bad", "invalid utf-8", req, path, raw=lambda b: b.replace(MARK.encode(), replacement))


@st.composite
def arbitrary_case(draw) -> Case:
    if draw(st.booleans()):
        data = draw(st.binary(max_size=80))
        return Case("arbitrary", "random bytes", None, ANY_FIELD, raw=lambda _: data)
    req = draw(GOOD)
    cut = draw(st.floats(0, 1, exclude_max=True))
    return Case("arbitrary", "cut-off message", req, ANY_FIELD, raw=lambda b: b[:int(len(b) * cut)])


CASES = st.one_of(good_case(), good_case(), bad_case(), bad_case(), bad_case(), arbitrary_case())

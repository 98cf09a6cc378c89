"""SamplingParams: vLLM's names, ranges and defaults; every bad value refused by name."""

from __future__ import annotations

import math

import numpy as np
import pytest

from nvllm.sampling_params import InvalidParameter, SamplingParams

NAN, INF = float("nan"), float("inf")


class TestResolve:
    def test_unset_fields_take_vllm_neutral_values(self):
        p = SamplingParams().resolve({})
        assert (p.temperature, p.top_k, p.top_p, p.min_p, p.repetition_penalty) == (1.0, 0, 1.0, 0.0, 1.0)
        assert (p.presence_penalty, p.frequency_penalty, p.min_tokens) == (0.0, 0.0, 0)
        assert p.max_tokens is None and p.seed is None and p.logprobs is None
        assert p.stop == [] and p.stop_token_ids == [] and p.skip_special_tokens is True
        assert not p.ignore_eos and not p.include_stop_str_in_output

    def test_unset_fields_take_the_model_defaults(self):
        gen_config = {"temperature": 0.6, "top_k": 20, "top_p": 0.8, "min_p": 0.05,
                      "repetition_penalty": 1.05, "bos_token_id": 1, "do_sample": True}
        p = SamplingParams().resolve(gen_config)
        assert (p.temperature, p.top_k, p.top_p, p.min_p, p.repetition_penalty) == (0.6, 20, 0.8, 0.05, 1.05)

    def test_request_values_beat_model_defaults(self):
        p = SamplingParams(temperature=0.9, top_k=5, top_p=0.5, min_p=0.0,
                           repetition_penalty=1.0).resolve({"temperature": 0.1, "top_k": 50, "top_p": 0.9,
                                                            "min_p": 0.2, "repetition_penalty": 1.3})
        assert (p.temperature, p.top_k, p.top_p, p.min_p, p.repetition_penalty) == (0.9, 5, 0.5, 0.0, 1.0)

    def test_resolve_returns_a_new_instance(self):
        req = SamplingParams(stop=["a"])
        p = req.resolve({"temperature": 0.5})
        assert req.temperature is None and p.temperature == 0.5
        p.stop.append("b")
        assert req.stop == ["a"]

    def test_top_k_minus_one_is_zero(self):
        assert SamplingParams(top_k=-1).resolve({}).top_k == 0
        assert SamplingParams(top_k=0).resolve({}).top_k == 0

    def test_tiny_temperature_is_raised_to_a_hundredth(self):
        assert SamplingParams(temperature=0.001).resolve({}).temperature == 0.01

    def test_greedy_turns_truncation_off(self):
        p = SamplingParams(temperature=0.0, top_k=3, top_p=0.5, min_p=0.2).resolve({})
        assert p.is_greedy and (p.top_k, p.top_p, p.min_p) == (0, 1.0, 0.0)
        assert SamplingParams().resolve({"temperature": 0.0}).is_greedy
        assert not SamplingParams(temperature=0.7).resolve({}).is_greedy
        assert not SamplingParams().is_greedy  # unresolved: the model decides

    def test_max_tokens_stays_unset_for_the_engine(self):
        # Its default depends on the prompt's length, which only the engine knows.
        assert SamplingParams().resolve({"max_new_tokens": 64}, max_model_len=4096).max_tokens is None
        assert SamplingParams(max_tokens=5).resolve({"max_new_tokens": 64}).max_tokens == 5

    def test_a_bad_model_default_is_reported_as_the_models(self):
        with pytest.raises(InvalidParameter, match="top_p .*generation_config.json") as e:
            SamplingParams().resolve({"top_p": 0.0})
        assert e.value.field == "top_p"

    def test_numpy_scalars_become_python_numbers(self):
        p = SamplingParams(temperature=np.float32(0.5), top_k=np.int64(7), seed=np.int64(3),
                           stop_token_ids=[np.int32(4)]).resolve({})
        assert type(p.temperature) is float and type(p.top_k) is int and type(p.seed) is int
        assert type(p.stop_token_ids[0]) is int

    def test_model_default_integers_for_float_fields(self):
        p = SamplingParams().resolve({"temperature": 1, "top_p": 1})
        assert type(p.temperature) is float and p.temperature == 1.0

    def test_resolve_validates(self):
        with pytest.raises(InvalidParameter, match="^top_p"):
            SamplingParams(top_p=2.0).resolve({})
        with pytest.raises(InvalidParameter, match="^stop"):
            SamplingParams(stop=["a", "b"]).resolve({}, max_stop_strings=1)
        with pytest.raises(InvalidParameter, match="^stop_token_ids"):
            SamplingParams(stop_token_ids=[10]).resolve({}, vocab_size=10)


class TestStop:
    def test_a_single_string_is_wrapped(self):
        # shapes clients send that the field's annotation (list[str]) leaves out; __post_init__ makes them lists
        assert SamplingParams(stop="###").stop == ["###"]  # type: ignore[arg-type]
        assert SamplingParams(stop=("a", "b")).stop == ["a", "b"]  # type: ignore[arg-type]
        assert SamplingParams(stop=None).stop == []  # type: ignore[arg-type]

    def test_limits_are_inclusive(self):
        SamplingParams(stop=["x" * 256] * 16).validate()
        SamplingParams(stop=["abc"] * 3).validate(max_stop_strings=3, max_stop_string_chars=3)


class TestAcceptsBoundaries:
    @pytest.mark.parametrize("field,value", [
        ("temperature", 0), ("temperature", 0.0), ("temperature", 100.0), ("top_k", -1), ("top_k", 0),
        ("top_k", 1), ("top_k", 10**6), ("top_p", 1.0), ("top_p", 1e-9), ("min_p", 0.0), ("min_p", 1.0),
        ("presence_penalty", -2.0), ("presence_penalty", 2), ("frequency_penalty", -2),
        ("frequency_penalty", 2.0), ("repetition_penalty", 1e-6), ("repetition_penalty", 5.0),
        ("seed", 0), ("seed", 2**64 - 1), ("seed", None), ("max_tokens", 1), ("max_tokens", None),
        ("min_tokens", 0), ("logprobs", 0), ("logprobs", 20), ("logprobs", None),
        ("stop_token_ids", [0, 5]), ("ignore_eos", True), ("skip_special_tokens", False),
        ("temperature", np.float64(0.7)), ("top_k", np.int32(4)),
    ])
    def test_accepted(self, field, value):
        SamplingParams(**{field: value}).resolve({}, vocab_size=100, max_model_len=4096)

    def test_max_and_min_tokens_at_their_limits(self):
        SamplingParams(max_tokens=4096, min_tokens=4096).validate(max_model_len=4096)


# (field, value, extra kwargs for the instance, validate() kwargs)
BAD = [
    ("temperature", NAN), ("temperature", INF), ("temperature", -INF), ("temperature", -0.1),
    ("temperature", "0.5"), ("temperature", True), ("temperature", [1.0]), ("temperature", np.nan),
    ("top_k", -2), ("top_k", 2.0), ("top_k", 5.5), ("top_k", True), ("top_k", "5"), ("top_k", NAN),
    ("top_p", 0.0), ("top_p", -0.5), ("top_p", 1.0001), ("top_p", NAN), ("top_p", INF), ("top_p", False),
    ("top_p", "0.9"),
    ("min_p", -0.01), ("min_p", 1.01), ("min_p", NAN), ("min_p", INF), ("min_p", True), ("min_p", "0"),
    ("presence_penalty", 2.01), ("presence_penalty", -2.01), ("presence_penalty", NAN),
    ("presence_penalty", INF), ("presence_penalty", True), ("presence_penalty", None),
    ("frequency_penalty", 2.5), ("frequency_penalty", -3), ("frequency_penalty", NAN),
    ("frequency_penalty", -INF), ("frequency_penalty", False), ("frequency_penalty", "1"),
    ("repetition_penalty", 0.0), ("repetition_penalty", -1.0), ("repetition_penalty", NAN),
    ("repetition_penalty", INF), ("repetition_penalty", True), ("repetition_penalty", "1.1"),
    ("seed", -1), ("seed", 1.0), ("seed", True), ("seed", "42"), ("seed", 2**64), ("seed", NAN),
    ("max_tokens", 0), ("max_tokens", -5), ("max_tokens", 1.5), ("max_tokens", 10.0),
    ("max_tokens", True), ("max_tokens", "10"), ("max_tokens", INF),
    ("min_tokens", -1), ("min_tokens", 1.5), ("min_tokens", True), ("min_tokens", None),
    ("min_tokens", NAN),
    ("stop_token_ids", [-1]), ("stop_token_ids", [1.0]), ("stop_token_ids", [True]),
    ("stop_token_ids", "1"), ("stop_token_ids", 5), ("stop_token_ids", [None]),
    ("ignore_eos", 1), ("ignore_eos", "true"), ("ignore_eos", None),
    ("include_stop_str_in_output", 0), ("skip_special_tokens", "no"), ("skip_special_tokens", None),
    ("logprobs", -1), ("logprobs", 21), ("logprobs", 1.5), ("logprobs", 5.0), ("logprobs", True),
    ("logprobs", "5"), ("logprobs", NAN),
    ("stop", [""]), ("stop", ""), ("stop", ["ok", ""]), ("stop", "x" * 257), ("stop", ["x" * 1000]),
    ("stop", ["s"] * 17), ("stop", [1]), ("stop", 5), ("stop", {"a"}), ("stop", [None]),
    ("stop", ["a", b"b"]),
    ("logit_bias", [1]), ("logit_bias", {"1": 1.0}), ("logit_bias", {-1: 1.0}), ("logit_bias", {1: 100.5}),
    ("logit_bias", {1: NAN}), ("logit_bias", {1: "5"}), ("logit_bias", {True: 1.0}),
    ("logit_bias", {i: 1.0 for i in range(1025)}),
]


@pytest.mark.parametrize("field,value", BAD, ids=lambda v: repr(v)[:20])
def test_every_bad_value_is_refused_by_name(field, value):
    p = SamplingParams(**{field: value})
    for check in (lambda: p.validate(), lambda: p.resolve({})):
        with pytest.raises(InvalidParameter) as e:
            check()
        assert e.value.field == field
        msg = str(e.value)
        assert msg.startswith(f"{field} must be "), msg
        assert ", got " in msg and len(msg) < 300, msg


@pytest.mark.parametrize("field,value,kwargs,limits", [
    ("max_tokens", 5000, {}, dict(max_model_len=4096)),
    ("min_tokens", 11, {"max_tokens": 10}, {}),
    ("stop_token_ids", [0, 50257], {}, dict(vocab_size=50257)),
    ("logit_bias", {50257: -5.0}, {}, dict(vocab_size=50257)),
    ("stop", ["a", "b", "c"], {}, dict(max_stop_strings=2)),
    ("stop", ["abcd"], {}, dict(max_stop_string_chars=3)),
])
def test_limits_that_depend_on_the_server_or_the_model(field, value, kwargs, limits):
    with pytest.raises(InvalidParameter) as e:
        SamplingParams(**{field: value}, **kwargs).validate(**limits)
    assert e.value.field == field and str(e.value).startswith(field)


class TestMessages:
    def test_message_names_the_value_and_the_range(self):
        with pytest.raises(InvalidParameter) as e:
            SamplingParams(temperature=NAN).validate()
        assert str(e.value) == "temperature must be a finite number >= 0, got nan"
        assert math.isnan(e.value.value) and e.value.reason == "a finite number >= 0"

    @pytest.mark.parametrize("field,value,text", [
        ("top_p", 1.5, "top_p must be a number in (0, 1], got 1.5"),
        ("top_k", True, "top_k must be an integer, -1 or 0 (off) or >= 1, got True"),
        ("logprobs", 21, "logprobs must be an integer in [0, 20] or unset, got 21"),
        ("repetition_penalty", 0, "repetition_penalty must be a finite number > 0, got 0"),
        ("presence_penalty", -INF, "presence_penalty must be a number in [-2, 2], got -inf"),
        ("stop", ["s"] * 17, "stop must be at most 16 strings, got 17 strings"),
    ])
    def test_exact_messages(self, field, value, text):
        with pytest.raises(InvalidParameter) as e:
            SamplingParams(**{field: value}).validate()
        assert str(e.value) == text

    def test_a_long_stop_string_is_cut_in_the_message(self):
        with pytest.raises(InvalidParameter) as e:
            SamplingParams(stop=["y" * 5000]).validate()
        msg = str(e.value)
        assert msg.startswith("stop must be a list of non-empty strings of at most 256 characters")
        assert "5000 characters" in msg and len(msg) < 250

    def test_an_empty_stop_string_is_named(self):
        with pytest.raises(InvalidParameter, match=r"stop must be .*entry 1 has 0.*got ''"):
            SamplingParams(stop=["ok", ""]).validate()

    def test_invalid_parameter_is_a_value_error(self):
        assert issubclass(InvalidParameter, ValueError)

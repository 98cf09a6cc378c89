"""Whisper's decoding rules on rows of logits (engine/transcription/rules.py), each against the rule as
openai-whisper states it, on a made vocabulary laid out as Whisper's: text, <|endoftext|>, specials, then
timestamps."""

from __future__ import annotations

import numpy as np
import pytest

from nvllm.engine.transcription.rules import MAX_INITIAL_TIMESTAMP, apply_rules, choose
from nvllm.engine.transcription.tokens import WhisperTokens

EOT, SOT, PREV, NOTS, BEGIN = 100, 101, 102, 103, 104
V = BEGIN + 200
T = WhisperTokens(eot=EOT, sot=SOT, sot_prev=PREV, no_timestamps=NOTS, timestamp_begin=BEGIN, no_speech=None,
                  transcribe=None, translate=None, sot_lm=None, languages={}, suppress=(5, SOT, PREV),
                  begin_suppress=(7, EOT))


def row(fill: float = 0.0) -> np.ndarray:
    return np.full(V, fill, np.float32)


def allowed(r: np.ndarray) -> set[int]:
    return set(np.flatnonzero(np.isfinite(r)).tolist())


def test_suppressed_tokens_are_never_chosen_and_the_first_is_neither_space_nor_end() -> None:
    r = row()
    apply_rules(r, T, [], timestamps=False)
    assert not {5, SOT, PREV, 7, EOT} & allowed(r)
    r = row()
    apply_rules(r, T, [9], timestamps=False)
    assert {7, EOT} <= allowed(r) and 5 not in allowed(r)


def test_without_timestamps_no_timestamp_rule_applies() -> None:
    r = row()
    apply_rules(r, T, [BEGIN + 3], timestamps=False)
    assert BEGIN in allowed(r) and 9 in allowed(r)


def test_a_window_opens_on_a_timestamp_within_its_first_second() -> None:
    r = row()
    apply_rules(r, T, [], timestamps=True)
    assert allowed(r) == set(range(BEGIN, BEGIN + MAX_INITIAL_TIMESTAMP + 1))


def test_after_a_segments_text_ends_on_a_timestamp_only_a_timestamp_or_the_end_follows() -> None:
    r = row()
    r[EOT] = 10.0   # likelier than all timestamps together: else they win outright (the last rule)
    apply_rules(r, T, [BEGIN, 9, 10, BEGIN + 20], timestamps=True)
    got = allowed(r)
    assert EOT in got and not any(i < EOT for i in got)
    assert min(i for i in got if i >= BEGIN) == BEGIN + 20   # the same time again closes the pair


def test_after_a_pair_text_follows_and_time_never_goes_back() -> None:
    r = row()
    apply_rules(r, T, [BEGIN, 9, BEGIN + 20, BEGIN + 20], timestamps=True)
    got = allowed(r)
    assert 9 in got and not any(i >= BEGIN for i in got)
    r = row()
    apply_rules(r, T, [BEGIN + 4, 9, 10], timestamps=True)   # mid-segment: a later timestamp, never an earlier one
    got = allowed(r)
    assert BEGIN + 5 in got and not {BEGIN, BEGIN + 4} & got
    assert NOTS not in got


def test_timestamps_win_when_their_mass_beats_every_text_token() -> None:
    r = row(-10.0)
    r[9] = 0.0
    r[BEGIN + 1:BEGIN + 60] = -1.0     # each less likely than token 9, together far more
    apply_rules(r, T, [BEGIN, 9], timestamps=True)
    assert not any(i < BEGIN for i in allowed(r))


def test_choose_is_argmax_at_zero_and_follows_the_distribution_above() -> None:
    r = row(-30.0)
    r[3], r[4] = 2.0, 1.0
    assert choose(r, 0.0, np.random.default_rng(0)) == 3
    rng = np.random.default_rng(0)
    draws = [choose(r, 1.0, rng) for _ in range(2000)]
    share = draws.count(3) / len(draws)
    assert share == pytest.approx(np.e / (np.e + 1), abs=0.04)

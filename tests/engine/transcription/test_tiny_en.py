"""The real Whisper tiny.en (`nvllm models pull whisper-tiny.en`, as README's test command pulls it): the held
speech clips transcribed token for token as transformers transcribes them with the same weights in float32
(tests/golden/whisper/tiny_en_transcripts.json, from tools/whisper_goldens_transcripts.py), one at a time and
all at once."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from helpers.engines import backed_engine
from nvllm.config import Settings
from nvllm.engine.llm_engine import LLMEngine
from nvllm.transcription_params import TranscriptionParams

ROOT = Path(__file__).resolve().parents[3]
MODEL = ROOT / "models" / "whisper-tiny.en"
SPEECH = ROOT / "tests" / "data" / "speech"
GOLDEN = json.loads((ROOT / "tests" / "golden" / "whisper" / "tiny_en_transcripts.json").read_text())["clips"]

pytestmark = pytest.mark.skipif(not (MODEL / "model.bin").exists(),
                                reason="whisper-tiny.en is not pulled (nvllm models pull whisper-tiny.en)")


@pytest.fixture(scope="module")
def engine() -> LLMEngine:
    s = Settings()
    s.model.path = str(MODEL)
    s.scheduler.max_num_seqs = len(GOLDEN)
    return backed_engine(s)


def transcribe(engine: LLMEngine, clips: list[str]) -> dict[str, tuple[list[int], str]]:
    got: dict[str, tuple[list[int], str]] = {c: ([], "") for c in clips}
    for c in clips:
        engine.add_request(c, {"audio": (SPEECH / f"{c}.wav").read_bytes()}, TranscriptionParams())
    while engine.has_unfinished():
        for out in engine.step():
            assert out.error is None
            tokens, text = got[out.request_id]
            got[out.request_id] = (tokens + out.token_ids, text + out.text)
    return got


def test_each_clip_is_transformers_transcript_token_for_token(engine: LLMEngine) -> None:
    for clip, want in GOLDEN.items():
        tokens, text = transcribe(engine, [clip])[clip]
        assert tokens == want["tokens"], (clip, text)
    assert text.strip() == "Fly the drone back to its landing pad before the wind blows stronger."


def test_the_clips_at_once_give_what_each_gives_alone(engine: LLMEngine) -> None:
    got = transcribe(engine, list(GOLDEN))
    assert {c: t for c, (t, _) in got.items()} == {c: w["tokens"] for c, w in GOLDEN.items()}

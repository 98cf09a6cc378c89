"""nvllm bench --transcribe and --voice-query: the speech benches print their split (front end, encoder, decoder;
upload, transcription, first token, the rest) on a tiny random Whisper, and refuse flags that do not go together,
naming them. Figures are checked for their presence and their sums, never for their speed."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from helpers.paths import TESTS
from nvllm import cli

SPEECH = TESTS / "data" / "speech"


@pytest.fixture(scope="module")
def tiny_whisper(tiny_whispers: dict[str, Path]) -> Path:
    """tiny-whisper (models/tiny_whisper.py): English-only, 80 mel bins, random weights, Whisper's tokenizer."""
    return tiny_whispers["tiny-whisper"]


@pytest.fixture(scope="module")
def clip() -> Path:
    path = SPEECH / "jfk.wav"
    if not path.exists():
        pytest.skip(f"{path} is missing")
    return path


def test_transcribe_bench_splits_each_row(tiny_whisper, clip):
    from nvllm.bench.transcription import bench_transcribe, format_transcribe

    results = bench_transcribe(tiny_whisper, clip, threads=[1], clips=[1, 3], repeats=2)
    assert len(results) == 1
    r = results[0]
    assert r["machine"]["threads"] == 1 and r["model"]["architecture"] == "WhisperForConditionalGeneration"
    assert r["clip"]["seconds"] == pytest.approx(11.0, abs=0.01)   # jfk.wav is 11 s
    one, three = r["runs"]
    assert (one["copies"], three["copies"]) == (1, 3)
    for row in (one, three):
        assert len(row["runs_s"]) == 2 and row["wall_s"] == min(row["runs_s"])
        assert row["front_end_s"] > 0 and row["encoder_s"] > 0 and row["decoder_s"] > 0
        assert row["front_end_s"] + row["encoder_s"] + row["decoder_s"] == pytest.approx(row["wall_s"], abs=2e-3)
        assert row["windows"] >= row["copies"] and row["steps"] >= 1
        assert row["audio_s"] == pytest.approx(11.0 * row["copies"], abs=0.05)
        assert row["x_real_time"] == pytest.approx(row["audio_s"] / row["wall_s"], rel=0.01)
    assert one["rtf"] == pytest.approx(one["wall_s"] / one["audio_s"], rel=0.01)
    table = format_transcribe(results)
    for word in ("front end", "encoder", "decoder", "x real time", "RTF", "11.00 s of audio"):
        assert word in table


def test_cli_transcribe_prints_the_table_and_json(tiny_whisper, clip, capsys):
    assert cli.main(["bench", "--transcribe", str(clip), "--model", str(tiny_whisper), "--clips", "2",
                     "--repeats", "1", "--threads", "1"]) == 0
    out = capsys.readouterr().out
    assert "front end" in out and "encoder" in out and "decoder" in out
    assert cli.main(["bench", "--transcribe", str(clip), "--model", str(tiny_whisper), "--clips", "1",
                     "--repeats", "1", "--threads", "1", "--json"]) == 0
    obj = json.loads(capsys.readouterr().out)
    assert obj["runs"][0]["copies"] == 1 and obj["runs"][0]["encoder_s"] > 0


def test_transcribe_refuses_a_model_that_does_not_transcribe(tiny_whisper, clip, capsys):
    from helpers.paths import MODELS
    llama = MODELS / "tiny-llama"
    if not (llama / "config.json").exists():
        pytest.skip("tiny-llama is not made")
    assert cli.main(["bench", "--transcribe", str(clip), "--model", str(llama), "--clips", "1"]) == 2
    assert "is not a speech model" in capsys.readouterr().err


@pytest.mark.parametrize("argv, named", [
    (["--transcribe", "CLIP", "--voice-query", "CLIP"], "--transcribe and --voice-query"),
    (["--transcribe", "CLIP", "--query", "http://127.0.0.1:1"], "drop --query"),
    (["--transcribe", "CLIP", "--embed"], "drop --embed"),
    (["--transcribe", "CLIP", "--chat-model", "m"], "--chat-model goes with --voice-query"),
    (["--voice-query", "CLIP", "--clips", "1"], "--clips goes with --transcribe"),
    (["--voice-query", "CLIP", "--threads", "1,2"], "--threads takes one count with --voice-query"),
    (["--clips", "1,16"], "--clips goes with --transcribe"),
    (["--chat-model", "m"], "--chat-model goes with --voice-query"),
    (["--transcribe", "CLIP", "--repeats", "0"], "--repeats must be at least 1"),
    (["--transcribe", "no/such.wav"], "--transcribe: no/such.wav: no such file"),
    (["--voice-query", "no/such.wav"], "--voice-query: no/such.wav: no such file"),
    (["--transcribe", "CLIP", "--clips", "0"], "--clips takes positive whole numbers"),
    (["--transcribe", "CLIP", "--clips", "1,x"], "--clips takes positive whole numbers"),
    (["--transcribe", "CLIP", "--clips", "2,2"], "--clips takes positive whole numbers"),
])
def test_speech_flags_that_do_not_go_together_are_refused_by_name(argv, named, capsys):
    clip = str(SPEECH / "jfk.wav")
    argv = [clip if a == "CLIP" else a for a in argv]
    assert cli.main(["bench", *argv]) == 2
    assert named in capsys.readouterr().err


def test_voice_query_reads_each_models_histograms_from_the_metrics_text():
    from nvllm.bench.voice_query import histograms, model_name

    text = "\n".join(f'{name}_{kind}{{model_name="{m}"}} {v}'
                     for m, base in (("speech", 1.0), ("chat", 10.0))
                     for name in ("vllm:e2e_request_latency_seconds", "vllm:time_to_first_token_seconds")
                     for kind, v in (("sum", base), ("count", 2)))
    assert histograms(text, "speech")["e2e"] == (1.0, 2.0)
    assert histograms(text, "chat")["ttft"] == (10.0, 2.0)
    assert histograms(text, "chat")["queue"] == (0.0, 0.0)     # absent: nothing to split
    assert model_name(Path("models/smollm2-135m-instruct.gguf")) == "smollm2-135m-instruct"
    assert model_name(Path("models/whisper-tiny.en")) == "whisper-tiny.en"


def test_voice_query_prints_its_split():
    from nvllm.bench.voice_query import format_voice_query

    r = {"clip": {"path": "q.wav", "bytes": 1}, "speech_model": "whisper", "chat_model": "chat", "threads": 2,
         "repeats": 3, "heard": "How much battery is left?", "answer": "Plenty.", "upload_ms": 1.0,
         "first_token_after_upload_ms": 400.0, "first_token_after_upload_ms_min": 390.0,
         "first_token_after_upload_ms_max": 410.0, "rest_ms": 300.0, "total_ms": 701.0,
         "transcription_ms": 250.0, "first_token_ms": 150.0, "chat_queue_ms": 1.0, "chat_prefill_ms": 120.0}
    text = format_voice_query(r)
    for part in ("upload 1.0", "transcription 250.0", "first token 150.0", "prefill 120.0", "the rest 300.0",
                 "400 ms after the upload ended", "'How much battery is left?'"):
        assert part in text

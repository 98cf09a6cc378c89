"""faster-whisper's side of tools/speech_side_by_side.py, run by the Python of faster-whisper's own venv
(tools/speech_peers_setup.sh makes it; nothing of nvllm is imported here):

    FWVENV/bin/python tools/speech_fw_timing.py CT2_FOLDER CLIP --compute-type int8 --threads 2 \\
        [--passes 3] [--copies 16]

Loads the model (not timed), transcribes the clip once to warm up, then `passes` times, each pass timed from
the file's path to the whole text (faster-whisper decodes the file and computes the features inside
transcribe(), as nvllm's front end does). Greedy (beam_size=1, best_of=1), no timestamps decoded, Whisper's
temperature fallback as faster-whisper's defaults have it. With --copies N the clip is transcribed as N copies at
once by faster-whisper's BatchedInferencePipeline (each copy decoded from the file, laid end to end, and given as
one clip_timestamps region each, batch_size N: the encoder and decoder run the N windows as one batch). Prints
one JSON object: the passes' seconds, the audio's seconds, the first copy's text.
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np
from faster_whisper import BatchedInferencePipeline, WhisperModel, decode_audio

RATE = 16000


def one(model: WhisperModel, clip: str) -> tuple[str, float]:
    segments, info = model.transcribe(clip, beam_size=1, best_of=1, without_timestamps=True, vad_filter=False)
    return "".join(s.text for s in segments).strip(), info.duration


def batched(pipe: BatchedInferencePipeline, clip: str, copies: int) -> tuple[str, float]:
    parts = [decode_audio(clip, sampling_rate=RATE) for _ in range(copies)]
    bounds, at = [], 0
    for p in parts:
        bounds.append({"start": at / RATE, "end": (at + len(p)) / RATE})
        at += len(p)
    segments, info = pipe.transcribe(np.concatenate(parts), beam_size=1, best_of=1, without_timestamps=True,
                                     clip_timestamps=bounds, batch_size=copies)
    texts = [s.text for s in segments]
    return texts[0].strip() if texts else "", info.duration


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("model")
    ap.add_argument("clip")
    ap.add_argument("--compute-type", default="int8")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--passes", type=int, default=3)
    ap.add_argument("--copies", type=int, default=1)
    a = ap.parse_args()
    model = WhisperModel(a.model, device="cpu", compute_type=a.compute_type, cpu_threads=a.threads)
    if a.copies == 1:
        def run() -> tuple[str, float]:
            return one(model, a.clip)
    else:
        pipe = BatchedInferencePipeline(model)

        def run() -> tuple[str, float]:
            return batched(pipe, a.clip, a.copies)
    text, audio = run()   # warm-up
    passes = []
    for _ in range(a.passes):
        t0 = time.perf_counter()
        text, audio = run()
        passes.append(time.perf_counter() - t0)
    print(json.dumps({"passes_s": passes, "audio_s": audio, "text": text}))


if __name__ == "__main__":
    main()

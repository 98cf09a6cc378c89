"""The spoken test clips of tests/data/speech/: short sentences said by espeak-ng, as 16 kHz 16-bit mono WAV.

    python tools/speech_clips.py [--out tests/data/speech]

Each clip is `espeak-ng -v en-us -s 160 --stdout TEXT` (espeak-ng 1.51, the Debian package; it writes
22,050 Hz 16-bit mono WAV), resampled to 16 kHz by soxr (HQ) and written as 16-bit PCM by soundfile. The
WAVs are committed, so the tests need no espeak-ng; rerun this only to change the sentences, and commit what
it writes with the version it printed.
"""

from __future__ import annotations

import argparse
import io
import subprocess
from pathlib import Path

import numpy as np
import soundfile as sf
import soxr

ROOT = Path(__file__).resolve().parent.parent

# name -> sentence: a question to a chat model, a drone's question, and a longer sentence (about 4 s)
CLIPS = {
    "capital": "What is the capital of France?",
    "battery": "How much battery is left?",
    "return": "Fly the drone back to its landing pad before the wind grows stronger.",
}
COMMAND = ["espeak-ng", "-v", "en-us", "-s", "160", "--stdout"]


def speak(text: str) -> np.ndarray:
    """espeak-ng's 16-bit samples of the sentence at 16 kHz."""
    wav = subprocess.run([*COMMAND, text], check=True, capture_output=True).stdout
    samples, rate = sf.read(io.BytesIO(wav), dtype="float32")
    return soxr.resample(samples, rate, 16000, quality="HQ")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=ROOT / "tests" / "data" / "speech")
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    version = subprocess.run(["espeak-ng", "--version"], check=True, capture_output=True, text=True).stdout
    print(version.strip())
    for name, text in CLIPS.items():
        samples = speak(text)
        sf.write(args.out / f"{name}.wav", np.clip(samples, -1.0, 1.0), 16000, subtype="PCM_16")
        print(f"{name}.wav  {len(samples) / 16000:.2f} s  {text}")


if __name__ == "__main__":
    main()

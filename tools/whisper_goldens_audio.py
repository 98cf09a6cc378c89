"""The golden log-mel features of the speech clips, by transformers' WhisperFeatureExtractor, for
tests/audio/test_features.py.

    python tools/whisper_goldens_audio.py [--out tests/golden/whisper]

Run in a separate venv with transformers and torch (never nvllm's). The extractor's NumPy path is the
reference (`_np_extract_fbank_features`, what it runs without torch); with torch installed it would run
torch.stft instead, so torch is hidden from it here, and how far the torch path lies from the NumPy one is
written beside the goldens (`torch_path_max_diff`).

Writes features_<clip>.npz for each WAV of tests/data/speech/ (16 kHz 16-bit mono, read as int16 / 32768,
which is what soundfile gives) and features_edges.npz. Whole arrays would be megabytes, so each keeps slices
in full and checksums of the rest; for 80 and 128 mel bins:
- `<n>_whole_*`: the whole clip (padding="longest", truncation=False): `shape`, `head` (the first 100
  frames), `mid` (100 frames from frames // 2 - 50), `tail` (the last 20), `frame_sums` and `bin_sums`
  (float64 sums over bins, over frames).
- `<n>_chunk_*`: the default 30-s chunk (padding="max_length"): `head` (50 frames), `edge` (20 frames
  around the clip's end, from len // 160 - 10, where the zero padding starts), `frame_sums`, `bin_sums`.
features_edges.npz: seeded noise of 160, 333 and 4000 samples (`<name>_input`, `<name>_<n>_whole` in full, 80
and 128 bins) and jfk three times over (33 s: `jfk3_<n>_chunk_*` cut to 30 s, `jfk3_<n>_whole_*`).
"""

from __future__ import annotations

import argparse
import json
import wave
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
SPEECH = ROOT / "tests" / "data" / "speech"
MELS = (80, 128)


def read_wav(path: Path) -> np.ndarray:
    with wave.open(str(path)) as w:
        assert (w.getframerate(), w.getsampwidth(), w.getnchannels()) == (16000, 2, 1), path
        return np.frombuffer(w.readframes(w.getnframes()), "<i2").astype(np.float32) / 32768


class Reference:
    def __init__(self) -> None:
        import transformers
        from transformers import WhisperFeatureExtractor
        from transformers.models.whisper import feature_extraction_whisper

        self.module = feature_extraction_whisper
        self.extractors = {n: WhisperFeatureExtractor(feature_size=n) for n in MELS}
        self.versions = {"transformers": transformers.__version__, "numpy": np.__version__}
        try:
            import torch
            self.versions["torch"] = torch.__version__
        except ImportError:
            pass

    def features(self, x: np.ndarray, n: int, chunk: bool, torch_path: bool = False) -> np.ndarray:
        kw: dict[str, Any] = {"sampling_rate": 16000, "return_tensors": "np"}
        if not chunk:
            kw.update(padding="longest", truncation=False)
        available = self.module.is_torch_available
        if not torch_path:
            self.module.is_torch_available = lambda: False
        try:
            return self.extractors[n](x, **kw).input_features[0]
        finally:
            self.module.is_torch_available = available


def slices(out: dict[str, np.ndarray], key: str, f: np.ndarray, samples: int, chunk: bool) -> None:
    frames = f.shape[1]
    out[f"{key}_frame_sums"] = f.astype(np.float64).sum(axis=0)
    out[f"{key}_bin_sums"] = f.astype(np.float64).sum(axis=1)
    if chunk:
        edge = min(max(0, samples // 160 - 10), frames - 20)
        out[f"{key}_head"] = f[:, :50]
        out[f"{key}_edge"] = f[:, edge:edge + 20]
    else:
        mid = max(0, frames // 2 - 50)
        out[f"{key}_shape"] = np.array(f.shape)
        out[f"{key}_head"] = f[:, :100]
        out[f"{key}_mid"] = f[:, mid:mid + 100]
        out[f"{key}_tail"] = f[:, -20:]


def clip_goldens(ref: Reference, x: np.ndarray, prefix: str = "") -> tuple[dict[str, np.ndarray], float]:
    out: dict[str, np.ndarray] = {}
    torch_diff = 0.0
    for n in MELS:
        for chunk in (False, True):
            f = ref.features(x, n, chunk)
            slices(out, f"{prefix}{n}_{'chunk' if chunk else 'whole'}", f, len(x), chunk)
            if "torch" in ref.versions:
                torch_diff = max(torch_diff, float(np.abs(ref.features(x, n, chunk, torch_path=True) - f).max()))
    return out, torch_diff


def save(path: Path, arrays: dict[str, Any], meta: dict) -> None:
    np.savez_compressed(path, meta=np.array(json.dumps(meta, sort_keys=True)), **arrays)
    print(f"{path.relative_to(ROOT)}  {path.stat().st_size // 1024} KiB  torch path max diff "
          f"{meta['torch_path_max_diff']:.2e}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=ROOT / "tests" / "golden" / "whisper")
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    ref = Reference()
    meta = {"reference": "WhisperFeatureExtractor._np_extract_fbank_features", **ref.versions}
    for wav in sorted(SPEECH.glob("*.wav")):
        arrays, torch_diff = clip_goldens(ref, read_wav(wav))
        save(args.out / f"features_{wav.stem}.npz", arrays,
             {**meta, "clip": wav.name, "samples": len(read_wav(wav)), "torch_path_max_diff": torch_diff})

    rng = np.random.default_rng(52)
    edges: dict[str, np.ndarray] = {}
    worst = 0.0
    for length in (160, 333, 4000):
        x = (rng.standard_normal(length) * 0.1).astype(np.float32)
        edges[f"noise{length}_input"] = x
        for n in MELS:
            f = ref.features(x, n, chunk=False)
            edges[f"noise{length}_{n}_whole"] = f
            if "torch" in ref.versions and length > 200:    # torch.stft's reflect pad needs 201 samples
                worst = max(worst, float(np.abs(ref.features(x, n, False, torch_path=True) - f).max()))
    arrays, torch_diff = clip_goldens(ref, np.tile(read_wav(SPEECH / "jfk.wav"), 3), prefix="jfk3_")
    save(args.out / "features_edges.npz", {**edges, **arrays},
         {**meta, "clip": "seeded noise; jfk.wav three times", "torch_path_max_diff": max(worst, torch_diff)})


if __name__ == "__main__":
    main()

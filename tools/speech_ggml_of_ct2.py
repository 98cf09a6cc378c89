"""A CTranslate2 Whisper folder written as whisper.cpp's ggml f16 .bin, so that whisper.cpp runs the very weights
nvllm and faster-whisper read (tools/speech_side_by_side.py compares the three):

    .venv/bin/python tools/speech_ggml_of_ct2.py CT2_FOLDER OUT.bin

The tensors come by Hugging Face name from nvllm's CTranslate2 reader (its fused q|k|v split back), the file is
laid out by the ggml writer the reader's tests use (tests/helpers/ggml_writer.py: the layout of whisper.cpp's
models/convert-h5-to-ggml.py, F16 matrices and convolutions, float32 vectors, positions and conv biases), with
the real mel filters in it (whisper.cpp computes its log-mel with the file's filters; the tests' files hold
zeros): nvllm's own, Slaney's as librosa and openai-whisper's assets have them. The vocabulary is the folder's
tokenizer.json's, each token's bytes, in id order up to <|endoftext|> (whisper.cpp names the special tokens
after it itself).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
from helpers.ggml_writer import ggml_bytes  # noqa: E402
from nvllm.audio.features import mel_filters  # noqa: E402
from nvllm.model.weights.ct2_file import open_ct2  # noqa: E402
from nvllm.model.weights.ct2_whisper import ct2_dims, hf_tensors  # noqa: E402
from nvllm.text.whisper_vocab import BYTE_CHARS  # noqa: E402

_FILTERS_AT = 4 + 11 * 4 + 2 * 4   # magic, the hyperparameters, the filters' two sizes


def vocabulary(tokenizer_json: Path) -> list[bytes]:
    """Each ordinary token's bytes, by id, through <|endoftext|>."""
    vocab = json.loads(tokenizer_json.read_text(encoding="utf-8"))["model"]["vocab"]
    byte_of = {ch: b for b, ch in enumerate(BYTE_CHARS)}
    by_id = sorted(vocab.items(), key=lambda kv: kv[1])
    if [i for _, i in by_id] != list(range(len(by_id))):
        raise ValueError(f"{tokenizer_json}: the vocabulary's ids are not 0..{len(by_id) - 1}")
    return [bytes(byte_of[c] for c in tok) for tok, _ in by_id]


def main() -> int:
    if len(sys.argv) != 3:
        print(__doc__.split("\n\n")[1], file=sys.stderr)
        return 2
    folder, out = Path(sys.argv[1]), Path(sys.argv[2])
    f = open_ct2(folder / "model.bin")
    dims = ct2_dims(f)
    tensors = {}
    for name, (fmt, raw, shape) in hf_tensors(f, dims).items():
        dtype = {"F16": np.float16, "F32": np.float32}.get(fmt.name)
        if dtype is None:
            raise ValueError(f"{name} is stored as {fmt.name}: write the ggml file from an F16 or F32 folder")
        tensors[name] = raw.view(dtype).reshape(shape).astype(np.float32)
    data = bytearray(ggml_bytes(tensors, dims, vocabulary(folder / "tokenizer.json"), "F16"))
    filters = np.ascontiguousarray(mel_filters(dims.num_mel_bins).T, dtype=np.float32)   # [n_mels, 201]
    data[_FILTERS_AT:_FILTERS_AT + filters.nbytes] = filters.tobytes()
    out.write_bytes(bytes(data))
    print(f"{out}: {len(data) / 2**20:.1f} MiB, {len(tensors)} tensors, vocabulary of {dims.vocab_size}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

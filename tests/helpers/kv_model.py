"""A small GGUF whose heads every KV format can take (64 wide: q8_0's blocks of 32 divide them)."""

from __future__ import annotations

from pathlib import Path

from nvllm.model_files.synthetic.shapes import Shape
from nvllm.model_files.synthetic.writer import synthesize


def hd64_gguf(folder: Path) -> Path:
    shape = Shape("kv", "qwen2", 256, 512, 2, 4, 2, 64, 1024, 512, 1e6, 1e-6, "qwen2", {1000: "<|endoftext|>"},
                  bos=1000, eos=1000, bpe=1000)
    return Path(synthesize(shape, "Q8_0", folder / "hd64.gguf"))

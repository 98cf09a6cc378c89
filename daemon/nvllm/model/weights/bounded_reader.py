"""A weight file read from its mapping with every read checked against the bytes left: a hostile header can
ask for no more than the file holds (CTranslate2's model.bin, whisper.cpp's ggml .bin)."""

from __future__ import annotations

from pathlib import Path

from nvllm.model.config import ModelLoadError


class BoundedReader:
    def __init__(self, buf: memoryview, path: Path) -> None:
        self.buf, self.path, self.pos = buf, path, 0

    def fail(self, what: str) -> ModelLoadError:
        return ModelLoadError(f"{self.path}: {what}")

    def left(self) -> int:
        return len(self.buf) - self.pos

    def take(self, n: int, what: str) -> memoryview:
        if n > self.left():
            raise self.fail(f"{what} needs {n} bytes at offset {self.pos} but the file ends {self.left()} bytes "
                            "later (truncated or corrupt)")
        b = self.buf[self.pos:self.pos + n]
        self.pos += n
        return b

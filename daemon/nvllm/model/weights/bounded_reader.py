"""A weight file read from its mapping with every read checked against the bytes left: a hostile header can
ask for no more than the file holds (CTranslate2's model.bin, whisper.cpp's ggml .bin)."""

from __future__ import annotations

import mmap
import os
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

from nvllm.model.config import ModelLoadError

R = TypeVar("R", bound="BoundedReader")
T = TypeVar("T")


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


def read_mapped(path: Path, min_bytes: int, what: str, reader: type[R], read: Callable[[R, mmap.mmap], T]) -> T:
    """The file mapped (refused below min_bytes, `what` naming the kind of model) and read by `read` through a
    `reader` over the mapping; on any failure the mapping is closed before the error goes on."""
    try:
        with open(path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            if size < min_bytes:
                raise ModelLoadError(f"{path}: {size} bytes is too short for {what} (truncated?)")
            mm = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    except OSError as e:
        raise ModelLoadError(f"{path}: cannot read ({e.strerror or e})") from None
    try:
        buf = memoryview(mm)
        try:
            return read(reader(buf, path), mm)
        finally:
            buf.release()
    except BaseException:
        try:
            mm.close()
        except BufferError:   # a view is still referenced (by the traceback): the GC unmaps it later
            pass
        raise

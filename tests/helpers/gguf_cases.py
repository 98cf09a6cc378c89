"""What the GGUF file tests share (tests/model/weights/test_gguf_*.py): the tiny random folders they write GGUFs from,
and a small random GGUF written again with metadata keys added or dropped."""

from __future__ import annotations

from pathlib import Path

import gguf
import numpy as np
import pytest
from gguf import GGMLQuantizationType as T

from helpers import gguf_util as gu
from helpers.paths import ROOT


def tiny_folder(tiny_models: dict, name: str) -> Path:
    """A tiny random model folder (models/make_test_models.py); the test skips where it is not made yet."""
    path = tiny_models.get(name, ROOT / "models" / name)
    if not (path / "config.json").exists():
        pytest.skip(f"{name} is not made by models/make_test_models.py yet")
    return path


def rewrite_gguf(tmp_path: Path, extra: dict | None = None, drop: tuple = (), arch: str = "llama",
                 qtype: T = T.F32) -> Path:
    """A small random GGUF written again with keys added or dropped (GGUFWriter, not byte surgery)."""
    src = gu.write_random_gguf(tmp_path / "src.gguf", qtype, arch, hidden=64, intermediate=128, vocab=32)
    extra = dict(extra or {})
    return rewrite_file(src, tmp_path / "rewritten.gguf", extra.pop("general.architecture", arch), drop, extra)


def rewrite_file(src: Path, out: Path, arch: str, drop: tuple = (), extra: dict | None = None,
                 tensors: dict[str, np.ndarray | None] | None = None) -> Path:
    """src written again as arch with keys dropped or set (a bool, list, string, float32 or uint32 by the
    value's type) and tensors dropped (None), replaced or added."""
    reader = gguf.GGUFReader(str(src))
    extra, tensors = dict(extra or {}), dict(tensors or {})
    w = gguf.GGUFWriter(str(out), arch)
    for k, f in reader.fields.items():
        if k.startswith("GGUF.") or k == "general.architecture" or k in drop or k in extra:
            continue
        vtype = f.types[0]
        if vtype == gguf.GGUFValueType.ARRAY:
            w.add_array(k, f.contents())
        else:
            w.add_key_value(k, f.contents(), vtype)
    for k, v in extra.items():
        if isinstance(v, bool):
            w.add_bool(k, v)
        elif isinstance(v, list):
            w.add_array(k, v)
        elif isinstance(v, str):
            w.add_string(k, v)
        elif isinstance(v, float):
            w.add_float32(k, v)
        else:
            w.add_uint32(k, v)
    for t in reader.tensors:
        if t.name not in tensors:
            w.add_tensor(t.name, np.array(t.data), raw_dtype=t.tensor_type)
    for name, data in tensors.items():
        if data is not None:
            w.add_tensor(name, data)
    return gu._finish(w, out)

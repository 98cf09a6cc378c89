"""tools/quality.py --activations: the GGUF scored once per activations mode against its float path."""
from __future__ import annotations

import importlib.util
import re
import sys

import pytest

from helpers.paths import ROOT
from nvllm.model.synthetic.shapes import Shape
from nvllm.model.synthetic.writer import synthesize


@pytest.fixture()
def quality(keep_int_variant):
    spec = importlib.util.spec_from_file_location("quality_tool", ROOT / "tools" / "quality.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules["quality_tool"] = mod   # its dataclasses look their module up there
    spec.loader.exec_module(mod)
    return mod


def test_activations_are_scored_against_the_float_path(quality, tmp_path, capsys):
    shape = Shape("q", "qwen2", 256, 512, 2, 4, 2, 64, 1024, 512, 1e6, 1e-6, "qwen2", {1000: "<|endoftext|>"},
                  bos=1000, eos=1000, bpe=1000)
    path = synthesize(shape, "Q4_K_M", tmp_path / "q.gguf")
    assert quality.main(["--folder", "", "--gguf", str(path), "--activations", "exact,int8", "--tokens", "80"]) == 0
    out = capsys.readouterr().out.splitlines()
    agree = {}
    for mode in ("float", "exact", "int8"):
        line = next(r for r in out if r.startswith(f"q.gguf, x {mode} "))
        agree[mode] = float(re.findall(r"([\d.]+)%", line)[0])
    assert agree["float"] == 100.0   # the reference itself
    assert agree["int8"] <= agree["exact"] <= 100.0


def test_bad_modes_and_a_missing_reference_are_refused(quality, tmp_path):
    with pytest.raises(SystemExit, match="--activations: 'int4'"):
        quality.main(["--activations", "int4", "--formats", ""])
    with pytest.raises(SystemExit, match="needs --gguf FILE and --activations"):
        quality.main(["--folder", "", "--gguf", str(tmp_path / "none.gguf")])

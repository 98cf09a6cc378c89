"""tools/quality.py --activations: the GGUF scored once per activations mode against its float path."""
from __future__ import annotations

import importlib.util
import re
import sys

import pytest

from helpers.paths import ROOT
from nvllm.model_files.synthetic.shapes import Shape
from nvllm.model_files.synthetic.writer import synthesize


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


def test_kv_formats_are_scored_against_an_f32_pool(quality, tmp_path, capsys):
    shape = Shape("k", "qwen2", 256, 512, 2, 4, 2, 64, 1024, 512, 1e6, 1e-6, "qwen2", {1000: "<|endoftext|>"},
                  bos=1000, eos=1000, bpe=1000)
    path = synthesize(shape, "Q8_0", tmp_path / "k.gguf")
    assert quality.main(["--folder", "", "--gguf", str(path), "--kv-cache-dtypes", "f16,q8_0", "--tokens", "80"]) == 0
    rows = {r.split()[0]: r.split() for r in capsys.readouterr().out.splitlines()[1:]}
    assert set(rows) == {"f32", "f16", "q8_0"}
    assert rows["f32"][2] == "+0.000%" and rows["f32"][3] == "100.00%"
    assert rows["f16"][2] != "+0.000%" or float(rows["f16"][4]) > 0   # f16 does round the pool
    with pytest.raises(SystemExit, match="--kv-cache-dtypes: 'fp8'"):
        quality.main(["--folder", "", "--gguf", str(path), "--kv-cache-dtypes", "fp8"])

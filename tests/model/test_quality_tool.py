"""tools/quality.py: the KV pool's formats scored against an f32 pool; a GGUF's activation modes are `nvllm bench
--quality`'s (tests/bench/test_bench_quality.py)."""
from __future__ import annotations

import importlib.util
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


def test_a_folder_is_needed_but_for_the_kv_formats(quality, tmp_path):
    with pytest.raises(SystemExit, match="nvllm bench --quality"):   # the activation modes are bench's now
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

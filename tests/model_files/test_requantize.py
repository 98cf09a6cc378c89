"""nvllm.model_files.synthetic.requantize (`nvllm models quantize`): a GGUF written again in another file type
as llama-quantize writes it: its tensor order, each tensor's type, each tensor's bytes, the metadata
copied with its own value types; and clear refusals."""
from __future__ import annotations

import subprocess
import sys
from collections import Counter
from pathlib import Path

import gguf
import numpy as np
import pytest
from gguf import GGMLQuantizationType as T

from helpers.gguf_type_cases import FILE_TYPES, TINY256
from helpers.gguf_util import write_random_gguf
from helpers.paths import ROOT
from nvllm.model.quant.dequantize import dequantize
from nvllm.model.quant.formats import FORMATS
from nvllm.model.quant.quantize import quantize
from nvllm.model.weights.gguf_file import read_gguf
from nvllm.model_files.synthetic.requantize import quantize_order, requantize

BY_NAME = {f.name: f for f in FORMATS.values()}
# What llama-cpp-python 0.3.36's llama-quantize wrote from the same tiny256 F32 file (every tensor's
# bytes matched nvllm's too; the SmolLM2 files' golden hashes are those of its output as well).
LLAMA_QUANTIZE_TYPES = {
    "Q5_0": {"Q5_0": 15, "F32": 5, "Q6_K": 1},
    "IQ4_NL": {"IQ4_NL": 15, "F32": 5, "Q6_K": 1},
    "Q3_K_M": {"Q3_K": 9, "F32": 5, "Q4_K": 4, "Q5_K": 2, "Q6_K": 1},
    "Q2_K": {"Q2_K": 9, "Q3_K": 6, "F32": 5, "Q6_K": 1},
    "IQ4_XS": {"IQ4_XS": 15, "F32": 5, "Q6_K": 1},
}


@pytest.fixture(scope="module")
def source(tmp_path_factory) -> Path:
    return write_random_gguf(tmp_path_factory.mktemp("src") / "tiny256-F32.gguf", T.F32, **TINY256)


def test_order_is_llama_quantizes() -> None:
    names = ["token_embd.weight", "blk.0.ffn_down.weight", "blk.1.attn_q.weight", "blk.10.attn_q.weight",
             "blk.2.attn_q.weight", "blk.0.attn_norm.weight", "output_norm.weight", "blk.9.attn_k.weight"]
    assert quantize_order(names) == [
        "output_norm.weight", "token_embd.weight", "blk.0.attn_norm.weight", "blk.0.ffn_down.weight",
        "blk.1.attn_q.weight", "blk.2.attn_q.weight", "blk.9.attn_k.weight", "blk.10.attn_q.weight"]


@pytest.mark.parametrize("file_type", FILE_TYPES)
def test_tensors_are_the_source_quantized_as_llama_quantize_types_them(file_type, source, tmp_path):
    out = requantize(source, file_type, tmp_path / f"{file_type}.gguf")
    src, new = read_gguf(source), read_gguf(out)
    assert list(new.tensors) == quantize_order(src.tensors)
    assert Counter(fmt.name for fmt, _, _ in new.tensors.values()) == LLAMA_QUANTIZE_TYPES[file_type]
    for name, (fmt, raw, shape) in new.tensors.items():
        sfmt, sraw, sshape = src.tensors[name]
        assert shape == sshape, name
        values = np.asarray(dequantize(sfmt, sraw, sshape), np.float32).reshape(-1, shape[-1])
        assert raw.tobytes() == quantize(fmt, values).tobytes(), name
    assert new.config == src.config


def test_metadata_is_copied_with_its_types(source, tmp_path):
    out = requantize(source, "Q2_K", tmp_path / "q2k.gguf")
    a, b = gguf.GGUFReader(str(source)).fields, gguf.GGUFReader(str(out)).fields
    skip = {"general.file_type", "GGUF.tensor_count", "GGUF.kv_count"}
    assert set(a) == set(b)
    for key in set(a) - skip:
        assert a[key].types == b[key].types and a[key].contents() == b[key].contents(), key
    assert b["general.file_type"].contents() == 10            # LLAMA_FTYPE_MOSTLY_Q2_K


def test_from_a_quantized_file_the_values_are_read_back(source, tmp_path):
    """--allow-requantize's way: a Q5_0 file written again in Q8_0 holds the Q5_0 values quantized."""
    q5 = requantize(source, "Q5_0", tmp_path / "q5.gguf")
    q8 = requantize(q5, "Q8_0", tmp_path / "q8.gguf")
    fmt, raw, shape = read_gguf(q5).tensors["blk.0.attn_q.weight"]
    fmt8, raw8, _ = read_gguf(q8).tensors["blk.0.attn_q.weight"]
    assert fmt8.name == "Q8_0"
    assert raw8.tobytes() == quantize(BY_NAME["Q8_0"], dequantize(fmt, raw, shape)).tobytes()


def run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "nvllm.cli", "models", "quantize", *args],
                          cwd=ROOT, capture_output=True, text=True, timeout=120)


def test_cli_writes_the_file_and_refuses_clearly(source, tmp_path):
    out = tmp_path / "cli-IQ4_XS.gguf"
    r = run(str(source), "--type", "IQ4_XS", "--out", str(out))
    assert r.returncode == 0 and r.stdout.strip() == str(out), r.stderr
    assert read_gguf(out).tensors["blk.0.ffn_up.weight"][0].name == "IQ4_XS"

    r = run(str(source), "--type", "Q4_K_S", "--out", str(tmp_path / "x.gguf"))
    assert r.returncode == 2 and "--type must be one of" in r.stderr and "Q4_K_S" in r.stderr
    r = run(str(source), "--type", "Q8_0", "--out", str(source))
    assert r.returncode == 2 and "--out must not be the file being read" in r.stderr
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(source.read_bytes()[:4096])                 # cut inside the metadata
    r = run(str(bad), "--type", "Q8_0", "--out", str(tmp_path / "y.gguf"))
    assert r.returncode == 1 and "Traceback" not in r.stderr and str(bad) in r.stderr
    assert not list(tmp_path.glob("y.gguf*"))


def test_the_help_names_every_file_type() -> None:
    """The CLI's help is written out (building it must not import NumPy); it lists what requantize takes."""
    from nvllm.model_files.synthetic.mixture import FILE_TYPES

    for action in ("quantize", "synthesize"):
        r = subprocess.run([sys.executable, "-m", "nvllm.cli", "models", action, "--help"],
                           cwd=ROOT, capture_output=True, text=True, timeout=60)
        assert r.returncode == 0
        listed = r.stdout.replace("\n", " ").replace("or ", ", ")
        assert all(f" {t}," in listed or f" {t} " in listed for t in FILE_TYPES), (action, r.stdout)

"""nvllm bench --quality (bench/quality.py): each activation mode and weight format against a float
reference, as llama-perplexity --kl-divergence reports it, and the greedy chat answers a user sees."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from nvllm import LLM, SamplingParams
from nvllm.bench.chat_prompts import PROMPTS
from nvllm.bench.quality import ANSWER_TOKENS, Source, bench_quality
from nvllm.model.kernels import matmul
from nvllm.model_files.synthetic.requantize import requantize
from nvllm.model_files.synthetic.shapes import Shape
from nvllm.model_files.synthetic.writer import synthesize

FEW = PROMPTS[:6]


@pytest.fixture(scope="module")
def q8(tiny_ggufs, tmp_path_factory) -> Path:
    return requantize(tiny_ggufs["tiny-llama"], "Q8_0", tmp_path_factory.mktemp("quality") / "tiny-q8_0.gguf")


def nvllm(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "nvllm.cli", *args], capture_output=True, text=True, timeout=600)


def test_a_model_against_itself_scores_zero_whatever_reads_it_beside(q8, tmp_path, keep_int_variant):
    """The same file under another name, in the reference's own mode: every figure says "the same", so
    the rows read the same positions with the same context as the reference in lockstep."""
    twin = shutil.copy(q8, tmp_path / "twin.gguf")
    result = bench_quality(Source(q8), activations=("float", "int8"), sources=[Source(Path(twin))],
                           max_tokens=200, prompts=FEW, progress=False)
    same, int8 = result["rows"]
    assert (same["activations"], int8["activations"]) == ("float", "int8")
    assert same["kl_max"] == 0 and same["ppl_change"] == 0
    assert same["same_top"] == same["greedy_equal"] == same["first_equal"] == 1 and same["differing_prompts"] == []
    assert result["text"]["tokens"] == 200 and result["prompts"] == len(FEW)
    assert 0 < int8["kl_median"] <= int8["kl_p99"] <= int8["kl_max"] and int8["kl_mean"] <= int8["kl_max"]
    assert int8["ppl_change"] == pytest.approx(int8["ppl"] / result["reference"]["ppl"] - 1)


def test_each_mode_answers_as_an_engine_built_in_that_mode(q8, keep_int_variant):
    """One loaded model serves every mode (the process's variant, set before each call): its greedy answers
    are those of an offline LLM built with that mode, and the int8 row moves further from float than exact."""
    result = bench_quality(Source(q8), max_tokens=300, prompts=FEW, progress=False)
    rows = {r["activations"]: r for r in result["rows"]}
    assert set(rows) == {"exact", "int8"}
    assert rows["exact"]["kl_mean"] < rows["int8"]["kl_mean"]
    want = {}
    for mode in ("float", "exact", "int8"):
        llm = LLM(q8, activations=mode)
        want[mode] = [o.token_ids for o in llm.chat([[{"role": "user", "content": p}] for p in FEW],
                                                   SamplingParams(temperature=0, max_tokens=ANSWER_TOKENS))]
        if mode == "float":
            assert result["reference"]["first_answer"] == llm.tokenizer.decode(want[mode][0], skip_special_tokens=True)
    for mode in ("exact", "int8"):
        differ = [i for i in range(len(FEW)) if want[mode][i] != want["float"][i]]
        assert rows[mode]["differing_prompts"] == differ
        assert rows[mode]["greedy_equal"] == pytest.approx(1 - len(differ) / len(FEW))
    assert matmul.int_variant()   # put back by keep_int_variant


def test_a_k_quant_file_of_a_real_shape_is_closer_in_exact_than_in_int8(tmp_path, keep_int_variant):
    shape = Shape("q", "qwen2", 256, 512, 2, 4, 2, 64, 1024, 512, 1e6, 1e-6, "qwen2", {1000: "<|endoftext|>"},
                  bos=1000, eos=1000, bpe=1000)
    path = synthesize(shape, "Q4_K_M", tmp_path / "q.gguf")
    rows = {r["activations"]: r for r in bench_quality(Source(path), max_tokens=80, prompts=FEW,
                                                        progress=False)["rows"]}
    assert rows["int8"]["same_top"] <= rows["exact"]["same_top"] <= 1
    assert rows["exact"]["kl_mean"] < rows["int8"]["kl_mean"]


def test_weight_formats_of_an_f32_source_each_a_row(tiny_ggufs):
    r = nvllm("bench", "--quality", "--model", str(tiny_ggufs["tiny-llama"]), "--formats", "Q8_0,Q4_K_M",
              "--activations", "exact", "--text-tokens", "200", "--json")
    assert r.returncode == 0, r.stderr
    result = json.loads(r.stdout)
    rows = result["rows"]
    assert [Path(row["model"]).name for row in rows] == ["tiny-llama-Q8_0.gguf", "tiny-llama-Q4_K_M.gguf"]
    assert all(row["activations"] == "exact" for row in rows)
    assert rows[0]["kl_mean"] < rows[1]["kl_mean"]            # 8 bits a weight are closer than ~4.5
    assert result["prompts"] == len(PROMPTS) >= 50


def test_the_table_names_each_figure(q8):
    r = nvllm("bench", "--quality", "--model", str(q8), "--text-tokens", "100")
    assert r.returncode == 0, r.stderr
    head = r.stdout.splitlines()[1].split()
    assert head[:2] == ["row", "ppl"] and "p99" in head and "greedy" in head
    assert "tiny-q8_0.gguf, x exact" in r.stdout and "tiny-q8_0.gguf, x int8" in r.stdout


@pytest.mark.parametrize("args, says", [
    (["--formats", "Q8_0"], "must be an F32 or F16 file"),
    (["--formats", "Q9_9"], "--formats: a GGUF's are the file types"),
    (["--text-tokens", "1"], "--text-tokens must be 0 (all) or at least 2"),
    (["--activations", "float"], "--activations float is --quality's reference"),
])
def test_bad_quality_flags_are_refused_naming_the_flag(q8, args, says):
    r = nvllm("bench", "--quality", "--model", str(q8), *args)
    assert r.returncode == 2 and says in r.stderr, r.stderr


def test_reference_and_formats_need_quality(q8):
    r = nvllm("bench", "--model", str(q8), "--reference", str(q8))
    assert r.returncode == 2 and "go with --quality" in r.stderr

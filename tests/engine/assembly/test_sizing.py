"""Planning a model's memory per weight format: `nvllm serve --dry-run` shows the bytes the weights will
hold in the format they are served in (model.quantization included, from config.json alone with
--memory-gb), and tools/sizing.py prints docs/configuration.md's table through the same planning."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

from helpers.paths import ROOT
from nvllm.cli import serve_plan
from nvllm.config import load_settings
from nvllm.engine.assembly import factory
from nvllm.engine.assembly.memory import GiB, MiB
from nvllm.model.config import ModelConfig, load_config
from nvllm.model.decoder import Model
from nvllm.model.weights.conversion import quantized_weight_bytes

KINDS = ["q8_0", "q4_0", "q4_k", "bf16"]


def load_tool():
    spec = importlib.util.spec_from_file_location("sizing_tool", ROOT / "tools" / "sizing.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(scope="module")
def q4k_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A random Llama whose rows split into Q4_K's 256-value blocks (the tiny models' 64 do not)."""
    sys.path.insert(0, str(ROOT / "models"))
    try:
        import tiny_kit as mk
    finally:
        sys.path.pop(0)
    out = tmp_path_factory.mktemp("q4k")
    cfg = {"architectures": ["LlamaForCausalLM"], "hidden_size": 256, "intermediate_size": 512,
           "num_hidden_layers": 1, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 64,
           "vocab_size": 96, "max_position_embeddings": 256, "tie_word_embeddings": False}
    (out / "config.json").write_text(json.dumps(cfg))
    mk.write_weights(out, cfg, "float32", seed=5, bias=False, std=0.05, embed_std=0.1)
    return out


@pytest.mark.parametrize("kind", KINDS)
def test_planned_bytes_are_what_quantizing_leaves(kind: str, tiny_models, q4k_folder: Path) -> None:
    for folder in [*tiny_models.values(), q4k_folder]:
        model = Model.from_dir(folder, kind)
        assert quantized_weight_bytes(model.config, kind) == model.weights.nbytes, (folder.name, kind)


def test_q4_k_is_planned_as_q4_k_where_rows_allow(q4k_folder: Path) -> None:
    c = load_config(q4k_folder)
    assert quantized_weight_bytes(c, "q4_k") < quantized_weight_bytes(c, "q8_0") < c.weight_bytes


def test_the_default_models_sizes_as_the_readme_states() -> None:
    # SmolLM2-135M's shape (as tools/sizing.py has it): 136, 72, 123 and 256 MiB against 513 float32.
    c = ModelConfig.from_dict(load_tool().SHAPES["SmolLM2-135M-Instruct"])
    got = {k: quantized_weight_bytes(c, k) // MiB for k in KINDS}
    assert got == {"q8_0": 136, "q4_0": 72, "q4_k": 123, "bf16": 256} and c.weight_bytes // MiB == 513


@pytest.mark.parametrize("kind", ["", "f32", *KINDS])
def test_dry_run_for_a_board_shows_the_served_format(kind: str, tiny_models, capsys) -> None:
    folder = tiny_models["tiny-llama"]                        # stored as float32
    settings = load_settings(None, {"model": {"path": str(folder), "quantization": kind}})
    assert serve_plan.dry_run(settings, 8.0) == 0
    out = capsys.readouterr().out
    c = load_config(folder)
    want = quantized_weight_bytes(c, kind) if kind not in ("", "f32") else c.weight_bytes
    words = {"": "stored: 10 float32 matrices", "f32": "float32 (model.quantization)"}.get(
        kind, f"{kind} (model.quantization)")
    assert f"({want} bytes held in memory), as {words}\n" in out
    # converted matrices are read as float32 one at a time: the peak is the weights and the largest one
    converted = kind not in ("", "f32")
    assert ("loading: the weights peak at" in out) == converted
    peak = want + 4 * c.vocab_size * c.hidden_size
    assert f"({peak} bytes), each matrix read as float32" in out or not converted
    # The pool is planned on what the weights leave of the board.
    info, plan = factory.plan_for_board(settings, 8.0)
    assert info.weight_bytes == want and plan.sizing.available_bytes == 8 * GiB - want


@pytest.mark.parametrize("kind", ["q8_0", "bf16"])
def test_dry_run_here_and_for_a_board_agree_on_the_weights(kind: str, tiny_models) -> None:
    """Loading (no --memory-gb) quantizes for real; planning (--memory-gb) only reads config.json."""
    folder = tiny_models["tiny-qwen2"]
    runs = [subprocess.run([sys.executable, "-m", "nvllm.cli", "serve", "--model", str(folder), "--dry-run",
                            "--quantization", kind, "--num-blocks", "64", *extra],
                           cwd=ROOT, capture_output=True, text=True, timeout=300)
            for extra in ([], ["--memory-gb", "8"])]
    lines = []
    for r in runs:
        assert r.returncode == 0, r.stderr
        lines.append([line for line in r.stdout.splitlines() if line.startswith("weights: ")])
    assert lines[0] == lines[1] and len(lines[0]) == 1 and f"as {kind} (model.quantization)" in lines[0][0]


def test_dry_run_refuses_quantizing_a_gguf(tiny_ggufs) -> None:
    r = subprocess.run([sys.executable, "-m", "nvllm.cli", "serve", "--model", str(tiny_ggufs["tiny-llama"]),
                        "--dry-run", "--memory-gb", "8", "--quantization", "q8_0"],
                       cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert "model.quantization='q8_0' is for Hugging Face folders" in r.stderr


def test_the_sizing_table_is_the_dry_runs(tmp_path: Path) -> None:
    tool = load_tool()
    r = subprocess.run([sys.executable, str(ROOT / "tools" / "sizing.py"), "--gguf", str(tmp_path / "none")],
                       cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    table = r.stdout.splitlines()
    assert len(table) == 2 + len(tool.SHAPES) * len(tool.FORMATS)
    row = next(line for line in table if line.startswith("| Qwen2.5-1.5B-Instruct | q8_0 |"))
    cells = [c.strip() for c in row.strip("|").split("|")]
    # The same cell from `nvllm serve --dry-run --memory-gb 16` on a folder holding that config.json.
    folder = tmp_path / "qwen"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(tool.SHAPES["Qwen2.5-1.5B-Instruct"]))
    d = subprocess.run([sys.executable, "-m", "nvllm.cli", "serve", "--model", str(folder), "--dry-run",
                        "--memory-gb", "16", "--quantization", "q8_0"],
                       cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert d.returncode == 0, d.stderr
    line = {text.split(": ", 1)[0]: text.split(": ", 1)[1] for text in d.stdout.splitlines()}
    weights, pool = line["weights"].split(" (", 1)[0], line["pool"].split(" (", 1)[0]
    seqs = line["context"].split("-> ", 1)[1].split(" sequences", 1)[0]
    assert cells[2] == weights and cells[4] == f"{pool}, {seqs}"


def test_a_config_only_folder_is_planned_as_its_torch_dtype(tmp_path: Path) -> None:
    """Planning for a bf16 checkpoint from its config.json alone: 16-bit matrices and a bf16 KV pool
    (cache.dtype=auto), as loading the real folder would give; no torch_dtype plans float32."""
    tool = load_tool()
    for dtype, weights, kv in (("bfloat16", "BF16", "bf16"), ("float16", "F16", "f16"), (None, "float32", "f32")):
        folder = tmp_path / str(dtype)
        folder.mkdir()
        cfg = dict(tool.SHAPES["Qwen2.5-1.5B-Instruct"], **({"torch_dtype": dtype} if dtype else {}))
        (folder / "config.json").write_text(json.dumps(cfg))
        settings = load_settings(None, {"model": {"path": str(folder)}})
        info = factory.read_model_info(settings)
        assert info.kv_format.name == kv
        assert info.weight_format.endswith(f" {weights} matrices"), info.weight_format

"""What the process holds besides the weights, the pool and the scratch (engine/assembly/footprint.py): a line
each in `nvllm serve --dry-run` and the daemon's start-up log, adding up to the resident set after the load."""

from __future__ import annotations

import re
import subprocess
import sys

from nvllm.cli import serve_plan
from nvllm.config import load_settings
from nvllm.engine.assembly import factory
from nvllm.engine.assembly.memory import RUNTIME_OVERHEAD_BYTES

MiB = 1 << 20
PARTS = ("interpreter and imports", "tokenizer and vocabulary", "grammar compiler", "other",
         "total besides the weights")


def mib(line: str) -> int:
    found = re.search(r": (-?\d+) MiB", line)
    assert found is not None, line
    return int(found.group(1))


def test_each_part_has_its_line_and_they_add_up(tiny_ggufs) -> None:
    loaded = factory.load_model(load_settings(overrides={"model": {"path": str(tiny_ggufs["tiny-qwen2"])}}))
    fp = loaded.footprint
    assert fp is not None
    lines = fp.lines()
    assert [line.split(":")[0] for line in lines] == list(PARTS)
    assert fp.before_load > 0 and fp.tokenizer >= 0 and fp.weight_bytes == loaded.info.weight_bytes
    assert fp.before_load + fp.tokenizer + fp.weight_bytes + fp.other == fp.after_load
    # the lines' MiB are the parts', rounded: within a MiB each of the total they add to
    imports, tokenizer, other, total = (mib(lines[i]) for i in (0, 1, 3, 4))
    assert abs(imports + tokenizer + other - total) <= 3
    # what loading added besides the weights stays inside the allowance the plan still states (the process's
    # own size before the load is a test run's, however many tests ran before this one)
    assert fp.besides_weights - fp.before_load < RUNTIME_OVERHEAD_BYTES   # may be < 0: garbage given back


def test_dry_run_prints_them_beside_the_scratch(tiny_ggufs, capsys) -> None:
    settings = load_settings(overrides={"model": {"path": str(tiny_ggufs["tiny-qwen2"])},
                                        "scheduler": {"max_model_len": 128, "max_num_seqs": 2}})
    assert serve_plan.dry_run(settings) == 0
    out = capsys.readouterr().out
    assert re.search(r"^forward scratch: \d+ MiB for steps of up to \d+ tokens", out, re.M)
    assert "held besides the weights, pool and forward scratch" in out
    for part in PARTS:
        assert re.search(rf"^  {part}: ", out, re.M), part


def test_nothing_is_imported_before_it_is_used() -> None:
    """The offline paths (bench, LLM, generate) hold no grammar compiler, asyncio or HTTP server, and a daemon
    without http.listen no HTTP server, until a request asks for structure or the HTTP API is on; nor the Hub's
    client (a pull), the bundles' cryptography, or the upstreams' HTTP client (a forwarded request)."""
    lazy = ("llguidance", "starlette", "uvicorn", "huggingface_hub", "cryptography", "httpx2")
    code = ("import sys, nvllm.bench.throughput, nvllm.engine.assembly.factory, nvllm.llm, nvllm.server.daemon; "
            f"print(' '.join(m for m in {(*lazy, 'asyncio')!r} if m in sys.modules))")
    loaded = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    assert not set(lazy) & set(loaded), loaded
    offline = subprocess.run([sys.executable, "-c", code.replace(", nvllm.server.daemon", "")], capture_output=True,
                             text=True, check=True).stdout.split()
    assert offline == []

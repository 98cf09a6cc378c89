"""tools/window_pages.py: the pool bytes a sliding-window model's sequences hold, pages given back and kept."""
from __future__ import annotations

import importlib.util
import json

from helpers.paths import ROOT


def test_pages_given_back_hold_less_and_answer_the_same(tiny_models, capsys):
    spec = importlib.util.spec_from_file_location("window_pages_tool", ROOT / "tools" / "window_pages.py")
    assert spec is not None and spec.loader is not None
    tool = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tool)
    assert tool.main(["--model", str(tiny_models["tiny-gemma3"]), "--prompt-len", "90", "--gen-len", "4",
                      "--seqs", "2", "--pool-mb", "1", "--chunk", "32"]) == 0
    given, kept, summary = (json.loads(line) for line in capsys.readouterr().out.splitlines()[-3:])
    assert (given["groups"], kept["groups"]) == (6, 1)   # tiny-gemma3: one global layer, five sliding
    assert given["peak_bytes"] < kept["peak_bytes"] and summary["peak_bytes_ratio_kept_to_given_back"] > 1.5
    assert summary["same_tokens"] and given["preemptions"] == kept["preemptions"] == 0

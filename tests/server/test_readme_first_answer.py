"""README's first question, asked as README asks it, of the default model at the default settings: the
daemon's answer (nvllm query --chat, as README's first command runs it) and the offline `LLM.chat`
example's both name Paris and end by themselves. A default that flips a near-tie at the first token
(int8 activations did: "L'Étoile, la Cité, ..." for 4,000 tokens) fails here."""

from __future__ import annotations

import contextlib
import io
import json
import os
import re
import shlex

import pytest

from helpers.daemon_util import DaemonProcess
from helpers.paths import ROOT

pytestmark = pytest.mark.smollm2


def readme_block(marker: str) -> str:
    text = (ROOT / "README.md").read_text()
    return text.split(marker, 1)[1].split("```", 2)[1]


def readme_question() -> list[str]:
    """The `nvllm query` words of README's first command, less --wait (the test waits for the daemon)."""
    command = readme_block("<!-- serve-command -->")
    words = shlex.split(command.split("nvllm query", 1)[1].split("&&")[0])
    if "--wait" in words:
        i = words.index("--wait")
        del words[i:i + 2]
    return words


def test_readme_asks_what_a_user_asks_first():
    assert readme_question() == ["--chat", "What is the capital of France?"]


def test_the_daemon_at_its_defaults_answers_readmes_question(smollm2_gguf, tmp_path):
    # the model as README's command serves it: no settings file, the pool sized from memory, the defaults
    daemon = DaemonProcess(tmp_path, smollm2_gguf, config=None, num_blocks=None, plain=True)
    try:
        plain = daemon.cli("query", *readme_question())
        assert plain.returncode == 0, plain.stderr
        lines = [line for line in plain.stdout.splitlines() if line.strip()]
        assert "Paris" in plain.stdout and len(lines) <= 3, plain.stdout
        as_json = daemon.cli("query", "--json", *readme_question())
        answer = json.loads(as_json.stdout)
        assert "Paris" in answer["text"] and answer["finish_reason"] == "stop", answer
    finally:
        assert daemon.stop() == 0, daemon.log()


def test_readmes_offline_example_answers_it(smollm2_gguf, keep_int_variant):
    block = next(b for b in (ROOT / "README.md").read_text().split("```python")[1:] if "from nvllm import LLM" in b)
    code = block.split("```", 1)[0]
    assert "models/smollm2-135m-instruct.gguf" in code
    out = io.StringIO()
    cwd = os.getcwd()
    os.chdir(smollm2_gguf.parent.parent)   # README's paths are the repository's
    try:
        with contextlib.redirect_stdout(out):
            exec(compile(code, "README.md", "exec"), {})
    finally:
        os.chdir(cwd)
    printed = out.getvalue()
    assert "Paris" in printed and re.search(r"\bstop\b", printed), printed

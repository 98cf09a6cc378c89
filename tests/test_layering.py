"""The layers import one way: server -> engine -> model, never up and never past the layer below.

Every import statement of every module is read (function-local ones too), so a lazy import cannot
slip past. docs/DESIGN.md lists the layers; the shared bottom (settings, sampling parameters, the
generated API stubs, the cgroup reader) may be imported from anywhere.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "daemon" / "nvllm"
SHARED = {"nvllm", "nvllm.config", "nvllm.sampling_params", "nvllm.v1", "nvllm.cgroup"}
TEXT = {"nvllm.tokenizer", "nvllm.detokenizer", "nvllm.chat_template"}

# layer -> the nvllm modules (by prefix) it may import besides itself and the shared bottom
ALLOWED = {
    "server": {"nvllm.engine"},
    "engine": {"nvllm.model"} | TEXT,
    "model": TEXT,
}


def nvllm_imports(path: Path) -> list[tuple[int, str]]:
    """(line, module) of every import of an nvllm module in the file."""
    tree = ast.parse(path.read_text(), str(path))
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found += [(node.lineno, node.module)]
            # `from nvllm import model` names a module too
            found += [(node.lineno, f"{node.module}.{a.name}") for a in node.names
                      if (PACKAGE.parent / node.module.replace(".", "/") / a.name).is_dir()]
    return [(line, m) for line, m in found if m == "nvllm" or m.startswith("nvllm.")]


def is_under(module: str, prefix: str) -> bool:
    return module == prefix or module.startswith(prefix + ".")


def violations(layer: str) -> list[str]:
    own = f"nvllm.{layer}"
    ok = ALLOWED[layer] | SHARED | {own}
    bad = []
    for path in sorted((PACKAGE / layer).rglob("*.py")):
        for line, module in nvllm_imports(path):
            if module in SHARED and module != "nvllm":
                continue
            if module == "nvllm" or any(is_under(module, p) for p in ok if p not in SHARED):
                continue
            if any(is_under(module, p) for p in SHARED - {"nvllm"}):
                continue
            bad.append(f"{path.relative_to(PACKAGE.parent)}:{line} imports {module}")
    return bad


@pytest.mark.parametrize("layer", sorted(ALLOWED))
def test_layer_imports_only_what_lies_directly_below(layer: str) -> None:
    assert violations(layer) == []


def test_the_check_sees_a_reach_down_past_the_layer(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fake = tmp_path / "nvllm"
    (fake / "server").mkdir(parents=True)
    (fake / "model").mkdir()
    (fake / "server" / "x.py").write_text(
        "from nvllm.engine import factory\n"
        "def f():\n    from nvllm.model.decoder import Model\n    import nvllm.tokenizer\n")
    monkeypatch.setattr(__import__(__name__), "PACKAGE", fake)
    assert violations("server") == ["nvllm/server/x.py:3 imports nvllm.model.decoder",
                                    "nvllm/server/x.py:4 imports nvllm.tokenizer"]

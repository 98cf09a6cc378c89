"""What the model tests share: the sampler's files run under the production constants and again under tiny
ones that force the other code paths (helpers/sampler_cases.py); the golden tests hold GGUF logits on the
exact float path."""

from __future__ import annotations

import pytest

from helpers.sampler_cases import PATHS, use_path


@pytest.fixture(params=PATHS)
def paths(request, monkeypatch):
    """Run a test under the production constants and under constants forcing the other paths."""
    return use_path(request.param, monkeypatch)


@pytest.fixture
def exact_float_matmuls():
    """GGUF logits are held to transformers within 1e-3 on the exact float path: blocks decoded to float,
    x kept float32. Activations "exact", x quantized to 16 bits, move SmolLM2's logits by up to ~0.007
    and are held to their own rule (test_qdot.py); the greedy continuations run on "exact" and must still
    be transformers' token for token."""
    from nvllm.model.kernels import matmul as mk

    if mk.lib is None:
        yield
        return
    lib, was = mk.lib, mk.lib.dot_variant(-1)
    lib.dot_variant(0)                                     # float; kernel_path may take mk.lib away meanwhile
    yield
    lib.dot_variant(was)

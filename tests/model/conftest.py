"""What the sampler's test files share: each runs under the production constants and again under tiny ones
that force the other code paths (helpers/sampler_cases.py)."""

from __future__ import annotations

import pytest

from helpers.sampler_cases import PATHS, use_path


@pytest.fixture(params=PATHS)
def paths(request, monkeypatch):
    """Run a test under the production constants and under constants forcing the other paths."""
    return use_path(request.param, monkeypatch)

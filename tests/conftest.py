"""Shared fixtures: the tiny test models (made on demand) and the default model (pulled by the README's
test command; absent outside CI its tests are skipped, in CI its absence is a failure)."""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path

import pytest
from hypothesis import settings

# CI runs the same examples every time, so a red run always reproduces; locally they vary and explore.
settings.register_profile("ci", derandomize=True, deadline=None, print_blob=True)
if os.environ.get("CI"):
    settings.load_profile("ci")

ROOT = Path(__file__).resolve().parent.parent
MODELS = ROOT / "models"
TINY = ("tiny-llama", "tiny-qwen2", "tiny-llama-f16", "tiny-qwen3", "tiny-phi3", "tiny-smollm3", "tiny-gemma3")
ENCODERS = ("tiny-bert", "tiny-bert-cls", "tiny-bert-reranker",   # models/tiny_encoders.py
            "tiny-xlmr-reranker", "tiny-nomic-bert")                 # models/tiny_xlmr.py, tiny_nomic.py
SMOLLM2 = MODELS / "smollm2-135m-instruct"


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "aarch64: the subset deploy/aarch64-check.sh runs under emulation (pytest -m aarch64): "
                   "golden tests on the tiny models and one daemon round trip")


def _load_maker():
    spec = importlib.util.spec_from_file_location("make_test_models", MODELS / "make_test_models.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules["make_test_models"] = mod
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(scope="session")
def tiny_models() -> dict[str, Path]:
    """name -> folder of each tiny random model, written into models/ when missing."""
    missing = [n for n in TINY if not (MODELS / n / "config.json").exists()]
    if missing:
        _load_maker().make_all(MODELS, only=missing)
    return {n: MODELS / n for n in TINY}


@pytest.fixture(scope="session")
def tiny_encoders() -> dict[str, Path]:
    """name -> folder of each tiny BERT (embedders and a cross-encoder), written into models/ when missing."""
    missing = [n for n in ENCODERS if not (MODELS / n / "config.json").exists()]
    if missing:
        _load_maker().make_all(MODELS, only=missing)
    return {n: MODELS / n for n in ENCODERS}


@pytest.fixture(scope="session")
def tiny_whispers() -> dict[str, Path]:
    """name -> folder of each tiny Whisper (models/tiny_whisper.py: tiny-whisper, tiny-whisper-f16,
    tiny-whisper-multi, tiny-whisper-v3), written into models/ when missing."""
    from helpers.whisper_models import make_whispers

    return make_whispers()


@pytest.fixture(scope="session")
def tiny_ggufs(tiny_models: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """name -> the tiny model as llama.cpp would convert it (F16 for tiny-llama-f16, F32 for the rest)."""
    import gguf

    from helpers.gguf_util import write_gguf

    out = tmp_path_factory.mktemp("gguf")
    types = {"tiny-llama-f16": gguf.GGMLQuantizationType.F16}
    return {n: write_gguf(p, out / f"{n}.gguf", types.get(n, gguf.GGMLQuantizationType.F32))
            for n, p in tiny_models.items()}


@pytest.fixture(scope="session")
def smollm2_gguf(smollm2: Path) -> Path:
    """The default model's GGUF as shipped (Q4_1), which `nvllm models pull` keeps beside the folder."""
    path = smollm2.parent / f"{smollm2.name}.gguf"
    if not path.exists():
        if os.environ.get("CI"):
            pytest.fail(f"{path} is missing: CI must pull it (nvllm models pull smollm2-135m-instruct)")
        pytest.skip("the default model's GGUF is not pulled (nvllm models pull smollm2-135m-instruct)")
    return path


@pytest.fixture(scope="session")
def smollm2() -> Path:
    if not (SMOLLM2 / "config.json").exists():
        if os.environ.get("CI"):
            pytest.fail(f"{SMOLLM2} is missing: CI must pull it (nvllm models pull smollm2-135m-instruct --folder)")
        pytest.skip("the default model's folder is not pulled (nvllm models pull smollm2-135m-instruct --folder)")
    return SMOLLM2


@pytest.fixture(scope="module")
def pulled(smollm2: Path) -> Path:
    """The folder the test command pulled into models/ (`nvllm models pull smollm2-135m-instruct --folder`):
    the tests read that pull's output rather than convert the GGUF a second time (the registry's tests and
    the deploy tests)."""
    from helpers.smollm2_pull import NAME
    from nvllm.model_files import registry

    assert registry.is_complete(NAME, smollm2), f"{smollm2} is not a complete pull of this version: pull it again"
    return smollm2


@pytest.fixture(scope="module")
def pulled_gguf(pulled: Path) -> Path:
    """The GGUF the same pull kept beside the folder."""
    from helpers.smollm2_pull import NAME
    from nvllm.model_files import registry

    gguf = registry.gguf_file(pulled.parent, NAME)
    assert registry.has_verified_gguf(NAME, gguf), f"{gguf} is missing or not the published file: pull again"
    return gguf


# -- the aarch64 emulation, beside the rest ---------------------------------------------------------------
@pytest.hookimpl(trylast=True)    # after -m and -k deselected what they do
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """When the emulated aarch64 run is among the tests, start it now and run its test last: it waits for an
    emulation that ran beside the rest of the suite (helpers/emulation.py)."""
    from helpers import emulation

    found = [item for item in items if item.nodeid == emulation.TEST]
    if not found or config.option.collectonly or os.environ.get("NVLLM_SKIP_AARCH64") == "1":
        return
    items.remove(found[0])
    items.append(found[0])
    emulation.start()


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    from helpers import emulation

    emulation.stop()


# -- reliability figures ----------------------------------------------------------------------------
# The stress tests (tests/stress/test_stress_*.py) record their figures here; they are printed in the terminal
# summary and written to reliability.json in pytest's base temp dir (or to $NVLLM_RELIABILITY_JSON).
# docs/reliability.md quotes them.
_FIGURES = pytest.StashKey[dict]()
_FIGURES_PATH = pytest.StashKey[Path]()


@pytest.fixture(scope="session")
def reliability(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory):
    """record(name, **figures): keep one test's figures (printed with -s as a RELIABILITY line too)."""
    import json

    config = request.config
    figures = config.stash.setdefault(_FIGURES, {})
    path = Path(os.environ.get("NVLLM_RELIABILITY_JSON") or tmp_path_factory.getbasetemp() / "reliability.json")
    config.stash[_FIGURES_PATH] = path

    def record(name: str, **values) -> None:
        figures[name] = values
        path.write_text(json.dumps(figures, indent=2) + "\n")
        print(f"\nRELIABILITY {name}: " + ", ".join(f"{k}={v}" for k, v in values.items()))
    return record


def pytest_terminal_summary(terminalreporter, exitstatus, config) -> None:
    figures = config.stash.get(_FIGURES, None)
    if not figures:
        return
    terminalreporter.section("reliability figures")
    for name, values in figures.items():
        terminalreporter.write_line(f"{name}: " + ", ".join(f"{k}={v}" for k, v in values.items()))
    terminalreporter.write_line(f"(written to {config.stash[_FIGURES_PATH]})")


@pytest.fixture()
def keep_int_variant():
    """Puts the process's integer-kernel variant back after the test: building an engine, set_activations
    and set_int_variant all change it for the whole process."""
    from nvllm.model.kernels import matmul as mk

    was = mk.int_variant()
    yield
    if was:
        mk.set_int_variant(was)


@pytest.fixture(params=["c-kernels", "numpy"])
def kernel_path(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Runs the test on both paths: the C kernels, and the NumPy code that stands in where they were
    not built (no C compiler at install)."""
    from nvllm.model.kernels import matmul as matmul_kernels
    from nvllm.model.kernels import ops as kernels

    if request.param == "numpy":
        monkeypatch.setattr(kernels, "lib", None)
        monkeypatch.setattr(matmul_kernels, "lib", None)
    elif kernels.lib is None:
        pytest.skip("the C kernels were not built (no C compiler at install)")
    return request.param


@pytest.fixture(scope="module")
def tiny(tiny_models: dict[str, Path]) -> Path:
    """The tiny Llama the daemon and engine tests serve."""
    return tiny_models["tiny-llama"]


@pytest.fixture(scope="module")
def offline(tiny: Path):
    """The offline engine on the same model and pool size as the test daemons: the reference answers."""
    from helpers.daemon_util import NUM_BLOCKS
    from nvllm import LLM
    return LLM(tiny, num_blocks=NUM_BLOCKS)

"""A decode step's layers in one C call (kernels/step.py, csrc/step.c) against its twin, decoder.py's loop
over the layers that calls the same kernels one by one: the same bits at every position, for every
storage a matrix has (float32 arrays, F16, quantized blocks, parts in different formats side by side),
Qwen2's biases and Qwen3's head norms, Phi-4-mini's partial rotary and SmolLM3's NoPE layers, one sequence and
many, one thread and two. And what it refuses."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pytest

from helpers.schedule import run_schedule
from nvllm.model.decoder import ForwardBatch, Model
from nvllm.model.kernels import matmul, ops, step, threads
from nvllm.model.matrix.fused import FusedWeight
from nvllm.model.weights.conversion import quantize_weight

pytestmark = [pytest.mark.aarch64,
              pytest.mark.skipif(matmul.lib is None or ops.lib is None, reason="the C kernels are not built")]

# Three prompts prefilled together, then decoded together, then one alone (a one-row step, where a float32
# matrix goes to BLAS and the loop runs instead), then two together again.
PROMPT_LENS = (5, 19, 33)
STEPS = ([list(PROMPT_LENS)] + [[1, 1, 1]] * 4 + [[0, 1, 0]] * 3 + [[1, 0, 1]] * 3)


def prompts(vocab: int) -> list[np.ndarray]:
    rng = np.random.default_rng(7)
    total = [n + sum(s[i] for s in STEPS[1:]) for i, n in enumerate(PROMPT_LENS)]
    return [rng.integers(0, vocab, n) for n in total]


def both_ways(model: Model, monkeypatch: pytest.MonkeyPatch, n_threads: int) -> tuple[list, list, int]:
    """Logits of the schedule with the layers in C and in the loop, and how many steps ran in C."""
    calls = []
    real = step.StepLayers.__call__

    def counted(self, *args, **kwargs):
        calls.append(args[0].shape[0])
        return real(self, *args, **kwargs)

    monkeypatch.setattr(step.StepLayers, "__call__", counted)
    monkeypatch.setattr(threads, "count", n_threads)
    ids = prompts(model.config.vocab_size)
    model.layers_in_c = True
    in_c = run_schedule(model, ids, STEPS)
    model.layers_in_c = False
    loop = run_schedule(model, ids, STEPS)
    return in_c, loop, len(calls)


def assert_same_bits(in_c: list, loop: list) -> None:
    for i, (a, b) in enumerate(zip(in_c, loop)):
        assert a.shape == b.shape
        bad = np.flatnonzero(~(a == b).all(axis=1))
        assert not bad.size, f"prompt {i}: positions {bad.tolist()} differ, by up to {np.abs(a - b).max():.3g}"


@pytest.mark.parametrize("name", ["tiny-llama", "tiny-qwen2", "tiny-llama-f16", "tiny-qwen3", "tiny-phi3",
                                  "tiny-smollm3", "tiny-gemma3"])
@pytest.mark.parametrize("quantization", ["", "q8_0", "q4_k"])
@pytest.mark.parametrize("n_threads", [1, 2])
def test_the_c_step_gives_the_loops_bits(tiny_models: dict[str, Path], name: str, quantization: str,
                                         n_threads: int, monkeypatch: pytest.MonkeyPatch) -> None:
    model = Model.from_dir(tiny_models[name], quantization=quantization)
    in_c, loop, calls = both_ways(model, monkeypatch, n_threads)
    assert_same_bits(in_c, loop)
    # float32 matrices take BLAS for one row: those steps run the loop
    one_row_in_c = all("F32" not in m.formats for layer in model.weights.layers
                       for m in (layer.qkv, layer.o, layer.gate_up, layer.down))
    assert calls == len(STEPS) - (0 if one_row_in_c else 3)


def test_parts_in_different_formats_side_by_side(tiny_models: dict[str, Path],
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """A Q4_K_M file's q|k|v and gate|up: each part in its own format, each writing its own columns."""
    model = Model.from_dir(tiny_models["tiny-qwen2"])
    for layer in model.weights.layers:
        w = layer.qkv.dequantize()
        q, k = model.q_size, model.kv_size
        layer.qkv = FusedWeight([quantize_weight(w[:q], "q4_k"), quantize_weight(w[q:q + k], "q8_0"),
                                 quantize_weight(w[q + k:], "f16")])
        g = layer.gate_up.dequantize()
        layer.gate_up = FusedWeight([quantize_weight(g[:len(g) // 2], "q4_0"),
                                     quantize_weight(g[len(g) // 2:], "bf16")])
    in_c, loop, calls = both_ways(model, monkeypatch, 2)
    assert_same_bits(in_c, loop)
    assert calls == len(STEPS)


def test_soft_capped_attention_runs_the_loop(tiny_models: dict[str, Path], monkeypatch: pytest.MonkeyPatch) -> None:
    model = Model.from_dir(tiny_models["tiny-llama"], quantization="q8_0")
    steps = [[4, 0], [1, 4], [1, 1]]
    calls = []
    monkeypatch.setattr(step.StepLayers, "__call__", lambda self, x, *a: calls.append(x.shape[0]))
    run_schedule(model, [np.arange(6), np.arange(5)], steps)
    assert calls == [4, 5, 2]   # prefill, mixed and decode steps alike
    calls.clear()
    model.config.attn_logit_softcapping = 50.0   # not in the paged kernels
    run_schedule(model, [np.arange(6), np.arange(5)], steps)
    assert calls == []


def decode_batch(model: Model, slots: list[int], tables: list[list[int]], ctx: list[int]) -> ForwardBatch:
    n = len(slots)
    return ForwardBatch.build(np.arange(n), np.array(ctx) - 1, np.array(slots), np.ones(n, np.int64),
                              np.array(ctx), np.array(tables), np.arange(n))


@pytest.fixture
def q8_model(tiny_models: dict[str, Path]) -> Model:
    return Model.from_dir(tiny_models["tiny-llama"], quantization="q8_0")


def test_slots_and_pages_outside_the_pool_are_refused_before_anything_is_written(q8_model: Model) -> None:
    cache = q8_model.make_kv_cache(4, 16)
    before = cache.pool.copy()
    with pytest.raises(ValueError, match="slot_mapping: token 1 has slot 64, outside the pool's"):
        q8_model.forward(decode_batch(q8_model, [3, 64], [[0], [1]], [4, 1]), cache)
    with pytest.raises(ValueError, match="block_tables: row 1, page 0 is block 9"):
        q8_model.forward(decode_batch(q8_model, [3, 17], [[0], [9]], [4, 2]), cache)
    assert np.array_equal(cache.pool, before)


def test_the_plan_refuses_what_does_not_fit(q8_model: Model) -> None:
    c, layer = q8_model.config, q8_model.weights.layers[0]
    cache = q8_model.make_kv_cache(4, 16)
    spec = step.LayerSpec(layer.input_norm, (layer.qkv,), (layer.o,), layer.post_norm, (layer.gate_up,),  # type: ignore[arg-type]
                          (layer.down,))  # type: ignore[arg-type]
    args = (c.num_heads, c.num_kv_heads, c.head_dim, c.intermediate_size, c.rms_norm_eps)
    with pytest.raises(ValueError, match=r"layers\[0\]\.o: need parts of"):
        step.StepLayers([step.LayerSpec(*(spec.input_norm, spec.qkv, spec.down, spec.post_norm, spec.gate_up,
                                            spec.down))], cache.pool[:1], *args)
    with pytest.raises(ValueError, match=r"layers\[0\]\.post_norm: need a contiguous float32"):
        step.StepLayers([step.LayerSpec(spec.input_norm, spec.qkv, spec.o, spec.post_norm[:-1], spec.gate_up,
                                          spec.down)], cache.pool[:1], *args)
    with pytest.raises(ValueError, match=r"pool: need a writable contiguous \[1, 2, blocks"):
        step.StepLayers([spec], cache.pool, *args)   # two layers' pages for one layer
    plan = step.StepLayers([spec], cache.pool[:1], *args)
    batch = decode_batch(q8_model, [3], [[0]], [4])
    rope = ops.RopeWriteKV(np.ones((1, c.head_dim // 2), np.float32), np.zeros((1, c.head_dim // 2), np.float32),
                           batch.attn.slot_mapping, c.num_heads, c.num_kv_heads, c.head_dim, 1.0)
    assert batch.attn.paged_decode is not None
    with pytest.raises(ValueError, match="x: need a writable contiguous float32"):
        plan(np.zeros((1, c.hidden_size), np.float64), [rope], [batch.attn.paged_decode], 1)
    with pytest.raises(ValueError, match="ropes, attentions: need .* and 2 rows of one kind"):
        plan(np.zeros((2, c.hidden_size), np.float32), [rope], [batch.attn.paged_decode], 1)
    with pytest.raises(ValueError, match=r"ropes, attentions: need one per group \(1\), got 2 and 2"):
        plan(np.zeros((1, c.hidden_size), np.float32), [rope] * 2, [batch.attn.paged_decode] * 2, 1)
    with pytest.raises(ValueError, match="threads: need an integer"):
        plan(np.zeros((1, c.hidden_size), np.float32), [rope], [batch.attn.paged_decode], 0)
    local = step.StepLayers([dataclasses.replace(spec, local=True)], cache.pool[:1], *args)
    half = (2, c.head_dim // 2)
    two_tokens = ops.RopeWriteKV(np.ones(half, np.float32), np.zeros(half, np.float32), np.array([3, 4]),
                                 c.num_heads, c.num_kv_heads, c.head_dim, 1.0)
    with pytest.raises(ValueError, match="rope_local: need the local layers' rope for the same heads and tokens"):
        local(np.zeros((1, c.hidden_size), np.float32), [rope], [batch.attn.paged_decode], 1, two_tokens)

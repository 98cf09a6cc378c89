"""model/matrix/ and the GGUF weights kept in their format: a DenseWeight, a QuantizedWeight and a
FusedWeight of parts in different formats each multiply by apply(); rows() dequantizes only the rows
asked for; a GGUF loaded in place gives the layout, logits and greedy tokens of the same file
dequantized to float32, and holds its weights at their size in the file."""
from __future__ import annotations

import importlib
import json
import logging
import subprocess
import sys
from pathlib import Path

import gguf
import numpy as np
import pytest
from gguf import GGMLQuantizationType as T

from helpers import gguf_util as gu
from nvllm.model.decoder import ForwardBatch, Model
from nvllm.model.matrix.dense import DenseWeight
from nvllm.model.matrix.fused import FusedWeight
from nvllm.model.matrix.packed import PackedWeight
from nvllm.model.matrix.quantized import QuantizedWeight
from nvllm.model.matrix.weight import DECODE_ROWS
from nvllm.model.quant.formats import FORMATS, raw_nbytes
from nvllm.model.quant.packed import packable
from nvllm.model.weights import gguf_weights
from nvllm.model.weights.gguf_file import read_gguf
from nvllm.model.weights.gguf_weights import IN_PLACE_FORMATS, load_gguf_weights, resident_weight_bytes
from nvllm.model.weights.layout import ModelWeights

FORMAT = {f.name: f for f in FORMATS.values()}
KEPT = (QuantizedWeight, PackedWeight)   # a matrix kept in its file's format: as it is, or repacked
F16_FIELDS = {"Q4_0": [0], "Q4_1": [0, 2], "Q5_0": [0], "Q5_1": [0, 2], "Q8_0": [0],
              "Q2_K": [80, 82], "Q3_K": [108], "Q4_K": [0, 2], "Q5_K": [0, 2], "Q6_K": [208],
              "IQ4_NL": [0], "IQ4_XS": [0]}
# Logits in place against the same file dequantized: the same values multiplied in another order, so
# they differ by float32 rounding only; this bound is 1e-5 of the largest logit (measured: 5e-7 to 1.5e-6).
LOGIT_RTOL = 1e-5


@pytest.fixture(params=["c-matmul", "numpy-matmul"])
def matmul_path(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Both ways a QuantizedWeight is multiplied: the C kernels, and the NumPy twin where they are absent.
    The C kernels take their exact float path for Q8_0, Q4_0 and Q4_1 here: these tests hold the weights
    in place to the dequantized ones; x quantized to 8 bits (the default) is held to its own rule in
    test_qdot.py."""
    try:
        mk = importlib.import_module("nvllm.model.kernels.matmul")
    except ImportError:
        mk = None
    if request.param == "numpy-matmul":
        if mk is not None:
            monkeypatch.setattr(mk, "lib", None)
    elif mk is None or mk.lib is None:
        pytest.skip("the C matmul kernels are not built")
    else:
        lib, was = mk.lib, mk.lib.dot_variant(-1)
        lib.dot_variant(0)                                 # float; kernel_path may take mk.lib away meanwhile
        request.addfinalizer(lambda: lib.dot_variant(was))
    return request.param


def random_weight(name: str, out_features: int, in_features: int, seed: int) -> QuantizedWeight:
    """Random blocks of a format with small finite scales (random bytes there could be NaN)."""
    fmt = FORMAT[name]
    rng = np.random.default_rng(seed)
    shape = (out_features, in_features)
    if name == "F16":
        raw = (rng.standard_normal(out_features * in_features) * 0.1).astype(np.float16).view(np.uint8)
    elif name == "BF16":
        bits = (rng.standard_normal(out_features * in_features).astype(np.float32) * 0.1).view(np.uint32) >> 16
        raw = bits.astype(np.uint16).view(np.uint8)
    else:
        raw = rng.integers(0, 256, raw_nbytes(fmt, shape), dtype=np.uint8)
        blocks = raw.reshape(-1, fmt.block_bytes)
        for off in F16_FIELDS[name]:
            scale = (rng.random(len(blocks)) * 0.02 + 0.001).astype(np.float16)
            blocks[:, off:off + 2] = scale.view(np.uint8).reshape(-1, 2)
    w = QuantizedWeight.from_raw(fmt, raw, shape)
    assert isinstance(w, QuantizedWeight)
    return w


def bound(x: np.ndarray, w_out_in: np.ndarray) -> np.ndarray:
    """What float32 rounding may move x @ w.T by, elementwise (a generous multiple of eps * sum |x||w|)."""
    return 64 * np.finfo(np.float32).eps * (np.abs(x).astype(np.float64) @ np.abs(w_out_in).T.astype(np.float64))


# ---------------------------------------------------------------- apply and rows

def test_a_float32_matrix_multiplies_as_x_at_w_transposed():
    rng = np.random.default_rng(0)
    x, w = rng.standard_normal((3, 8)).astype(np.float32), rng.standard_normal((8, 5)).astype(np.float32)
    np.testing.assert_array_equal(DenseWeight(w.T).apply(x), x @ w)   # [out, in] not C-contiguous: BLAS


@pytest.mark.parametrize("name", sorted(IN_PLACE_FORMATS))
def test_a_quantized_weight_multiplies_as_x_times_its_values(name: str, matmul_path: str):
    w = random_weight(name, 40, 512, seed=len(name))
    dense = w.dequantize()                                      # [out, in]
    for rows in (1, 7):                                         # a decode token, a prefill chunk
        x = np.random.default_rng(rows).standard_normal((rows, 512)).astype(np.float32)
        y = w.apply(x)
        assert y.dtype == np.float32 and y.shape == (rows, 40) and y.flags.c_contiguous and y.flags.writeable
        want = x.astype(np.float64) @ dense.T.astype(np.float64)
        assert np.all(np.abs(y - want) <= bound(x, dense)), name


@pytest.mark.parametrize("rows", [1, 4, DECODE_ROWS + 1])   # decode, a batch, prefill
def test_fused_parts_lay_their_outputs_side_by_side(matmul_path: str, rows: int):
    a, b = random_weight("Q4_K", 16, 256, 1), random_weight("Q6_K", 8, 256, 2)
    x = np.random.default_rng(3).standard_normal((rows, 256)).astype(np.float32)
    fused = FusedWeight([a, b])
    y = fused.apply(x)
    assert fused.shape == (24, 256) and y.shape == (rows, 24) and y.flags.c_contiguous
    np.testing.assert_array_equal(y[:, :16], a.apply(x))
    np.testing.assert_array_equal(y[:, 16:], b.apply(x))
    out = np.full((rows, 24), np.nan, np.float32)
    assert fused.apply(x, out) is out                       # each part wrote its own columns of it
    np.testing.assert_array_equal(out, y)
    assert fused.formats == ("Q4_K", "Q6_K") and fused.nbytes == a.nbytes + b.nbytes
    np.testing.assert_array_equal(fused.dequantize(), np.concatenate([a.dequantize(), b.dequantize()]))


def test_weights_refuse_what_they_cannot_hold():
    with pytest.raises(ValueError, match="a dense weight is a 2-D array"):
        DenseWeight(np.zeros(4, np.float32))
    with pytest.raises(ValueError, match="fused parts need one input size"):
        FusedWeight([random_weight("Q8_0", 4, 64, 1), random_weight("Q8_0", 4, 32, 2)])
    with pytest.raises(ValueError, match="fused parts need one input size"):
        FusedWeight([])


@pytest.mark.parametrize("name", sorted(IN_PLACE_FORMATS | {"F32"}))
def test_rows_dequantize_only_the_rows_asked_for(name: str):
    w = random_weight(name, 50, 256, seed=5) if name != "F32" else QuantizedWeight.from_raw(
        FORMAT["F32"], np.random.default_rng(5).standard_normal(50 * 256).astype(np.float32).view(np.uint8),
        (50, 256))
    ids = np.array([3, 0, 49, 3, 17], dtype=np.int64)
    got = w.rows(ids)
    assert got.dtype == np.float32 and got.shape == (5, 256)
    np.testing.assert_array_equal(got, w.dequantize()[ids])
    assert w.rows(np.array([], dtype=np.int64)).shape == (0, 256)


def test_rows_refuse_ids_out_of_range_or_of_the_wrong_kind():
    w = random_weight("Q8_0", 10, 64, seed=1)
    with pytest.raises(ValueError, match="row id 10 is out of range for a Q8_0 weight of 10 rows"):
        w.rows(np.array([1, 10]))
    with pytest.raises(ValueError, match="row id -1 is out of range"):
        w.rows(np.array([-1]))
    with pytest.raises(ValueError, match="1-D integer ids"):
        w.rows(np.array([[1]]))
    with pytest.raises(ValueError, match="1-D integer ids"):
        w.rows(np.array([1.0]))


def test_rows_of_a_float32_table_index_it():
    table = np.arange(12, dtype=np.float32).reshape(4, 3)
    np.testing.assert_array_equal(DenseWeight(table).rows(np.array([2, 0])), table[[2, 0]])


# ---------------------------------------------------------------- a GGUF kept in place



MATRICES = ("qkv", "o", "gate_up", "down")


def assert_same_layout(ours: ModelWeights, ref: ModelWeights) -> None:
    """The in-place weights hold exactly the float32 layout's values, each in its place."""
    np.testing.assert_array_equal(ours.embed.dequantize(), ref.embed.dequantize())
    np.testing.assert_array_equal(ours.lm_head.dequantize(), ref.lm_head.dequantize())
    np.testing.assert_array_equal(ours.norm, ref.norm)
    for a, b in zip(ours.layers, ref.layers):
        for name, x in vars(b).items():
            y = getattr(a, name)
            if x is None:
                assert y is None, name
            elif name in MATRICES:
                np.testing.assert_array_equal(y.dequantize(), x.dequantize(), err_msg=name)
            else:
                assert isinstance(y, np.ndarray) and y.dtype == np.float32, name
                np.testing.assert_array_equal(y, x, err_msg=name)


def prompt_logits(model: Model, ids: np.ndarray) -> np.ndarray:
    n, bs = len(ids), 16
    blocks = -(-n // bs)
    pos = np.arange(n)
    fb = ForwardBatch.build(ids, pos, pos, np.array([n]), np.array([n]), np.arange(blocks, dtype=np.int32)[None],
                            np.arange(n))
    return model.forward(fb, model.make_kv_cache(blocks, bs))


def greedy(model: Model, ids: list[int], steps: int) -> list[int]:
    """Greedy tokens, one decode step at a time through the cache."""
    bs, total = 16, len(ids) + steps
    blocks = -(-total // bs)
    cache = model.make_kv_cache(blocks, bs)
    table = np.arange(blocks, dtype=np.int32)[None]
    n = len(ids)
    pos = np.arange(n)
    logits = model.forward(ForwardBatch.build(np.array(ids), pos, pos, np.array([n]), np.array([n]), table,
                                              np.array([n - 1])), cache)
    out = []
    for _ in range(steps):
        tok = int(np.argmax(logits[0]))
        out.append(tok)
        p = len(ids) + len(out) - 1
        logits = model.forward(ForwardBatch.build(np.array([tok]), np.array([p]), np.array([p]), np.array([1]),
                                                  np.array([p + 1]), table, np.array([0])), cache)
    return out


CASES = [("llama", T.Q4_0, False), ("llama", T.Q8_0, True), ("llama", T.Q4_K, False),
         ("qwen2", T.Q4_K, True), ("qwen3", T.Q8_0, False), ("llama", T.Q6_K, True),
         ("qwen2", T.Q4_1, False), ("llama", T.Q5_K, False), ("llama", T.F16, False), ("llama", T.BF16, True),
         ("llama", T.Q2_K, False), ("qwen2", T.Q3_K, True), ("qwen3", T.IQ4_NL, False), ("llama", T.IQ4_XS, True)]


@pytest.fixture(scope="module", params=CASES, ids=lambda c: f"{c[0]}-{c[1].name}{'-tied' if c[2] else ''}")
def random_gguf(request, tmp_path_factory) -> Path:
    arch, qtype, tied = request.param
    return gu.write_random_gguf(tmp_path_factory.mktemp("inplace") / "r.gguf", qtype, arch, tied=tied,
                                layers=2, vocab=96, seed=int(qtype))


def test_in_place_weights_are_the_dequantized_layout(random_gguf: Path):
    m = read_gguf(random_gguf)
    ours, ref = load_gguf_weights(m, in_place=True), load_gguf_weights(read_gguf(random_gguf), in_place=False)
    fmt = m.tensors["blk.0.attn_q.weight"][0].name
    for layer in ours.layers:
        for name in MATRICES:
            w = getattr(layer, name)
            # kept in the file's format, repacked for the kernels where the format is (its own memory)
            assert isinstance(w, PackedWeight if packable(w.fmt) else QuantizedWeight), name
            assert w.fmt.name == fmt and w.buffers()[0].flags.owndata, name
    assert isinstance(ours.embed, KEPT) and isinstance(ours.lm_head, KEPT)
    assert (ours.lm_head is ours.embed) == m.config.tie_word_embeddings
    assert_same_layout(ours, ref)
    assert m.mapping is not None
    mapped = np.frombuffer(m.mapping, np.uint8)
    for layer in ours.layers:
        for w in (layer.qkv, layer.down):
            assert isinstance(w, KEPT) and not np.shares_memory(w.buffers()[0], mapped)


def test_weights_packed_a_few_rows_at_a_time_are_the_same(random_gguf: Path, monkeypatch: pytest.MonkeyPatch):
    # the loader packs a chunk of rows at a time (Q and K unpermuted on the way): chunks of one panel here
    whole = load_gguf_weights(read_gguf(random_gguf), in_place=True)
    monkeypatch.setattr(gguf_weights, "_CHUNK_BYTES", 1)
    small = load_gguf_weights(read_gguf(random_gguf), in_place=True)
    for a, b in zip(whole.layers, small.layers):
        for name in MATRICES:
            np.testing.assert_array_equal(getattr(a, name).dequantize(), getattr(b, name).dequantize(), err_msg=name)


def test_in_place_logits_equal_the_dequantized_models(random_gguf: Path, matmul_path: str, kernel_path: str):
    m = read_gguf(random_gguf)
    in_place = Model(m.config, load_gguf_weights(m, in_place=True))
    f32 = Model(m.config, load_gguf_weights(read_gguf(random_gguf), in_place=False))
    ids = np.random.default_rng(1).integers(0, m.config.vocab_size, 21)
    with np.errstate(over="ignore"):   # random K-quant scales make big gates: NumPy's silu overflows exp to 0
        ours, ref = prompt_logits(in_place, ids), prompt_logits(f32, ids)
        prompt = ids[:5].tolist()
        tokens, want = greedy(in_place, prompt, 12), greedy(f32, prompt, 12)
    np.testing.assert_allclose(ours, ref, rtol=0, atol=LOGIT_RTOL * np.abs(ref).max())
    assert tokens == want


def test_resident_bytes_are_the_files_tensor_bytes(random_gguf: Path):
    m = read_gguf(random_gguf)
    file_bytes = sum(raw.size for _, raw, _ in m.tensors.values())
    w = load_gguf_weights(m, in_place=True)
    assert w.nbytes == file_bytes          # every tensor once, a tied lm_head counted with the embedding
    assert abs(w.nbytes - file_bytes) <= 0.1 * file_bytes


def test_resident_bytes_are_known_from_the_header(random_gguf: Path, tmp_path: Path):
    paths = [random_gguf, _mixed_gguf(tmp_path),
             gu.write_random_gguf(tmp_path / "q5.gguf", T.Q5_1, "qwen2", layers=1, vocab=64),
             gu.write_random_gguf(tmp_path / "f32.gguf", T.F32, "llama", layers=1, vocab=64, tied=True)]
    for path in paths:
        for in_place in (True, False):
            m = read_gguf(path)
            assert resident_weight_bytes(m, in_place) == load_gguf_weights(m, in_place).nbytes, (path, in_place)


def test_a_format_without_an_in_place_kernel_is_float32_and_logged(tmp_path: Path, caplog, monkeypatch):
    # every GGUF type nvllm reads has a kernel now: take Q5_0's away to see the NumPy-only path
    monkeypatch.setattr(gguf_weights, "IN_PLACE_FORMATS", IN_PLACE_FORMATS - {"Q5_0"})
    path = gu.write_random_gguf(tmp_path / "q5.gguf", T.Q5_0, "llama", layers=1, vocab=64)
    with caplog.at_level(logging.INFO, logger="nvllm.model.weights.gguf_weights"):
        w = load_gguf_weights(read_gguf(path), in_place=True)
    assert all(isinstance(getattr(w.layers[0], n), DenseWeight) for n in MATRICES)
    assert isinstance(w.embed, DenseWeight) and not w.lm_head.shares_memory(w.embed)
    lines = [r.getMessage() for r in caplog.records if r.name == "nvllm.model.weights.gguf_weights"]
    assert len(lines) == 1 and "9 matrices dequantized to float32" in lines[0], lines
    assert "blk.0.attn_q.weight (Q5_0)" in lines[0] and "Q4_K" in lines[0]


def test_without_the_kernels_every_matrix_is_float32_and_logged(tmp_path: Path, caplog, monkeypatch):
    path = gu.write_random_gguf(tmp_path / "q4.gguf", T.Q4_0, "llama", layers=1, vocab=64)
    monkeypatch.setattr(gguf_weights, "in_place_kernels", lambda: False)
    with caplog.at_level(logging.INFO, logger="nvllm.model.weights.gguf_weights"):
        w = load_gguf_weights(read_gguf(path))
    assert all(isinstance(getattr(w.layers[0], n), DenseWeight) for n in MATRICES)
    assert any("every matrix dequantized to float32" in r.getMessage() and "not built" in r.getMessage()
               for r in caplog.records)
    monkeypatch.setattr(gguf_weights, "in_place_kernels", lambda: True)
    assert isinstance(load_gguf_weights(read_gguf(path)).layers[0].qkv, PackedWeight)


def _mixed_gguf(tmp_path: Path) -> Path:
    """A Q4_K model whose attn_v is Q6_K, as a Q4_K_M file has it."""
    a = gguf.GGUFReader(str(gu.write_random_gguf(tmp_path / "a.gguf", T.Q4_K, "llama", vocab=64)))
    b = gguf.GGUFReader(str(gu.write_random_gguf(tmp_path / "b.gguf", T.Q6_K, "llama", vocab=64)))
    v = {t.name: t for t in b.tensors if ".attn_v." in t.name}
    out = tmp_path / "mixed.gguf"
    w = gguf.GGUFWriter(str(out), "llama")
    for k, f in a.fields.items():
        if k.startswith("GGUF.") or k == "general.architecture":
            continue
        if f.types[0] == gguf.GGUFValueType.ARRAY:
            w.add_array(k, f.contents())
        else:
            w.add_key_value(k, f.contents(), f.types[0])
    for t in a.tensors:
        t = v.get(t.name, t)
        w.add_tensor(t.name, np.array(t.data), raw_dtype=t.tensor_type)
    return gu._finish(w, out)


def test_parts_in_different_formats_stay_in_their_formats(tmp_path: Path, matmul_path: str):
    path = _mixed_gguf(tmp_path)
    w = load_gguf_weights(read_gguf(path), in_place=True)
    qkv = w.layers[0].qkv
    # q|k stacked in their one format, v beside them in its own
    assert isinstance(qkv, FusedWeight) and [p.formats for p in qkv.parts] == [("Q4_K",), ("Q6_K",)]
    c = read_gguf(path).config
    assert [p.shape[0] for p in qkv.parts] == [(c.num_heads + c.num_kv_heads) * c.head_dim, c.num_kv_heads * c.head_dim]
    assert isinstance(w.layers[0].gate_up, KEPT)
    ref = load_gguf_weights(read_gguf(path), in_place=False)
    assert_same_layout(w, ref)
    m = read_gguf(path)
    ids = np.arange(9)
    a, b = prompt_logits(Model(m.config, w), ids), prompt_logits(Model(m.config, ref), ids)
    np.testing.assert_allclose(a, b, rtol=0, atol=LOGIT_RTOL * np.abs(b).max())


_RSS_SCRIPT = """
import json, sys
from nvllm.model.weights.gguf_weights import load_gguf_weights
from nvllm.model.weights.gguf_file import read_gguf
def rss():
    return int(open("/proc/self/statm").read().split()[1]) * 4096
m = read_gguf(sys.argv[1])
before = rss()
w = load_gguf_weights(m, in_place=True)
print(json.dumps({"rss": rss() - before, "nbytes": w.nbytes,
                  "file": sum(raw.size for _, raw, _ in m.tensors.values())}))
"""


@pytest.mark.skipif(not Path("/proc/self/statm").exists(), reason="reads the resident set from /proc")
def test_smollm2_in_place_is_resident_at_its_file_size(smollm2_gguf: Path):
    """The shipped Q4_1 file: the resident set grows by the tensors' bytes in the file, within 10% (the
    copies made, the mapped pages of the originals dropped)."""
    r = subprocess.run([sys.executable, "-c", _RSS_SCRIPT, str(smollm2_gguf)], capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0, r.stderr
    got = json.loads(r.stdout.strip().splitlines()[-1])
    print(f"\nsmollm2 in place: {got}")
    assert got["nbytes"] == got["file"]
    assert abs(got["rss"] - got["file"]) <= 0.1 * got["file"], got




@pytest.mark.parametrize("name", ["Q8_0", "Q4_0", "Q4_1"])
def test_decode_sized_calls_take_the_integer_path_and_prefill_the_float_one(name: str):
    """apply() lets x be quantized for up to DECODE_ROWS rows (a decode step) and sends longer calls
    (prefill) to BLAS on the dequantized blocks; each holds to its own twin."""
    from nvllm.model.kernels import qdot

    mk = importlib.import_module("nvllm.model.kernels.matmul")
    if mk.lib is None or mk.int_variant() == "float":
        pytest.skip("no integer variant of the C matmul kernels runs here")
    w = random_weight(name, 8, 64, seed=5)
    bits = 16 if mk.int_variant().endswith("-i16") else 8
    rng = np.random.default_rng(3)
    for rows in (1, DECODE_ROWS):
        x = rng.standard_normal((rows, 64)).astype(np.float32)
        np.testing.assert_array_equal(w.apply(x), qdot.matmul(w, x, bits))
    x = rng.standard_normal((DECODE_ROWS + 1, 64)).astype(np.float32)
    y = w.apply(x)
    np.testing.assert_array_equal(y, w.matmul(x))
    assert not np.array_equal(y, qdot.matmul(w, x, bits))

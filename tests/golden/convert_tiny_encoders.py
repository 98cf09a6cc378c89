"""Convert the tiny encoder folders to GGUF with llama.cpp's own convert_hf_to_gguf.py, so that nvllm's tests can
read files as llama.cpp's converter writes them (tests/golden/converted/).

The converter refuses a vocabulary whose pre-tokenizer hash it does not list, and ours (trained for the tests)
is in no list. This script answers that check the way a person converting such a model does: it runs the
converter unchanged with its `get_vocab_base_pre` patched to return "bert-bge" (the BERT uncased WordPiece
entry, BAAI/bge-small-en-v1.5's); llama.cpp's files are not edited. (tiny-xlmr-reranker's SentencePiece
vocabulary is read from sentencepiece.bpe.model, with no such check.)

One more answer, for tiny-nomic-bert: the converter reads config.json through transformers' AutoConfig first,
and transformers 5 has a NomicBertConfig of its own that ignores nomic's keys (n_embd, n_layer, ...) and keeps
its defaults, nomic-embed-text-v1.5's shape (768 wide, 12 layers): right for that model by coincidence, wrong for
any other. The converter's own fallback when AutoConfig fails is config.json as it is; for a nomic_bert folder
this script takes that path (as the converter does with a transformers that has no nomic_bert).
Everything else is the converter's.

How to run (from the repository root; llama.cpp's sources at LLAMA_CPP, default /work/llama/llama.cpp):

    .refvenv/bin/pip install torch==2.13.0 transformers numpy safetensors tokenizers   # make_golden.py's venv
    .refvenv/bin/pip install pyyaml tqdm requests sentencepiece protobuf   # what the converter imports
    python models/make_test_models.py --only tiny-bert --only tiny-bert-cls --only tiny-bert-reranker \
        --only tiny-xlmr-reranker --only tiny-nomic-bert
    .refvenv/bin/python tests/golden/convert_tiny_encoders.py [--models-dir models] [--llama-cpp DIR]

The converter's gguf-py is the one in llama.cpp's tree (the converter puts it first on sys.path). Writes
tiny-bert.f32.gguf, tiny-bert.f16.gguf, tiny-bert-cls.f32.gguf, tiny-bert-reranker.f32.gguf,
tiny-xlmr-reranker.f32.gguf, tiny-nomic-bert.f32.gguf and tiny-nomic-bert.f16.gguf; running twice gives
byte-identical files.
"""

from __future__ import annotations

import argparse
import json
import os
import runpy
import subprocess
import sys
from pathlib import Path

GGUF_DIR = Path(__file__).resolve().parent / "converted"
CONVERSIONS = (("tiny-bert", "f32"), ("tiny-bert", "f16"), ("tiny-bert-cls", "f32"), ("tiny-bert-reranker", "f32"),
               ("tiny-xlmr-reranker", "f32"), ("tiny-nomic-bert", "f32"), ("tiny-nomic-bert", "f16"))
PRE_TOKENIZER = "bert-bge"


def run_converter(llama_cpp: Path, converter_args: list[str]) -> None:
    """In this process: convert_hf_to_gguf.py's main with the pre-tokenizer check answered."""
    sys.path.insert(0, str(llama_cpp))
    from conversion.base import ModelBase, TextModel  # llama.cpp's conversion package, found through the path above

    def get_vocab_base_pre(self, tokenizer) -> str:  # noqa: ARG001 - the converter's signature
        return PRE_TOKENIZER

    load_hparams = ModelBase.load_hparams

    def nomic_config_as_written(dir_model: Path, is_mistral_format: bool) -> dict:
        config_file = Path(dir_model) / "config.json"
        if config_file.is_file():
            config = json.loads(config_file.read_text(encoding="utf-8"))
            if config.get("model_type") == "nomic_bert":
                return config
        return load_hparams(dir_model, is_mistral_format)

    TextModel.get_vocab_base_pre = get_vocab_base_pre
    ModelBase.load_hparams = staticmethod(nomic_config_as_written)
    sys.argv = [str(llama_cpp / "convert_hf_to_gguf.py"), *converter_args]
    runpy.run_path(sys.argv[0], run_name="__main__")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--models-dir", type=Path, default=Path("models"))
    parser.add_argument("--out", type=Path, default=GGUF_DIR)
    parser.add_argument("--llama-cpp", type=Path, default=Path(os.environ.get("LLAMA_CPP", "/work/llama/llama.cpp")))
    parser.add_argument("--converter-args", nargs=argparse.REMAINDER,
                        help="(internal) run the converter in this process with these arguments")
    args = parser.parse_args(argv)
    if args.converter_args is not None:
        run_converter(args.llama_cpp.resolve(), args.converter_args)
        return 0

    args.out.mkdir(parents=True, exist_ok=True)
    for name, outtype in CONVERSIONS:
        folder, target = args.models_dir / name, args.out / f"{name}.{outtype}.gguf"
        if not (folder / "config.json").is_file():
            raise SystemExit(f"no {folder}: run models/make_test_models.py first")
        # One converter per process: it keeps module-level state (logging, registered classes).
        subprocess.run([sys.executable, __file__, "--llama-cpp", str(args.llama_cpp), "--converter-args",
                        str(folder), "--outtype", outtype, "--outfile", str(target)], check=True)
        target.chmod(0o644)
        print(f"{target}: {target.stat().st_size} bytes")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

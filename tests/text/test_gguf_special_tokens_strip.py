"""A GGUF's added tokens swallow the whitespace beside them as llama.cpp's loader sets it by model (its
"set attributes by model/tokenizer/architecture name" rules, text/gguf_strip.py), so a Phi-3 GGUF renders a
chat to the ids of its Hugging Face folder.

The tiny Phi-3-mini tokenizer (tests/golden/tokenizer_spm-phi3.json, helpers/phi3_gguf.py) is a SentencePiece
model with Phi-3-mini's added tokens, flags and chat template; its GGUF is what llama.cpp's converter writes for
the folder tiny-phi3-mini, general.name "Tiny Phi3 Mini". The golden's ids are transformers' for the folder.
"""

from __future__ import annotations

from typing import Any

import pytest

from helpers.phi3_gguf import gguf_metadata, phi3_golden, write_phi3_folder, write_phi3_gguf
from nvllm.text.gguf_spm import GGUF_NORMAL
from nvllm.text.gguf_strip import gguf_strips
from nvllm.text.gguf_vocab import GGUF_CONTROL, GGUF_USER_DEFINED
from nvllm.text.tokenizer import Tokenizer

PLANETS = [{"role": "user", "content": "Name three planets in our solar system."}]


@pytest.fixture(scope="module")
def phi3(tmp_path_factory: pytest.TempPathFactory) -> tuple[Tokenizer, Tokenizer, dict[str, Any]]:
    """(the folder's tokenizer, the GGUF's, the GGUF's metadata)"""
    folder = write_phi3_folder(tmp_path_factory.mktemp("phi3") / "tiny-phi3-mini")
    path = write_phi3_gguf(folder, folder.parent / "tiny-phi3-mini.gguf")
    meta = gguf_metadata(path)
    return Tokenizer.from_dir(folder), Tokenizer.from_gguf_metadata(meta, str(path)), meta


def named(meta: dict[str, Any], name: str | None) -> Tokenizer:
    m = {k: v for k, v in meta.items() if k != "general.name"}
    if name is not None:
        m["general.name"] = name
    return Tokenizer.from_gguf_metadata(m, "named.gguf")


def test_the_gguf_is_what_the_converter_writes_for_phi3(phi3):
    _, _, meta = phi3
    assert (meta["general.architecture"], meta["general.name"]) == ("phi3", "Tiny Phi3 Mini")
    assert (meta["tokenizer.ggml.model"], meta["tokenizer.ggml.pre"]) == ("llama", "default")
    types = dict(zip(meta["tokenizer.ggml.tokens"], meta["tokenizer.ggml.token_type"]))
    # added_tokens_decoder's special ones are control, </s> (not special) user-defined
    assert {t: types[t] for t in ("<unk>", "<s>", "</s>", "<|user|>", "<|end|>", "<|endoftext|>")} == {
        "<unk>": GGUF_CONTROL, "<s>": GGUF_CONTROL, "</s>": GGUF_USER_DEFINED, "<|user|>": GGUF_CONTROL,
        "<|end|>": GGUF_CONTROL, "<|endoftext|>": GGUF_CONTROL}
    assert meta["tokenizer.ggml.add_bos_token"] is False and "tokenizer.ggml.add_space_prefix" not in meta


def test_chat_prompt_ids_equal_the_folders(phi3):
    folder, gguf, _ = phi3
    cases = phi3_golden()["chat"]
    assert cases[0]["messages"] == PLANETS
    assert any(m["role"] == "system" for c in cases for m in c["messages"])
    assert any(sum(m["role"] == "user" for m in c["messages"]) > 1 for c in cases)   # multi-turn
    for case in cases:
        assert gguf.render_chat(case["messages"]) == folder.render_chat(case["messages"]) == case["text"]
        assert gguf.encode_chat(case["messages"]) == folder.encode_chat(case["messages"]) == case["ids"], case["text"]
        assert gguf.decode(case["ids"]) == folder.decode(case["ids"])


def test_the_planets_prompt_has_no_space_or_newline_after_a_turn_token(phi3):
    _, gguf, _ = phi3
    pieces = [gguf.id_to_token(i) for i in gguf.encode_chat(PLANETS)]
    assert len(pieces) == 26 and pieces[:2] == ["<|user|>", "▁N"]
    assert pieces[-2:] == ["<|end|>", "<|assistant|>"]   # the "\n" after each is the token's


def test_text_ids_equal_the_folders(phi3):
    folder, gguf, _ = phi3
    for case in phi3_golden()["encode"]:
        assert gguf.encode(case["text"]) == folder.encode(case["text"]) == case["ids"], case["text"]


def test_each_added_token_strips_as_the_folders(phi3):
    folder, gguf, _ = phi3

    def flags(tok: Tokenizer) -> dict[str, tuple[bool, bool]]:
        return {t.content: (t.lstrip, t.rstrip) for t in tok.backend.get_added_tokens_decoder().values()}

    ours = flags(gguf)
    assert {t: ours[t] for t in flags(folder)} == flags(folder)
    assert ours["<|user|>"] == ours["</s>"] == (False, True)
    assert ours["<s>"] == ours["<unk>"] == ours["<|endoftext|>"] == (False, False)


def test_a_folder_written_from_the_gguf_keeps_the_flags(phi3):
    from nvllm.model.weights.gguf_convert import tokenizer_config

    folder, gguf, _ = phi3
    decoder = tokenizer_config(gguf, False, 4096)["added_tokens_decoder"]
    added = {a["content"]: (a["lstrip"], a["rstrip"]) for a in decoder.values()}
    assert added["<|user|>"] == added["<|assistant|>"] == (False, True) and added["<s>"] == (False, False)


@pytest.mark.parametrize("name, strips", [
    ("Tiny Phi3 Mini", True), ("Phi3", True), ("PHI-3-mini-4k-instruct", True), ("my-phi3-finetune", True),
    # llama.cpp matches "phi-3" or "phi3" alone; nvllm also "phi 3", the name today's converter gives
    # Phi-3-mini-4k-instruct and Phi-3.5-mini (its config's _name_or_path, dashes made spaces)
    ("Phi 3 Mini 4k Instruct", True), ("Phi 3.5 Mini Instruct", True),
    ("Phi 4 Mini Instruct", False), ("Phi-4-mini-instruct", False), (None, False),
])
def test_the_phi3_rule_goes_by_general_name(phi3, name: str | None, strips: bool):
    _, _, meta = phi3
    tok = named(meta, name)
    assert (tok.encode("<|user|>\n Hi") == tok.encode("<|user|>Hi")) is strips


def test_the_mask_rules_lstrip_and_the_first_match_alone_applies():
    tokens = ["<unk>", "<s>", "</s>", "<mask>", "[MASK]", "<|user|>", "a"]
    types = [2, 3, 3, GGUF_USER_DEFINED, GGUF_CONTROL, GGUF_CONTROL, GGUF_NORMAL]

    def strips(**meta: str) -> dict[str, tuple[bool, bool]]:
        return gguf_strips({k.replace("__", "."): v for k, v in meta.items()}, "m.gguf", tokens, types)

    mask = {"<mask>": (True, False)}
    assert strips(tokenizer__ggml__pre="jina-v2-es") == strips(general__architecture="nomic-bert-moe") == mask
    assert strips(general__architecture="jina-bert-v3", general__name="phi3") == mask   # the first rule wins
    assert strips(general__name="Modern-BERT base") == {"[MASK]": (True, False)}
    assert strips(general__name="phi3") == {t: (False, True) for t in ("</s>", "[MASK]", "<mask>", "<|user|>")}
    assert strips(general__name="llama", general__architecture="phi3", tokenizer__ggml__pre="default") == {}


def test_an_lstrip_token_takes_the_space_before_it(phi3):
    _, _, meta = phi3
    m = dict(meta, **{"general.architecture": "nomic-bert-moe"})
    tokens = m["tokenizer.ggml.tokens"] = list(m["tokenizer.ggml.tokens"])
    tokens[-1] = "<mask>"   # an unused [PAD] becomes a user-defined <mask>
    m["tokenizer.ggml.token_type"] = [*m["tokenizer.ggml.token_type"][:-1], GGUF_USER_DEFINED]
    tok = Tokenizer.from_gguf_metadata(m, "mask.gguf")
    assert tok.encode("Hello  \n<mask>") == tok.encode("Hello<mask>")
    assert tok.encode("<|user|>\nHi") != tok.encode("<|user|>Hi")   # no Phi-3 rstrip under the mask rule


@pytest.mark.parametrize("key", ["general.name", "general.architecture", "tokenizer.ggml.pre"])
def test_a_name_that_is_not_text_is_refused_naming_the_key(phi3, key: str):
    _, _, meta = phi3
    with pytest.raises(ValueError, match=f"^bad.gguf: {key} is int, expected a string"):
        Tokenizer.from_gguf_metadata(dict(meta, **{key: 3}), "bad.gguf")

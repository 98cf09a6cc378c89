"""What a synthetic `bert` GGUF holds beyond the writer's common part: its tensors and its metadata, as
llama.cpp's convert_hf_to_gguf.py writes a sentence-transformers BertModel (bge-small-en-v1.5, all-MiniLM-L6-v2).

The tensors: the embeddings (token_embd, position_embd, token_types and their norm token_embd_norm), then per
layer attn_q, attn_k, attn_v, attn_output, attn_output_norm, ffn_up, ffn_down, layer_output_norm, each matrix
with its bias and each norm with its gain and bias; no output norm, no pooler (the converter drops BERT's), in
the order the converter reads them from model.safetensors (sorted by their Hugging Face names, so blk.10 comes
before blk.2). position_embd and token_types stay F32 in every file type, as the converter and llama-quantize
keep them (mixture.py's roles pos_embd and token_types).

The metadata: `bert.*` (block_count, context_length, embedding_length, feed_forward_length,
attention.head_count, attention.layer_norm_epsilon, attention.causal false, pooling_type), then the
tokenizer as gguf-py's SpecialVocab reads a BERT folder: model "bert", token_type_count, the WordPiece list in
llama.cpp's form (wordpiece.py), bos = [CLS] and eos = [SEP] (tokenizer_config.json has cls and sep only;
SpecialVocab takes them for bos and eos), unk, sep, pad, cls, mask, add_bos and add_eos true and add_sep false
(from tokenizer.json's TemplateProcessing "[CLS] $A [SEP]"), and the BertNormalizer's lowercase.
"""

from __future__ import annotations

import gguf

from nvllm.model.weights.gguf_names import bert_tensor_name
from nvllm.model_files.synthetic.mixture import TensorSpec
from nvllm.model_files.synthetic.shapes import Shape
from nvllm.model_files.synthetic.wordpiece import wordpiece_vocabulary

_LOWERCASE = "tokenizer.ggml.normalizer.lowercase"   # llama.cpp's key (gguf-py's add_normalizer_lowercase)
_MATRICES = ("attn_q", "attn_k", "attn_v", "attn_output", "ffn_up", "ffn_down")


def bert_tensor_specs(shape: Shape) -> list[TensorSpec]:
    """Every tensor of a bert shape, in the order llama.cpp's converter writes them."""
    h, f = shape.hidden, shape.intermediate
    specs = [TensorSpec("token_embd.weight", "token_embd", (shape.vocab, h)),
             TensorSpec("position_embd.weight", "pos_embd", (shape.context, h)),
             TensorSpec("token_types.weight", "token_types", (shape.token_types, h)),
             TensorSpec("token_embd_norm.weight", "norm", (h,)), TensorSpec("token_embd_norm.bias", "bias", (h,))]
    rows = {"ffn_up": (f, h), "ffn_down": (h, f)}
    for i in range(shape.layers):
        b = f"blk.{i}."
        for m in _MATRICES:
            out, inp = rows.get(m, (h, h))
            specs += [TensorSpec(f"{b}{m}.weight", m, (out, inp)), TensorSpec(f"{b}{m}.bias", "bias", (out,))]
        for norm in ("attn_output_norm", "layer_output_norm"):
            specs += [TensorSpec(f"{b}{norm}.weight", "norm", (h,)), TensorSpec(f"{b}{norm}.bias", "bias", (h,))]
    return sorted(specs, key=lambda s: bert_tensor_name(s.name))


def bert_metadata(w: gguf.GGUFWriter, shape: Shape, file_type: int, seed: int) -> None:
    """The keys after general.architecture, in the converter's order."""
    w.add_type("model")
    w.add_name(f"{shape.name} (synthetic, random weights, seed {seed})")
    w.add_block_count(shape.layers)
    w.add_context_length(shape.context)
    w.add_embedding_length(shape.hidden)
    w.add_feed_forward_length(shape.intermediate)
    w.add_head_count(shape.heads)
    w.add_layer_norm_eps(shape.norm_eps)
    w.add_file_type(file_type)
    w.add_causal_attention(False)
    w.add_pooling_type(gguf.PoolingType(shape.pooling))
    w.add_quantization_version(gguf.GGML_QUANT_VERSION)
    tokens, types = wordpiece_vocabulary(shape, seed)
    w.add_token_type_count(shape.token_types)
    w.add_tokenizer_model("bert")
    w.add_tokenizer_pre(shape.pre)
    w.add_token_list(tokens)
    w.add_token_types(types)
    by_name = {text: i for i, text in shape.specials.items()}
    w.add_bos_token_id(shape.bos)
    w.add_eos_token_id(shape.eos)
    w.add_unk_token_id(by_name["[UNK]"])
    w.add_sep_token_id(shape.eos)
    w.add_pad_token_id(by_name["[PAD]"])
    w.add_uint32("tokenizer.ggml.cls_token_id", shape.bos)   # gguf-py's add_cls_token_id
    w.add_mask_token_id(by_name["[MASK]"])
    w.add_add_bos_token(True)
    w.add_add_eos_token(True)
    w.add_add_sep_token(False)
    w.add_bool(_LOWERCASE, True)

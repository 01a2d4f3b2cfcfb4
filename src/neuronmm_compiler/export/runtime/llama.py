"""A Llama decoder in plain PyTorch with the module names and weight names of Hugging Face transformers'
``LlamaForCausalLM`` (``model.embed_tokens``, ``model.layers.<i>.self_attn.{q,k,v,o}_proj``,
``model.layers.<i>.mlp.{gate,up,down}_proj``, ``input_layernorm``, ``post_attention_layernorm``, ``model.norm``,
``lm_head``), for checking a patched MLP on the CPU where transformers is not installed: load a checkpoint, take
the logits, :func:`patch` the MLPs, take them again and compare (the logit matching NxD Inference's accuracy check
does). Full-sequence causal attention, no KV cache; RoPE with Llama 3's frequency scaling when the config has it.

Part of a package written by ``nmmc export``.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from safetensors.torch import load_file
from torch import nn


class LlamaRMSNorm(nn.Module):
    def __init__(self, hidden_size: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden_size))
        self.variance_epsilon = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dtype = x.dtype
        x = x.float()
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.variance_epsilon)
        return self.weight * x.to(dtype)


class LlamaMLP(nn.Module):
    def __init__(self, config: dict[str, Any]) -> None:
        super().__init__()
        self.hidden_size, self.intermediate_size = config["hidden_size"], config["intermediate_size"]
        self.gate_proj = nn.Linear(self.hidden_size, self.intermediate_size, bias=False)
        self.up_proj = nn.Linear(self.hidden_size, self.intermediate_size, bias=False)
        self.down_proj = nn.Linear(self.intermediate_size, self.hidden_size, bias=False)
        self.act_fn = nn.SiLU()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(self.act_fn(self.gate_proj(x)) * self.up_proj(x))


def rope_frequencies(config: dict[str, Any], head_dim: int) -> torch.Tensor:
    """The inverse frequencies of the rotary embedding (Llama 3's ``rope_scaling`` applied when present)."""
    base = float(config.get("rope_theta", 10000.0))
    inv = 1.0 / base ** (torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim)
    scaling = config.get("rope_scaling") or {}
    if scaling.get("rope_type", scaling.get("type")) == "llama3":
        factor, low, high = scaling["factor"], scaling["low_freq_factor"], scaling["high_freq_factor"]
        old = scaling["original_max_position_embeddings"]
        wavelen = 2 * math.pi / inv
        smooth = (old / wavelen - low) / (high - low)
        scaled = torch.where(wavelen > old / low, inv / factor, inv)
        middle = (wavelen <= old / low) & (wavelen >= old / high)
        inv = torch.where(middle, (1 - smooth) * inv / factor + smooth * inv, scaled)
    return inv.float()


def _rotate(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


class LlamaAttention(nn.Module):
    def __init__(self, config: dict[str, Any]) -> None:
        super().__init__()
        hidden = config["hidden_size"]
        self.heads = config["num_attention_heads"]
        self.kv_heads = config.get("num_key_value_heads", self.heads)
        self.head_dim = config.get("head_dim") or hidden // self.heads
        self.q_proj = nn.Linear(hidden, self.heads * self.head_dim, bias=False)
        self.k_proj = nn.Linear(hidden, self.kv_heads * self.head_dim, bias=False)
        self.v_proj = nn.Linear(hidden, self.kv_heads * self.head_dim, bias=False)
        self.o_proj = nn.Linear(self.heads * self.head_dim, hidden, bias=False)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        b, s, _ = x.shape
        q = self.q_proj(x).view(b, s, self.heads, self.head_dim).transpose(1, 2)
        k = self.k_proj(x).view(b, s, self.kv_heads, self.head_dim).transpose(1, 2)
        v = self.v_proj(x).view(b, s, self.kv_heads, self.head_dim).transpose(1, 2)
        q, k = q * cos + _rotate(q) * sin, k * cos + _rotate(k) * sin
        repeat = self.heads // self.kv_heads
        k, v = k.repeat_interleave(repeat, dim=1), v.repeat_interleave(repeat, dim=1)
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.o_proj(out.transpose(1, 2).reshape(b, s, self.heads * self.head_dim))


class LlamaDecoderLayer(nn.Module):
    def __init__(self, config: dict[str, Any]) -> None:
        super().__init__()
        eps = config.get("rms_norm_eps", 1e-6)
        self.self_attn = LlamaAttention(config)
        self.mlp = LlamaMLP(config)
        self.input_layernorm = LlamaRMSNorm(config["hidden_size"], eps)
        self.post_attention_layernorm = LlamaRMSNorm(config["hidden_size"], eps)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        x = x + self.self_attn(self.input_layernorm(x), cos, sin)
        return x + self.mlp(self.post_attention_layernorm(x))


class LlamaModel(nn.Module):
    def __init__(self, config: dict[str, Any]) -> None:
        super().__init__()
        self.config = config
        self.embed_tokens = nn.Embedding(config["vocab_size"], config["hidden_size"])
        self.layers = nn.ModuleList(LlamaDecoderLayer(config) for _ in range(config["num_hidden_layers"]))
        self.norm = LlamaRMSNorm(config["hidden_size"], config.get("rms_norm_eps", 1e-6))
        head_dim = config.get("head_dim") or config["hidden_size"] // config["num_attention_heads"]
        self.register_buffer("inv_freq", rope_frequencies(config, head_dim), persistent=False)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        x = self.embed_tokens(input_ids)
        positions = torch.arange(input_ids.shape[1], dtype=torch.float32)
        angles = torch.outer(positions, self.inv_freq)
        emb = torch.cat((angles, angles), dim=-1)
        cos, sin = emb.cos().to(x.dtype), emb.sin().to(x.dtype)
        for layer in self.layers:
            x = layer(x, cos, sin)
        return self.norm(x)


class LlamaForCausalLM(nn.Module):
    """``LlamaForCausalLM(config)(input_ids) -> logits`` [batch, sequence, vocab]; ``config`` a config.json dict."""

    def __init__(self, config: dict[str, Any]) -> None:
        super().__init__()
        self.config = config
        self.model = LlamaModel(config)
        self.lm_head = nn.Linear(config["hidden_size"], config["vocab_size"], bias=False)
        if config.get("tie_word_embeddings", False):
            self.lm_head.weight = self.model.embed_tokens.weight

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.lm_head(self.model(input_ids))

    @classmethod
    def from_pretrained(cls, directory: str | Path, dtype: torch.dtype = torch.float32) -> LlamaForCausalLM:
        """A Hugging Face Llama checkpoint directory (config.json, model.safetensors or a sharded index)."""
        directory = Path(directory)
        config = json.loads((directory / "config.json").read_text(encoding="utf-8"))
        model = cls(config)
        index = directory / "model.safetensors.index.json"
        files = (sorted(set(json.loads(index.read_text(encoding="utf-8"))["weight_map"].values()))
                 if index.is_file() else ["model.safetensors"])
        state: dict[str, torch.Tensor] = {}
        for name in files:
            state.update(load_file(str(directory / name)))
        if config.get("tie_word_embeddings", False):
            state.setdefault("lm_head.weight", state["model.embed_tokens.weight"])
        model.load_state_dict(state, strict=True)
        return model.to(dtype).eval()

"""The NumPy forward pass (:class:`~.forward.CausalLM`) mirrored in torch, for ``--heal finetune``.

Same weights (shared with the NumPy arrays, not copied; a tied LM head is a transposed view),
float32, batch-first; attention through ``scaled_dot_product_attention`` (fused, causal). The MLP of
any layer can be replaced by a callable (the compressed model's factors). torch itself is imported only by
:func:`import_torch`, which says how to install it when it is missing.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from ..errors import InputError

__all__ = ["TORCH_INSTALL", "TorchLM", "import_torch"]

TORCH_INSTALL = ("pip install 'nmmc[torch]' (on a CPU-only machine, pip install torch==2.13.0 or another CPU "
                 "build first: PyPI's default torch wheel brings several GB of CUDA libraries)")


def import_torch(purpose: str = "--heal finetune"):
    """The torch module, or a one-line InputError saying that ``purpose`` needs it and how to install it."""
    try:
        import torch
    except ImportError:
        raise InputError(f"{purpose} needs PyTorch, which is not installed: {TORCH_INSTALL}") from None
    return torch


class TorchLM:
    """:class:`~.forward.CausalLM`'s forward pass in torch (same weights, float32), batch-first."""

    def __init__(self, model, torch):
        self.torch, self.arch = torch, model.arch
        t = torch.from_numpy
        self.embed, self.norm = t(model.embed), t(model.norm)
        self.lm_head = t(model.lm_head)  # a tied head stays a transposed view of the embedding (no copy)
        self.layers = [{k: t(v) for k, v in layer.items()} for layer in model.layers]
        self.inv_freq = model.inv_freq
        self._rope: dict[int, tuple[Any, Any]] = {}

    def rms(self, x, weight):
        eps = self.arch.rms_norm_eps
        return x * self.torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * weight

    def _rope_tables(self, tokens: int):
        if tokens not in self._rope:
            angles = np.arange(tokens, dtype=np.float64)[:, None] * self.inv_freq[None, :]
            full = np.concatenate([angles, angles], axis=-1)
            self._rope[tokens] = (self.torch.from_numpy(np.cos(full).astype(np.float32)),
                                  self.torch.from_numpy(np.sin(full).astype(np.float32)))
        return self._rope[tokens]

    @staticmethod
    def _rotate(x, cos, sin, torch):
        half = x.shape[-1] // 2
        return x * cos + torch.cat([-x[..., half:], x[..., :half]], dim=-1) * sin

    def _attention(self, layer, x, cos, sin):
        torch, a = self.torch, self.arch
        batch, tokens, _ = x.shape
        out = {}
        for name, heads in (("q_proj", a.num_attention_heads), ("k_proj", a.num_key_value_heads),
                            ("v_proj", a.num_key_value_heads)):
            y = x @ layer[name]
            if a.attention_bias:
                y = y + layer[name + "_bias"]
            out[name] = y.view(batch, tokens, heads, a.head_dim).transpose(1, 2)
        q, k, v = out["q_proj"], out["k_proj"], out["v_proj"]
        if a.qk_norm:
            q, k = self.rms(q, layer["q_norm"]), self.rms(k, layer["k_norm"])
        q, k = self._rotate(q, cos, sin, torch), self._rotate(k, cos, sin, torch)
        group = a.num_attention_heads // a.num_key_value_heads
        if group > 1:
            k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
        att = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        return att.transpose(1, 2).reshape(batch, tokens, a.num_attention_heads * a.head_dim) @ layer["o_proj"]

    def dense_mlp(self, index: int, x):
        """The original MLP of layer ``index``."""
        w = self.layers[index]
        return (self.torch.nn.functional.silu(x @ w["gate"]) * (x @ w["up"])) @ w["down"]

    def hidden(self, tokens, mlp: Callable[[int, Any], Any] | None = None):
        """The final normalized hidden state [batch, tokens, hidden]; ``mlp(layer, x)`` replaces the
        original MLP when given."""
        cos, sin = self._rope_tables(tokens.shape[1])
        h = self.embed[tokens]
        for index, layer in enumerate(self.layers):
            h = h + self._attention(layer, self.rms(h, layer["input_norm"]), cos, sin)
            x = self.rms(h, layer["post_norm"])
            h = h + (mlp(index, x) if mlp is not None else self.dense_mlp(index, x))
        return self.rms(h, self.norm)

    def logits(self, tokens, mlp: Callable[[int, Any], Any] | None = None):
        """Logits [batch, tokens, vocab]; ``mlp(layer, x)`` replaces the original MLP when given."""
        return self.hidden(tokens, mlp) @ self.lm_head

"""A NumPy forward pass of Llama / Qwen2 / Qwen3 decoder models, for calibration and evaluation.

nmmc needs two things from a model's forward pass: the input of every MLP on real text (to whiten the
SVD, :mod:`.whitening`) and the model's next-token predictions with the original and with compressed
MLPs (perplexity and top-1 agreement, :mod:`.quality`). Both run on the CPU of the machine that
compresses. This module is that forward pass, in float32 NumPy (reductions and softmax in float32,
attention one sequence at a time), so that ``nmmc compress --calibration`` needs no PyTorch: the
CPU build of torch alone adds ~860 MB to an environment and PyPI's default wheel several GB of CUDA
libraries (``benchmarks/results/compression-runs.md``), against a few hundred lines here.

The architecture, as Hugging Face's ``LlamaForCausalLM`` / ``Qwen2ForCausalLM`` / ``Qwen3ForCausalLM``
compute it (``scripts/check_forward.py`` compares the logits with transformers' where it is installed):

    h = embed[tokens]
    per layer:  h += o_proj(attention(rope(q_proj(n)), rope(k_proj(n)), v_proj(n)))   n = rms_norm(h)
                h += down_proj(silu(gate_proj(m)) * up_proj(m))                      m = rms_norm(h)
    logits = lm_head(rms_norm(h))   (lm_head = embed when tie_word_embeddings)

RMSNorm ``x / sqrt(mean(x^2) + eps) * weight``; RoPE on the two halves of each head (``rotate_half``),
with Llama-3's frequency scaling when the config asks for it; grouped-query attention (each key/value
head serves ``heads / kv_heads`` query heads) with a causal mask; Qwen2 adds a bias to q, k and v;
Qwen3 normalizes q and k per head (``q_norm``, ``k_norm``) before RoPE.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..checkpoints.config import read_config
from ..checkpoints.weights import WeightReader
from ..errors import InputError

__all__ = ["Architecture", "CausalLM", "MlpObserver", "MlpOverride", "add_rows", "read_architecture"]

#: ``observer(layer, x, h)``: the MLP input ``x`` [tokens, hidden] and the down projection's input
#: ``h = silu(x Wg) * (x Wu)`` [tokens, intermediate] of one layer, as the original model computes them.
MlpObserver = Callable[[int, np.ndarray, np.ndarray], None]
#: ``override(layer, x) -> y``: the MLP output [tokens, hidden] to use instead of the original one
#: (None: the original). The hidden state that reaches the next layers is the overridden one.
MlpOverride = Callable[[int, np.ndarray], "np.ndarray | None"]


@dataclass(frozen=True)
class Architecture:
    """What the forward pass needs beyond :class:`~.config.ModelConfig`'s MLP shapes."""

    model_type: str
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    vocab_size: int
    rms_norm_eps: float
    rope_theta: float
    rope_scaling: dict | None
    tie_word_embeddings: bool
    attention_bias: bool
    qk_norm: bool


def _number(raw: dict, field: str, default: float | None, where: Path) -> float:
    value = raw.get(field, default)
    if value is None or isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) \
            or value <= 0:
        raise InputError(f"{where}: field {field!r} must be a positive number for the forward pass; got {value!r}")
    return value


def read_architecture(model_dir: str | Path) -> Architecture:
    """The forward pass's view of ``config.json`` (sizes checked as :func:`~.config.read_config` does)."""
    config = read_config(model_dir)
    where = Path(model_dir) / "config.json" if Path(model_dir).is_dir() else Path(model_dir)
    raw = json.loads(where.read_text(encoding="utf-8"))
    heads = int(_number(raw, "num_attention_heads", None, where))
    kv_heads = int(_number(raw, "num_key_value_heads", heads, where))
    head_dim = int(_number(raw, "head_dim", config.hidden_size // heads, where))
    if heads % kv_heads or head_dim % 2:
        raise InputError(f"{where}: {heads} attention heads do not split into {kv_heads} key/value groups of an "
                         f"even head_dim ({head_dim})")
    scaling = raw.get("rope_scaling")
    if scaling is not None:
        kind = scaling.get("rope_type", scaling.get("type")) if isinstance(scaling, dict) else None
        if kind not in ("default", "llama3"):
            raise InputError(f"{where}: rope_scaling {kind!r} is not supported by nmmc's forward pass "
                             "(supported: none, llama3)")
    arch = config.architecture
    return Architecture(
        model_type=arch, hidden_size=config.hidden_size, intermediate_size=config.intermediate_size,
        num_hidden_layers=config.num_hidden_layers, num_attention_heads=heads, num_key_value_heads=kv_heads,
        head_dim=head_dim, vocab_size=int(_number(raw, "vocab_size", None, where)),
        rms_norm_eps=float(_number(raw, "rms_norm_eps", 1e-6, where)),
        rope_theta=float(_number(raw, "rope_theta", 10000.0, where)),
        rope_scaling=scaling if isinstance(scaling, dict) and scaling.get("rope_type", scaling.get("type")) ==
        "llama3" else None,
        tie_word_embeddings=bool(raw.get("tie_word_embeddings", False)),
        attention_bias=bool(raw.get("attention_bias", arch == "qwen2")),
        qk_norm=arch == "qwen3",
    )


def rope_frequencies(arch: Architecture) -> np.ndarray:
    """Inverse frequencies [head_dim / 2] (float64), with Llama-3 scaling if the config has it."""
    inv = 1.0 / arch.rope_theta ** (np.arange(0, arch.head_dim, 2, dtype=np.float64) / arch.head_dim)
    s = arch.rope_scaling
    if s is None:
        return inv
    factor, low, high = float(s["factor"]), float(s.get("low_freq_factor", 1.0)), float(s.get("high_freq_factor", 4.0))
    old = float(s.get("original_max_position_embeddings", 8192))
    wavelength = 2 * math.pi / inv
    smooth = np.clip((old / wavelength - low) / (high - low), 0.0, 1.0) if high != low else (wavelength < old / high)
    scaled = (1 - smooth) * inv / factor + smooth * inv
    return np.where(wavelength < old / high, inv, np.where(wavelength > old / low, inv / factor, scaled))


def rms_norm(x: np.ndarray, weight: np.ndarray, eps: float) -> np.ndarray:
    variance = np.mean(np.square(x, dtype=np.float32), axis=-1, keepdims=True)
    return (x / np.sqrt(variance + np.float32(eps))) * weight


def silu(x: np.ndarray) -> np.ndarray:
    return x / (np.float32(1.0) + np.exp(-x))


def log_softmax(logits: np.ndarray) -> np.ndarray:
    shifted = logits - logits.max(axis=-1, keepdims=True)
    return shifted - np.log(np.exp(shifted).sum(axis=-1, keepdims=True))


def add_rows(parts: Sequence[np.ndarray], block: np.ndarray) -> None:
    """Add ``block`` (rows in the order of ``parts``, concatenated) to ``parts``, each in place."""
    offset = 0
    for part in parts:
        part += block[offset:offset + len(part)]
        offset += len(part)


class CausalLM:
    """A decoder model loaded from a Hugging Face directory (config.json + safetensors), float32.

    Weights are kept as nmmc's ``W = weight.T`` [in, out] so every projection is ``x @ W``.
    """

    def __init__(self, model_dir: str | Path):
        self.arch = read_architecture(model_dir)
        self.model_dir = Path(model_dir)
        reader = WeightReader(model_dir)
        a = self.arch
        q_out, kv_out = a.num_attention_heads * a.head_dim, a.num_key_value_heads * a.head_dim

        def read(name: str, shape: tuple[int, ...]) -> np.ndarray:
            array = reader.read(name, shape=shape)
            if not np.isfinite(array).all():
                raise InputError(f"{self.model_dir}: tensor {name!r} holds NaN or Inf values")
            return array

        self.embed = read("model.embed_tokens.weight", (a.vocab_size, a.hidden_size))
        self.norm = read("model.norm.weight", (a.hidden_size,))
        self.lm_head = self.embed.T if a.tie_word_embeddings or "lm_head.weight" not in reader.files \
            else np.ascontiguousarray(read("lm_head.weight", (a.vocab_size, a.hidden_size)).T)
        self.layers: list[dict[str, np.ndarray]] = []
        shapes = {"q_proj": q_out, "k_proj": kv_out, "v_proj": kv_out}
        for i in range(a.num_hidden_layers):
            p = f"model.layers.{i}."
            layer = {"input_norm": read(p + "input_layernorm.weight", (a.hidden_size,)),
                     "post_norm": read(p + "post_attention_layernorm.weight", (a.hidden_size,)),
                     "o_proj": np.ascontiguousarray(read(p + "self_attn.o_proj.weight", (a.hidden_size, q_out)).T)}
            for name, out in shapes.items():
                layer[name] = np.ascontiguousarray(read(f"{p}self_attn.{name}.weight", (out, a.hidden_size)).T)
                if a.attention_bias:
                    layer[name + "_bias"] = read(f"{p}self_attn.{name}.bias", (out,))
            if a.qk_norm:
                layer["q_norm"] = read(p + "self_attn.q_norm.weight", (a.head_dim,))
                layer["k_norm"] = read(p + "self_attn.k_norm.weight", (a.head_dim,))
            for proj, shape in (("gate", (a.intermediate_size, a.hidden_size)),
                                ("up", (a.intermediate_size, a.hidden_size)),
                                ("down", (a.hidden_size, a.intermediate_size))):
                layer[proj] = np.ascontiguousarray(read(f"{p}mlp.{proj}_proj.weight", shape).T)
            self.layers.append(layer)
        self.inv_freq = rope_frequencies(a)
        self._tables: dict[int, tuple[np.ndarray, np.ndarray, np.ndarray]] = {}  # per length: cos, sin, causal mask

    # ------------------------------------------------------------------ pieces

    def mlp_weight(self, layer: int, projection: str) -> np.ndarray:
        """nmmc's ``W`` [in, out] of one MLP projection (float32)."""
        return self.layers[layer][projection]

    def _length_tables(self, tokens: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The rotary cos and sin [tokens, head_dim] of positions 0..tokens-1 and the additive causal mask
        [tokens, tokens] (0 on and below the diagonal, -inf above), computed once per length."""
        if tokens not in self._tables:
            angles = np.arange(tokens, dtype=np.float64)[:, None] * self.inv_freq[None, :]
            full = np.concatenate([angles, angles], axis=-1)
            mask = np.where(np.tril(np.ones((tokens, tokens), dtype=bool)), np.float32(0), np.float32(-np.inf))
            self._tables[tokens] = (np.cos(full).astype(np.float32), np.sin(full).astype(np.float32), mask)
        return self._tables[tokens]

    @staticmethod
    def _rope(x: np.ndarray, cos: np.ndarray, sin: np.ndarray) -> np.ndarray:
        """x [heads, tokens, head_dim] rotated by position (the rotate_half convention)."""
        half = x.shape[-1] // 2
        rotated = np.concatenate([-x[..., half:], x[..., :half]], axis=-1)
        return x * cos + rotated * sin

    def _attention(self, layer: dict[str, np.ndarray], x: np.ndarray) -> np.ndarray:
        a = self.arch
        tokens = x.shape[0]
        projected = {}
        for name, heads in (("q_proj", a.num_attention_heads), ("k_proj", a.num_key_value_heads),
                            ("v_proj", a.num_key_value_heads)):
            y = x @ layer[name]
            if a.attention_bias:
                y = y + layer[name + "_bias"]
            projected[name] = y.reshape(tokens, heads, a.head_dim).transpose(1, 0, 2)
        q, k, v = projected["q_proj"], projected["k_proj"], projected["v_proj"]
        if a.qk_norm:
            q, k = rms_norm(q, layer["q_norm"], a.rms_norm_eps), rms_norm(k, layer["k_norm"], a.rms_norm_eps)
        cos, sin, mask = self._length_tables(tokens)
        q, k = self._rope(q, cos, sin), self._rope(k, cos, sin)
        group = a.num_attention_heads // a.num_key_value_heads
        k, v = np.repeat(k, group, axis=0), np.repeat(v, group, axis=0)
        scores = q @ k.transpose(0, 2, 1)
        scores *= np.float32(1.0 / math.sqrt(a.head_dim))
        scores += mask  # in place from here on: [heads, tokens, tokens] is the largest array of the pass
        scores -= scores.max(axis=-1, keepdims=True)
        weights = np.exp(scores, out=scores)
        weights /= weights.sum(axis=-1, keepdims=True)
        out = (weights @ v).transpose(1, 0, 2).reshape(tokens, a.num_attention_heads * a.head_dim)
        return out @ layer["o_proj"]

    def mlp(self, layer: int, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The original MLP of ``layer``: (output [tokens, hidden], down's input h [tokens, intermediate])."""
        w = self.layers[layer]
        h = silu(x @ w["gate"]) * (x @ w["up"])
        return h @ w["down"], h

    # ------------------------------------------------------------------ the pass

    def observe_mlps(self, sequences: Sequence[np.ndarray], observe: MlpObserver) -> list[np.ndarray]:
        """Run several sequences through the original model, each with its own causal attention, and hand
        ``observe`` every layer's MLP inputs of all of them at once: their rows concatenated, so that the MLP's
        and the observer's products are one larger matrix product each (faster on a CPU than one per sequence).
        Returns each sequence's final residual stream [tokens, hidden] (before the final norm)."""
        for tokens in sequences:
            self.check_tokens(tokens)
        a = self.arch
        hs = [self.embed[np.asarray(tokens)] for tokens in sequences]
        for index, layer in enumerate(self.layers):
            for h in hs:
                h += self._attention(layer, rms_norm(h, layer["input_norm"], a.rms_norm_eps))
            x = rms_norm(np.concatenate(hs), layer["post_norm"], a.rms_norm_eps)
            out, inner = self.mlp(index, x)
            observe(index, x, inner)
            add_rows(hs, out)
        return hs

    def check_tokens(self, tokens: np.ndarray) -> None:
        """InputError unless ``tokens`` is a non-empty 1-D sequence of ids in the model's vocabulary."""
        tokens = np.asarray(tokens)
        if tokens.ndim != 1 or not tokens.size or tokens.min() < 0 or tokens.max() >= self.arch.vocab_size:
            raise InputError(f"token ids must be a non-empty 1-D sequence in [0, {self.arch.vocab_size}) for this "
                             "model's vocabulary")

    def forward(self, tokens: np.ndarray, *, observe: MlpObserver | None = None,
                override: MlpOverride | None = None, logits: bool = True) -> np.ndarray | None:
        """Logits [tokens, vocab] (float32) of one sequence of token ids, or None when ``logits`` is False
        (calibration only needs ``observe``). See :data:`MlpObserver` and :data:`MlpOverride`."""
        tokens = np.asarray(tokens)
        self.check_tokens(tokens)
        a = self.arch
        h = self.embed[tokens]
        for index, layer in enumerate(self.layers):
            h = h + self._attention(layer, rms_norm(h, layer["input_norm"], a.rms_norm_eps))
            x = rms_norm(h, layer["post_norm"], a.rms_norm_eps)
            replaced = override(index, x) if override is not None else None
            if replaced is None or observe is not None:
                out, inner = self.mlp(index, x)
                if observe is not None:
                    observe(index, x, inner)
            h = h + (out if replaced is None else replaced)
        if not logits:
            return None
        return rms_norm(h, self.norm, a.rms_norm_eps) @ self.lm_head

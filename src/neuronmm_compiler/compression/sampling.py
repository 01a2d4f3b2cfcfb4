"""Calibration text that costs nothing: token sequences sampled from the original model itself.

A model's own samples follow the distribution it was trained on, which is broader than any one
file a user has at hand; mixed into the calibration set they widen the activations the whitening and
the healing are fitted to (benchmarks/results/compression-runs.md measures whether it helps). Sampling is ancestral
(temperature 1 by default, optionally top-p), from the beginning-of-sequence token, with a KV cache so
each new token costs one token's forward pass; ``batch`` sequences are decoded together. Deterministic
for a given seed (and batch). The matmuls have a few rows each ([batch, hidden]): they run on one BLAS
thread, because more threads only wait for each other there -- measured on the shared 2-core machine
(load average ~6), ``nmmc compress --calibration-samples 2048`` sampled 2 tokens/s with OpenBLAS's
default two threads and 7-22 with one (load average 20 to 5; 4 sequences together); 8 sequences together
sampled 35 tokens/s of wall time, 83 per CPU second, and 64 sequences 150 per CPU second. So one thread is
the default here; ``compress`` passes its ``--threads`` (default: every core) and decodes 64 sequences together.
On the idle machine (SmolLM2-135M, 64 sequences of 64 tokens): 252 tokens/s with one thread, 395 with two.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
from threadpoolctl import threadpool_limits

from ..errors import InputError
from .forward import log_softmax, rms_norm, silu

__all__ = ["sample_tokens"]


def _step(model, tokens: np.ndarray, position: int, cache: list[dict[str, np.ndarray]]) -> np.ndarray:
    """Logits [batch, vocab] of the next token after ``tokens`` [batch] at ``position`` (cache updated)."""
    a = model.arch
    h = model.embed[tokens]  # [batch, hidden]
    batch = h.shape[0]
    angles = position * model.inv_freq
    cos = np.cos(np.concatenate([angles, angles])).astype(np.float32)
    sin = np.sin(np.concatenate([angles, angles])).astype(np.float32)
    half = a.head_dim // 2
    group = a.num_attention_heads // a.num_key_value_heads
    for index, layer in enumerate(model.layers):
        n = rms_norm(h, layer["input_norm"], a.rms_norm_eps)
        heads = {}
        for name, count in (("q_proj", a.num_attention_heads), ("k_proj", a.num_key_value_heads),
                            ("v_proj", a.num_key_value_heads)):
            y = n @ layer[name]
            if a.attention_bias:
                y = y + layer[name + "_bias"]
            heads[name] = y.reshape(batch, count, a.head_dim)
        q, k, v = heads["q_proj"], heads["k_proj"], heads["v_proj"]
        if a.qk_norm:
            q, k = rms_norm(q, layer["q_norm"], a.rms_norm_eps), rms_norm(k, layer["k_norm"], a.rms_norm_eps)
        q = q * cos + np.concatenate([-q[..., half:], q[..., :half]], axis=-1) * sin
        k = k * cos + np.concatenate([-k[..., half:], k[..., :half]], axis=-1) * sin
        c = cache[index]
        c["k"][:, :, position], c["v"][:, :, position] = k, v
        keys, values = c["k"][:, :, :position + 1], c["v"][:, :, :position + 1]  # [batch, kv, t, d]
        qg = q.reshape(batch, a.num_key_value_heads, group, a.head_dim)
        scores = np.einsum("bkgd,bktd->bkgt", qg, keys) * np.float32(1.0 / math.sqrt(a.head_dim))
        weights = np.exp(scores - scores.max(axis=-1, keepdims=True))
        weights /= weights.sum(axis=-1, keepdims=True)
        out = np.einsum("bkgt,bktd->bkgd", weights, values).reshape(batch, a.num_attention_heads * a.head_dim)
        h = h + out @ layer["o_proj"]
        m = rms_norm(h, layer["post_norm"], a.rms_norm_eps)
        h = h + (silu(m @ layer["gate"]) * (m @ layer["up"])) @ layer["down"]
    return rms_norm(h, model.norm, a.rms_norm_eps) @ model.lm_head


def sample_tokens(model, count: int, *, length: int = 512, batch: int = 8, seed: int = 0,
                  temperature: float = 1.0, top_p: float = 1.0, start_token: int = 0,
                  progress: Callable[[int, int], None] | None = None, threads: int = 1) -> np.ndarray:
    """``count`` token ids sampled from ``model`` (:class:`~.forward.CausalLM`): sequences of ``length``
    tokens, each starting with ``start_token`` (the tokenizer's beginning/end-of-text id, 0 for SmolLM2
    and most Llama-family BPEs), concatenated. ``threads``: BLAS threads (see the module docstring)."""
    if count < 1 or length < 2 or batch < 1:
        raise InputError(f"sampling needs a positive token count, length >= 2 and batch >= 1; got {count}, "
                         f"{length}, {batch}")
    if not temperature > 0 or not 0 < top_p <= 1:
        raise InputError(f"temperature must be positive and top_p in (0, 1]; got {temperature}, {top_p}")
    with threadpool_limits(limits=threads, user_api="blas"):
        return _sample(model, count, length, batch, seed, temperature, top_p, start_token, progress)


def _sample(model, count: int, length: int, batch: int, seed: int, temperature: float, top_p: float,
            start_token: int, progress: Callable[[int, int], None] | None) -> np.ndarray:
    a = model.arch
    rng = np.random.default_rng(seed)
    sequences_needed = math.ceil(count / length)
    out = []
    total_steps = sequences_needed * (length - 1)
    done = 0
    for first in range(0, sequences_needed, batch):
        b = min(batch, sequences_needed - first)
        cache = [{"k": np.zeros((b, a.num_key_value_heads, length, a.head_dim), np.float32),
                  "v": np.zeros((b, a.num_key_value_heads, length, a.head_dim), np.float32)}
                 for _ in model.layers]
        tokens = np.full((b, length), start_token, dtype=np.int64)
        for position in range(length - 1):
            logp = log_softmax(_step(model, tokens[:, position], position, cache) / np.float32(temperature))
            probs = np.exp(logp.astype(np.float64))
            if top_p < 1:
                order = np.argsort(-probs, axis=-1)
                sorted_p = np.take_along_axis(probs, order, axis=-1)
                cut = np.cumsum(sorted_p, axis=-1) - sorted_p >= top_p
                sorted_p[cut] = 0.0
                probs = np.zeros_like(probs)
                np.put_along_axis(probs, order, sorted_p, axis=-1)
            probs /= probs.sum(axis=-1, keepdims=True)
            draws = rng.random(b)
            tokens[:, position + 1] = np.minimum((np.cumsum(probs, axis=-1) < draws[:, None]).sum(axis=-1),
                                                 a.vocab_size - 1)
            done += b
            if progress is not None:
                progress(done, total_steps)
        out.extend(tokens)
    return np.concatenate(out)[:count]

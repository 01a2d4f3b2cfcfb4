"""Healing by gradient fine-tuning: distil the original model into the compressed one (torch, CPU).

The compressed model is the original one with every compressed MLP projection replaced by ``x @ u @ v``.
Only ``u`` and ``v`` are trained (attention, norms, embeddings and dense projections stay frozen), so
the result has the same block-aligned ranks and is written in the same factor files. The loss is the
Kullback-Leibler divergence from the original model's next-token distribution to the compressed
model's, on the calibration tokens (distillation: no labels, and the teacher's full distribution says
more per token than the next token alone). Training the factors directly is LoRA with the adapter
merged from the start: at ranks of 60-100% of ``min(in, out)`` the factors are no larger than the
adapters of a useful LoRA rank, and there is nothing to merge back.

Why torch (an optional extra, ``pip install 'nmmc[torch]'``): it is the one autodiff library whose CPU
build runs a 135M-parameter transformer's forward and backward passes at BLAS speed on 2 cores with
fused attention (``scaled_dot_product_attention``), and its CPU wheel (~860 MB installed, 2.13.0 is on
this machine's disk) is the one users already have. JAX's CPU build is smaller (~620 MB with its
dependencies) but compiles every new shape with XLA first and has no on-disk copy here; autograd
(pure NumPy) has no fused kernels and is an order of magnitude slower on matmul-heavy graphs. The
NumPy forward pass (:mod:`.forward`) stays the reference for calibration and evaluation; this module
mirrors it in torch (tested against it) and is imported only for ``--heal finetune``.

Resuming: every ``checkpoint_seconds`` (and at the end) the trained factors, the optimizer's state and
the step are written to ``checkpoint`` (a temporary file renamed into place). A run whose checkpoint
records the same settings (calibration digest, ranks, steps, learning rate, ...) continues from the
recorded step with the same data order; another run's checkpoint is ignored and overwritten.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import time
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import InputError
from .calibration import sequences
from .config import PROJECTIONS

__all__ = ["TORCH_INSTALL", "FinetuneSettings", "finetune_heal", "import_torch"]

TORCH_INSTALL = ("pip install 'nmmc[torch]' (on a CPU-only machine, pip install torch==2.13.0 or another CPU "
                 "build first: PyPI's default torch wheel brings several GB of CUDA libraries)")


def import_torch():
    """The torch module, or a one-line InputError saying how to install it."""
    try:
        import torch
    except ImportError:
        raise InputError(f"--heal finetune needs PyTorch, which is not installed: {TORCH_INSTALL}") from None
    return torch


@dataclass(frozen=True)
class FinetuneSettings:
    """Distillation settings (all recorded in the checkpoint and the manifest)."""

    steps: int = 60
    learning_rate: float = 1e-4
    batch: int = 1  # sequences per step
    length: int = 256  # tokens per sequence
    warmup: int = 3
    seed: int = 0
    threads: int = 2
    checkpoint_seconds: float = 60.0


Factors = Mapping[int, Mapping[str, "tuple[np.ndarray, np.ndarray] | np.ndarray"]]


class _TorchLM:
    """:class:`~.forward.CausalLM`'s forward pass in torch (same weights, float32), batch-first."""

    def __init__(self, model, torch):
        self.torch, self.arch = torch, model.arch
        t = torch.from_numpy
        self.embed, self.norm = t(model.embed), t(model.norm)
        self.lm_head = t(np.ascontiguousarray(model.lm_head))
        self.layers = [{k: t(v) for k, v in layer.items()} for layer in model.layers]
        self.inv_freq = model.inv_freq

    def _rms(self, x, weight):
        eps = self.arch.rms_norm_eps
        return x * self.torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * weight

    def _rope_tables(self, tokens: int):
        angles = np.arange(tokens, dtype=np.float64)[:, None] * self.inv_freq[None, :]
        full = np.concatenate([angles, angles], axis=-1)
        return (self.torch.from_numpy(np.cos(full).astype(np.float32)),
                self.torch.from_numpy(np.sin(full).astype(np.float32)))

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
            q, k = self._rms(q, layer["q_norm"]), self._rms(k, layer["k_norm"])
        q, k = self._rotate(q, cos, sin, torch), self._rotate(k, cos, sin, torch)
        group = a.num_attention_heads // a.num_key_value_heads
        if group > 1:
            k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
        att = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        return att.transpose(1, 2).reshape(batch, tokens, a.num_attention_heads * a.head_dim) @ layer["o_proj"]

    def logits(self, tokens, mlp: Callable[[int, Any], Any] | None = None):
        """Logits [batch, tokens, vocab]; ``mlp(layer, x)`` replaces the original MLP when given."""
        torch = self.torch
        cos, sin = self._rope_tables(tokens.shape[1])
        h = self.embed[tokens]
        silu = torch.nn.functional.silu
        for index, layer in enumerate(self.layers):
            h = h + self._attention(layer, self._rms(h, layer["input_norm"]), cos, sin)
            x = self._rms(h, layer["post_norm"])
            y = mlp(index, x) if mlp is not None else (silu(x @ layer["gate"]) * (x @ layer["up"])) @ layer["down"]
            h = h + y
        return self._rms(h, self.norm) @ self.lm_head


def _key(settings: FinetuneSettings, identity: Mapping[str, Any]) -> str:
    record = {k: v for k, v in asdict(settings).items() if k not in ("threads", "checkpoint_seconds")}
    return hashlib.sha256(json.dumps({"settings": record, **identity}, sort_keys=True, default=str).encode()
                          ).hexdigest()[:16]


def _learning_rate(settings: FinetuneSettings, step: int) -> float:
    """Linear warm-up, then cosine decay to 0."""
    if step < settings.warmup:
        return settings.learning_rate * (step + 1) / settings.warmup
    span = max(settings.steps - settings.warmup, 1)
    return settings.learning_rate * 0.5 * (1 + math.cos(math.pi * (step - settings.warmup) / span))


def _batches(ids: np.ndarray, settings: FinetuneSettings) -> list[np.ndarray]:
    """Full-length sequences of the calibration ids (a ragged tail is dropped)."""
    chunks = [c for c in sequences(np.asarray(ids), settings.length) if len(c) == settings.length]
    if len(chunks) < settings.batch:
        raise InputError(f"fine-tuning needs at least {settings.batch * settings.length} calibration tokens "
                         f"({settings.batch} sequences of {settings.length}); got {len(ids)}")
    return chunks


def finetune_heal(model, ids: np.ndarray, factors: Factors, *, settings: FinetuneSettings | None = None,
                  checkpoint: str | Path | None = None, identity: Mapping[str, Any] | None = None,
                  progress: bool = False, on_step: Callable[[int, int, float], None] | None = None
                  ) -> tuple[dict, dict]:
    """Factors trained by distillation (same ranks; dense projections unchanged) and a record of the run.

    ``model``: the original :class:`~.forward.CausalLM`; ``ids``: calibration token ids; ``factors``: the
    starting point (whitened or closed-form healed). ``identity``: what else the checkpoint must match
    (e.g. the calibration digest and the starting method). ``progress``: a tqdm bar on stderr.
    ``on_step(step, steps, loss)`` after every step.
    """
    torch = import_torch()
    settings = settings or FinetuneSettings()
    if settings.steps < 1 or settings.batch < 1 or settings.length < 2 or not settings.learning_rate > 0:
        raise InputError(f"fine-tuning settings must be positive: {settings}")
    chunks = _batches(ids, settings)
    torch.set_num_threads(settings.threads)
    lm = _TorchLM(model, torch)
    params: dict[tuple[int, str], tuple[Any, Any]] = {}
    for layer, projections in factors.items():
        for proj in PROJECTIONS:
            f = projections[proj]
            if isinstance(f, tuple):
                params[(layer, proj)] = tuple(torch.nn.Parameter(torch.from_numpy(np.array(t, dtype=np.float32)))
                                              for t in f)
    flat = [t for pair in params.values() for t in pair]
    optimizer = torch.optim.Adam(flat, lr=settings.learning_rate)
    key = _key(settings, {**(identity or {}), "ranks": sorted((f"{k[0]}.{k[1]}", p[0].shape[1])
                                                              for k, p in params.items()),
                          "tokens": hashlib.sha256(np.asarray(ids, dtype=np.int64).tobytes()).hexdigest()[:16]})
    start, losses = 0, []
    path = Path(checkpoint) if checkpoint is not None else None
    if path is not None and path.is_file():
        try:
            state = torch.load(path, weights_only=False)
        except Exception:  # a truncated or foreign file: start over
            state = None
        if isinstance(state, dict) and state.get("key") == key:
            with torch.no_grad():
                for p, saved in zip(flat, state["params"], strict=True):
                    p.copy_(saved)
            if state.get("optimizer") is not None:
                optimizer.load_state_dict(state["optimizer"])
            start, losses = int(state["step"]), list(state["losses"])

    def save(step: int, done: bool) -> None:
        if path is None:
            return
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        torch.save({"key": key, "step": step, "losses": losses, "params": [p.detach() for p in flat],
                    "optimizer": None if done else optimizer.state_dict()}, tmp)
        os.replace(tmp, path)

    silu = torch.nn.functional.silu

    def student_mlp(layer: int, x):
        def proj(name: str, inp):
            pair = params.get((layer, name))
            return (inp @ pair[0]) @ pair[1] if pair is not None else inp @ lm.layers[layer][name]
        return proj("down", silu(proj("gate", x)) * proj("up", x))

    bar = None
    if progress:
        import sys

        from tqdm import tqdm

        bar = tqdm(total=settings.steps, initial=start, desc="finetune", unit="step", file=sys.stderr,
                   leave=False)
    began, last_save = time.time(), time.time()
    order_rng = np.random.default_rng(settings.seed)
    order = np.concatenate([order_rng.permutation(len(chunks))
                            for _ in range(math.ceil(settings.steps * settings.batch / len(chunks)))])
    for step in range(start, settings.steps):
        picks = order[step * settings.batch:(step + 1) * settings.batch]
        tokens = torch.from_numpy(np.stack([chunks[i] for i in picks]).astype(np.int64))
        with torch.no_grad():
            teacher = torch.log_softmax(lm.logits(tokens), dim=-1)
        student = torch.log_softmax(lm.logits(tokens, student_mlp), dim=-1)
        loss = torch.nn.functional.kl_div(student.flatten(0, 1), teacher.flatten(0, 1), log_target=True,
                                          reduction="batchmean")
        for group in optimizer.param_groups:
            group["lr"] = _learning_rate(settings, step)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        del teacher, student
        losses.append(float(loss.detach()))
        if bar is not None:
            bar.update(1)
            bar.set_postfix_str(f"KL {losses[-1]:.4f}", refresh=False)
        if on_step is not None:
            on_step(step + 1, settings.steps, losses[-1])
        if time.time() - last_save >= settings.checkpoint_seconds and step + 1 < settings.steps:
            save(step + 1, done=False)
            last_save = time.time()
    if bar is not None:
        bar.close()
    if start < settings.steps:
        save(settings.steps, done=True)
    healed: dict[int, dict] = {}
    for layer, projections in factors.items():
        healed[layer] = {}
        for proj in PROJECTIONS:
            pair = params.get((layer, proj))
            healed[layer][proj] = projections[proj] if pair is None else \
                tuple(np.ascontiguousarray(t.detach().numpy().copy()) for t in pair)
    record = {"settings": asdict(settings), "resumed_at_step": start, "seconds": round(time.time() - began, 1),
              "kl_first": losses[0] if losses else None,
              "kl_last_10": float(np.mean(losses[-10:])) if losses else None}
    return healed, record

"""Healing by gradient fine-tuning: distil the original model into the compressed one (torch, CPU).

The compressed model is the original one with every compressed MLP projection replaced by ``x @ u @ v``.
Only ``u`` and ``v`` are trained (attention, norms, embeddings and dense projections stay frozen), so
the result has the same block-aligned ranks and is written in the same factor files. The loss is the
Kullback-Leibler divergence from the original model's next-token distribution to the compressed
model's, on the calibration tokens (distillation: the teacher's full distribution says more per token than
the next token alone), plus ``label_weight`` times the cross-entropy of the data's own next tokens, which fits
the compressed model to the calibration text as well as to the teacher (measured: at 0.3 every text's
perplexity fell, the top-1 agreement with the original by at most 0.01). Training the factors directly is
LoRA with the adapter merged from the start: at ranks of 60-100% of ``min(in, out)`` the factors are no larger
than the adapters of a useful LoRA rank, and there is nothing to merge back.

Why torch (an optional extra, ``pip install 'nmmc[torch]'``): it is the one autodiff library whose CPU
build runs a 135M-parameter transformer's forward and backward passes at BLAS speed on 2 cores with
fused attention (``scaled_dot_product_attention``), and its CPU wheel (~860 MB installed, 2.13.0 is on
this machine's disk) is the one users already have. JAX's CPU build is smaller (~620 MB with its
dependencies) but compiles every new shape with XLA first and has no on-disk copy here; autograd
(pure NumPy) has no fused kernels and is an order of magnitude slower on matmul-heavy graphs. The
NumPy forward pass (:mod:`.forward`) stays the reference for calibration and evaluation; this module
mirrors it in torch (tested against it) and is imported only for ``--heal finetune``.

Step cost (SmolLM2-135M, 256 tokens, 2 cores): the teacher's targets are computed once per
calibration sequence, without gradients, and kept as its top-``top_k`` log-probabilities per token
(``top_k * 8`` bytes a token; the loss is the KL divergence restricted to those tokens, which hold
nearly all of the teacher's mass), so an epoch over the calibration set after the first costs only
the student's forward and backward passes, in ``threads`` torch threads (``docs/compression.md``, "Time
and memory", gives the measured seconds per step and peak memory). The student's matmuls run in bfloat16
autocast or in float32, whichever this machine runs faster (``dtype="auto"``: one step's forward and backward
pass timed in each before the first step; bfloat16 took half float32's time on one 2-core host and 1.5x on
another). Optionally (``layer_weight``) each compressed MLP's output is also pulled towards the original MLP's
output on the same (student) input: a relative squared error averaged over layers, cheap and local.

Tensor-parallel factor-shard blocks (``shards``): the student's MLP is the deployment's, the sum over ranks
of ``down_i(silu(gate_i(x)) * up_i(x))`` with each rank's own block factors (:func:`.heal_shards.sharded_mlp`);
the unsharded model is the case of one rank owning every intermediate column, so both train the same way.

Resuming: every ``checkpoint_seconds`` (and at the end) the trained factors, the optimizer's state and
the step are written to ``checkpoint`` (a temporary file renamed into place). A run whose checkpoint
records the same settings (calibration digest, ranks, steps, learning rate, ...) continues from the
recorded step with the same data order and the matmul type "auto" chose; another run's checkpoint is ignored
and overwritten (:mod:`.finetune_checkpoint`).
"""

from __future__ import annotations

import math
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ..checkpoints.config import PROJECTIONS
from ..errors import InputError
from ..workers.cores import available_cores
from .calibration import sequences
from .finetune_checkpoint import checkpoint_key, deferred_sigint, load_checkpoint, save_checkpoint
from .torch_lm import TORCH_INSTALL, import_torch

__all__ = ["DTYPES", "TORCH_INSTALL", "FinetuneSettings", "choose_dtype", "finetune_heal", "import_torch",
           "student_mlp", "teacher_states"]

#: The student's matmul types (:attr:`FinetuneSettings.dtype`).
DTYPES = ("auto", "bfloat16", "float32")
@dataclass(frozen=True)
class FinetuneSettings:
    """Distillation settings (all but ``threads`` and ``checkpoint_seconds`` recorded in the checkpoint
    key and the manifest)."""

    steps: int = 200
    # measured: 1e-4 diverged, 3e-5 and 3e-6 healed less (benchmarks/results/compression-runs.md)
    learning_rate: float = 1e-5
    batch: int = 1  # sequences per step
    length: int = 256  # tokens per sequence
    warmup: int = 5
    seed: int = 0
    top_k: int = 64  # teacher log-probabilities kept per token
    layer_weight: float = 0.0  # weight of the per-layer MLP-output error (0: logits only)
    # weight of the cross-entropy of the data's own next tokens, added to the KL (0: distillation alone); measured
    # at 300 steps on SmolLM2-135M: 0.3 lowered every text's perplexity (in domain below the original's), the top-1
    # agreement with the original within 0.01; 1.0 lowered them more and the agreement by up to 0.036
    # (benchmarks/results/compression-runs.md, "Twelfth run")
    label_weight: float = 0.3
    weight_decay: float = 0.0  # AdamW's, towards 0 (not towards the starting factors)
    # the student's matmuls (autocast; factors, optimizer, loss stay float32): bfloat16, float32, or "auto", the
    # faster of the two on this machine, timed before the first step (:func:`choose_dtype`)
    dtype: str = "auto"
    # tokens sampled from the original model (seed + 1) that ``compress`` adds to the distillation data
    # (finetune_heal itself trains on the ids it is given); measured: 16384 healed every text more than 0, at
    # ~110 CPU s of sampling and ~30 of fine-tuning more for SmolLM2-135M (benchmarks/results/compression-runs.md,
    # "Third run")
    samples: int = 16384
    threads: int | None = None  # torch threads; None: every core this process may use (as compress's --threads)
    checkpoint_seconds: float = 60.0


Factors = Mapping[int, Mapping[str, "tuple[np.ndarray, np.ndarray] | np.ndarray"]]


def _blocks(f) -> list | None:
    """A projection's trained factors as a list of ``(u, v)`` blocks (one per rank; one for unsharded factors),
    None for a dense projection (an array, or None: the blocks of a projection not factored per rank)."""
    if isinstance(f, list):
        return f
    return [f] if isinstance(f, tuple) else None


def student_mlp(torch, lm, params: Mapping[tuple[int, str], list], spans: list[tuple[int, int]] | None, layer: int,
                x):
    """The compressed model's MLP of ``layer`` in torch: with ``spans`` (each rank's intermediate columns) the sum
    over ranks of ``down_i(silu(gate_i(x)) * up_i(x))`` from each rank's ``params[(layer, proj)][i]`` block (the
    original weight's block where a projection has none); without, the one MLP of ``params[(layer, proj)][0]``."""
    weights = lm.layers[layer]

    def proj(name: str, inp, i: int, span: tuple[int, int] | None):
        pairs = params.get((layer, name))
        if pairs is not None:
            return (inp @ pairs[i][0]) @ pairs[i][1]
        w = weights[name]
        if span is not None:
            w = w[span[0]:span[1]] if name == "down" else w[:, span[0]:span[1]]
        return inp @ w

    total = None
    for i, span in enumerate(spans or [None]):
        y = proj("down", torch.nn.functional.silu(proj("gate", x, i, span)) * proj("up", x, i, span), i, span)
        total = y if total is None else total + y
    return total


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
                  progress: bool = False, on_step: Callable[[int, int, float], None] | None = None,
                  in_place: bool = False, state: dict | None = None, extra: Any = None,
                  key_ids: np.ndarray | None = None, shards: Sequence[tuple[int, int]] | None = None,
                  teacher_hidden: Mapping[int, np.ndarray] | None = None) -> tuple[dict, dict]:
    """Factors trained by distillation (same ranks; dense projections unchanged) and a record of the run.

    ``model``: the original :class:`~.forward.CausalLM`; ``ids``: calibration token ids; ``factors``: the
    starting point (whitened or closed-form healed). ``identity``: what else the checkpoint must match
    (e.g. the calibration digest and the starting method). ``progress``: a tqdm bar on stderr.
    ``on_step(step, steps, loss)`` after every step. ``in_place``: train the given factors' float32
    contiguous arrays themselves instead of copies (saves one copy of all factors, 0.3 GB for
    SmolLM2-135M at rank 384; the caller must not need the starting point afterwards). ``state``: the
    checkpoint, already read by :func:`load_checkpoint` (not read again). ``extra``: stored in every
    checkpoint (e.g. what produced the starting point, so that a resume can skip producing it).
    ``key_ids``: the tokens the checkpoint key covers instead of ``ids`` (when the rest of ``ids`` follows
    from the settings, e.g. ``samples`` drawn from the model). ``shards``: the ``[start, stop)`` intermediate
    columns of each tensor-parallel rank; ``factors[layer][proj]`` is then a list of per-rank ``(u, v)`` blocks
    (None or absent: the projection is not factored per rank and its weight's blocks stay as they are), trained
    through the sum over ranks that the deployment computes, and returned in the same form. ``teacher_hidden``: the
    original model's final normalised hidden state [length, hidden] of some of the fine-tuning sequences, by their
    index among the full-length sequences of ``ids`` (e.g. kept by the calibration pass over the same tokens:
    :func:`teacher_states`), so that their teacher targets need only the LM head.

    Ctrl-C (SIGINT, in the main thread) finishes the current step, writes the checkpoint and then raises
    KeyboardInterrupt; a kill loses at most ``checkpoint_seconds`` of steps.
    """
    torch = import_torch()
    from .torch_lm import TorchLM

    settings = settings or FinetuneSettings()
    if settings.steps < 1 or settings.batch < 1 or settings.length < 2 or not settings.learning_rate > 0 \
            or settings.top_k < 1 or settings.layer_weight < 0 or settings.weight_decay < 0 \
            or settings.dtype not in DTYPES:
        raise InputError(f"fine-tuning settings must be positive: {settings}")
    chunks = _batches(ids, settings)
    torch.set_num_threads(settings.threads or available_cores())
    lm = TorchLM(model, torch)
    spans = None if shards is None else [(int(a), int(b)) for a, b in shards]
    params: dict[tuple[int, str], list[tuple[Any, Any]]] = {}
    for layer, projections in factors.items():
        for proj in PROJECTIONS:
            blocks = _blocks(projections.get(proj))
            if blocks is not None:
                if len(blocks) != len(spans or [None]):
                    raise InputError(f"layer {layer} {proj}: {len(blocks)} factor blocks for "
                                     f"{len(spans or [None])} ranks")
                params[(layer, proj)] = [tuple(torch.nn.Parameter(torch.from_numpy(
                    np.ascontiguousarray(t, dtype=np.float32) if in_place else np.array(t, dtype=np.float32)))
                    for t in pair) for pair in blocks]
    flat = [t for blocks in params.values() for pair in blocks for t in pair]
    optimizer = _optimizer(torch, flat, settings)
    ranks = {k: p[0][0].shape[1] for k, p in params.items()} if spans is None else \
        {(k[0], f"{k[1]}.rank{i}"): pair[0].shape[1] for k, p in params.items() for i, pair in enumerate(p)}
    key = checkpoint_key(settings, {**(identity or {}), **({} if spans is None else {"shards": spans})},
                         ids if key_ids is None else key_ids, ranks)
    start, losses = 0, []
    path = Path(checkpoint) if checkpoint is not None else None
    if state is None or state.get("key") != key:
        state = load_checkpoint(path, key)
    if state is not None:
        with torch.no_grad():
            for p, saved in zip(flat, state["params"], strict=True):
                if p.data_ptr() != saved.data_ptr():
                    p.copy_(saved)
        if state.get("optimizer") is not None:
            optimizer.load_state_dict(state["optimizer"])
        start, losses = int(state["step"]), list(state["losses"])
    chosen = state.get("dtype") if state is not None else None  # what "auto" chose before a resume
    state = None  # its optimizer tensors are the optimizer's now; the rest is not needed

    def save(step: int, done: bool) -> None:
        if path is None:
            return
        save_checkpoint({"key": key, "step": step, "losses": losses, "params": [p.detach() for p in flat],
                         "optimizer": None if done else optimizer.state_dict(), "extra": extra, "dtype": chosen},
                        path)

    layer_errors: list = []

    def mlp(layer: int, x):
        y = student_mlp(torch, lm, params, spans, layer, x)
        if settings.layer_weight > 0 and any((layer, p) in params for p in PROJECTIONS):
            with torch.no_grad():
                target = lm.dense_mlp(layer, x).float()
            layer_errors.append((y.float() - target).pow(2).sum() / target.pow(2).sum().clamp_min(1e-30))
        return y

    targets: dict[int, tuple[Any, Any]] = {}  # chunk -> the teacher's top-k (log-probabilities, token ids)

    def teacher(index: int):
        if index not in targets:
            with torch.no_grad():
                known = (teacher_hidden or {}).get(index)
                hidden = lm.hidden(torch.from_numpy(chunks[index][None].astype(np.int64)))[0] if known is None \
                    else torch.from_numpy(known)
                targets[index] = torch.log_softmax(hidden @ lm.lm_head, -1).topk(settings.top_k, dim=-1)
        return targets[index]

    began, last_save = time.time(), time.time()
    order_rng = np.random.default_rng(settings.seed)
    order = np.concatenate([order_rng.permutation(len(chunks))
                            for _ in range(math.ceil(settings.steps * settings.batch / len(chunks)))])

    def loss_of(step: int, dtype: str):
        """The KL divergence of step ``step``'s sequences, and the loss trained (with the per-layer term)."""
        picks = order[step * settings.batch:(step + 1) * settings.batch]
        tokens = torch.from_numpy(np.stack([chunks[i] for i in picks]).astype(np.int64))
        top = [teacher(int(i)) for i in picks]
        t_logp, t_ids = torch.stack([t[0] for t in top]), torch.stack([t[1] for t in top])
        layer_errors.clear()
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=dtype == "bfloat16"):
            s_logits = lm.logits(tokens, mlp)
        s_logp = torch.log_softmax(s_logits.float(), dim=-1)
        kl = _sparse_kl(torch, t_logp, s_logp.gather(-1, t_ids))
        loss = kl + settings.layer_weight * torch.stack(layer_errors).mean() if layer_errors else kl
        if settings.label_weight > 0:
            loss = loss + settings.label_weight * _label_nll(s_logp, tokens)
        return kl, loss

    probe: dict[str, float] = {}
    if settings.dtype != "auto":
        chosen = settings.dtype
    elif chosen is None and start < settings.steps:
        if progress:  # the setup is a stage of its own: the step bar's rate and estimate count steps only
            print("finetune: setup (timing a step in float32 and in bfloat16 to choose the dtype)", file=sys.stderr)
        probe = _time_dtypes(lambda dtype: loss_of(start, dtype)[1].backward(), flat)
        chosen = choose_dtype(probe)
    bar = None
    if progress:
        from tqdm import tqdm

        bar = tqdm(total=settings.steps, initial=start, desc="finetune", unit="step", file=sys.stderr,
                   leave=False)

    def one_step(step: int) -> None:
        nonlocal last_save
        kl, loss = loss_of(step, chosen)
        for group in optimizer.param_groups:
            group["lr"] = _learning_rate(settings, step)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        losses.append(float(kl.detach()))
        del kl, loss
        if bar is not None:
            bar.update(1)
            bar.set_postfix_str(f"KL {losses[-1]:.4f}", refresh=False)
        if on_step is not None:
            on_step(step + 1, settings.steps, losses[-1])
        if time.time() - last_save >= settings.checkpoint_seconds and step + 1 < settings.steps:
            save(step + 1, done=False)
            last_save = time.time()

    with deferred_sigint() as interrupted:
        for step in range(start, settings.steps):
            one_step(step)
            if interrupted:
                save(step + 1, done=step + 1 == settings.steps)
                if bar is not None:
                    bar.close()
                if path is not None:
                    print(f"fine-tuning interrupted after step {step + 1} of {settings.steps}; checkpoint {path} "
                          "(the same command resumes from it)", file=sys.stderr)
                raise KeyboardInterrupt
    if bar is not None:
        bar.close()
    if start < settings.steps:
        save(settings.steps, done=True)
    healed: dict[int, dict] = {}
    for layer, projections in factors.items():
        healed[layer] = {}
        for proj in PROJECTIONS:
            blocks = params.get((layer, proj))
            if blocks is None:
                if proj in projections:
                    healed[layer][proj] = projections[proj]
                continue
            trained = [tuple(t.detach().numpy() if in_place else t.detach().numpy().copy() for t in pair)
                       for pair in blocks]
            healed[layer][proj] = trained if spans is not None else trained[0]
    record = {"settings": asdict(settings), "dtype": chosen, "dtype_probe_seconds": probe or None,
              "resumed_at_step": start, "seconds": round(time.time() - began, 1),
              "kl_first": losses[0] if losses else None,
              "kl_last_10": float(np.mean(losses[-10:])) if losses else None}
    return healed, record


def teacher_states(final: Sequence[np.ndarray], calibration_length: int, settings: FinetuneSettings
                   ) -> dict[int, np.ndarray]:
    """``finetune_heal``'s ``teacher_hidden`` from a calibration pass over the first tokens of its ``ids`` in
    sequences of ``calibration_length`` that kept each one's first ``settings.length`` final hidden states
    (:func:`.calibration.calibrate`'s ``keep_final``): the fine-tuning sequences that start where a calibration
    sequence starts (all of them at equal lengths, every other one at half) see exactly the same tokens."""
    out = {}
    for i, hidden in enumerate(final):
        start = i * calibration_length
        if start % settings.length == 0 and len(hidden) >= settings.length:
            out[start // settings.length] = np.ascontiguousarray(hidden[:settings.length], dtype=np.float32)
    return out


def choose_dtype(seconds: Mapping[str, float]) -> str:
    """bfloat16 when its timed step (``seconds``, per dtype) is at least 10% faster than float32's, else float32,
    the exact one (measured: bfloat16 took half float32's time on one 2-core host and 1.5-2x on another, with AVX-512
    BF16 and no AMX; benchmarks/results/compression-runs.md, "Seventh run" and "Tenth run")."""
    return "bfloat16" if seconds["bfloat16"] * 1.1 <= seconds["float32"] else "float32"


def _time_dtypes(step: Callable[[str], None], flat: list) -> dict[str, float]:
    """Seconds of ``step(dtype)`` (a forward and backward pass, no update) per dtype: the best of two after a
    warm-up each, the dtypes alternating so that a change in the machine's load hits both; gradients cleared."""
    runs: dict[str, list[float]] = {"bfloat16": [], "float32": []}
    for _ in range(3):
        for dtype, times in runs.items():
            began = time.perf_counter()
            step(dtype)
            times.append(time.perf_counter() - began)
    for p in flat:
        p.grad = None
    return {dtype: round(min(times[1:]), 4) for dtype, times in runs.items()}


def _sparse_kl(torch, t_logp, s_logp):
    """KL divergence from the teacher to the student over the teacher's top-k tokens plus one bucket for
    the rest of the vocabulary (a proper divergence: 0 only when the student matches those k
    probabilities), averaged over tokens."""
    t_p, s_p = t_logp.exp(), s_logp.exp()
    t_rest = (1 - t_p.sum(-1)).clamp_min(1e-12)
    s_rest = (1 - s_p.sum(-1)).clamp_min(1e-12)
    return ((t_p * (t_logp - s_logp)).sum(-1) + t_rest * (t_rest.log() - s_rest.log())).mean()


def _label_nll(s_logp, tokens):
    """The mean negative log-likelihood the student gives each token's next token within its sequence (the last
    token of a sequence has none there); ``s_logp`` [sequences, tokens, vocabulary], ``tokens`` int64."""
    return -s_logp[:, :-1].gather(-1, tokens[:, 1:, None]).mean()


def _optimizer(torch, params: list, settings: FinetuneSettings):
    """AdamW, fused where this torch has the CPU kernel (2.4 and later)."""
    try:
        return torch.optim.AdamW(params, lr=settings.learning_rate, weight_decay=settings.weight_decay, fused=True)
    except (RuntimeError, TypeError, ValueError):
        return torch.optim.AdamW(params, lr=settings.learning_rate, weight_decay=settings.weight_decay)

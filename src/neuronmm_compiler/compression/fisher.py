"""How much the model's predictions care about each direction of the residual stream, per layer (torch).

The closed form (:mod:`.heal`) measures down's error, and through :mod:`.heal_metric` gate's and up's,
in the MLP's output: every direction of the residual stream weighs the same. They do not weigh the same
to the model. An error ``d`` added to layer ``l``'s residual stream changes the next-token
distributions by, to second order, ``KL ~ 1/2 d^T F_l d`` with ``F_l`` the Fisher information of the
model's output distribution with respect to that stream. It is estimated by the Gram of the gradients
``g = dL/dh_l`` of the loss ``L = -log p(y)`` with ``y`` sampled from the model's own prediction at
every position (the true Fisher, not the empirical one: it needs no labels, so any text serves, and its
expectation is the KL divergence's Hessian, the quantity distillation and perplexity care about).

A Fisher from a few thousand tokens is noisy and fits their domain, so the metric the closed form uses
is a mix with the identity (:func:`residual_metric`), each part normalised to a mean diagonal of 1.

Cost: one forward and one backward pass of the original model per sequence (no factors). The gradient at
the logits, ``softmax - onehot(y)``, is applied by hand, so no ``[tokens, vocab]`` tensor is kept for the
backward pass (two of ``length * vocab * 4`` bytes live at once).
"""

from __future__ import annotations

import contextlib
import ctypes
from collections.abc import Callable

import numpy as np

from .calibration import batch_gram, sequences

__all__ = ["FISHER_MIX", "FISHER_TOKENS", "residual_fisher", "residual_metric"]

#: Calibration tokens the Fisher is estimated on (sequences spread evenly over the calibration set).
FISHER_TOKENS = 8192
#: Weight of the identity in the residual-stream metric (measured on SmolLM2-135M,
#: benchmarks/results/compression-runs.md, "Sixth run").
FISHER_MIX = 0.5


def _spread(chunks: list[np.ndarray], tokens: int) -> list[np.ndarray]:
    """At most ``tokens`` tokens' worth of ``chunks``, taken evenly over the list (every source of a
    mixed calibration set is represented)."""
    full = [c for c in chunks if len(c) == len(chunks[0])]
    count = max(1, min(len(full), tokens // max(len(chunks[0]), 1)))
    return [full[i] for i in np.linspace(0, len(full) - 1, count).round().astype(int)]


def residual_fisher(model, ids: np.ndarray, *, length: int, tokens: int = FISHER_TOKENS, seed: int = 0,
                    threads: int = 1, progress: Callable[[int, int], None] | None = None
                    ) -> tuple[list[np.ndarray], int]:
    """Per layer, ``sum_t g_t^T g_t`` [hidden, hidden] (float64) of the gradients of the sampled-label loss
    with respect to the residual stream after that layer's MLP, over at most ``tokens`` calibration tokens (one
    sequence at least); and the number of tokens it was estimated on."""
    from .finetune import import_torch
    from .torch_lm import TorchLM

    torch = import_torch("--heal-metric fisher")
    torch.set_num_threads(threads)
    lm = TorchLM(model, torch)
    picked = _spread(sequences(np.asarray(ids), length), tokens)
    generator = torch.Generator().manual_seed(seed)
    sums = [np.zeros((model.arch.hidden_size,) * 2) for _ in model.layers]
    for done, sequence in enumerate(picked, 1):
        tokens_t = torch.from_numpy(sequence[None].astype(np.int64))
        probes: list = []

        def mlp(index: int, x, probes=probes):
            probe = torch.zeros(x.shape, requires_grad=True)  # dL/dprobe = dL/dh after this layer's MLP
            probes.append(probe)
            return lm.dense_mlp(index, x) + probe

        hidden = lm.hidden(tokens_t, mlp)
        with torch.no_grad():  # dL/dlogits = softmax - onehot(y): no [tokens, vocab] tensor in the graph
            p = torch.softmax((hidden @ lm.lm_head).reshape(-1, lm.lm_head.shape[1]), dim=-1)
            labels = torch.multinomial(p, 1, generator=generator).squeeze(1)
            p[torch.arange(labels.shape[0]), labels] -= 1.0
            upstream = (p @ lm.lm_head.T).reshape(hidden.shape)
            del p
        hidden.backward(upstream)
        for index, probe in enumerate(probes):
            sums[index] += batch_gram(probe.grad.reshape(-1, probe.shape[-1]).numpy())
        del hidden, upstream, probes
        if progress is not None:
            progress(done, len(picked))
    _release_freed_memory()
    return sums, sum(len(c) for c in picked)


def _release_freed_memory() -> None:
    """Hand the freed activations back to the OS. glibc keeps freed heap pages: measured on SmolLM2-135M,
    1.7 GB of them stayed resident after the passes and raised the compress run's peak past 4 GiB."""
    with contextlib.suppress(OSError, AttributeError):  # not glibc: nothing to do
        ctypes.CDLL("libc.so.6").malloc_trim(0)


def residual_metric(fisher: np.ndarray, mix: float = FISHER_MIX) -> np.ndarray:
    """``(1 - mix) F / mean(diag F) + mix I``: the Fisher ``F`` mixed with the identity."""
    fisher = np.asarray(fisher, dtype=np.float64)
    scale = float(np.mean(np.diag(fisher)))
    base = fisher / scale if scale > 0 else np.zeros_like(fisher)
    return (1.0 - mix) * base + mix * np.eye(fisher.shape[0])

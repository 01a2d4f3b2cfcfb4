"""The optional prologue of a gated MLP: residual add (its sum stored), then RMSNorm or LayerNorm.

What AWS nki-library's ``mlp`` kernel fuses before its projections (aws-neuron/nki-library
@d2ad3a579498d1888aa8740af97fd325dd5f2740, src/nkilib_src/nkilib/core/mlp/mlp.py: ``fused_add_tensor``,
``store_fused_add_result``, ``normalization_type``, ``normalization_weights_tensor``, ``eps``)::

    s = x + residual                       (with a residual; stored as the output ``residual_sum``)
    n = norm(s) * gamma                    (rmsnorm: s / sqrt(mean(s^2) + eps);
                                            layernorm: (s - mean) / sqrt(var + eps))
    out = (silu(n Wg) * (n Wu)) Wd

A :class:`NormPrologue` is the request (``--fuse-norm``, ``--residual``, ``--norm-eps``, ``--fold-gamma``);
:func:`add_prologue` adds it to an MLP graph. With ``fold_gamma`` the kernel takes no gamma: the weights that
read the normalized value are given with gamma folded in, ``diag(gamma) W_gate`` and ``diag(gamma) W_up``
(``diag(gamma) U_gate`` and ``diag(gamma) U_up`` for SVD factors: ``(n * gamma) U V = n (diag(gamma) U) V``),
which :func:`fold_gamma` computes offline, once per checkpoint. LayerNorm's shift ``beta`` is not on the command
line (nki-library's ``normalization_bias_tensor`` is optional); a graph file's ``layernorm`` op takes it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..errors import InputError
from ..vocab import ElementwiseOp, NormOp

if TYPE_CHECKING:
    import numpy as np

    from ..ir import Graph

__all__ = ["DEFAULT_EPS", "NormPrologue", "add_prologue", "fold_gamma", "prologue_from_dict"]

#: nki-library's default ``eps`` (mlp.py).
DEFAULT_EPS = 1e-6
#: Names of the prologue's kernel arguments and of the stored sum.
RESIDUAL, GAMMA, SUM_OUTPUT = "residual", "gamma", "residual_sum"


@dataclass(frozen=True)
class NormPrologue:
    """A gated MLP's prologue: ``norm`` (rmsnorm or layernorm), a ``residual`` added first (its sum stored as
    the output ``residual_sum``), ``eps``, and whether gamma is folded into the weights (``fold_gamma``)."""

    norm: NormOp
    residual: bool = False
    eps: float = DEFAULT_EPS
    fold_gamma: bool = False

    def __post_init__(self) -> None:
        norm = NormOp.lookup(self.norm)
        if norm is None:
            raise InputError(f"unknown normalization {self.norm!r}; accepted: {', '.join(NormOp)}")
        object.__setattr__(self, "norm", norm)
        if isinstance(self.eps, bool) or not isinstance(self.eps, int | float) or not 0.0 < float(self.eps) < 1.0:
            raise InputError(f"--norm-eps must be a number in (0, 1); got {self.eps!r}")
        object.__setattr__(self, "eps", float(self.eps))

    def describe(self) -> str:
        """``residual add + rmsnorm (eps 1e-06, gamma folded)``."""
        gamma = "gamma folded into the weights" if self.fold_gamma else "gamma applied"
        return f"{'residual add + ' if self.residual else ''}{self.norm} (eps {self.eps!r}, {gamma})"

    def to_dict(self) -> dict[str, Any]:
        return {"norm": str(self.norm), "residual": self.residual, "eps": self.eps, "fold_gamma": self.fold_gamma}


def prologue_from_dict(data: Any) -> NormPrologue | None:
    """The prologue of a workload's JSON form (None when absent); InputError when malformed."""
    if data is None:
        return None
    if not isinstance(data, Mapping) or set(data) - {"norm", "residual", "eps", "fold_gamma"}:
        raise InputError(f"workload field 'prologue' must be null or {{norm, residual, eps, fold_gamma}}; got {data!r}")
    residual, fold = data.get("residual", False), data.get("fold_gamma", False)
    if not isinstance(residual, bool) or not isinstance(fold, bool):
        raise InputError("workload field 'prologue': residual and fold_gamma are booleans")
    return NormPrologue(data.get("norm"), residual=residual, eps=data.get("eps", DEFAULT_EPS), fold_gamma=fold)


def add_prologue(graph: Graph, prologue: NormPrologue, x: str) -> str:
    """Add the prologue over the input ``x`` [T, H] of ``graph``: the ``residual`` input and the stored sum
    (``residual_sum``), the ``gamma`` [H] input unless folded, the norm (node ``xn``); return the normalized
    value's id, which the projections read."""
    node = graph.node(x)
    tokens, hidden = node.shape
    source = x
    if prologue.residual:
        residual = graph.add_input(RESIDUAL, (tokens, hidden), node.dtype)
        source = graph.add_elementwise(ElementwiseOp.ADD, x, residual, id="x_sum")
        graph.add_output(SUM_OUTPUT, source)
    params = () if prologue.fold_gamma else (graph.add_input(GAMMA, (hidden,), node.dtype),)
    return graph.add_norm(prologue.norm, source, *params, eps=prologue.eps, id="xn")


def fold_gamma(gamma: np.ndarray, weights: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The weights that read the normalized value with gamma folded in: ``diag(gamma) W`` = each row ``h`` of
    ``W`` [H, N] times ``gamma[h]`` (``w_gate``, ``w_up`` of a dense MLP; ``u_gate``, ``u_up`` of an SVD one),
    computed in float64 and cast back to each weight's dtype. Exact in real arithmetic: ``(n * gamma) W =
    n (diag(gamma) W)``; in bf16 the folded weight is rounded once where the kernel would round ``n * gamma``."""
    import numpy as np

    g = np.asarray(gamma, dtype=np.float64).reshape(-1)
    out: dict[str, np.ndarray] = {}
    for name, weight in weights.items():
        w = np.asarray(weight)
        if w.ndim != 2 or w.shape[0] != g.shape[0]:
            raise InputError(f"fold_gamma: {name} must be [H, N] with H = {g.shape[0]} (gamma's length); "
                             f"got {list(w.shape)}")
        out[name] = (w.astype(np.float64) * g[:, None]).astype(w.dtype)
    return out

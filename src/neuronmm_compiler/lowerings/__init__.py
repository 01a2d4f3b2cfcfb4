"""The lowering registry: how a kind of schedule turns a lowered graph into loop-nest programs.

Each entry (a :class:`~.base.Lowering`) says which workloads it compiles, its schedule class and
presets, the pass pipeline its kernels need, how a kernel subgraph is lowered under one of its
schedules, the search space and evaluator of its schedules, and the baselines a tuned kernel is
compared with. The driver (:mod:`neuronmm_compiler.driver`) picks the entry for a workload
(:func:`lowering_for`) and otherwise treats every entry alike; a stored schedule names its entry by
``kind`` (:func:`lowering_named`). Entries: ``gemm`` (:mod:`.gemm`, one GEMM kernel, AWS's
tutorial presets) and ``fused`` (:mod:`.fused`, chains, MLPs and user graphs, possibly several
kernels).
"""

from __future__ import annotations

from collections.abc import Callable

from ..errors import UnknownNameError
from ..frontends.workloads import Workload
from .base import Baseline, Lowering
from .gemm import GemmLowering

__all__ = ["Baseline", "Lowering", "lowering_for", "lowering_named", "register_lowering", "registered_lowerings"]

#: kind -> the entry, or the function that builds it on first use (the fused family is a fifth of nmmc's modules,
#: which a command on a GEMM need not import: start-up, docs/architecture.md)
_REGISTRY: dict[str, Lowering | Callable[[], Lowering]] = {}


def register_lowering(entry: Lowering | Callable[[], Lowering],
                      kind: str | None = None) -> Lowering | Callable[[], Lowering]:
    """Add an entry (its ``kind`` must be new), or with ``kind`` a function building the entry when first asked for."""
    kind = kind or entry.kind  # type: ignore[union-attr]
    if kind in _REGISTRY:
        raise TypeError(f"lowering {kind!r} is already registered")
    _REGISTRY[kind] = entry
    return entry


def _entry(kind: str) -> Lowering:
    entry = _REGISTRY[kind]
    if not isinstance(entry, Lowering):
        entry = _REGISTRY[kind] = entry()
    return entry


def registered_lowerings() -> dict[str, Lowering]:
    """The entries by kind, in registration order (the order :func:`lowering_for` tries them)."""
    return {kind: _entry(kind) for kind in _REGISTRY}


def lowering_for(workload: Workload) -> Lowering:
    """The first registered entry that accepts ``workload``."""
    for kind in _REGISTRY:
        if (entry := _entry(kind)).accepts(workload):
            return entry
    raise UnknownNameError(f"no lowering compiles a {workload.kind} workload")


def lowering_named(kind: str) -> Lowering:
    """The entry of a stored schedule's ``kind``."""
    try:
        return _entry(kind)
    except KeyError:
        raise UnknownNameError(f"unknown schedule kind {kind!r}; kinds: {', '.join(_REGISTRY)}") from None


def _fused() -> Lowering:
    from .fused import FusedLowering

    return FusedLowering()


register_lowering(GemmLowering())  # tried first: a --shape GEMM is one GEMM kernel
register_lowering(_fused, "fused")

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

from ..errors import UnknownNameError
from ..frontends.workloads import Workload
from .base import Baseline, Lowering
from .fused import FusedLowering
from .gemm import GemmLowering

__all__ = ["Baseline", "Lowering", "lowering_for", "lowering_named", "register_lowering", "registered_lowerings"]

_REGISTRY: dict[str, Lowering] = {}


def register_lowering(entry: Lowering) -> Lowering:
    """Add an entry (its ``kind`` must be new)."""
    if entry.kind in _REGISTRY:
        raise TypeError(f"lowering {entry.kind!r} is already registered")
    _REGISTRY[entry.kind] = entry
    return entry


def registered_lowerings() -> dict[str, Lowering]:
    """The entries by kind, in registration order (the order :func:`lowering_for` tries them)."""
    return dict(_REGISTRY)


def lowering_for(workload: Workload) -> Lowering:
    """The first registered entry that accepts ``workload``."""
    for entry in _REGISTRY.values():
        if entry.accepts(workload):
            return entry
    raise UnknownNameError(f"no lowering compiles a {workload.kind} workload")


def lowering_named(kind: str) -> Lowering:
    """The entry of a stored schedule's ``kind``."""
    try:
        return _REGISTRY[kind]
    except KeyError:
        raise UnknownNameError(f"unknown schedule kind {kind!r}; kinds: {', '.join(_REGISTRY)}") from None


register_lowering(GemmLowering())  # tried first: a --shape GEMM is one GEMM kernel
register_lowering(FusedLowering())

"""What a lowering registry entry is (:class:`Lowering`) and what it compares against (:class:`Baseline`).

The registry itself is :mod:`neuronmm_compiler.lowerings`; the driver treats every entry alike.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

from ..cost_model import CostReport
from ..frontends.workloads import Workload
from ..ir import Graph
from ..kernel_ir.program import Program
from ..passes import Pass
from ..search import Evaluator, SearchSpace, SpaceSpec
from ..targets import Target

if TYPE_CHECKING:
    from ..cost_model.footprint import Footprint

__all__ = ["Baseline", "Lowering"]


@dataclass(frozen=True)
class Baseline:
    """What a tuned kernel is compared with: a label for tables, how its speedup is named, its cost
    (None when the baseline cannot be modelled for this workload)."""

    label: str
    speedup_label: str
    cost: CostReport | None

    def speedup(self, cost: CostReport) -> float | None:
        """How many times faster ``cost`` is than this baseline (None when it is not modelled or does not fit)."""
        if self.cost is None or not self.cost.feasible:
            return None
        return self.cost.latency_us / cost.latency_us


class Lowering(ABC):
    """One entry of the registry (see the module docstring)."""

    #: The entry's name, recorded with every stored schedule (caches, lockfiles, kernel metadata).
    kind: ClassVar[str]
    #: The schedule dataclass (a :class:`~neuronmm_compiler.schedule.gemm.ScheduleParams`).
    schedule_class: ClassVar[type]
    #: Name of the schedule compiled when none is given.
    default_schedule_name: ClassVar[str]
    #: --exhaustive-threshold default: the largest space enumerated rather than sampled.
    exhaustive_threshold: ClassVar[int]
    #: What an SBUF / PSUM overflow message suggests (the parameters of this schedule family).
    fit_advice: ClassVar[tuple[str, str]]

    @abstractmethod
    def accepts(self, workload: Workload) -> bool:
        """True when this entry compiles ``workload``."""

    def presets(self, workload: Workload) -> Mapping[str, str]:
        """Named schedules for ``workload`` with a one-line description each."""
        return {}

    @abstractmethod
    def resolve(self, workload: Workload, schedule: Any | None, preset: str | None,
                params: Mapping[str, str | int], target: Target) -> Any:
        """The schedule to compile: ``schedule`` (or the preset, or the default) with ``params``
        applied, checked against the target's limits and normalized to the workload."""

    @abstractmethod
    def pipeline(self, schedule: Any) -> list[Pass]:
        """The passes from the workload's graph to the graph this entry lowers."""

    @abstractmethod
    def kernels(self, graph: Graph) -> list[Graph]:
        """The kernel subgraphs of a graph after :meth:`pipeline`, in the order they run."""

    @abstractmethod
    def lower(self, kernel: Graph, schedule: Any, target: Target) -> Program:
        """One kernel subgraph as a loop-nest program under ``schedule``."""

    @abstractmethod
    def summary(self, workload: Workload, schedule_name: str, schedule: Any, programs: list[Program],
                footprints: list[Footprint], cost: CostReport, target: Target) -> list[tuple[str, str]]:
        """The (field, text) rows of an emitted file's header."""

    @abstractmethod
    def space(self, workload: Workload) -> SearchSpace:
        """The candidate values of every searched parameter for ``workload``."""

    @abstractmethod
    def search_setup(self, workload: Workload, target: Target,
                     exhaustive_threshold: int) -> tuple[SpaceSpec, Evaluator]:
        """The search space and evaluator (a picklable call, rebuilt in worker processes)."""

    @abstractmethod
    def baselines(self, workload: Workload, target: Target) -> dict[str, Baseline]:
        """The alternatives a tuned kernel is compared with, by name, best-known first."""

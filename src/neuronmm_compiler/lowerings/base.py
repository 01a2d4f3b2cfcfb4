"""What a lowering registry entry is (:class:`Lowering`) and what it compares against (:class:`Baseline`).

The registry itself is :mod:`neuronmm_compiler.lowerings`; the driver treats every entry alike.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

from ..cost_model import CostReport, combine_reports, estimate
from ..errors import ScheduleError
from ..frontends.workloads import Workload
from ..ir import Graph
from ..kernel_ir.program import DTYPE_BYTES, Program
from ..passes import Pass
from ..search import DEFAULT_TRIALS, Evaluator, SearchSpace, SpaceSpec
from ..support import dma_transpose_rule
from ..targets import IN_GRAPH, Target
from ..vocab import Dialect

if TYPE_CHECKING:
    from ..cost_model.footprint import Footprint

__all__ = ["BASELINE_ORDER", "Baseline", "Lowering", "aws_baseline", "dma_transpose_ok", "one_core_label",
           "one_core_unrunnable", "ordered_baselines", "resolve_split", "split_restriction", "transpose_choice",
           "undocumented_dma_transpose"]


def undocumented_dma_transpose(workload: Workload, target: Target, dialect: Dialect) -> str | None:
    """The rule a transposing DMA load would break for the workload's dtype on the target in the dialect
    (:func:`neuronmm_compiler.support.dma_transpose_rule`), None when it is documented."""
    return dma_transpose_rule(dialect, target.name, DTYPE_BYTES[workload.dtype])


def dma_transpose_ok(workload: Workload, target: Target, dialect: Dialect) -> bool:
    """True when a transposing DMA load may be emitted; where it may not, A^T / X^T is made on the
    TensorEngine (``pe``)."""
    return undocumented_dma_transpose(workload, target, dialect) is None


def transpose_choice(name: str, schedule: Any | None, params: Mapping[str, str | int], workload: Workload,
                     target: Target, dialect: Dialect) -> dict[str, str]:
    """The override of transpose parameter ``name`` ("a_transpose", "x_transpose") a schedule needs where the
    transposing DMA load is not documented (:func:`dma_transpose_ok`): ``pe`` instead of a preset's ``dma``, and
    a ScheduleError citing the rule when the caller asked for ``dma`` (with ``--param``, or in a given schedule:
    a stored or searched decision, every value of which was asked for)."""
    rule = undocumented_dma_transpose(workload, target, dialect)
    if rule is None:
        return {}
    asked = {**(schedule.as_dict() if schedule is not None else {}), **params}
    if asked.get(name) == "dma":
        raise ScheduleError(f"{name}=dma: nisa.dma_transpose is not documented for {workload.dtype} on {target.name} "
                            f"({rule}, docs/nki-rules.md); use {name}=pe, --a-layout km, or --dialect neuronxcc")
    return {name: "pe"}


def one_core_label(label: str, target: Target) -> str:
    """A baseline's label, saying it runs on one physical core where the target has logical cores (AWS's tutorial
    kernels are LNC=1 kernels: they never read nl.program_id)."""
    if target.lnc == 1:
        return label
    return f"{label[:-1]}, LNC=1)" if label.endswith(")") else f"{label} (LNC=1)"


def one_core_unrunnable(target: Target) -> str:
    """Why a kernel of one physical core (LNC=1: AWS's tutorial kernels) cannot run in the target's launch context,
    or "" where it can (standalone, or inside a graph compiled at LNC=1). Inside a model graph the kernel takes the
    graph's LNC degree and neuronx-cc rejects a mismatch: compiler error NCC_EVRF066 (Neuron 2.33, "Configuring the
    LNC degree of kernels", nki/get-started/about/lnc.html; compiler/error-codes/EVRF066.html; rule NKI-LNC-DEGREE,
    docs/nki-rules.md)."""
    if target.launch != IN_GRAPH or target.lnc == 1:
        return ""
    return (f"cannot run here: an LNC=1 kernel inside a model graph compiled at LNC={target.lnc} is a compile error "
            "(NCC_EVRF066, from Neuron SDK 2.33); in that graph the stack runs neuronx-cc's own lowering of these "
            "matmuls (not modelled) or an LNC=2 kernel (nki-library's MLP where it runs, or nmmc's)")


def aws_baseline(label: str, speedup_label: str, cost: CostReport | None, target: Target) -> Baseline:
    """A baseline of AWS's tutorial kernels, which run on one physical core: labelled so on a target of logical
    cores (:func:`one_core_label`), and not runnable where the launch context rules that out
    (:func:`one_core_unrunnable`)."""
    why = one_core_unrunnable(target)
    return Baseline(one_core_label(label, target), speedup_label, cost, one_core=True, runnable=not why,
                    not_runnable=why)


def split_restriction(schedule_class: type, lnc: int) -> dict[str, tuple]:
    """The ``lnc_split`` values a search tries at logical-core degree ``lnc``: ``none`` on one core, every real
    split on more (kernel_ir/lnc.py)."""
    spec = next(s for s in schedule_class.SPECS if s.name == "lnc_split")
    return {"lnc_split": ("none",) if lnc == 1 else tuple(v for v in spec.candidates if v != "none")}


def resolve_split(schedule: Any, params: Mapping[str, str | int], target: Target,
                  programs: Callable[[Any], list[Program]], exclude: tuple[str, ...] = ()) -> Any:
    """``schedule`` with the ``lnc_split`` its target needs: ``none`` on one physical core (asking for another is a
    ScheduleError); on an LNC=2 target the split asked for, or when none was (``none``), the schedule family's
    split with the lowest predicted latency among those under which every kernel ``programs(schedule)`` lowers to
    divides and fits (else the first split, whose kernels then carry the reason they do not divide); ``exclude``:
    splits the dialect cannot emit."""
    if target.lnc == 1:
        if schedule.lnc_split != "none" and "lnc_split" in params:
            raise ScheduleError(f"lnc_split={schedule.lnc_split} divides work between the programs of a logical core; "
                                f"{target.label} runs one program (use --lnc 2 on trn2/trn3, or lnc_split=none)")
        return schedule.with_params({"lnc_split": "none"}) if schedule.lnc_split != "none" else schedule
    if schedule.lnc_split != "none":
        return schedule
    splits = tuple(v for v in split_restriction(type(schedule), target.lnc)["lnc_split"] if v not in exclude)
    best: tuple[float, Any] | None = None
    dividing = None  # a split that divides but does not fit: its kernels report the capacity problem
    for split in splits:
        candidate = schedule.with_params({"lnc_split": split})
        lowered = programs(candidate)
        cost = combine_reports([estimate(p, target) for p in lowered])
        if cost.feasible and (best is None or cost.latency_us < best[0]):
            best = (cost.latency_us, candidate)
        if dividing is None and all(p.split_error is None for p in lowered):
            dividing = candidate
    if best is not None:
        return best[1]
    return dividing if dividing is not None else schedule.with_params({"lnc_split": splits[0]})


#: The order baselines are shown in: the order a user meets them. First what a user of an MLP on trn2 runs today,
#: AWS nki-library's fused MLP ("nkilib-mlp", modelled in nmmc's IR: lowerings/nkilib_mlp.py), then nmmc's own
#: fused dense MLP tuned the same way ("nmmc-dense"), then AWS's tutorial kernels per matmul ("dense"), and the SVD
#: factors unfused. Names not listed keep their order after these.
BASELINE_ORDER: tuple[str, ...] = ("nkilib-mlp", "nmmc-dense", "dense", "unfused")


def ordered_baselines(baselines: Mapping[str, Baseline]) -> dict[str, Baseline]:
    """``baselines`` in :data:`BASELINE_ORDER`."""
    rank = {name: i for i, name in enumerate(BASELINE_ORDER)}
    return dict(sorted(baselines.items(), key=lambda item: rank.get(item[0], len(rank))))


@dataclass(frozen=True)
class Baseline:
    """What a tuned kernel is compared with: a label for tables, how its speedup is named, its cost
    (None when the baseline cannot be modelled for this workload), whether it runs on one physical core
    (AWS's tutorial kernels) rather than on the target's logical core (nmmc's own kernels), and whether it can run
    at all in the target's launch context. A baseline that cannot run there is a reference row: every printer shows
    it labelled so, with ``not_runnable``, and no speedup over it (:meth:`speedup` is None)."""

    label: str
    speedup_label: str
    cost: CostReport | None
    one_core: bool = True
    #: Why the baseline has no cost (``cost`` None), for the reader: e.g. the assert of nki-library's it trips.
    reason: str = ""
    #: What JSON reports add about it (a variant, its source).
    details: Mapping[str, Any] | None = None
    #: False where this baseline cannot run in the target's launch context (an LNC=1 kernel in an LNC=2 graph,
    #: nki-library's kernel where it asserts or where the serving stack does not call it)...
    runnable: bool = True
    #: ...and why, with what the serving stack runs there instead where that is known.
    not_runnable: str = ""

    def speedup(self, cost: CostReport) -> float | None:
        """How many times faster ``cost`` is than this baseline (None when it is not modelled, does not fit, or
        cannot run in the launch context: no speedup is stated over a baseline nobody can run there)."""
        if not self.runnable or self.cost is None or not self.cost.feasible:
            return None
        return self.cost.latency_us / cost.latency_us

    def context_dict(self) -> dict[str, Any]:
        """Whether it can run in the launch context, and why not (``tune --json``, index.json)."""
        return {"runnable": self.runnable, **({"not_runnable": self.not_runnable} if not self.runnable else {})}


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
    #: --trials default: the Optuna trials of a search of this entry's schedules.
    default_trials: ClassVar[int] = DEFAULT_TRIALS
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
                params: Mapping[str, str | int], target: Target, dialect: Dialect) -> Any:
        """The schedule to compile: ``schedule`` (or the preset, or the default) with ``params``
        applied, checked against the target's limits and what ``dialect`` may emit there, and
        normalized to the workload."""

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
    def space(self, workload: Workload, dma_transpose: bool = True, lnc: int = 1, exchange: bool = True) -> SearchSpace:
        """The candidate values of every searched parameter for ``workload`` (``dma_transpose``: whether a
        transposing DMA load may be emitted, see :func:`dma_transpose_ok`; ``lnc``: the target's logical-core
        degree, which decides the ``lnc_split`` candidates; ``exchange``: whether the dialect documents
        ``nisa.sendrecv``, which splits that exchange values between the programs need)."""

    @abstractmethod
    def search_setup(self, workload: Workload, target: Target, exhaustive_threshold: int,
                     dma_transpose: bool = True, exchange: bool = True) -> tuple[SpaceSpec, Evaluator]:
        """The search space and evaluator (a picklable call, rebuilt in worker processes); the flags as for
        :meth:`space`."""

    @abstractmethod
    def baselines(self, workload: Workload, target: Target, dma_transpose: bool = True) -> dict[str, Baseline]:
        """The alternatives a tuned kernel is compared with, by name, best-known first."""

"""The cost of collectives between the NeuronCores of a tensor-parallel group.

An alpha-beta model of the ring algorithm (docs/tensor-parallel.md, "The collective model"): over
``N`` ranks, a ring all-reduce of a tensor of ``S`` bytes is a reduce-scatter then an all-gather,
``2 (N - 1)`` steps, each rank sending ``2 (N - 1) / N * S`` bytes; an all-gather or a
reduce-scatter is half of that. A step costs the interconnect's fixed latency, the bytes cost the
bandwidth one rank gets (:meth:`~neuronmm_compiler.targets.Interconnect.gbytes_per_s_per_rank`):

    t = steps * step_latency + bytes_sent / bandwidth_per_rank

The constants live in the hardware table (:data:`~neuronmm_compiler.targets.INTERCONNECTS`), with
their sources. The reduction arithmetic is left out (AWS's Trainium2 has dedicated collective cores;
it is small next to the transfer). Nothing here is validated against measured collectives: every
printed figure says so (:data:`UNVALIDATED`).
"""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import InputError
from ..targets import Target, interconnect_of

#: What nmmc prints next to a collective's cost.
UNVALIDATED = "collective costs are an alpha-beta ring model of published link bandwidths, not validated " \
              "against measurements"
#: The collectives the model knows, with (steps, bytes sent) per rank as multiples of (N - 1) and (N - 1) / N * S.
OPS: dict[str, tuple[int, int]] = {"all_reduce": (2, 2), "all_gather": (1, 1), "reduce_scatter": (1, 1)}


@dataclass(frozen=True)
class CollectiveCost:
    """One collective's predicted cost on one rank."""

    op: str
    ranks: int
    tensor_bytes: int  # the full tensor's size (what every rank holds, before or after)
    bytes_sent_per_rank: float
    latency_us: float
    bandwidth_us: float

    @property
    def total_us(self) -> float:
        return self.latency_us + self.bandwidth_us

    def as_dict(self) -> dict[str, float | int | str]:
        return {"op": self.op, "ranks": self.ranks, "tensor_bytes": self.tensor_bytes,
                "bytes_sent_per_rank": self.bytes_sent_per_rank, "latency_us": self.latency_us,
                "bandwidth_us": self.bandwidth_us, "total_us": self.total_us}


def ranks_per_instance(target: Target) -> int:
    """The largest tensor-parallel group in one instance: one rank per core a kernel launches on (a logical core
    of ``target.lnc`` physical cores: trn2.48xlarge has 64 ranks at LNC=2, 128 at LNC=1)."""
    return interconnect_of(target).ranks_per_instance // target.lnc


def check_group(target: Target, ranks: int) -> None:
    """InputError unless ``ranks`` ranks fit in one instance of the target (the model covers NeuronLink
    within an instance, not EFA between instances)."""
    fabric = interconnect_of(target)
    if ranks > ranks_per_instance(target):
        what = "logical NeuronCores" if target.lnc > 1 else "NeuronCores"
        raise InputError(f"--tp {ranks} spans more than one {fabric.instance} ({ranks_per_instance(target)} {what}); "
                         "nmmc models collectives over NeuronLink within one instance only")


def collective_cost(op: str, tensor_bytes: int, ranks: int, target: Target) -> CollectiveCost:
    """The predicted cost of ``op`` (all_reduce, all_gather, reduce_scatter) of a ``tensor_bytes`` tensor over
    ``ranks`` NeuronCores of ``target``'s instance. One rank costs nothing."""
    if op not in OPS:
        raise InputError(f"unknown collective {op!r}; known: {', '.join(OPS)}")
    check_group(target, ranks)
    if ranks == 1:
        return CollectiveCost(op, 1, tensor_bytes, 0.0, 0.0, 0.0)
    fabric = interconnect_of(target)
    steps, volume = OPS[op]
    sent = volume * (ranks - 1) / ranks * tensor_bytes
    # a rank is a logical core: a chip's links are shared by its cores / lnc ranks
    bandwidth = fabric.gbytes_per_s_per_rank(target.cores_per_chip // target.lnc) * 1e3  # bytes per microsecond
    return CollectiveCost(op, ranks, tensor_bytes, sent, steps * (ranks - 1) * fabric.step_latency_us,
                          sent / bandwidth)

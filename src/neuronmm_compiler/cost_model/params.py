"""Efficiency parameters of the cost model: the numbers that are not hardware facts.

Hardware facts (clocks, bandwidths, capacities, the DMA efficiency curve) live in
:mod:`neuronmm_compiler.targets`. What is here are per-instruction cycle costs, overlap
assumptions and achieved-fraction-of-peak factors, each with its source. They are kept in one
dataclass so a calibration against measured latencies (``nmmc calibrate``) can refit them; a
calibrated :class:`~neuronmm_compiler.targets.Target` carries its own instance, which
:func:`~.model.estimate` uses unless it is handed another one.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ..targets import Target

#: Version of the cost model; part of any cache key of search results.
COST_MODEL_VERSION = "1"


@dataclass(frozen=True)
class ModelParams:
    """Per-instruction costs and overlap factors (see docs/cost_model.md for each derivation).

    Cycle counts are floats so a calibration can fit them continuously; the defaults are the
    published (integer) figures."""

    # TensorEngine: an nc_matmul takes about max(moving free size, 64) cycles (AWS NKI performance
    # guide); fp32 operands run at a quarter of the bf16 rate.
    matmul_min_cycles: float = 64
    matmul_fp32_factor: float = 4
    # TensorE transpose (matmul with an identity): about max(P, min(64, F)) cycles (AWS guide).
    transpose_min_cycles: float = 64
    # Vector/Scalar engines: ~N cycles per input per instruction over the free size, plus a fixed
    # instruction overhead of ~60-100 cycles and ~60 cycles per SBUF/PSUM access (AWS guide).
    engine_instruction_cycles: float = 64
    engine_access_cycles: float = 60
    # DMA fixed cost per transfer (the target's dma_fixed_cost_us) overlaps across the DMA queues;
    # this many transfers are in flight at once. AWS: 16 DMA engines per core; we assume they
    # all serve one kernel's transfers.
    dma_queues_in_flight: float = 16
    # Achieved fraction of the nominal TensorEngine clock and of the nominal DMA bandwidth. 1.0 is
    # the datasheet figure; a calibration fits them (AWS's best GEMM reaches ~85% of peak).
    tensor_engine_efficiency: float = 1.0
    dma_bandwidth_efficiency: float = 1.0

    def as_dict(self) -> dict[str, float]:
        return asdict(self)


DEFAULT_PARAMS = ModelParams()
PARAM_NAMES: tuple[str, ...] = tuple(f.name for f in fields(ModelParams))


def params_of(target: Target) -> ModelParams:
    """The parameters a target carries (a calibrated target's fit), else :data:`DEFAULT_PARAMS`."""
    return target.params if target.params is not None else DEFAULT_PARAMS

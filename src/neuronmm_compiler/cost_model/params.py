"""Efficiency parameters of the cost model: the numbers that are not hardware facts.

Hardware facts (clocks, bandwidths, capacities, the DMA efficiency curve) live in
:mod:`neuronmm_compiler.targets`. What is here are per-instruction cycle costs and overlap
assumptions, each with its source. They are kept in one dataclass so a calibration against
measured latencies can refit them and hand a new instance to :func:`~.model.estimate`.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

#: Version of the cost model; part of any cache key of search results.
COST_MODEL_VERSION = "1"


@dataclass(frozen=True)
class ModelParams:
    """Per-instruction costs and overlap factors (see docs/cost_model.md for each derivation)."""

    # TensorEngine: an nc_matmul takes about max(moving free size, 64) cycles (AWS NKI performance
    # guide); fp32 operands run at a quarter of the bf16 rate.
    matmul_min_cycles: int = 64
    matmul_fp32_factor: int = 4
    # TensorE transpose (matmul with an identity): about max(P, min(64, F)) cycles (AWS guide).
    transpose_min_cycles: int = 64
    # Vector/Scalar engines: ~N cycles per input per instruction over the free size, plus a fixed
    # instruction overhead of ~60-100 cycles and ~60 cycles per SBUF/PSUM access (AWS guide).
    engine_instruction_cycles: int = 64
    engine_access_cycles: int = 60
    # DMA fixed cost per transfer (the target's dma_fixed_cost_us) overlaps across the DMA queues;
    # this many transfers are in flight at once. AWS: 16 DMA engines per core; we assume they
    # all serve one kernel's transfers.
    dma_queues_in_flight: int = 16

    def as_dict(self) -> dict[str, float]:
        return asdict(self)


DEFAULT_PARAMS = ModelParams()

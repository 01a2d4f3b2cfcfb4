"""Efficiency parameters of the cost model: the numbers that are not hardware facts.

Hardware facts (clocks, bandwidths, capacities, the DMA efficiency curve) live in
:mod:`neuronmm_compiler.targets`. What is here are per-instruction cycle costs, overlap
assumptions and achieved-fraction-of-peak factors, each with its source. They are kept in one
dataclass, :class:`ModelParams`, so a calibration against measured latencies (``nmmc calibrate``) can
refit them; a calibrated :class:`~neuronmm_compiler.targets.Target` carries its own instance, which
:func:`~.model.estimate` uses unless it is handed another one. Because a target carries them, the
dataclass is defined in :mod:`neuronmm_compiler.targets` (which imports nothing of nmmc's, so both
the hardware table and the calibrated-file reader there can use it); the cost model takes it from here.
"""

from __future__ import annotations

from ..targets import DEFAULT_PARAMS, PARAM_NAMES, ModelParams, Target

__all__ = ["COST_MODEL_VERSION", "DEFAULT_PARAMS", "PARAM_NAMES", "ModelParams", "params_of"]

#: Version of the cost model; part of any cache key of search results.
COST_MODEL_VERSION = "4"


def params_of(target: Target) -> ModelParams:
    """The parameters a target carries (a calibrated target's fit), else :data:`DEFAULT_PARAMS`."""
    return target.params if target.params is not None else DEFAULT_PARAMS

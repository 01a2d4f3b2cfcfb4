"""The analytic cost model of a loop-nest program on a Trainium target."""

from . import counts_mx  # noqa: F401  (registers the MX instructions' counts with .counts)
from .counts import ProgramCounts, count_program
from .footprint import Footprint, check_fits, footprint
from .model import (
    CostReport,
    combine_reports,
    dma_efficiency,
    effective_rates,
    estimate,
    model_inputs,
)
from .params import COST_MODEL_VERSION, DEFAULT_PARAMS, PARAM_NAMES, ModelParams, params_of

__all__ = [
    "COST_MODEL_VERSION",
    "DEFAULT_PARAMS",
    "PARAM_NAMES",
    "CostReport",
    "Footprint",
    "ModelParams",
    "ProgramCounts",
    "check_fits",
    "combine_reports",
    "count_program",
    "dma_efficiency",
    "effective_rates",
    "estimate",
    "footprint",
    "model_inputs",
    "params_of",
]

"""Calibrated target files: what ``nmmc calibrate`` writes and every ``--target FILE.json`` loads.

The file is JSON::

    {
      "format": "nmmc-calibrated-target", "version": 1,
      "base": "trn1",                                   # the stock target it refines
      "target": {"dma_fixed_cost_us": 1.1, "dma_transpose_efficiency": 0.31},
      "params": {"tensor_engine_efficiency": 0.86, ...},   # ModelParams fields (missing: default)
      "provenance": {"measurements": "m.csv", "rows": 12, "rms_rel_error_before": 0.21,
                     "rms_rel_error_after": 0.03, "date": "2026-12-01T10:00:00+00:00",
                     "fitted": ["dma_fixed_cost_us", ...]}
    }

``target`` may set only the hardware table's estimated fields (:data:`~neuronmm_compiler.targets.TARGET_FIELDS`);
everything else is the base target's. Loading checks every value (positive and finite; the transpose
efficiency a fraction in (0, 1]) so a hand-edited file fails with one line naming the problem.

This module writes the file; :mod:`neuronmm_compiler.targets` reads it (:func:`~neuronmm_compiler.targets.
load_target_file`), because ``get_target`` loads one wherever a target is named and the hardware table
may import nothing that imports it back.
"""

from __future__ import annotations

import json

from ..cost_model.params import params_of
from ..errors import InputError
from ..targets import FORMAT, TARGET_FIELDS, VERSION, Target

__all__ = ["target_file_text"]


def target_file_text(target: Target) -> str:
    """The file text of a calibrated target (sorted keys, two-space indent, trailing newline)."""
    if target.calibration is None:
        raise InputError(f"target {target.name} is not calibrated")
    data = {
        "format": FORMAT,
        "version": VERSION,
        "base": target.name,
        "target": {name: getattr(target, name) for name in TARGET_FIELDS},
        "params": params_of(target).as_dict(),
        "provenance": target.calibration.as_dict(),
    }
    return json.dumps(data, indent=2, sort_keys=True, allow_nan=False) + "\n"

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

``target`` may set only the hardware table's estimated fields (:data:`TARGET_FIELDS`); everything
else is the base target's. Loading checks every value (positive and finite; the transpose
efficiency a fraction in (0, 1]) so a hand-edited file fails with one line naming the problem.
"""

from __future__ import annotations

import json
import math
from dataclasses import replace
from pathlib import Path
from typing import Any

from .cost_model.params import PARAM_NAMES, ModelParams, params_of
from .errors import InputError
from .targets import TARGETS, Calibration, Target

FORMAT = "nmmc-calibrated-target"
VERSION = 1
#: The hardware table's estimated fields a calibration may refit (see targets.py).
TARGET_FIELDS: tuple[str, ...] = ("dma_fixed_cost_us", "dma_transpose_efficiency")
#: Fields that are fractions in (0, 1]; every other fitted value is a positive number.
FRACTIONS: frozenset[str] = frozenset({"dma_transpose_efficiency"})
PROVENANCE_TYPES: dict[str, type | tuple[type, ...]] = {
    "measurements": str, "rows": int, "rms_rel_error_before": (int, float), "rms_rel_error_after": (int, float),
    "date": str, "fitted": list,
}


def check_value(name: str, value: Any) -> float:
    """A fitted value as a float; InputError unless it is a positive finite number (a fraction in
    (0, 1] for :data:`FRACTIONS`)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
        raise InputError(f"{name} must be a positive finite number; got {value!r}")
    if name in FRACTIONS and value > 1:
        raise InputError(f"{name} is a fraction in (0, 1]; got {value!r}")
    return float(value)


def calibrated_target(base: Target, *, target_values: dict[str, float], params: ModelParams,
                      calibration: Calibration) -> Target:
    """``base`` with refitted estimated fields, its model parameters and provenance."""
    unknown = sorted(set(target_values) - set(TARGET_FIELDS))
    if unknown:
        raise InputError(f"a calibration may set only {', '.join(TARGET_FIELDS)} of a target; not {unknown}")
    values = {name: check_value(name, v) for name, v in target_values.items()}
    return replace(base, **values, params=params, calibration=calibration)


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


def _section(data: dict[str, Any], key: str) -> dict[str, Any]:
    value = data.get(key)
    if not isinstance(value, dict):
        raise InputError(f"'{key}' must be a JSON object; got {type(value).__name__}")
    return value


def parse_target_file(text: str, *, source: str) -> Target:
    """The calibrated target a file's text describes; InputError (without the file name) when malformed."""
    try:
        data = json.loads(text)
    except ValueError as exc:
        raise InputError(f"not valid JSON ({exc})") from None
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise InputError(f"not a calibrated target file (no \"format\": \"{FORMAT}\"; write one with "
                         "'nmmc calibrate')")
    if data.get("version") != VERSION:
        raise InputError(f"version {data.get('version')!r} is not supported (this nmmc reads version {VERSION})")
    base = data.get("base")
    if base not in TARGETS:
        raise InputError(f"base target {base!r} is not one of {', '.join(TARGETS)}")
    target_values = _section(data, "target")
    raw_params = _section(data, "params")
    unknown = sorted(set(raw_params) - set(PARAM_NAMES))
    if unknown:
        raise InputError(f"unknown model parameter(s) {unknown}; known: {', '.join(PARAM_NAMES)}")
    params = ModelParams(**{name: check_value(name, v) for name, v in raw_params.items()})
    provenance = _section(data, "provenance")
    for name, kind in PROVENANCE_TYPES.items():
        value = provenance.get(name)
        if not isinstance(value, kind) or isinstance(value, bool):
            raise InputError(f"provenance field {name!r} is missing or of the wrong type ({value!r})")
    calibration = Calibration(source=source, measurements=provenance["measurements"], rows=provenance["rows"],
                              rms_rel_error_before=float(provenance["rms_rel_error_before"]),
                              rms_rel_error_after=float(provenance["rms_rel_error_after"]),
                              date=provenance["date"], fitted=tuple(str(f) for f in provenance["fitted"]))
    return calibrated_target(TARGETS[base], target_values=target_values, params=params, calibration=calibration)


def load_target_file(path: str | Path) -> Target:
    """Read a calibrated target file; InputError naming the file when it is missing or malformed."""
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise InputError(f"calibrated target file not found: {str(p)!r} (write one with 'nmmc calibrate "
                         "MEASUREMENTS.csv -o FILE.json', or name a stock target: "
                         f"{', '.join(TARGETS)})") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise InputError(f"cannot read calibrated target file {str(p)!r}: {exc}") from None
    try:
        return parse_target_file(text, source=str(path))
    except InputError as exc:
        raise InputError(f"{p}: {exc}") from None

"""Verify an emitted kernel file: run it in the interpreter on fresh random inputs and compare
with a float64 NumPy evaluation of the graph recorded in its metadata.

The reference is rebuilt from the graph (not taken from the file's own ``reference()``), so a
kernel cannot vouch for itself. Tolerances, on ``||out - ref||_F / ||ref||_F``:

* bfloat16: 1e-2. Inputs are drawn as bf16 values (exact in fp32), products are exact in fp32 and
  accumulate in fp32 PSUM; the output is rounded once to bf16 (relative error <= 2^-9 ~ 2e-3 per
  element), and schedules that keep partial sums in bf16 SBUF round once more per K block. The
  Frobenius-norm error stays around 1e-3..4e-3; 1e-2 leaves margin while any indexing or
  accumulation bug (a missed tile is O(1) relative error) still fails it by orders of magnitude.
* float32: 1e-5. The only difference from float64 is fp32 summation order (~1e-7 sqrt(K)).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import ml_dtypes
import numpy as np

from .codegen import read_metadata
from .errors import InputError, KernelError
from .interpreter import run_kernel
from .ir import evaluate, parse_text
from .targets import Target, get_target

TOLERANCES = {"bfloat16": 1e-2, "float32": 1e-5}
NUMPY_DTYPES = {"bfloat16": ml_dtypes.bfloat16, "float32": np.float32}


@dataclass
class VerifyReport:
    """The outcome of one verification."""

    ok: bool
    kernel: str
    target: str
    dialect: str
    seed: int
    rel_error: float | None
    tolerance: float
    max_abs_error: float | None
    error: str | None = None
    counters: dict[str, Any] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        out = asdict(self)
        counters = out.pop("counters")
        out.update(counters)
        return out


def random_inputs(specs: list[dict[str, Any]], seed: int) -> dict[str, np.ndarray]:
    """Standard-normal inputs of the given names, shapes and dtypes (deterministic per seed)."""
    rng = np.random.default_rng(seed)
    out = {}
    for spec in specs:
        values = rng.standard_normal(tuple(spec["shape"]), dtype=np.float32)
        out[spec["name"]] = values.astype(NUMPY_DTYPES[spec["dtype"]])
    return out


def verify_source(source: str, *, filename: str = "<kernel>", seed: int = 0,
                  target: Target | None = None) -> VerifyReport:
    """Verify kernel source text (see the module docstring)."""
    meta = read_metadata(source)
    if meta is None:
        raise InputError(f"{filename}: not an nmmc kernel file (no '# nmmc-metadata:' header line)")
    try:
        tgt = target or get_target(meta["target"])
        graph = parse_text(meta["graph"])
        kernel_name = meta["kernel"]
        inputs_spec, outputs_spec = meta["inputs"], meta["outputs"]
    except (KeyError, TypeError) as exc:
        raise InputError(f"{filename}: malformed nmmc metadata ({exc})") from None
    out_dtype = outputs_spec[0]["dtype"]
    report = VerifyReport(ok=False, kernel=kernel_name, target=tgt.name, dialect=meta.get("dialect", "?"),
                          seed=seed, rel_error=None, tolerance=TOLERANCES[out_dtype], max_abs_error=None)
    inputs = random_inputs(inputs_spec, seed)
    try:
        run = run_kernel(source, filename=filename, kernel_name=kernel_name,
                         args=[inputs[s["name"]] for s in inputs_spec], target=tgt,
                         output_names=[s["name"] for s in outputs_spec])
    except KernelError as exc:
        report.error = str(exc)
        return report
    report.counters = run.counters.as_dict()
    expected = evaluate(graph, inputs)
    worst_rel, worst_abs = 0.0, 0.0
    for spec, actual in zip(outputs_spec, run.outputs, strict=True):
        ref = np.asarray(expected[spec["name"]], dtype=np.float64)
        got = np.asarray(actual, dtype=np.float64)
        if got.shape != ref.shape:
            report.error = f"output {spec['name']}: shape {got.shape}, expected {ref.shape}"
            return report
        if not np.all(np.isfinite(got)):
            report.error = f"output {spec['name']} holds non-finite values (unwritten or overflowed)"
            return report
        diff = got - ref
        denom = float(np.linalg.norm(ref)) or 1.0
        worst_rel = max(worst_rel, float(np.linalg.norm(diff)) / denom)
        worst_abs = max(worst_abs, float(np.max(np.abs(diff))) if diff.size else 0.0)
    report.rel_error, report.max_abs_error = worst_rel, worst_abs
    report.ok = worst_rel <= report.tolerance
    if not report.ok:
        report.error = f"relative error {worst_rel:.3e} exceeds the {out_dtype} tolerance {report.tolerance:.0e}"
    return report


def verify_file(path: str | Path, *, seed: int = 0, target: Target | None = None) -> VerifyReport:
    p = Path(path)
    try:
        source = p.read_text()
    except OSError as exc:
        raise InputError(f"cannot read kernel file {str(p)!r}: {exc.strerror}") from None
    return verify_source(source, filename=str(p), seed=seed, target=target)

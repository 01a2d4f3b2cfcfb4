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


def _merge(total: dict[str, Any], part: dict[str, Any]) -> None:
    """Add one kernel's counters into the file's: counts add up, peaks take the maximum."""
    for key, value in part.items():
        if isinstance(value, dict):
            into = total.setdefault(key, {})
            for k, v in value.items():
                into[k] = into.get(k, 0) + v
        elif key.endswith(("_peak_bytes", "_peak_banks")):
            total[key] = max(total.get(key, 0), value)
        else:
            total[key] = total.get(key, 0) + value


def verify_source(source: str, *, filename: str = "<kernel>", seed: int = 0,
                  target: Target | None = None) -> VerifyReport:
    """Verify kernel source text (see the module docstring). A file with several kernels runs them
    in order, each reading its arguments by name from the graph's inputs and earlier kernels'
    outputs; counters add up over kernels (peaks: the largest kernel's) and are also reported per
    kernel under ``kernels``."""
    meta = read_metadata(source)
    if meta is None:
        raise InputError(f"{filename}: not an nmmc kernel file (no '# nmmc-metadata:' header line)")
    try:
        tgt = target or get_target(meta["target"])
        graph = parse_text(meta["graph"])
        kernels = meta["kernels"]
        inputs_spec, outputs_spec = meta["inputs"], meta["outputs"]
        names = [k["name"] for k in kernels]
    except (KeyError, TypeError) as exc:
        raise InputError(f"{filename}: malformed nmmc metadata ({exc})") from None
    out_dtype = outputs_spec[0]["dtype"]
    report = VerifyReport(ok=False, kernel=", ".join(names), target=tgt.name, dialect=meta.get("dialect", "?"),
                          seed=seed, rel_error=None, tolerance=TOLERANCES[out_dtype], max_abs_error=None)
    inputs = random_inputs(inputs_spec, seed)
    tensors: dict[str, np.ndarray] = dict(inputs)
    per_kernel: list[dict[str, Any]] = []
    totals: dict[str, Any] = {}
    for kernel in kernels:
        try:
            run = run_kernel(source, filename=filename, kernel_name=kernel["name"],
                             args=[tensors[s["name"]] for s in kernel["inputs"]], target=tgt,
                             arg_names=[s["name"] for s in kernel["inputs"]],
                             output_names=[s["name"] for s in kernel["outputs"]])
        except KernelError as exc:
            report.error = f"{kernel['name']}: {exc}" if len(kernels) > 1 else str(exc)
            return report
        except KeyError as exc:
            raise InputError(f"{filename}: kernel {kernel['name']} reads {exc}, which no input or earlier "
                             "kernel provides") from None
        for spec, value in zip(kernel["outputs"], run.outputs, strict=True):
            tensors[spec["name"]] = value
        counters = run.counters.as_dict()
        per_kernel.append({"name": kernel["name"], **counters})
        _merge(totals, counters)
    report.counters = {**totals, "kernels": per_kernel} if len(kernels) > 1 else totals
    expected = evaluate(graph, inputs)
    worst_rel, worst_abs = 0.0, 0.0
    for spec in outputs_spec:
        ref = np.asarray(expected[spec["name"]], dtype=np.float64)
        got = np.asarray(tensors[spec["name"]], dtype=np.float64)
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

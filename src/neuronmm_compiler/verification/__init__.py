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

Graphs with intermediates (fused chains, MLPs) also round every value they store as a matmul
operand (bf16 strips on chip, as NeuronMM's kernels do, or a tensor handed between kernels). That
error is relative to the intermediate, not to the output, and cancellation in later matmuls can make
it large relative to a small output (one output element, few terms). So the check is
``||out - ref|| <= tol * ||ref|| + ||A||``, ``A`` being 4 standard deviations of that rounding error
at the outputs, by probabilistic error analysis: each stored value v adds a relative error uniform
in [-u, u] (variance u^2 v^2 / 3; u = 2^-8 for bf16, 2^-24 for fp32), and variances propagate
linearly: through a matmul as ``var(A) B^2 + A^2 var(B)``, through multiply likewise, through add
as a sum, through silu times its Lipschitz constant squared (1.1^2). A single GEMM stores no
intermediate, so ``A = 0`` and its check is unchanged; a missed or wrong tile stays an O(||ref||)
error, far outside either term.
"""

from __future__ import annotations

import gc
import os
import stat
import warnings
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import ml_dtypes
import numpy as np

from ..codegen import KernelSpec, TensorSpec, read_metadata
from ..errors import InputError, KernelError
from ..interpreter import run_kernel
from ..interpreter.scale_units import ScaleUnits
from ..ir import Graph, parse_text
from ..ir.quantized import calibrate, is_quantized, scale_exponents, unquantized
from ..support import check_sdk, newest_sdk
from ..targets import Target, get_target, with_lnc
from ..vocab import Dialect, Layout
from .memory import check_memory
from .reference import reference_chunks
from .sandbox import check_source
from .static_check import Violation, check_kernel_source

TOLERANCES = {"bfloat16": 1e-2, "float32": 1e-5}
NUMPY_DTYPES = {"bfloat16": ml_dtypes.bfloat16, "float32": np.float32, "float8_e4m3": ml_dtypes.float8_e4m3,
                "float8_e5m2": ml_dtypes.float8_e5m2, "float8_e4m3fn": ml_dtypes.float8_e4m3fn}
#: Where a kernel runs: nmmc's interpreter, or AWS's simulator (``nki`` / ``neuronxcc``, see nki_backend.py).
BACKENDS = ("interpreter", "nki-simulator")
#: The largest kernel file verify reads (emitted kernels are tens of KiB).
MAX_KERNEL_BYTES = 8 * 1024 * 1024

#: Runs one kernel of a file: (the metadata's kernel entry, its argument arrays, the target) ->
#: (output arrays, the interpreter's counters or None when the backend has none).
KernelRunner = Callable[[KernelSpec, list[np.ndarray], Target], tuple[list[np.ndarray], dict[str, Any] | None]]


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
    rounding_allowance: float = 0.0  # ||A|| / ||ref||: what intermediate roundings may add (see module doc)
    error: str | None = None
    backend: str = "interpreter"
    counters: dict[str, Any] = field(default_factory=dict)
    #: The outputs matched the reference (``ok`` also needs no rule violation).
    values_ok: bool = False
    #: The Neuron SDK release whose NKI rules the static pass checked (None: the pass did not run).
    sdk: str | None = None
    #: What the static rule pass found (see :mod:`.static_check`); any violation fails the report.
    violations: list[Violation] = field(default_factory=list)
    #: The kernel's logical-core degree: how many programs the interpreter ran against one HBM.
    lnc: int = 1
    #: The largest magnitude in the reference outputs: the scale ``max_abs_error`` is read against.
    max_abs_reference: float | None = None
    #: An FP8 graph's outputs against the float64 evaluation of the graph it quantizes (ir/quantized.py), on the
    #: same values: the quantization error, reported, never checked (None: not an FP8 graph; docs/quantization.md).
    unquantized_rel_error: float | None = None

    def as_dict(self) -> dict[str, Any]:
        out = asdict(self)
        counters = out.pop("counters")
        out["violations"] = [v.as_dict() for v in self.violations]
        out.update(counters)
        return out


def random_inputs(specs: Iterable[TensorSpec], seed: int) -> dict[str, np.ndarray]:
    """Standard-normal inputs of the given names, shapes and dtypes (deterministic per seed)."""
    rng = np.random.default_rng(seed)
    out = {}
    for spec in specs:
        values = rng.standard_normal(spec.shape, dtype=np.float32)
        out[spec.name] = values.astype(NUMPY_DTYPES[spec.dtype])
    return out


def merge_counters(total: dict[str, Any], part: dict[str, Any]) -> None:
    """Add one kernel's counters into a total (a file's, a rank's, all ranks'): counts add up, peaks take
    the maximum."""
    for key, value in part.items():
        if isinstance(value, list):  # per program of a logical core: program by program
            into_list = total.setdefault(key, [{} for _ in value])
            for into_program, program in zip(into_list, value, strict=True):
                merge_counters(into_program, program)
        elif isinstance(value, dict):
            into = total.setdefault(key, {})
            for k, v in value.items():
                into[k] = into.get(k, 0) + v
        elif key.endswith(("_peak_bytes", "_peak_banks")):
            total[key] = max(total.get(key, 0), value)
        else:
            total[key] = total.get(key, 0) + value


def interpreter_runner(source: str, filename: str, graph: Graph | None = None) -> KernelRunner:
    """Run the file's kernels in nmmc's interpreter (limits checked, counters kept); a quantized ``graph`` (the file's)
    also has the interpreter check its scale units (rule NMMC-FP8-SCALE-ONCE, interpreter/scale_units.py)."""
    exponents = scale_exponents(graph) if graph is not None and is_quantized(graph) else None

    def run(kernel: KernelSpec, args: list[np.ndarray], target: Target) -> tuple[list[np.ndarray], dict[str, Any]]:
        units = None if exponents is None else ScaleUnits(
            sorted({s for exps in exponents.values() for s in exps}),
            {s.name: exponents.get(s.name, {}) for s in kernel.inputs},
            {s.name: exponents.get(s.name, {}) for s in kernel.outputs})
        result = run_kernel(source, filename=filename, kernel_name=kernel.name, args=args, target=target,
                            arg_names=[s.name for s in kernel.inputs], output_names=[s.name for s in kernel.outputs],
                            units=units)
        outputs, counters = result.outputs, result.counters.as_dict()
        if result.program_counters:  # an LNC kernel: each program's own counts besides the sums
            counters["programs"] = [c.as_dict() for c in result.program_counters]
        del result
        gc.collect()  # the interpreter's machine (its copies of the arguments) sits in reference cycles
        return outputs, counters

    return run


def _runner(backend: str, source: str, filename: str, dialect: str, graph: Graph) -> KernelRunner:
    if backend == "interpreter":
        return interpreter_runner(source, filename, graph)
    if backend == "nki-simulator":
        from .nki_backend import simulator_runner

        return simulator_runner(source, filename, dialect)
    raise InputError(f"unknown verification backend {backend!r}; backends: {', '.join(BACKENDS)}")


def verify_source(source: str, *, filename: str = "<kernel>", seed: int = 0, target: Target | None = None,
                  backend: str = "interpreter", rules: bool = False, sdk: str | None = None,
                  max_memory: int | None = None) -> VerifyReport:
    """Verify kernel source text (see the module docstring). A file with several kernels runs them
    in order, each reading its arguments by name from the graph's inputs and earlier kernels'
    outputs; counters add up over kernels (peaks: the largest kernel's) and are also reported per
    kernel under ``kernels``. ``backend`` runs the kernels in nmmc's interpreter (the default) or in
    AWS's NKI simulator (``nki-simulator``: no counters, and the simulator checks no capacity); the
    inputs, reference and tolerance are the same.

    Before anything runs, the file must pass :func:`~.sandbox.check_source` (SandboxError, an
    InputError, otherwise): it may hold only the NKI subset nmmc emits. NumPy's floating-point
    warnings are silenced; an overflow shows as a non-finite output or a failed comparison.

    With ``rules`` (as ``nmmc verify`` does), the static NKI rule pass
    (:func:`~.static_check.check_kernel_source`) runs before the kernels, for the file's dialect, the target
    (``target`` or the file's) and Neuron SDK release ``sdk`` (default: the release the file records it was emitted
    for, where its code depends on one, else the newest release that supports the dialect on the target,
    :func:`~neuronmm_compiler.support.newest_sdk`; InputError, before anything runs, for a
    release the rule book was not read for, with the reason for the file's dialect when it is a later one,
    :func:`~neuronmm_compiler.support.check_sdk`). The kernels still run; any violation fails the report
    (``violations``, ``sdk``).

    The reference is computed and compared in row chunks (:mod:`.reference`), so memory grows with
    the file's tensors, not with float64 copies of them; ``max_memory`` (bytes) refuses, with an
    InputError before anything runs, a file whose verification is estimated to need more
    (:mod:`.memory`)."""
    if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
        raise InputError(f"the seed must be a non-negative integer; got {seed!r}")
    with np.errstate(all="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        report = _verify_source(source, filename, seed, target, backend, rules, sdk, max_memory)
    if report.violations:
        report.ok = False
        if report.error is None:
            count = len(report.violations)
            report.error = (f"{count} NKI rule violation{'s' if count > 1 else ''} "
                            f"({report.dialect} on {report.target}, Neuron SDK {report.sdk})")
    return report


def static_rules(source: str, dialect: str, target: str, sdk: str | None) -> tuple[str, list[Violation]]:
    """(the SDK release checked, the violations) of the static rule pass over a kernel file's source; ``sdk``
    None picks the newest release supporting ``dialect`` on ``target``."""
    dialect_ = Dialect(dialect)
    release = check_sdk(sdk, dialect_) if sdk is not None else newest_sdk(dialect_, target)
    return release, check_kernel_source(source, dialect=dialect_, target=target, sdk=release)


def _verify_source(source: str, filename: str, seed: int, target: Target | None, backend: str, rules: bool,
                   sdk: str | None, max_memory: int | None) -> VerifyReport:
    try:
        meta = read_metadata(source)
    except InputError as exc:
        raise InputError(f"{filename}: {exc}") from None
    if meta is None:
        raise InputError(f"{filename}: not an nmmc kernel file (no '# nmmc-metadata:' header line)")
    check_source(source, filename)
    if sdk is not None:
        check_sdk(sdk, meta.dialect)
    elif meta.sdk is not None:
        try:
            sdk = check_sdk(meta.sdk, meta.dialect)
        except InputError as exc:
            raise InputError(f"{filename}: its metadata records Neuron SDK {meta.sdk} ({exc}); pass --sdk") from None
    tgt = with_lnc(target or get_target(meta.target), meta.lnc)  # the file's programs decide the logical core
    graph = parse_text(meta.graph)
    check_memory(filename, meta, graph, max_memory)
    kernels = meta.kernels
    out_dtype = meta.outputs[0].dtype
    runner = _runner(backend, source, filename, meta.dialect, graph)
    report = VerifyReport(ok=False, kernel=", ".join(k.name for k in kernels), target=tgt.name, dialect=meta.dialect,
                          seed=seed, rel_error=None, tolerance=TOLERANCES[out_dtype], max_abs_error=None,
                          backend=backend, lnc=tgt.lnc)
    if rules:
        report.sdk, report.violations = static_rules(source, meta.dialect, tgt.name, sdk)
    plain = unquantized(graph) if is_quantized(graph) else None
    if plain is not None:  # FP8: draw the unquantized graph's inputs, quantize weights and calibrate static scales
        raw = random_inputs([TensorSpec(n.name or n.id, n.storage_shape, n.dtype) for n in plain.inputs()], seed)
        inputs = calibrate(graph, raw)
    else:
        inputs = random_inputs(meta.inputs, seed)
    tensors: dict[str, np.ndarray] = dict(inputs)
    per_kernel: list[dict[str, Any]] = []
    totals: dict[str, Any] = {}
    for kernel in kernels:
        try:
            args = [tensors[s.name] for s in kernel.inputs]
        except KeyError as exc:
            raise InputError(f"{filename}: kernel {kernel.name} reads {exc}, which no input or earlier "
                             "kernel provides") from None
        try:
            outputs, counters = runner(kernel, args, tgt)
            if len(outputs) != len(kernel.outputs):
                raise KernelError(f"kernel {kernel.name!r} returned {len(outputs)} tensor(s), its metadata "
                                  f"declares {len(kernel.outputs)}")
        except KernelError as exc:
            report.error = f"{kernel.name}: {exc}" if len(kernels) > 1 else str(exc)
            return report
        for spec, value in zip(kernel.outputs, outputs, strict=True):
            tensors[spec.name] = value
        if counters is not None:
            per_kernel.append({"name": kernel.name, **counters})
            merge_counters(totals, counters)
    report.counters = {**totals, "kernels": per_kernel} if len(kernels) > 1 and per_kernel else totals
    _compare(report, graph, [s.name for s in meta.outputs], inputs, tensors, out_dtype)
    if plain is not None and report.values_ok:
        report.unquantized_rel_error = _relative_error(plain, [s.name for s in meta.outputs], raw, tensors)
    return report


def _relative_error(graph: Graph, names: list[str], inputs: dict[str, np.ndarray],
                    tensors: dict[str, np.ndarray]) -> float:
    """The largest ``||out - ref||_F / ||ref||_F`` over the outputs ``names`` against ``graph``'s float64 reference."""
    by_name = {node.name: node for node in graph.outputs()}
    err = dict.fromkeys(names, 0.0)
    ref = dict.fromkeys(names, 0.0)
    for chunk in reference_chunks(graph, inputs):
        for name in names:
            stored = tensors[name]
            got = stored.T if by_name[name].layout == Layout.TRANSPOSED else stored
            value = chunk.values[name]
            diff = np.asarray(got[chunk.start:chunk.stop], dtype=np.float64) - value
            err[name] += float(np.vdot(diff, diff))
            ref[name] += float(np.vdot(value, value))
    return max(float(np.sqrt(err[n])) / (float(np.sqrt(ref[n])) or 1.0) for n in names)


def _compare(report: VerifyReport, graph: Graph, names: list[str], inputs: dict[str, np.ndarray],
             tensors: dict[str, np.ndarray], out_dtype: str) -> None:
    """Fill ``report`` with the comparison of the kernels' outputs (``tensors``) with the float64
    reference, streamed in row chunks (:mod:`.reference`): norms add up chunk by chunk, so neither
    the reference nor a float64 copy of an output is ever held whole."""
    by_name = {node.name: node for node in graph.outputs()}
    outputs = [by_name[name] for name in names]
    for node in outputs:
        got = tensors[node.name]
        if got.shape != node.storage_shape:
            report.error = f"output {node.name}: shape {got.shape}, expected {node.storage_shape}"
            return
        if not np.all(np.isfinite(got)):
            report.error = f"output {node.name} holds non-finite values (unwritten or overflowed)"
            return
    ref_sq = dict.fromkeys((node.name for node in outputs), 0.0)
    err_sq, allow_sq, worst_abs, largest = dict(ref_sq), dict(ref_sq), 0.0, 0.0
    for chunk in reference_chunks(graph, inputs):
        for node in outputs:
            stored = tensors[node.name]
            got = stored.T if node.layout == Layout.TRANSPOSED else stored
            ref = chunk.values[node.name]
            diff = np.asarray(got[chunk.start:chunk.stop], dtype=np.float64) - ref
            ref_sq[node.name] += float(np.vdot(ref, ref))
            err_sq[node.name] += float(np.vdot(diff, diff))
            sigma = chunk.sigmas[node.name]
            if sigma is not None:
                allow_sq[node.name] += float(np.vdot(sigma, sigma))
            worst_abs = max(worst_abs, float(np.max(np.abs(diff))) if diff.size else 0.0)
            largest = max(largest, float(np.max(np.abs(ref))) if ref.size else 0.0)
    worst_rel, ok = 0.0, True
    for node in outputs:
        denom = float(np.sqrt(ref_sq[node.name])) or 1.0
        error, extra = float(np.sqrt(err_sq[node.name])), float(np.sqrt(allow_sq[node.name]))
        ok = ok and error <= report.tolerance * denom + extra
        worst_rel = max(worst_rel, error / denom)
        report.rounding_allowance = max(report.rounding_allowance, extra / denom)
    report.rel_error, report.max_abs_error, report.max_abs_reference = worst_rel, worst_abs, largest
    report.ok = report.values_ok = ok
    if not report.ok:
        report.error = (f"relative error {worst_rel:.3e} exceeds the {out_dtype} tolerance {report.tolerance:.0e}"
                        f" + intermediate rounding allowance {report.rounding_allowance:.1e}")


def verify_file(path: str | Path, *, seed: int = 0, target: Target | None = None,
                backend: str = "interpreter", rules: bool = False, sdk: str | None = None,
                max_memory: int | None = None) -> VerifyReport:
    """:func:`verify_source` of a file (InputError when it cannot be read, is not a regular file, is
    larger than :data:`MAX_KERNEL_BYTES` or is not UTF-8 text)."""
    p = Path(path)
    source = read_kernel_file(p)
    return verify_source(source, filename=str(p), seed=seed, target=target, backend=backend, rules=rules, sdk=sdk,
                         max_memory=max_memory)


def read_kernel_file(path: Path) -> str:
    """The text of a kernel file: a regular file (a FIFO or device is refused before it is opened,
    so ``/dev/zero`` or a pipe cannot hang verify) of at most :data:`MAX_KERNEL_BYTES`, UTF-8 text
    without NUL bytes; InputError otherwise."""
    where = f"kernel file {str(path)!r}"
    try:
        if not stat.S_ISREG(path.stat().st_mode):
            raise InputError(f"cannot read {where}: not a regular file")
        flags = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0)  # in case it turned into a FIFO since
        fd = os.open(path, flags)
        with os.fdopen(fd, "rb") as f:
            if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):
                raise InputError(f"cannot read {where}: not a regular file")
            data = f.read(MAX_KERNEL_BYTES + 1)
    except OSError as exc:
        raise InputError(f"cannot read {where}: {exc.strerror}") from None
    if len(data) > MAX_KERNEL_BYTES:
        raise InputError(f"cannot read {where}: larger than {MAX_KERNEL_BYTES // (1024 * 1024)} MiB")
    if b"\0" in data:
        raise InputError(f"cannot read {where}: it holds NUL bytes (a binary file, not a kernel)")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise InputError(f"cannot read {where}: not UTF-8 text (byte {exc.start}); a binary file, "
                         "not a kernel") from None


"""Run an NKI kernel file on the CPU: restricted imports and builtins, argument wrapping, error locations.

The file runs with only :data:`KERNEL_BUILTINS` (and an ``__import__`` that hands out the NKI
stand-ins and numpy) as builtins, and NumPy's floating-point warnings silenced (an overflow shows up
as a non-finite output, which verification reports). That alone is no sandbox: ``nmmc verify``
first checks the file's syntax tree against the NKI subset (verification/sandbox.py).
"""

from __future__ import annotations

import builtins
import contextlib
import copy
import functools
import inspect
import linecache
import warnings
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from threadpoolctl import threadpool_limits

from ..errors import KernelError, UnsupportedAPIError
from ..targets import Target
from ..vocab import Dialect
from . import api_legacy, api_nki
from .counters import Counters
from .lnc import SharedHbm, Turns
from .machine import Machine
from .modules import StandInModule
from .scale_units import ScaleUnits
from .tensor import HBM, Tensor, require_written

#: modules a kernel file may import besides the NKI stand-ins (__future__ is a compiler directive)
PLAIN_IMPORTS = frozenset({"numpy", "math", "ml_dtypes", "__future__"})
#: the builtins a kernel file sees (emitted kernels use range, min and tuple)
KERNEL_BUILTINS = frozenset({"range", "min", "max", "tuple", "len", "abs"})


@dataclass
class KernelRun:
    """The result of :func:`run_kernel`: output arrays (in their HBM dtype), the counters, and the
    dialect whose NKI modules the file imported (None when it imported none)."""

    outputs: list[np.ndarray]
    counters: Counters
    dialect: Dialect | None
    #: each program's own counters (one entry unless the target has LNC > 1); ``counters`` sums them
    program_counters: list[Counters] = field(default_factory=list)


class _Importer:
    """The ``__import__`` of a kernel namespace: NKI stand-ins, numpy, math, ml_dtypes only."""

    def __init__(self, machine: Machine):
        self.machine = machine
        self.modules: dict[str, StandInModule] = {}

    def __call__(self, name: str, globals: Any = None, locals: Any = None, fromlist: Any = (),
                 level: int = 0) -> Any:
        if level:
            raise UnsupportedAPIError(f"relative import of {name!r} is not allowed in a kernel file")
        if name in PLAIN_IMPORTS:
            return builtins.__import__(name, globals, locals, fromlist, level)
        top = name.partition(".")[0]
        dialect = Dialect.of_module(name)
        if dialect is None:
            allowed = ", ".join(sorted(PLAIN_IMPORTS - {"__future__"}))
            raise UnsupportedAPIError(f"import of {name!r} is not allowed in a kernel file; allowed: "
                                      f"{allowed} and the NKI modules (nki, nki.language, nki.isa, nki.lnc or "
                                      "neuronxcc.nki, neuronxcc.nki.language, neuronxcc.nki.isa)")
        m = self.machine
        if m.dialect is None:
            m.dialect = dialect
            build = api_nki.build_modules if dialect == Dialect.NKI else api_legacy.build_modules
            self.modules = build(m)
        elif m.dialect != dialect:
            raise UnsupportedAPIError(f"import of {name!r} mixes NKI dialects: the file already imported "
                                      f"the NKI {m.dialect.nki_version} modules")
        module = self.modules.get(name)
        if module is None:
            raise UnsupportedAPIError(f"import of {name!r} is not allowed: only {sorted(self.modules)}")
        return module if fromlist else self.modules[top]


def _kernel_line(tb: Any, filename: str) -> int | None:
    line = None
    while tb is not None:
        if tb.tb_frame.f_code.co_filename == filename:
            line = tb.tb_lineno
        tb = tb.tb_next
    return line


@contextlib.contextmanager
def _located(m: Machine) -> Iterator[None]:
    """Turn every exception into a KernelError naming the innermost kernel-file line executing."""
    try:
        yield
    except KernelError as exc:
        if exc.line is not None:
            raise
        line = _kernel_line(exc.__traceback__, m.filename)
        located = type(exc)(exc.bare_message, line=line, source_line=m.source_line(line))
        raise located.with_traceback(exc.__traceback__) from None
    except Exception as exc:
        line = _kernel_line(exc.__traceback__, m.filename)
        message = f"kernel raised {type(exc).__name__}: {exc}"
        raise KernelError(message, line=line, source_line=m.source_line(line)) from exc


def run_kernel(source: str, *, filename: str, kernel_name: str, args: Sequence[np.ndarray],
               target: Target, output_names: Sequence[str] | None = None,
               arg_names: Sequence[str] | None = None, units: ScaleUnits | None = None) -> KernelRun:
    """Execute kernel ``kernel_name`` of the NKI source file ``source`` on NumPy arrays.

    ``args`` become HBM tensors named by the kernel's parameter names (or ``arg_names``); each keeps
    its dtype (float32, bfloat16 or float16). The kernel must return an HBM tensor or a tuple of
    them; they come back as arrays in :attr:`KernelRun.outputs`, and their counters are keyed by
    ``output_names`` (default ``output0``, ``output1``, ...). Every failure is a
    :class:`~neuronmm_compiler.errors.KernelError` whose ``line`` is the kernel-file line executing.
    ``units`` (an FP8 kernel's scale units, by argument and output name) makes the run check rule
    NMMC-FP8-SCALE-ONCE (interpreter/scale_units.py).
    """
    # Thousands of small matmuls: multi-threaded BLAS gains nothing on them and, on a busy machine,
    # its spinning threads make each one up to ~100x slower.
    with threadpool_limits(limits=1, user_api="blas"), np.errstate(all="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        return _run(source, filename, kernel_name, args, target, output_names, arg_names, units)


def _run(source: str, filename: str, kernel_name: str, args: Sequence[np.ndarray], target: Target,
         output_names: Sequence[str] | None, arg_names: Sequence[str] | None, units: ScaleUnits | None) -> KernelRun:
    lines = source.splitlines()
    try:
        code = compile(source, filename, "exec", dont_inherit=True)
    except SyntaxError as exc:
        raise KernelError(f"kernel source does not parse: {exc.msg}", line=exc.lineno,
                          source_line=exc.text) from None
    except (ValueError, RecursionError, MemoryError) as exc:  # NUL bytes, nesting too deep to compile
        raise KernelError(f"kernel source does not compile: {type(exc).__name__}") from None
    linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)
    shared = SharedHbm(target.lnc) if target.lnc > 1 else None
    turns = Turns(shared) if shared is not None else None
    # Each program of a logical core runs the kernel on its own core (SBUF, PSUM, engines, counters) against the
    # same HBM (interpreter/lnc.py).
    machines = [Machine(target, filename, lines, program_id=p, shared=shared, turns=turns) for p in range(target.lnc)]
    for m in machines:
        m.units = units
    functions = [_load(code, m, kernel_name) for m in machines]
    names = _argument_names(functions[0], kernel_name, args, arg_names)
    arguments = [machines[0].input_tensor(array, name) for array, name in zip(args, names, strict=True)]
    for m in machines[1:]:
        m.hbm_allocs.extend(t.alloc for t in arguments)
        for tensor in arguments:
            shared.share_argument(tensor.alloc)  # type: ignore[union-attr]

    def body(p: int) -> list[Any]:
        m = machines[p]
        if shared is not None:
            shared.begin(p)
        with _located(m):
            result = functions[p](*[Tensor.whole(t.alloc) for t in arguments])
        # capacity: sweep the live intervals [allocation, last access] of the on-chip allocations
        m.memory.finish(m.source_line)
        return list(result) if isinstance(result, (tuple, list)) else [result]

    results = turns.run([functools.partial(body, p) for p in range(target.lnc)]) if turns else [body(0)]
    returned = results[0]
    for result in results[1:]:
        if [id(v.alloc) if isinstance(v, Tensor) else v for v in result] != [
                id(v.alloc) if isinstance(v, Tensor) else v for v in returned]:
            raise KernelError(f"the programs of kernel {kernel_name!r} return different tensors: an LNC kernel "
                              "returns the same shared HBM outputs from every program")
    if shared is not None:
        shared.finish()
    m = machines[0]
    if output_names is None:
        output_names = [f"output{i}" for i in range(len(returned))]
    elif len(output_names) != len(returned):
        raise KernelError(f"kernel {kernel_name!r} returned {len(returned)} tensor(s) but "
                          f"{len(output_names)} output name(s) were given")
    outputs = []
    for value, name in zip(returned, output_names, strict=True):
        if not isinstance(value, Tensor) or value.alloc.buffer != HBM:
            raise KernelError(f"kernel {kernel_name!r} must return HBM tensors (nl.shared_hbm), output "
                              f"{name!r} is {value!r:.100}")
        require_written(value, f"kernel output {name!r}")
        if units is not None and m.dialect == Dialect.NKI:
            units.check_output(value, name)
        outputs.append(value.data if value.is_full else value.data.copy())
    per_program = [copy.deepcopy(other.counters) for other in machines] if shared is not None else []
    c = m.counters
    keys = m.hbm_counter_names([v.alloc for v in returned], list(output_names))
    c.hbm_bytes_read = {keys[id(a)]: a.bytes_read for a in m.hbm_allocs}
    c.hbm_bytes_written = {keys[id(a)]: a.bytes_written for a in m.hbm_allocs}
    for other in machines[1:]:  # HBM bytes are counted on the shared tensors, so all programs are in them already
        c.add_engine_counts(other.counters)
    return KernelRun(outputs=outputs, counters=c, dialect=m.dialect, program_counters=per_program)


def _load(code: Any, m: Machine, kernel_name: str) -> Any:
    """Execute the module code in a fresh restricted namespace bound to ``m``; the kernel function."""
    kernel_builtins: dict[str, Any] = {name: getattr(builtins, name) for name in KERNEL_BUILTINS}
    kernel_builtins["__import__"] = _Importer(m)
    namespace: dict[str, Any] = {"__builtins__": kernel_builtins, "__name__": "__nmmc_kernel__",
                                 "__file__": m.filename}
    with _located(m):
        exec(code, namespace)
    fn = namespace.get(kernel_name)
    if not callable(fn):
        raise KernelError(f"the kernel file defines no function {kernel_name!r}")
    return fn


def _argument_names(fn: Any, kernel_name: str, args: Sequence[np.ndarray],
                    arg_names: Sequence[str] | None) -> list[str]:
    if arg_names is not None:
        if len(arg_names) != len(args):
            raise KernelError(f"{len(args)} argument(s) but {len(arg_names)} argument name(s)")
        return list(arg_names)
    params = list(inspect.signature(fn).parameters)
    if len(params) != len(args):
        raise KernelError(f"kernel {kernel_name!r} takes {len(params)} parameter(s) {params}, "
                          f"got {len(args)} argument(s)")
    return params

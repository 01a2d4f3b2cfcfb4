"""The state of one kernel run: target, counters, memory tracker, allocations and dialect."""

from __future__ import annotations

import operator
import re
import sys
from typing import Any

import ml_dtypes
import numpy as np

from ..errors import KernelError, KernelLimitError, UnsupportedAPIError
from ..targets import Target
from ..vocab import Dialect
from .counters import Counters
from .lnc import SharedHbm, Turns
from .memory import MemoryTracker
from .mx import MX_DTYPES
from .scale_units import ANY, ScaleUnits
from .tensor import HBM, PSUM, SBUF, Allocation, Tensor, as_f32, mark_written, require_written, write

BFLOAT16 = np.dtype(ml_dtypes.bfloat16)
FLOAT32 = np.dtype(np.float32)
FLOAT16 = np.dtype(np.float16)
#: ``nl.float8_e4m3`` / ``nl.float8_e5m2`` (1S,4E,3M / 1S,5E,2M): ml_dtypes' IEEE-style layouts, largest finite
#: 240 / 57344 (ir/fp8.py). A cast into them rounds to nearest even and does not saturate (an overflow is inf): a
#: kernel clamps first (rule NKI-FP8-SATURATE).
FLOAT8_E4M3 = np.dtype(ml_dtypes.float8_e4m3)
FLOAT8_E5M2 = np.dtype(ml_dtypes.float8_e5m2)
#: ``nl.float8_e4m3fn`` (OCP, "no inf, NaN represented by 0bS111'1111"): ml_dtypes' float8_e4m3fn, largest finite
#: 448; an overflowing cast is NaN there, refused under the same rule. nc_matmul takes it on NeuronCore-v4 only
#: (Target.fp8_formats, rule NKI-MATMUL-E4M3FN, checked by perf_mode.check_fp8_formats).
FLOAT8_E4M3FN = np.dtype(ml_dtypes.float8_e4m3fn)
#: and the MX tiles' dtypes: the packed ``_x4`` types and the uint8 / float8_e8m0fnu scales (interpreter/mx.py)
SUPPORTED_DTYPES = (BFLOAT16, FLOAT32, FLOAT16, FLOAT8_E4M3, FLOAT8_E5M2, FLOAT8_E4M3FN, *MX_DTYPES)


def _poisoned(dims: tuple[int, ...], dt: np.dtype) -> np.ndarray:
    """A new tile's storage: NaN where the dtype has it, zeros otherwise (the written mask marks it unwritten)."""
    return np.full(dims, np.nan, dt) if dt.kind == "f" or dt == BFLOAT16 else np.zeros(dims, dt)

_ASSIGNED_NAME = re.compile(r"\s*([A-Za-z_]\w*)\s*(?::[^=]+)?=[^=]")


class Buffer:
    """A memory space marker: ``nl.sbuf``, ``nl.psum``, ``nl.shared_hbm`` (and its aliases)."""

    __slots__ = ("kind", "name")

    def __init__(self, name: str, kind: str):
        self.name = name
        self.kind = kind

    def __repr__(self) -> str:
        return f"nl.{self.name}"


class ParDim(int):
    """``nl.par_dim(n)``: an int that remembers it marked the partition dim (0.1 dialect)."""


class Machine:
    """Everything one :func:`run_kernel` call mutates; the stand-in modules close over it."""

    def __init__(self, target: Target, filename: str, source_lines: list[str], *, program_id: int = 0,
                 shared: SharedHbm | None = None, turns: Turns | None = None):
        self.target = target
        #: ``nl.program_id(0)`` and ``nl.num_programs()`` of this run (an LNC=2 kernel runs once per program)
        self.program_id = program_id
        self.programs = shared.programs if shared is not None else 1
        self.shared = shared
        self.turns = turns  # how the programs take turns and exchange (nisa.sendrecv); None on one core
        self.filename = filename
        self.source_lines = source_lines
        self.counters = Counters()
        self.memory = MemoryTracker(target, self.counters)
        #: event clock: +1 on every API call (modules.api) and 0.1-style assignment / +=; every access
        #: to an on-chip allocation stamps its liveness record with it (see memory.py)
        self.clock = 0
        #: the NKI dialect of the file, set by its first NKI import (see loader.py)
        self.dialect: Dialect | None = None
        self.hbm_allocs: list[Allocation] = []
        #: the scale-unit tracker of an FP8 kernel run (rule NMMC-FP8-SCALE-ONCE), else None
        self.units: ScaleUnits | None = None

    # --- source position ----------------------------------------------------------------
    def current_line(self) -> int | None:
        """Line of the innermost kernel-file frame on the stack."""
        f = sys._getframe(1)
        filename = self.filename
        while f is not None:
            if f.f_code.co_filename == filename:
                return f.f_lineno
            f = f.f_back
        return None

    def source_line(self, line: int | None) -> str | None:
        if line is None or not 1 <= line <= len(self.source_lines):
            return None
        return self.source_lines[line - 1]

    def _default_name(self, line: int | None, buffer: str) -> str:
        text = self.source_line(line)
        match = _ASSIGNED_NAME.match(text) if text else None
        if match:
            return match.group(1)
        return f"{buffer}@{line}" if line is not None else buffer

    # --- dtypes and shapes ----------------------------------------------------------------
    @staticmethod
    def dtype(value: Any, what: str = "dtype") -> np.dtype:
        try:
            dt = np.dtype(value)
        except TypeError:
            dt = None
        if dt not in SUPPORTED_DTYPES:
            raise UnsupportedAPIError(f"{what} {value!r} is not supported; use nl.bfloat16, nl.float32, "
                                      "nl.float16, nl.float8_e4m3, nl.float8_e5m2, nl.float8_e4m3fn, or for MX tiles "
                                      "nl.float8_e4m3fn_x4, nl.float8_e5m2_x4, nl.float4_e2m1fn_x4, nl.uint8")
        return dt

    @staticmethod
    def shape(value: Any) -> tuple[int, ...]:
        dims = tuple(value) if isinstance(value, (tuple, list)) else (value,)
        out = []
        for i, d in enumerate(dims):
            if isinstance(d, ParDim) and i != 0:
                raise UnsupportedAPIError(f"nl.par_dim in dim {i} of shape {list(dims)}: the subset keeps "
                                          "the partition dim first")
            try:
                n = operator.index(d)
            except TypeError:
                raise UnsupportedAPIError(f"shape {dims!r}: dims must be ints") from None
            if n <= 0:
                raise KernelError(f"shape {list(dims)}: dims must be positive")
            out.append(n)
        if not out:
            raise KernelError("a tensor needs at least one dim")
        return tuple(out)

    # --- allocation -------------------------------------------------------------------------
    def allocate(self, shape: Any, dtype: Any, buffer: Any, name: Any, *, zero: bool) -> Tensor:
        """``nl.ndarray`` / ``nl.zeros``: a new buffer, NaN-poisoned unless ``zero``."""
        if not isinstance(buffer, Buffer):
            raise UnsupportedAPIError(f"buffer={buffer!r} is not supported; use nl.sbuf, nl.psum or "
                                      "nl.shared_hbm")
        dims = self.shape(shape)
        dt = self.dtype(dtype)
        line = self.current_line()
        kind = buffer.kind
        if not name:
            name = self._default_name(line, kind)
        if kind == HBM and zero:
            raise UnsupportedAPIError("nl.zeros in HBM is not in the subset; allocate with nl.ndarray")
        if kind == HBM and self.shared is not None:  # both programs of a logical core see one tensor
            alloc = self.shared.hbm_allocation(
                line, lambda: Allocation(self, _poisoned(dims, dt), kind, str(name), line))
            if alloc.data.shape != dims or alloc.data.dtype != dt:
                raise KernelError(f"program {self.program_id} allocates {alloc.describe()} as {list(dims)} "
                                  f"{dt.name}: the programs of a logical core disagree on a shared HBM tensor")
            self.hbm_allocs.append(alloc)
            return Tensor.whole(alloc)
        data = np.zeros(dims, dt) if zero else _poisoned(dims, dt)
        alloc = Allocation(self, data, kind, str(name), line, written=zero)
        if zero and self.units is not None:
            alloc.units = ANY  # zeros are zeros in any scale units
        if kind == HBM:
            self.hbm_allocs.append(alloc)
        else:
            self.memory.allocate(alloc, self.clock)
            if zero:
                self.counters.memsets += 1
        return Tensor.whole(alloc)

    def input_tensor(self, array: np.ndarray, name: str) -> Tensor:
        """Wrap a kernel argument as a fully written HBM tensor (its dtype is the HBM dtype)."""
        if not isinstance(array, np.ndarray):
            raise KernelError(f"kernel argument {name!r} must be a numpy array, got {type(array).__name__}")
        self.dtype(array.dtype, f"kernel argument {name!r} dtype")
        alloc = Allocation(self, np.array(array, copy=True), HBM, name, None, written=True)
        self.hbm_allocs.append(alloc)
        tensor = Tensor.whole(alloc)
        if self.units is not None:
            self.units.load_argument(tensor, name)
        return tensor

    def temporary(self, values: np.ndarray, dtype: np.dtype, buffer: str, producer: str) -> Tensor:
        """A 0.1-style op result: on-chip, fully written, not counted against capacity."""
        data = np.array(values, dtype=dtype, copy=True)
        if buffer != HBM and data.ndim and data.shape[0] > self.target.pmax:
            raise KernelLimitError(f"partition dim {data.shape[0]} exceeds pmax {self.target.pmax} "
                                   f"for a {buffer} value of shape {list(data.shape)}")
        line = self.current_line()
        alloc = Allocation(self, data, buffer, f"{buffer} value@{line}", line, written=True,
                           producer=producer)
        return Tensor.whole(alloc)

    # --- 0.1 writes through indexing --------------------------------------------------------
    def _require_legacy(self, what: str) -> None:
        if self.dialect != Dialect.NEURONXCC:
            raise UnsupportedAPIError(f"{what} is not in the NKI 0.3 subset: write tensors through an "
                                      "nisa call's dst= argument")

    def assign(self, dst: Tensor, value: Any) -> None:
        """``buf[idx] = value`` (0.1): write an op result into a buffer, cast to its dtype."""
        if isinstance(value, Tensor) and value.alloc.producer is None and value.same_region(dst):
            return  # the write-back half of `buf[idx] += value`, already applied in place
        self._require_legacy("assignment into a tensor")
        self.clock += 1
        if not isinstance(value, Tensor):
            raise UnsupportedAPIError(f"assigning {type(value).__name__} into {dst.describe()}: the "
                                      "subset assigns only op results (nl.load, nl.copy, nc_matmul, ...)")
        producer = value.alloc.producer
        if producer is None:
            raise UnsupportedAPIError(f"assigning buffer {value.describe()} into {dst.describe()}: copy "
                                      "explicitly with nl.copy")
        if dst.alloc.buffer == HBM:
            raise UnsupportedAPIError(f"assignment into HBM tensor {dst.describe()}: use nl.store")
        if value.shape != dst.shape:
            raise KernelError(f"assignment shape mismatch: value {list(value.shape)} into "
                              f"{dst.describe()} of shape {list(dst.shape)}")
        if producer == "pe":
            if dst.alloc.buffer != PSUM:
                raise KernelLimitError(f"matmul result must be written to PSUM (TensorE writes PSUM "
                                       f"only), not {dst.describe()}")
        elif producer == "dma" and dst.alloc.buffer == PSUM:
            raise KernelLimitError(f"DMA cannot access PSUM: loaded value assigned into {dst.describe()}")
        write(dst, value.data)

    def accumulate(self, dst: Tensor, value: Any) -> None:
        """``psum[idx] += nc_matmul(...)`` (0.1): accumulate in place in fp32."""
        self._require_legacy("+= on a tensor")
        self.clock += 1
        if dst.alloc.buffer != PSUM:
            raise KernelLimitError(f"+= accumulation target must be in PSUM (matmul accumulation), not "
                                   f"{dst.describe()}")
        if not isinstance(value, Tensor) or value.alloc.producer != "pe":
            raise UnsupportedAPIError(f"+= into PSUM {dst.describe()} accepts only nc_matmul/nc_transpose "
                                      f"results, got {value!r:.80}")
        if value.shape != dst.shape:
            raise KernelError(f"+= shape mismatch: value {list(value.shape)} into {dst.describe()} of "
                              f"shape {list(dst.shape)}")
        require_written(dst, "+= accumulation target")
        if dst.dtype == FLOAT32:
            np.add(dst.data, as_f32(value), out=dst.data)
        else:
            dst.data[...] = as_f32(dst) + as_f32(value)
        mark_written(dst)

    # --- results -----------------------------------------------------------------------------
    def hbm_counter_names(self, outputs: list[Allocation], output_names: list[str]) -> dict[int, str]:
        """Counter key of every HBM allocation: outputs by ``output_names``, others by name; unique."""
        names: dict[int, str] = {}
        taken: set[str] = set()
        by_id = {id(a): n for a, n in zip(outputs, output_names, strict=True)}
        for alloc in self.hbm_allocs:
            # kernel arguments (no allocation line) keep their parameter name
            name = alloc.name if alloc.line is None else by_id.get(id(alloc), alloc.name)
            base, k = name, 2
            while name in taken:
                name, k = f"{base}#{k}", k + 1
            taken.add(name)
            names[id(alloc)] = name
        return names


SBUF_BUFFER = Buffer("sbuf", SBUF)
PSUM_BUFFER = Buffer("psum", PSUM)
HBM_BUFFERS = {name: Buffer(name, HBM) for name in ("shared_hbm", "hbm", "private_hbm")}

"""Tensors of the interpreter: an allocation (NumPy storage plus a per-element "written" mask) and
views of it made by indexing.

Indexing accepts ints, ``slice`` with step 1 and ``nl.ds(start, size)`` (which is a slice), and is
bounds-checked: NumPy would silently clip an out-of-range slice, the hardware would read or write
someone else's bytes, so the interpreter stops with :class:`KernelLimitError`.
"""

from __future__ import annotations

import operator
from typing import TYPE_CHECKING, Any

import numpy as np

from ..errors import KernelLimitError, UninitializedReadError, UnsupportedAPIError

if TYPE_CHECKING:
    from .machine import Machine

HBM, SBUF, PSUM = "hbm", "sbuf", "psum"
#: The id of the interpreter's check that every element read was written before (docs/nki-subset.md): in an LNC=2
#: kernel, also what a missing exchange shows as (the other program's half never arrived).
UNWRITTEN_READ = "KERNEL-UNWRITTEN-READ"
#: The rule a write of an out-of-range value into an FP8 tile breaks (verification/rules.py).
FP8_SATURATE_RULE = "NKI-FP8-SATURATE"


class Allocation:
    """One buffer: storage, written mask and bookkeeping. Views (:class:`Tensor`) keep it alive."""

    __slots__ = (
        "buffer",
        "bytes_read",
        "bytes_written",
        "data",
        "fully_written",
        "line",
        "lnc",
        "machine",
        "name",
        "producer",
        "record",
        "units",
        "written",
    )

    def __init__(self, machine: Machine, data: np.ndarray, buffer: str, name: str, line: int | None,
                 *, written: bool = False, producer: str | None = None):
        self.machine = machine
        self.data = data
        self.buffer = buffer
        self.name = name
        self.line = line
        self.fully_written = written
        # a fully written allocation never consults its mask; give it a free read-only one
        self.written = np.broadcast_to(True, data.shape) if written else np.zeros(data.shape, bool)
        self.producer = producer  # set on 0.1 temporaries: "dma", "pe" (TensorE) or "engine"
        # liveness record of a counted on-chip allocation (set by MemoryTracker.allocate), else None;
        # every access stamps ``record.last`` with the machine's event clock
        self.record = None
        self.bytes_read = 0
        self.bytes_written = 0
        # the shared-HBM record of an HBM tensor both programs of an LNC=2 kernel see (interpreter/lnc.py), else None
        self.lnc = None
        # the scale units of its elements in an FP8 kernel run (interpreter/scale_units.py), else None
        self.units = None

    def describe(self) -> str:
        where = f", allocated at line {self.line}" if self.line is not None else ""
        kind = "temporary " if self.producer is not None else ""
        shape = list(self.data.shape)
        return f"'{self.name}' ({kind}{self.buffer} {shape} {self.data.dtype.name}{where})"


def _format_box(box: tuple[tuple[int, int], ...], dims: tuple[int, ...]) -> str:
    parts = [f"{a}:{b}" if d in dims else str(a) for d, (a, b) in enumerate(box)]
    return "[" + ", ".join(parts) + "]"


def _index_value(value: Any, what: str) -> int:
    try:
        return operator.index(value)
    except TypeError:
        raise UnsupportedAPIError(
            f"tensor index {what} must be an int, got {type(value).__name__} {value!r}; "
            "the subset indexes with ints, start:stop slices and nl.ds(start, size)") from None


class Tensor:
    """A view of an :class:`Allocation`: a box of allocation coordinates, some dims kept."""

    __slots__ = ("alloc", "box", "data", "dims", "is_full", "key", "pattern", "shape")

    def __init__(self, alloc: Allocation, box: tuple[tuple[int, int], ...], dims: tuple[int, ...]):
        self.alloc = alloc
        #: the [step, num] pairs of a view made by .ap(), else None
        self.pattern: tuple[tuple[int, int], ...] | None = None
        self.box = box
        self.dims = dims
        full_shape = alloc.data.shape
        full = len(dims) == len(box)
        shape = []
        key: list[slice | int] = []
        for d, (a, b) in enumerate(box):
            if d in dims:
                key.append(slice(a, b))
                shape.append(b - a)
            else:
                key.append(a)
            if full and (a or b != full_shape[d]):
                full = False
        self.shape = tuple(shape)
        self.key = key = tuple(key)
        self.is_full = full
        if dims:
            self.data = alloc.data[key]
        else:  # all ints: keep a 0-d *view* (plain indexing would copy a scalar out)
            self.data = alloc.data[tuple(slice(a, b) for a, b in box)].reshape(())

    @classmethod
    def whole(cls, alloc: Allocation) -> Tensor:
        """The view covering all of ``alloc``."""
        shape = alloc.data.shape
        return cls(alloc, tuple((0, n) for n in shape), tuple(range(len(shape))))

    # --- attributes -------------------------------------------------------------------------
    @property
    def dtype(self) -> np.dtype:
        return self.alloc.data.dtype

    @property
    def buffer(self) -> str:
        return self.alloc.buffer

    @property
    def ndim(self) -> int:
        return len(self.dims)

    def region(self) -> str:
        """This view in allocation coordinates, e.g. ``[0:128, 256:512]``."""
        return _format_box(self.box, self.dims)

    def describe(self) -> str:
        return f"{self.alloc.describe()} region {self.region()}"

    def __repr__(self) -> str:
        return f"<nmmc tensor {self.describe()}>"

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):
            raise AttributeError(name)
        raise UnsupportedAPIError(f"tensor attribute .{name} is not in the NKI subset nmmc interprets "
                                  "(tensors have .shape, .dtype, .buffer, .ndim)")

    def __iter__(self):
        raise UnsupportedAPIError("iterating over a tensor is not in the NKI subset; index it instead")

    # --- indexing ---------------------------------------------------------------------------
    def __getitem__(self, key: Any) -> Tensor:
        if not isinstance(key, tuple):
            key = (key,)
        ndim = len(self.dims)
        if any(k is Ellipsis for k in key):
            at = next(i for i, k in enumerate(key) if k is Ellipsis)
            rest = key[at + 1:]
            if any(k is Ellipsis for k in rest):
                raise UnsupportedAPIError("a tensor index may contain at most one '...'")
            fill = ndim - (len(key) - 1)
            key = key[:at] + (slice(None),) * max(fill, 0) + rest
        if len(key) > ndim:
            raise KernelLimitError(
                f"slice out of bounds: {len(key)} indices for {ndim}-d view of {self.describe()}")
        alloc = self.alloc
        on_chip = alloc.buffer != HBM
        box = list(self.box)
        dropped: set[int] = set()
        for i, k in enumerate(key):
            d = self.dims[i]
            start0, stop0 = box[d]
            length = stop0 - start0
            if isinstance(k, slice):
                if k.step is not None and _index_value(k.step, "step") != 1:
                    raise UnsupportedAPIError(f"slice step {k.step!r} in dim {i}: only step 1 is supported")
                start = 0 if k.start is None else _index_value(k.start, "start")
                stop = length if k.stop is None else _index_value(k.stop, "stop")
                if not 0 <= start < stop <= length:
                    what = "empty slice" if 0 <= stop <= start <= length else "slice out of bounds"
                    raise KernelLimitError(
                        f"{what}: {start}:{stop} in dim {i} (extent {length}) of {self.describe()}")
                box[d] = (start0 + start, start0 + stop)
            else:
                idx = _index_value(k, f"in dim {i}")
                if not 0 <= idx < length:
                    raise KernelLimitError(
                        f"slice out of bounds: index {idx} in dim {i} (extent {length}) of {self.describe()}")
                if on_chip and d == 0:
                    raise UnsupportedAPIError(
                        f"integer index on the partition dim of {self.describe()}: "
                        "use a slice such as t[i:i+1, ...] to keep dim 0 the partition dim")
                box[d] = (start0 + idx, start0 + idx + 1)
                dropped.add(d)
        dims = tuple(d for d in self.dims if d not in dropped) if dropped else self.dims
        return Tensor(alloc, tuple(box), dims)

    def __setitem__(self, key: Any, value: Any) -> None:
        self.alloc.machine.assign(self[key], value)

    def __iadd__(self, value: Any) -> Tensor:
        self.alloc.machine.accumulate(self, value)
        return self

    def ap(self, pattern: Any, offset: Any = 0) -> Tensor:
        """``t.ap(pattern=[[step, num], ...], offset=o)`` on a whole tensor (NKI access patterns): the elements
        ``offset + sum(i_d * step_d)`` of its storage, as a read-only view of shape ``[num, ...]``. A step of 0
        repeats elements (a partition broadcast, ``[[0, P], [1, F]]``); the subset reads such views of HBM tensors only
        as a DMA source (rule NKI-DMA-BROADCAST), and of on-chip tensors only as an engine's source whose first pair
        walks the partitions ([elements per partition, P]: the strided copy of an MX kernel, docs/mx.md); nothing
        writes through one."""
        a = self.alloc
        if not self.is_full:
            raise UnsupportedAPIError(f".ap() on {self.describe()}: the subset reads access patterns of whole tensors "
                                      "only")
        try:
            pairs = [(operator.index(step), operator.index(num)) for step, num in pattern]
            start = operator.index(offset)
        except (TypeError, ValueError):
            raise UnsupportedAPIError(f".ap(pattern={pattern!r:.60}, offset={offset!r:.20}): pattern is a list of "
                                      "[step, num] integer pairs, offset an integer") from None
        if not pairs or any(num <= 0 or step < 0 for step, num in pairs):
            raise KernelLimitError(f".ap(pattern={pattern!r:.60}) of {self.describe()}: counts must be positive, steps "
                                   "non-negative")
        flat = np.full([num for _, num in pairs], start, dtype=np.int64)
        for axis, (step, num) in enumerate(pairs):
            shape = [1] * len(pairs)
            shape[axis] = num
            flat = flat + step * np.arange(num).reshape(shape)
        size = a.data.size
        if start < 0 or int(flat.max()) >= size:
            raise KernelLimitError(f"slice out of bounds: .ap(pattern={pattern!r:.60}, offset={start}) reads element "
                                   f"{int(flat.max())} of {self.describe()}, which has {size}")
        view = Tensor.whole(a)
        view.data = a.data.reshape(-1)[flat]
        view.shape = view.data.shape
        view.dims = tuple(range(len(pairs)))
        view.is_full = False
        view.pattern = tuple(pairs)
        if a.buffer != HBM:  # on chip: partitions first, and the elements it reads checked written one by one
            per_partition = size // a.data.shape[0]
            inner = start % per_partition + sum(step * (num - 1) for step, num in pairs[1:])
            if pairs[0][0] != per_partition or inner >= per_partition:
                raise UnsupportedAPIError(f".ap(pattern={pattern!r:.60}) of {self.describe()}: an on-chip access "
                                          f"pattern's first pair walks the partitions, [{per_partition}, P]")
            view.key = np.unravel_index(flat, a.data.shape)
        return view

    def contiguous_run(self) -> int | None:
        """Elements per contiguous run of a partition's part of an .ap() view (its free pairs, merged from the
        innermost while each step is the next pair's span), or None for a view that is not an access pattern."""
        if self.pattern is None:
            return None
        free = self.pattern[1:]
        if not free or free[-1][0] != 1:
            return 1
        run = free[-1][1]
        for step, num in reversed(free[:-1]):
            if step != run:
                break
            run *= num
        return run

    def same_region(self, other: Tensor) -> bool:
        return self.alloc is other.alloc and self.box == other.box and self.dims == other.dims


# --- access checks and writes (hot path: keep cheap) ------------------------------------------
# Every read of a view goes through require_written and every write through write or mark_written;
# each stamps the allocation's liveness record with the current event clock (its last access).
def require_written(t: Tensor, role: str) -> None:
    """Raise :class:`UninitializedReadError` if any element of view ``t`` was never written."""
    a = t.alloc
    record = a.record
    if record is not None:
        record.last = a.machine.clock
    if a.lnc is not None:
        a.lnc.read(t)
    if a.fully_written:
        return
    mask = a.written[t.key]
    if mask.all():
        return
    box = list(t.box)
    count = 1
    if t.dims:
        missing = np.nonzero(~np.asarray(mask))
        for i, d in enumerate(t.dims):
            base = t.box[d][0]
            box[d] = (base + int(missing[i].min()), base + int(missing[i].max()) + 1)
        count = int(missing[0].size)
    raise UninitializedReadError(
        f"{UNWRITTEN_READ}: read of unwritten memory: {role} reads {a.describe()} region {t.region()}, whose elements "
        f"{_format_box(tuple(box), t.dims)} ({count} element(s)) were never written")


def write(t: Tensor, values: Any) -> None:
    """Store ``values`` into view ``t`` (cast to its dtype, round-to-nearest) and mark it written."""
    a = t.alloc
    record = a.record
    if record is not None:
        record.last = a.machine.clock
    if a.lnc is not None:
        a.lnc.wrote(t)
    if t.pattern is not None:
        raise UnsupportedAPIError(f"a write through the access pattern {list(t.pattern)} of {t.describe()}: the subset "
                                  "reads access patterns only")
    t.data[...] = values
    if t.data.dtype.itemsize == 1 and not np.all(np.isfinite(t.data)):
        raise KernelLimitError(f"{FP8_SATURATE_RULE}: a value outside the finite range of {t.data.dtype.name} was "
                               f"written into {t.describe()}; clamp it first (the FP8 cast does not saturate)")
    if not a.fully_written:
        if t.is_full:
            a.fully_written = True
            a.written = np.broadcast_to(True, a.data.shape)
        else:
            a.written[t.key] = True


def mark_written(t: Tensor) -> None:
    """Mark view ``t`` written after its data was updated in place (an access, like :func:`write`)."""
    a = t.alloc
    record = a.record
    if record is not None:
        record.last = a.machine.clock
    if a.lnc is not None:
        a.lnc.wrote(t)
    if not a.fully_written:
        if t.is_full:
            a.fully_written = True
            a.written = np.broadcast_to(True, a.data.shape)
        else:
            a.written[t.key] = True


def as_f32(t: Tensor) -> np.ndarray:
    """The view's values as float32 (no copy when already float32)."""
    d = t.data
    return d if d.dtype == np.float32 else d.astype(np.float32)

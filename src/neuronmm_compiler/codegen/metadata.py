"""The ``# nmmc-metadata:`` line of an emitted kernel file, as typed data.

Every kernel file carries one line ``# nmmc-metadata: {...}``: JSON (keys sorted, no spaces) with
what it takes to check and re-derive the file long after it was emitted. :class:`KernelMetadata`
is that JSON, typed; :meth:`KernelMetadata.to_line` writes the line (the bytes the golden kernels
hold) and :func:`read_metadata` / :meth:`KernelMetadata.from_dict` read it back, with one
InputError line for a malformed line or a file of another metadata format.

Format 3 (current) holds:

- ``format``: 3; ``nmmc_version``: the nmmc that wrote the file;
- ``dialect``: the NKI dialect (:class:`~neuronmm_compiler.vocab.Dialect`); ``target``: the
  target's name;
- ``inputs`` / ``outputs``: the graph's HBM tensors (name, storage shape, dtype), in argument order;
- ``kernels``: each kernel function, in the order they run, with its arguments and outputs;
- ``schedule``: the lowering entry (``kind``: ``gemm`` or ``fused``), the schedule's name and
  parameters;
- ``graph``: the graph after the pass pipeline, in the IR's text form;
- ``lnc``: the logical-core degree the kernel is written for, present only when it is not 1;
- ``sdk``: the Neuron SDK release the file's code is for, present only where the code depends on it (an nki-dialect
  kernel whose programs exchange: ``nki.lnc.sendrecv`` from 2.34, ``nisa.sendrecv`` before; support.uses_nki_lnc).
  ``nmmc verify`` checks a file against it by default, and against the newest release of the file's dialect on its
  target when it is absent (the same code serves every release of that range).

Format 3 added the schedule's ``kind``; files of formats 1 and 2 (older nmmc) are refused with a
request to re-emit them.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from ..errors import InputError
from ..ir import DTYPES
from ..ir.mx import MX_SCALE_DTYPE
from ..vocab import Dialect

__all__ = [
    "METADATA_FORMAT",
    "METADATA_PREFIX",
    "KernelMetadata",
    "KernelSpec",
    "ScheduleRecord",
    "TensorSpec",
    "buffer_specs",
    "read_metadata",
]

#: What starts the metadata line.
METADATA_PREFIX = "# nmmc-metadata: "
#: The format this nmmc writes and reads (3: the schedule records its lowering entry, ``kind``).
METADATA_FORMAT = 3

_MALFORMED = "malformed nmmc metadata"
_SCALARS = (str, int, float, bool, type(None))


#: How messages name the JSON types a field may need to be.
_KIND_NAMES: Mapping[type, str] = MappingProxyType({int: "an integer", str: "a string", list: "a list",
                                                    dict: "an object"})


def _type_name(value: object) -> str:
    """How messages name the JSON type of ``value``."""
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, (int, float)):
        return "a number"
    return {dict: "an object", list: "a list", str: "a string", type(None): "null"}.get(type(value),
                                                                                        type(value).__name__)


def _get(data: Mapping[str, Any], key: str, kind: type, where: str) -> Any:
    """``data[key]`` when present and of ``kind`` (a bool is not an integer), else InputError."""
    if key not in data:
        raise InputError(f"{_MALFORMED}: {where}has no {key!r}")
    value = data[key]
    if not isinstance(value, kind) or (isinstance(value, bool) and kind is not bool):
        raise InputError(f"{_MALFORMED}: {where}{key!r} must be {_KIND_NAMES[kind]}; got {_type_name(value)}")
    return value


def _object(value: Any, where: str) -> Mapping[str, Any]:
    if not isinstance(value, dict):
        raise InputError(f"{_MALFORMED}: {where} must be an object; got {_type_name(value)}")
    return value


@dataclass(frozen=True)
class TensorSpec:
    """An HBM tensor a kernel takes or returns: its name, storage shape and dtype."""

    name: str
    shape: tuple[int, ...]
    dtype: str

    def to_dict(self) -> dict[str, Any]:
        """The JSON object of the metadata line."""
        return {"name": self.name, "shape": list(self.shape), "dtype": self.dtype}

    @classmethod
    def from_dict(cls, data: Any, where: str) -> TensorSpec:
        """Read one tensor (``where`` names it in messages); InputError when malformed."""
        data = _object(data, where)
        name = _get(data, "name", str, f"{where} ")
        shape = _get(data, "shape", list, f"{where} ")
        if not shape or not all(isinstance(d, int) and not isinstance(d, bool) and d > 0 for d in shape):
            raise InputError(f"{_MALFORMED}: {where} 'shape' must be a list of positive integers; got {shape!r:.80}")
        dtype = _get(data, "dtype", str, f"{where} ")
        if dtype not in DTYPES and dtype != MX_SCALE_DTYPE:  # uint8: an MX tensor's scales (ir/mx.py, "Storage")
            raise InputError(f"{_MALFORMED}: {where} has the unknown dtype {dtype!r:.40}; dtypes: {', '.join(DTYPES)}")
        return cls(name, tuple(shape), dtype)


def _tensors(data: Mapping[str, Any], key: str, where: str) -> tuple[TensorSpec, ...]:
    items = _get(data, key, list, where)
    return tuple(TensorSpec.from_dict(item, f"{where}{key}[{index}]") for index, item in enumerate(items))


@dataclass(frozen=True)
class KernelSpec:
    """One kernel function of the file: its name, arguments and outputs (HBM tensors)."""

    name: str
    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]

    def to_dict(self) -> dict[str, Any]:
        """The JSON object of the metadata line."""
        return {"name": self.name, "inputs": [t.to_dict() for t in self.inputs],
                "outputs": [t.to_dict() for t in self.outputs]}

    @classmethod
    def from_dict(cls, data: Any, where: str) -> KernelSpec:
        """Read one kernel (``where`` names it in messages); InputError when malformed."""
        data = _object(data, where)
        return cls(_get(data, "name", str, f"{where} "), _tensors(data, "inputs", f"{where} "),
                   _tensors(data, "outputs", f"{where} "))


def buffer_specs(buffers: Iterable[Any]) -> tuple[TensorSpec, ...]:
    """The :class:`TensorSpec` of each buffer (a program's parameters or outputs)."""
    return tuple(TensorSpec(b.name, tuple(b.shape), b.dtype) for b in buffers)


def _frozen(params: Mapping[str, Any]) -> Mapping[str, Any]:
    return MappingProxyType(dict(params))


@dataclass(frozen=True)
class ScheduleRecord:
    """The schedule a file was lowered with: its lowering entry (``kind``), name and parameters."""

    kind: str
    name: str
    params: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        object.__setattr__(self, "params", _frozen(self.params))

    def __reduce__(self) -> tuple[Any, ...]:
        """Pickled as its constructor call (a read-only mapping does not pickle; worker processes
        of ``tune --model --jobs`` return tuned kernels)."""
        return (ScheduleRecord, (self.kind, self.name, dict(self.params)))

    def to_dict(self) -> dict[str, Any]:
        """The JSON object of the metadata line."""
        return {"kind": self.kind, "name": self.name, "params": dict(self.params)}

    @classmethod
    def from_dict(cls, data: Any) -> ScheduleRecord:
        """Read the schedule; InputError when malformed (parameters are JSON scalars by name)."""
        data = _object(data, "'schedule'")
        where = "'schedule' "
        params = _get(data, "params", dict, where)
        bad = next((k for k, v in params.items() if not isinstance(v, _SCALARS)), None)
        if bad is not None:
            raise InputError(f"{_MALFORMED}: schedule parameter {bad!r:.40} must be a string or a number; "
                             f"got {_type_name(params[bad])}")
        return cls(_get(data, "kind", str, where), _get(data, "name", str, where), params)


@dataclass(frozen=True)
class KernelMetadata:
    """The ``# nmmc-metadata:`` line of a kernel file (see the module docstring for the fields)."""

    format: int
    nmmc_version: str
    dialect: Dialect
    target: str
    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]
    kernels: tuple[KernelSpec, ...]
    schedule: ScheduleRecord
    graph: str
    #: the logical-core degree the kernel is written for (its programs; absent from the line when 1)
    lnc: int = 1
    #: the Neuron SDK release the code is for, where the code depends on it (absent from the line otherwise)
    sdk: str | None = None

    def to_dict(self) -> dict[str, Any]:
        """The line's JSON object, as nmmc has always written it (``lnc`` only when it is not 1, ``sdk`` only when the
        code depends on the release)."""
        return ({"lnc": self.lnc} if self.lnc != 1 else {}) | ({"sdk": self.sdk} if self.sdk is not None else {}) | {
            "format": self.format,
            "nmmc_version": self.nmmc_version,
            "kernels": [k.to_dict() for k in self.kernels],
            "dialect": self.dialect.value,
            "target": self.target,
            "inputs": [t.to_dict() for t in self.inputs],
            "outputs": [t.to_dict() for t in self.outputs],
            "schedule": self.schedule.to_dict(),
            "graph": self.graph,
        }

    def to_line(self) -> str:
        """The metadata line of the kernel file (no newline): keys sorted, no spaces."""
        return METADATA_PREFIX + json.dumps(self.to_dict(), sort_keys=True, separators=(",", ":"))

    @classmethod
    def from_dict(cls, data: Any) -> KernelMetadata:
        """Read the line's JSON object: InputError when it is malformed or of another format (a file
        written by an older or newer nmmc)."""
        data = _object(data, "the metadata")
        version = _get(data, "format", int, "")
        if version != METADATA_FORMAT:
            age = "an older" if version < METADATA_FORMAT else "a newer"
            raise InputError(f"the file's nmmc metadata is format {version}, written by {age} nmmc; this nmmc reads "
                             f"format {METADATA_FORMAT} (which records the schedule's kind): re-emit the file with "
                             "this nmmc")
        dialect_name = _get(data, "dialect", str, "")
        dialect = Dialect.lookup(dialect_name)
        if dialect is None:
            raise InputError(f"{_MALFORMED}: unknown dialect {dialect_name!r:.40}; dialects: {', '.join(Dialect)}")
        kernels = _get(data, "kernels", list, "")
        metadata = cls(
            format=version,
            nmmc_version=_get(data, "nmmc_version", str, ""),
            dialect=dialect,
            target=_get(data, "target", str, ""),
            inputs=_tensors(data, "inputs", ""),
            outputs=_tensors(data, "outputs", ""),
            kernels=tuple(KernelSpec.from_dict(k, f"kernels[{index}]") for index, k in enumerate(kernels)),
            schedule=ScheduleRecord.from_dict(_get(data, "schedule", dict, "")),
            graph=_get(data, "graph", str, ""),
            lnc=_lnc(data),
            sdk=_sdk(data),
        )
        for what in ("inputs", "outputs", "kernels"):
            if not getattr(metadata, what):
                raise InputError(f"{_MALFORMED}: {what!r} is empty")
        return metadata

    @classmethod
    def from_lines(cls, lines: Sequence[str]) -> KernelMetadata | None:
        """The metadata of a file's lines: None when no line starts with :data:`METADATA_PREFIX`;
        InputError when that line is not JSON or not format-3 metadata."""
        for line in lines:
            if line.startswith(METADATA_PREFIX):
                try:
                    data = json.loads(line[len(METADATA_PREFIX):])
                except json.JSONDecodeError as exc:
                    raise InputError(f"{_MALFORMED}: the '{METADATA_PREFIX.strip()}' line is not JSON "
                                     f"({exc.msg})") from None
                return cls.from_dict(data)
        return None


def _lnc(data: dict[str, Any]) -> int:
    value = data.get("lnc", 1)
    if isinstance(value, bool) or value not in (1, 2):
        raise InputError(f"{_MALFORMED}: 'lnc' must be 1 or 2; got {value!r:.40}")
    return value


def _sdk(data: dict[str, Any]) -> str | None:
    value = data.get("sdk")
    if value is not None and not (isinstance(value, str) and re.fullmatch(r"\d+\.\d+", value)):
        raise InputError(f"{_MALFORMED}: 'sdk' must be a Neuron SDK release such as \"2.34\"; got {value!r:.40}")
    return value


def read_metadata(source: str) -> KernelMetadata | None:
    """The metadata of an emitted kernel file's ``source``: None when the file has no metadata line
    (it is not an nmmc kernel file); InputError when the line is malformed or of another format."""
    return KernelMetadata.from_lines(source.splitlines())

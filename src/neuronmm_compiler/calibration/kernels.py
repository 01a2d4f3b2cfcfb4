"""Rebuild the loop-nest programs of an emitted kernel file, so the cost model can predict it.

An nmmc kernel file records, in its ``# nmmc-metadata:`` line, the graph it computes (after the
pass pipeline, in text form), its schedule's kind (the lowering registry entry) and parameters, and
its target. That is everything the compiler needs: :func:`neuronmm_compiler.driver.relower` splits
the graph into kernels and lowers each under the stored schedule, exactly as ``nmmc emit``/``tune``
did. The rebuilt programs' names,
arguments and outputs are checked against the file's metadata, so a file the current compiler
would lower differently is an error rather than a silently wrong prediction.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from pathlib import Path

from ..codegen import KernelMetadata, KernelSpec, buffer_specs, read_metadata
from ..cost_model import combine_reports, estimate
from ..driver import relower
from ..errors import InputError, NmmcError
from ..ir import parse_text
from ..kernel_ir.program import Program
from ..targets import Target, get_target, with_lnc
from ..vocab import Dialect


@dataclass
class KernelFile:
    """An emitted kernel file read back: its text, metadata, sha256 and rebuilt programs."""

    path: str
    source: str
    metadata: KernelMetadata
    programs: list[Program] = field(repr=False)

    @property
    def sha256(self) -> str:
        return hashlib.sha256(self.source.encode("utf-8")).hexdigest()

    @property
    def target_name(self) -> str:
        """The name of the target the file was emitted for."""
        return self.metadata.target

    @property
    def dialect(self) -> Dialect:
        """The file's NKI dialect."""
        return self.metadata.dialect

    def predict_us(self, target: Target) -> float:
        """Predicted latency of the whole file in microseconds (its kernels run one after another)."""
        return combine_reports([estimate(p, target) for p in self.programs]).latency_us


def programs_from_metadata(meta: KernelMetadata, target: Target) -> list[Program]:
    """The programs a kernel file's metadata describes (InputError when they cannot be rebuilt or do
    not match the kernels the file declares)."""
    try:
        graph = parse_text(meta.graph)
    except NmmcError as exc:
        raise InputError(f"malformed graph in the metadata: {exc}") from None
    try:
        programs = relower(graph, meta.schedule.kind, dict(meta.schedule.params), target)
    except NmmcError as exc:
        raise InputError(f"cannot re-lower its schedule: {exc}") from None
    rebuilt = tuple(KernelSpec(p.name, buffer_specs(p.params), buffer_specs(p.outputs)) for p in programs)
    declared = meta.kernels
    if rebuilt != declared:
        names = ", ".join(k.name for k in declared)
        raise InputError(f"this nmmc lowers its schedule to other kernels than the file's ({names}); "
                         "re-emit the file with this nmmc")
    return programs


def read_kernel_file(path: str | Path, *, shown: str | None = None) -> KernelFile:
    """Read an emitted kernel file and rebuild its programs; InputError naming the file (as ``shown``)
    when it is missing, not an nmmc kernel, or cannot be rebuilt."""
    from ..verification import read_kernel_file as read_kernel_text

    name = shown or str(path)
    p = Path(path)
    if not p.exists():
        raise InputError(f"kernel file not found: {name}")
    source = read_kernel_text(p)  # a FIFO or device is refused before it is opened (it would block)
    try:
        meta = read_metadata(source)
    except InputError as exc:
        raise InputError(f"{name}: {exc}") from None
    if meta is None:
        raise InputError(f"{name} is not an nmmc kernel file (no '# nmmc-metadata:' header line)")
    try:
        programs = programs_from_metadata(meta, with_lnc(get_target(meta.target), meta.lnc))
    except InputError as exc:
        raise InputError(f"{name}: {exc}") from None
    return KernelFile(path=str(path), source=source, metadata=meta, programs=programs)

"""On-chip footprint of a program against a target's SBUF and PSUM."""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import ScheduleError
from ..kernel_ir.program import Program
from ..targets import Target


@dataclass(frozen=True)
class Footprint:
    """On-chip memory a program needs, against what the target has."""

    sbuf_bytes_per_partition: int
    sbuf_capacity: int
    psum_banks: int
    psum_capacity: int
    #: why the work could not be divided between the programs of a logical core (kernel_ir/lnc.py): such a
    #: program does not fit the target's logical core any more than one that overflows SBUF
    split_error: str | None = None
    #: SBUF bytes per partition with a second copy of every block a loop's iterations fill with one DMA
    #: (:meth:`~..kernel_ir.program.Program.rotating_loads`): the room the steady state's overlap of those loads with
    #: the compute on the previous block needs (docs/cost_model.md, "Room to rotate")
    sbuf_rotating_bytes_per_partition: int = 0

    @property
    def rotates(self) -> bool:
        """Whether the loop loads have room for a second copy: if not, each waits for the compute on the last one (a
        program with no such loads rotates, even one that does not fit at all: that is :attr:`fits`' verdict)."""
        return (self.sbuf_rotating_bytes_per_partition <= self.sbuf_capacity
                or self.sbuf_rotating_bytes_per_partition == self.sbuf_bytes_per_partition)

    @property
    def fits(self) -> bool:
        return (self.sbuf_bytes_per_partition <= self.sbuf_capacity and self.psum_banks <= self.psum_capacity
                and self.split_error is None)

    def describe(self) -> str:
        """Per physical core: on an LNC=2 target each program has its own SBUF and PSUM."""
        return (f"SBUF {self.sbuf_bytes_per_partition} of {self.sbuf_capacity} bytes/partition, "
                f"PSUM {self.psum_banks} of {self.psum_capacity} banks")


def footprint(program: Program, target: Target) -> Footprint:
    """Every allocation site holds its buffer for the kernel's lifetime (see docs/architecture.md)."""
    sbuf, psum, rotating = program.peaks(target.psum_bank_bytes)
    return Footprint(
        sbuf_bytes_per_partition=sbuf,
        sbuf_rotating_bytes_per_partition=rotating,
        sbuf_capacity=target.sbuf_usable_bytes_per_partition,
        psum_banks=psum,
        psum_capacity=target.psum_banks,
        split_error=program.split_error,
    )


GEMM_ADVICE = ("use fewer tiles per block",
               "use fewer tiles per block, accumulate=sbuf, or put k innermost in loop_order")
FUSED_ADVICE = ("use a smaller tokens_per_block or weight_block_kib, or cache_weights=none",
                "use k_tiles_per_block=0 (no K blocking) or a smaller out_tile")


def check_fits(program: Program, target: Target, advice: tuple[str, str] = GEMM_ADVICE) -> Footprint:
    """Raise ScheduleError when the program's buffers exceed the target's SBUF or PSUM; ``advice``
    is what the message suggests for each (the parameters of the schedule family)."""
    fp = footprint(program, target)
    if fp.sbuf_bytes_per_partition > fp.sbuf_capacity:
        raise ScheduleError(
            f"schedule needs {fp.sbuf_bytes_per_partition} bytes of SBUF per partition; {target.name} has "
            f"{fp.sbuf_capacity} usable: {advice[0]}"
        )
    if fp.psum_banks > fp.psum_capacity:
        raise ScheduleError(
            f"schedule holds {fp.psum_banks} PSUM banks at once; {target.name} has {fp.psum_capacity}: {advice[1]}"
        )
    if fp.split_error is not None:
        raise ScheduleError(f"{fp.split_error}; choose another lnc_split or blocking, or --lnc 1")
    return fp

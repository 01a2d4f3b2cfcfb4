"""What the interpreter counts while it runs a kernel.

The counters are the interpreter's side of the cost-model contract: the cost model predicts bytes
moved, DMA transfers and engine instructions for a schedule, and a test compares its prediction with
these numbers for the emitted kernel.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class Counters:
    """Event counts of one kernel run.

    Byte counts are exact element counts times item sizes of the tensors involved. ``*_peak_bytes``
    are per partition; an on-chip allocation is live from its allocation to its last access (see
    ``memory.py``). ``psum_peak_bytes`` sums the raw (not bank-rounded) bytes of live PSUM
    allocations; ``psum_peak_banks`` counts whole banks (each allocation starts on a bank boundary).
    """

    hbm_bytes_read: dict[str, int] = field(default_factory=dict)
    hbm_bytes_written: dict[str, int] = field(default_factory=dict)
    dma_transfers: int = 0
    #: histogram: bytes per partition of one transfer (SBUF side) -> number of such transfers
    dma_bytes_per_partition: dict[int, int] = field(default_factory=dict)
    dma_transposes: int = 0
    matmul_instructions: int = 0
    #: sum over nc_matmul instructions of the moving operand's free size (PE-time accounting)
    matmul_moving_columns: int = 0
    #: nc_matmul instructions run in a PE tile smaller than the array (tile_position / tile_size)
    pe_tiled_matmuls: int = 0
    #: nc_matmul instructions with perf_mode=double_row (FP8; reported when there are any)
    double_row_matmuls: int = 0
    transposes: int = 0
    tensor_copies: int = 0
    tensor_tensor_ops: int = 0
    activations: int = 0
    #: VectorEngine statistics and tensor-scalar instructions (bn_stats, bn_aggr, tensor_scalar: the norm prologue)
    vector_ops: int = 0
    memsets: int = 0
    sbuf_peak_bytes: int = 0
    psum_peak_bytes: int = 0
    psum_peak_banks: int = 0

    @property
    def total_hbm_bytes_read(self) -> int:
        """Bytes read from HBM, all tensors."""
        return sum(self.hbm_bytes_read.values())

    @property
    def total_hbm_bytes_written(self) -> int:
        """Bytes written to HBM, all tensors."""
        return sum(self.hbm_bytes_written.values())

    def record_dma(self, bytes_per_partition: int) -> None:
        """Count one DMA transfer moving ``bytes_per_partition`` bytes on each SBUF partition."""
        self.dma_transfers += 1
        hist = self.dma_bytes_per_partition
        hist[bytes_per_partition] = hist.get(bytes_per_partition, 0) + 1

    def add_engine_counts(self, other: Counters) -> None:
        """Add another program's instruction and DMA counts (HBM bytes are counted per tensor, shared by the
        programs of a logical core); peaks are per physical core, so the larger is kept."""
        for name in ("dma_transfers", "dma_transposes", "matmul_instructions", "matmul_moving_columns",
                     "pe_tiled_matmuls", "transposes", "tensor_copies", "tensor_tensor_ops", "activations",
                     "vector_ops", "memsets", "double_row_matmuls"):
            setattr(self, name, getattr(self, name) + getattr(other, name))
        for size, count in other.dma_bytes_per_partition.items():
            self.dma_bytes_per_partition[size] = self.dma_bytes_per_partition.get(size, 0) + count
        for name in ("sbuf_peak_bytes", "psum_peak_bytes", "psum_peak_banks"):
            setattr(self, name, max(getattr(self, name), getattr(other, name)))

    def as_dict(self) -> dict[str, object]:
        """Every counter as plain JSON-able values (histogram keys become strings, sorted)."""
        return {
            "hbm_bytes_read": dict(self.hbm_bytes_read),
            "hbm_bytes_written": dict(self.hbm_bytes_written),
            "total_hbm_bytes_read": self.total_hbm_bytes_read,
            "total_hbm_bytes_written": self.total_hbm_bytes_written,
            "dma_transfers": self.dma_transfers,
            "dma_bytes_per_partition": {
                str(k): v for k, v in sorted(self.dma_bytes_per_partition.items())
            },
            "dma_transposes": self.dma_transposes,
            "matmul_instructions": self.matmul_instructions,
            "matmul_moving_columns": self.matmul_moving_columns,
            "pe_tiled_matmuls": self.pe_tiled_matmuls,
            **({"double_row_matmuls": self.double_row_matmuls} if self.double_row_matmuls else {}),
            "transposes": self.transposes,
            "tensor_copies": self.tensor_copies,
            "tensor_tensor_ops": self.tensor_tensor_ops,
            "activations": self.activations,
            "vector_ops": self.vector_ops,
            "memsets": self.memsets,
            "sbuf_peak_bytes": self.sbuf_peak_bytes,
            "psum_peak_bytes": self.psum_peak_bytes,
            "psum_peak_banks": self.psum_peak_banks,
        }

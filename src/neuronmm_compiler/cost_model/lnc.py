"""The cost of an LNC=2 kernel: each program on its own physical core, the two sharing one HBM stack.

"Logical NeuronCore configuration" (Neuron docs): "Trainium2 devices contain four 24GB HBM banks. Each bank is
shared by two physical NeuronCore-v3. When LNC=2, the two physical NeuronCores share a single address space."
Each physical core keeps its own engines, SBUF, PSUM and its 16 DMA engines (Trainium2 architecture guide), so
every program is costed with the one-core formulas on its own counts (``nl.program_id`` bound to its id); the
kernel takes as long as its slowest program, and pays one launch.

What the documents do not say is how much of the stack's bandwidth one core can draw while the other streams
too. nmmc's per-core HBM figure is the chip's bandwidth divided by its physical cores (trn2: 2.9 TB/s / 8), so a
stack serves its two cores twice that. The model charges the bytes both programs move in the steady state
against ``lnc_hbm_share`` x (programs x the per-core figure): with the default 1.0 each program streams at its
own core's rate when both stream (the stack's bandwidth is two cores' worth); 0.5 is the pessimistic reading
that the pair together gets only one core's worth. ``benchmarks/lnc.py`` prints the speedups under both.
"""

from __future__ import annotations

from dataclasses import replace

from ..kernel_ir.lnc import PROGRAM_ID
from ..kernel_ir.program import Program
from ..targets import ModelParams, Target
from .formulas import latency, steady_times
from .model import CostReport, _report, model_inputs
from .params import params_of


def estimate_programs(program: Program, target: Target, params: ModelParams | None = None) -> CostReport:
    """The report of a kernel run by ``program.programs`` programs (see the module docstring): the slowest
    program's times, everyone's traffic and instructions, ``program_latency_us`` per program."""
    params = params if params is not None else params_of(target)
    inputs = [model_inputs(program, target, params, env={PROGRAM_ID: p}) for p in range(program.programs)]
    steady = [v["eff_bytes"] - v["pro_eff_bytes"] - v["epi_eff_bytes"] for v, _ in inputs]
    shared_bw = inputs[0][0]["bw"] * program.programs * params.lnc_hbm_share
    t_shared = sum(steady) / shared_bw
    reports: list[CostReport] = []
    for values, counts in inputs:
        times = steady_times(values)
        fixed = (values["n_dma"] - values["pro_n_dma"] - values["epi_n_dma"]) * values["c_dma"] / values["q"]
        times["T_dma"] = max(times["T_dma"], fixed + t_shared)
        values["t_dma_shared"] = t_shared
        reports.append(_report(program, target, values, counts, times))
    slowest = max(reports, key=lambda r: latency(r.values))
    return _combined(slowest, reports, params, program.programs)


def _combined(slowest: CostReport, reports: list[CostReport], params: ModelParams, programs: int) -> CostReport:
    def total(name: str) -> int:
        return int(sum(getattr(r, name) for r in reports))

    def merged(name: str) -> dict:
        out: dict = {}
        for r in reports:
            for key, value in getattr(r, name).items():
                out[key] = out.get(key, 0) + value
        return dict(sorted(out.items())) if name == "dma_bytes_per_partition" else out

    v = slowest.values
    flops = total("flops")
    hbm = total("hbm_bytes_read") + total("hbm_bytes_written")
    # No kernel of this work is faster: its launch, plus its FLOPs at every core's peak or its compulsory traffic
    # at the logical core's bandwidth.
    lower = v["t_launch"] + max(flops / (v["peak_flops_per_us"] * programs),
                                v["compulsory_bytes"] / (v["bw"] * programs * params.lnc_hbm_share))
    return replace(
        slowest,
        flops=flops,
        arithmetic_intensity=flops / hbm if hbm else 0.0,
        hbm_bytes_read=total("hbm_bytes_read"),
        hbm_bytes_written=total("hbm_bytes_written"),
        hbm_bytes_read_by_tensor=merged("hbm_bytes_read_by_tensor"),
        hbm_bytes_written_by_tensor=merged("hbm_bytes_written_by_tensor"),
        dma_transfers=total("dma_transfers"),
        dma_transposes=total("dma_transposes"),
        dma_bytes_per_partition=merged("dma_bytes_per_partition"),
        matmul_instructions=total("matmul_instructions"),
        transposes=total("transposes"),
        psum_evictions=total("psum_evictions"),
        sbuf_read_bytes_by_pe=total("sbuf_read_bytes_by_pe"),
        psum_to_sbuf_bytes=total("psum_to_sbuf_bytes"),
        lower_bound_us=lower,
        program_latency_us=[r.latency_us for r in reports],
    )

"""The analytic latency model: the formulas of ``formulas.py`` over a program's counts and the target's constants.

Counting (``counts.py``) turns the loop-nest program into aggregate quantities: TensorEngine
cycles, Vector/Scalar cycles, DMA transfers and their efficiency-weighted bytes, and the same for
the prologue (everything before the first matmul) and the epilogue (everything after the last).
This module combines them with the target's clocks and bandwidths:

    T_pe   = pe_cycles / f_pe                   T_vec = vec_cycles / f_vec     T_act = act_cycles / f_act
    T_dma  = n_dma * c_dma / q  +  B_eff / BW   (fixed cost overlapped over q queues; bytes at the
                                                  curve's efficiency for their bytes per partition)
    T_stall = TensorE time spent waiting for PSUM evictions (one copy per tile allocated in a loop body)
    latency = T_launch + T_prologue + max(T_pe + T_stall, T_dma, T_vec, T_act over the steady state) + T_epilogue

The formulas are plain Python (``formulas.py``, which also builds them as sympy expressions for
``nmmc explain``). docs/cost_model.md derives each term.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from ..kernel_ir.lnc import PROGRAM_ID
from ..kernel_ir.program import Program, extent_variables
from ..targets import IN_GRAPH, Target
from .counts import ProgramCounts, count_program, dma_histogram, edge_counts, psum_stall_us
from .footprint import Footprint, footprint
from .formulas import engine_us, latency, lower_bound, serial_us, steady_times
from .params import ModelParams, params_of


def dma_efficiency(bytes_per_partition: float, target: Target) -> float:
    """Fraction of peak DMA bandwidth at this transfer size (log-linear between curve points), the curve read
    at the target's ``dma_size_scale`` times the bytes per partition."""
    curve = target.dma_efficiency_curve
    bytes_per_partition *= target.dma_size_scale
    if bytes_per_partition <= curve[0][0]:
        return curve[0][1] * max(bytes_per_partition, 1) / curve[0][0]
    for (x0, y0), (x1, y1) in itertools.pairwise(curve):
        if bytes_per_partition <= x1:
            t = (math.log2(bytes_per_partition) - math.log2(x0)) / (math.log2(x1) - math.log2(x0))
            return y0 + t * (y1 - y0)
    return curve[-1][1]


def dma_bandwidth_bytes_per_us(target: Target) -> float:
    """Peak DMA bandwidth of one core: the DMA engines' aggregate, capped by the core's HBM share."""
    engines = target.dma_engines * target.dma_bytes_per_ns_per_engine * 1000
    return min(engines, target.hbm_gbytes_per_s_per_core * 1000)


def effective_rates(target: Target, params: ModelParams) -> tuple[float, float]:
    """(TensorEngine GHz, DMA bytes/us) the model uses: the nominal figures times the achieved
    fractions ``tensor_engine_efficiency`` and ``dma_bandwidth_efficiency`` (1.0 unless calibrated)."""
    return (target.pe_clock_ghz * params.tensor_engine_efficiency,
            dma_bandwidth_bytes_per_us(target) * params.dma_bandwidth_efficiency)


def _eff_bytes(counts: ProgramCounts, target: Target) -> float:
    total = 0.0
    for (_, transpose, bpp), cls in counts.dma.items():
        eff = dma_efficiency(bpp, target) * (target.dma_transpose_efficiency if transpose else 1.0)
        total += cls.bytes / eff
    return total


@dataclass
class CostReport:
    """The model's figures for one program on one target (times in microseconds)."""

    latency_us: float
    bound: str
    flops: int
    arithmetic_intensity: float
    hbm_bytes_read: int
    hbm_bytes_written: int
    hbm_bytes_read_by_tensor: dict[str, int]
    hbm_bytes_written_by_tensor: dict[str, int]
    dma_transfers: int
    dma_transposes: int
    dma_bytes_per_partition: dict[int, int]
    engine_us: dict[str, float]
    dma_fixed_us: float
    dma_bytes_us: float
    prologue_us: float
    epilogue_us: float
    matmul_instructions: int
    transposes: int
    psum_evictions: int
    sbuf_read_bytes_by_pe: int
    psum_to_sbuf_bytes: int
    sbuf_bytes_per_partition: int
    sbuf_capacity: int
    psum_banks: int
    psum_capacity: int
    feasible: bool
    lower_bound_us: float
    #: SBUF bytes per partition with room for a second copy of every one-DMA loop block (Footprint), and whether it
    #: fits: when not, the steady state pays T_serial (docs/cost_model.md, "Room to rotate")
    sbuf_rotating_bytes_per_partition: int = 0
    rotates: bool = True
    values: dict[str, float] = field(default_factory=dict, repr=False)
    #: each program's latency on an LNC=2 target (empty on one core); the report's times are the slowest one's
    program_latency_us: list[float] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out.pop("values")
        if not self.program_latency_us:
            out.pop("program_latency_us")
        out["dma_bytes_per_partition"] = {str(k): v for k, v in self.dma_bytes_per_partition.items()}
        return out


def model_inputs(program: Program, target: Target, params: ModelParams | None = None,
                 counts: ProgramCounts | None = None, env: dict[str, int] | None = None,
                 fp: Footprint | None = None,
                 memo: dict[int, frozenset[str]] | None = None) -> tuple[dict[str, float], ProgramCounts]:
    """The numeric value of every symbol of the formulas, for this program and target (``params``:
    the target's own, i.e. a calibrated target's fit or the defaults, unless given; ``env``: the program id
    of one program of a logical core; ``fp``: the program's footprint, computed when not given; ``memo``: the
    loops' extent variables, shared between counts of one program, see :func:`.counts.count_program`)."""
    params = params if params is not None else params_of(target)
    fp = fp if fp is not None else footprint(program, target)
    f_pe, bw = effective_rates(target, params)
    columns = target.gemm_stationary_fmax  # the PE array's columns: a column-tiled matmul takes its share of them
    counts = counts or count_program(program, params, env, pe_columns=columns, memo=memo)
    pro = edge_counts(program, params, reverse=False, env=env, pe_columns=columns)
    epi = edge_counts(program, params, reverse=True, env=env, pe_columns=columns)
    dtype = program.params[0].dtype if program.params else "bfloat16"
    peak = (target.peak_bf16_tflops * 1e6 * params.tensor_engine_efficiency
            / (params.matmul_fp32_factor if dtype == "float32" else 1))
    if counts.mx_flops:  # the peak of the program's mix: nc_matmul_mx's FLOPs at the MX peak (targets.py; docs/mx.md)
        peak_mx = target.peak_mx_tflops * 1e6 * params.tensor_engine_efficiency
        peak = counts.flops / ((counts.flops - counts.mx_flops) / peak + counts.mx_flops / peak_mx)
    compulsory = sum(p.itemsize * math.prod(p.shape) for p in program.params)
    compulsory += sum(o.itemsize * math.prod(o.shape) for o in program.outputs)
    values = {
        "pe_cycles": counts.pe_cycles, "vec_cycles": counts.vector_cycles, "act_cycles": counts.scalar_cycles,
        "n_dma": counts.dma_transfers, "eff_bytes": _eff_bytes(counts, target),
        "pro_pe_cycles": pro.pe_cycles, "pro_vec_cycles": pro.vector_cycles, "pro_n_dma": pro.dma_transfers,
        "pro_eff_bytes": _eff_bytes(pro, target),
        "epi_pe_cycles": epi.pe_cycles, "epi_vec_cycles": epi.vector_cycles, "epi_n_dma": epi.dma_transfers,
        "epi_eff_bytes": _eff_bytes(epi, target),
        "f_pe": f_pe, "f_vec": target.vector_clock_ghz, "f_act": target.scalar_clock_ghz,
        "c_dma": target.dma_fixed_cost_us, "q": params.dma_queues_in_flight,
        "bw": bw, "flops": counts.flops,
        "hbm_bytes": counts.total_hbm_bytes_read + counts.total_hbm_bytes_written,
        "compulsory_bytes": compulsory, "peak_flops_per_us": peak, "t_launch": target.kernel_launch_us,
        # the launch context (Target.launch): 1 when every kernel pays t_launch (in-graph), 0 when the workload pays
        # it once (standalone); n_launch counts the launches a (combined) report pays
        "launch_per_kernel": 1.0 if target.launch == IN_GRAPH else 0.0, "n_launch": 1.0,
        "t_stall": psum_stall_us(counts, f_pe, target.vector_clock_ghz, target.scalar_clock_ghz),
        # each sendrecv: both programs wait for the other's half (a DMA fixed cost for the handshake, and the bytes)
        "t_exchange": counts.exchanges * target.dma_fixed_cost_us + counts.exchange_bytes / bw,
        # 1 when the loop loads have no room for a second copy: loads and compute take turns (T_serial)
        "serial": 0.0 if fp.rotates else 1.0,
    }
    return values, counts


def estimate(program: Program, target: Target, params: ModelParams | None = None) -> CostReport:
    """Predict the latency of ``program`` on ``target``, with the target's model parameters (a
    calibrated target's fit, else the defaults) unless ``params`` overrides them. A program of several
    programs (LNC=2) is costed per program, on its own physical core, with the HBM they share
    (:mod:`.lnc`)."""
    if program.programs > 1:
        return estimate_programs(program, target, params)
    fp = footprint(program, target)
    values, counts = model_inputs(program, target, params, fp=fp)
    return _report(target, values, counts, steady_times(values), fp)


def _report(target: Target, values: dict[str, float], counts: ProgramCounts, times: dict[str, float],
            fp: Footprint) -> CostReport:
    """The report of one program from its symbol values, counts and time terms."""
    total = latency(times)
    lower = lower_bound(values)
    dma_fixed = (values["n_dma"] - values["pro_n_dma"] - values["epi_n_dma"]) * values["c_dma"] / values["q"]
    dma_bytes = times["T_dma"] - dma_fixed
    steady = {"compute": times["T_pe"] + times["T_stall"], "dma": times["T_dma"], "vector": times["T_vec"],
              "scalar": times["T_act"]}
    top = max(steady, key=lambda k: steady[k])
    if top == "compute":
        bound = "compute"
    elif top == "dma":
        bound = "memory" if dma_bytes >= dma_fixed else "overhead"
    else:
        bound = "overhead"
    if times["T_prologue"] + times["T_epilogue"] > steady[top]:
        bound = "overhead"
    hbm = counts.total_hbm_bytes_read + counts.total_hbm_bytes_written
    return CostReport(
        latency_us=total,
        bound=bound,
        flops=counts.flops,
        arithmetic_intensity=counts.flops / hbm if hbm else 0.0,
        hbm_bytes_read=counts.total_hbm_bytes_read,
        hbm_bytes_written=counts.total_hbm_bytes_written,
        hbm_bytes_read_by_tensor=dict(counts.hbm_bytes_read),
        hbm_bytes_written_by_tensor=dict(counts.hbm_bytes_written),
        dma_transfers=counts.dma_transfers,
        dma_transposes=counts.dma_transposes,
        dma_bytes_per_partition=dma_histogram(counts),
        engine_us={"tensor": engine_us(counts.pe_cycles, values["f_pe"]),
                   "vector": engine_us(counts.vector_cycles, target.vector_clock_ghz),
                   "scalar": engine_us(counts.scalar_cycles, target.scalar_clock_ghz),
                   "dma": values["n_dma"] * values["c_dma"] / values["q"] + values["eff_bytes"] / values["bw"]},
        dma_fixed_us=dma_fixed,
        dma_bytes_us=dma_bytes,
        prologue_us=times["T_prologue"],
        epilogue_us=times["T_epilogue"],
        matmul_instructions=counts.matmuls,
        transposes=counts.transposes,
        psum_evictions=counts.psum_evictions,
        sbuf_read_bytes_by_pe=counts.sbuf_read_bytes_by_pe,
        psum_to_sbuf_bytes=counts.psum_to_sbuf_bytes,
        sbuf_bytes_per_partition=fp.sbuf_bytes_per_partition,
        sbuf_capacity=fp.sbuf_capacity,
        psum_banks=fp.psum_banks,
        psum_capacity=fp.psum_capacity,
        feasible=fp.fits,
        lower_bound_us=lower,
        sbuf_rotating_bytes_per_partition=fp.sbuf_rotating_bytes_per_partition,
        rotates=fp.rotates,
        values={**values, **times},
    )



def combine_reports(reports: list[CostReport]) -> CostReport:
    """The figures of kernels run one after another: times, traffic and instructions add up, on-chip
    footprints take the largest kernel's (each kernel has the chip to itself), the bound is the
    slowest kernel's, and the whole is feasible when every kernel is. HBM traffic between kernels
    (a handoff written by one and read by the next) is counted on both sides, as it happens.

    The launch (each report's ``t_launch``) depends on the launch context the reports were costed in
    (``launch_per_kernel``, from :attr:`Target.launch`). Standalone: the kernels of one workload run as one
    launch, so the whole pays the standalone launch cost once, not once per kernel (charging ~45 us per extra
    kernel would inflate fusion's predicted gains over the unfused baselines). In-graph: no kernel is launched
    on its own, and every kernel pays its own (small, assumed) in-graph cost: a baseline of five kernels pays it
    five times (docs/cost_model.md, section 2a)."""
    if not reports:
        raise ValueError("combine_reports needs at least one report")
    if len(reports) == 1:
        return reports[0]

    def total(name: str) -> float:
        return sum(getattr(r, name) for r in reports)

    slowest = max(reports, key=lambda r: r.latency_us)
    per_kernel = all(r.values.get("launch_per_kernel", 0.0) for r in reports)
    # standalone: all but one launch come off; in-graph: every kernel keeps its own
    launches = 0.0 if per_kernel else sum(r.values.get("t_launch", 0.0) for r in reports[1:])
    return CostReport(
        latency_us=total("latency_us") - launches,
        bound=slowest.bound,
        **_summed_counts(reports),
        engine_us={k: sum(r.engine_us[k] for r in reports) for k in reports[0].engine_us},
        dma_fixed_us=total("dma_fixed_us"),
        dma_bytes_us=total("dma_bytes_us"),
        prologue_us=total("prologue_us"),
        epilogue_us=total("epilogue_us"),
        sbuf_bytes_per_partition=max(r.sbuf_bytes_per_partition for r in reports),
        sbuf_capacity=reports[0].sbuf_capacity,
        psum_banks=max(r.psum_banks for r in reports),
        psum_capacity=reports[0].psum_capacity,
        feasible=all(r.feasible for r in reports),
        lower_bound_us=total("lower_bound_us") - launches,
        sbuf_rotating_bytes_per_partition=max(r.sbuf_rotating_bytes_per_partition for r in reports),
        rotates=all(r.rotates for r in reports),
        values={"t_launch": max(r.values.get("t_launch", 0.0) for r in reports),
                "launch_per_kernel": 1.0 if per_kernel else 0.0,
                "n_launch": total_launches(reports) if per_kernel else 1.0},
    )


def total_launches(reports: list[CostReport]) -> float:
    """How many launches the reports pay together, each paying its own (in-graph)."""
    return sum(r.values.get("n_launch", 1.0) for r in reports)


def _summed_counts(reports: list[CostReport]) -> dict[str, Any]:
    """The traffic and instruction counts of several reports added up (kernels run one after another, or the
    programs of a logical core), with the arithmetic intensity of the sum."""
    def total(name: str) -> int:
        return int(sum(getattr(r, name) for r in reports))

    def merged(name: str) -> dict:
        out: dict = {}
        for r in reports:
            for key, value in getattr(r, name).items():
                out[key] = out.get(key, 0) + value
        return dict(sorted(out.items())) if name == "dma_bytes_per_partition" else out

    flops = total("flops")
    hbm = total("hbm_bytes_read") + total("hbm_bytes_written")
    counts: dict[str, Any] = {name: total(name) for name in (
        "hbm_bytes_read", "hbm_bytes_written", "dma_transfers", "dma_transposes", "matmul_instructions", "transposes",
        "psum_evictions", "sbuf_read_bytes_by_pe", "psum_to_sbuf_bytes")}
    counts.update({name: merged(name) for name in (
        "hbm_bytes_read_by_tensor", "hbm_bytes_written_by_tensor", "dma_bytes_per_partition")})
    return {"flops": flops, "arithmetic_intensity": flops / hbm if hbm else 0.0, **counts}


# ----------------------------------------------------------------------------- logical cores (LNC=2)
# The cost of an LNC=2 kernel: each program on its own physical core, the two sharing one HBM stack.
#
# "Logical NeuronCore configuration" (Neuron docs): "Trainium2 devices contain four 24GB HBM banks. Each bank is
# shared by two physical NeuronCore-v3. When LNC=2, the two physical NeuronCores share a single address space."
# Each physical core keeps its own engines, SBUF, PSUM and its 16 DMA engines (Trainium2 architecture guide), so
# every program is costed with the one-core formulas on its own counts (``nl.program_id`` bound to its id); the
# kernel takes as long as its slowest program, and pays one launch.
#
# What the documents do not say is how much of the stack's bandwidth one core can draw while the other streams
# too. nmmc's per-core HBM figure is the chip's bandwidth divided by its physical cores (trn2: 2.9 TB/s / 8), so a
# stack serves its two cores twice that. The model charges the bytes both programs move in the steady state
# against ``lnc_hbm_share`` x (programs x the per-core figure): with the default 1.0 each program streams at its
# own core's rate when both stream (the stack's bandwidth is two cores' worth); 0.5 is the pessimistic reading
# that the pair together gets only one core's worth. ``benchmarks/lnc.py`` prints the speedups under both.


def estimate_programs(program: Program, target: Target, params: ModelParams | None = None) -> CostReport:
    """The report of a kernel run by ``program.programs`` programs (see the module docstring): the slowest
    program's times, everyone's traffic and instructions, ``program_latency_us`` per program."""
    params = params if params is not None else params_of(target)
    fp = footprint(program, target)
    memo: dict[int, frozenset[str]] = {}
    if PROGRAM_ID in extent_variables(program.body, memo):
        inputs = [model_inputs(program, target, params, env={PROGRAM_ID: p}, fp=fp, memo=memo)
                  for p in range(program.programs)]
    else:  # only offsets read the program id: every program counts alike (counted once, the same for each)
        values, counts = model_inputs(program, target, params, env={PROGRAM_ID: 0}, fp=fp, memo=memo)
        inputs = [(dict(values), counts) for _ in range(program.programs)]
    steady = [v["eff_bytes"] - v["pro_eff_bytes"] - v["epi_eff_bytes"] for v, _ in inputs]
    shared_bw = inputs[0][0]["bw"] * program.programs * params.lnc_hbm_share
    t_shared = sum(steady) / shared_bw
    reports: list[CostReport] = []
    for values, counts in inputs:
        times = steady_times(values)
        fixed = (values["n_dma"] - values["pro_n_dma"] - values["epi_n_dma"]) * values["c_dma"] / values["q"]
        times["T_dma"] = max(times["T_dma"], fixed + t_shared)
        times["T_serial"] = serial_us(times, values["serial"])
        values["t_dma_shared"] = t_shared
        reports.append(_report(target, values, counts, times, fp))
    slowest = max(reports, key=lambda r: latency(r.values))
    return _combined(slowest, reports, params, program.programs)


def _combined(slowest: CostReport, reports: list[CostReport], params: ModelParams, programs: int) -> CostReport:
    v = slowest.values
    counts = _summed_counts(reports)
    # No kernel of this work is faster: its launch, plus its FLOPs at every core's peak or its compulsory traffic at
    # the logical core's bandwidth.
    lower = v["t_launch"] + max(counts["flops"] / (v["peak_flops_per_us"] * programs),
                                v["compulsory_bytes"] / (v["bw"] * programs * params.lnc_hbm_share))
    return replace(slowest, **counts, lower_bound_us=lower, program_latency_us=[r.latency_us for r in reports])

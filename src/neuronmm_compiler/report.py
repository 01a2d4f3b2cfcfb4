"""Human-readable views of cost reports, tuning results and the ``explain`` walk-through."""

from __future__ import annotations

import sympy as sp

from .codegen.printer import NkiPrinter
from .compiler import CompiledKernel, Lowered, Tuned
from .cost_model import FORMULAS, LATENCY, LOWER_BOUND, CostReport
from .fused_compiler import CompiledGraph, GraphLowered, TunedGraph
from .ir import to_text


def _mib(nbytes: float) -> str:
    return f"{nbytes / 2**20:.2f} MiB"


def cost_lines(cost: CostReport) -> list[str]:
    """The model's figures for one schedule, one per line."""
    reads = ", ".join(f"{k} {_mib(v)}" for k, v in cost.hbm_bytes_read_by_tensor.items())
    writes = ", ".join(f"{k} {_mib(v)}" for k, v in cost.hbm_bytes_written_by_tensor.items())
    engines = ", ".join(f"{k} {v:.1f}" for k, v in cost.engine_us.items())
    hist = ", ".join(f"{n} x {b} B" for b, n in cost.dma_bytes_per_partition.items())
    return [
        f"latency          {cost.latency_us:.2f} us ({cost.bound}-bound); lower bound {cost.lower_bound_us:.2f} us "
        f"({cost.lower_bound_us / cost.latency_us:.0%} of it)",
        f"work             {cost.flops / 1e9:.3f} GFLOP, arithmetic intensity {cost.arithmetic_intensity:.1f} FLOP/B",
        f"HBM read         {_mib(cost.hbm_bytes_read)} ({reads})",
        f"HBM written      {_mib(cost.hbm_bytes_written)} ({writes})",
        f"DMA              {cost.dma_transfers} transfers ({cost.dma_transposes} transposing); "
        f"bytes/partition: {hist}",
        f"engine busy us   {engines}",
        f"DMA split us     fixed cost {cost.dma_fixed_us:.1f}, bytes {cost.dma_bytes_us:.1f}; "
        f"prologue {cost.prologue_us:.1f}, epilogue {cost.epilogue_us:.1f}",
        f"instructions     {cost.matmul_instructions} matmuls, {cost.transposes} TensorE transposes, "
        f"{cost.psum_evictions} PSUM evictions",
        f"on chip          SBUF {cost.sbuf_bytes_per_partition} of {cost.sbuf_capacity} B/partition, "
        f"PSUM {cost.psum_banks} of {cost.psum_capacity} banks: {'fits' if cost.feasible else 'DOES NOT FIT'}",
    ]


def tune_lines(tuned: Tuned) -> list[str]:
    c, s, base = tuned.compiled, tuned.search, tuned.baseline
    lines = [
        f"{c.problem.describe()} on {c.target.name}",
        f"search: {s.method}, {s.trials} trials, {s.evaluated} schedules costed ({s.feasible} fit) "
        f"of {s.space_size}, {s.seconds:.2f} s",
        "",
        f"  {'':<22}{'latency us':>12}  {'bound':<9}{'HBM MiB':>9}{'DMAs':>8}{'SBUF B/part':>13}{'PSUM':>6}",
    ]
    for name, cost in (("nmmc tuned", c.cost), ("aws-fully-optimized", base)):
        lat = f"{cost.latency_us:12.2f}" if cost.feasible else f"{'(no fit)':>12}"
        hbm = (cost.hbm_bytes_read + cost.hbm_bytes_written) / 2**20
        lines.append(f"  {name:<22}{lat}  {cost.bound:<9}{hbm:9.2f}{cost.dma_transfers:8d}"
                     f"{cost.sbuf_bytes_per_partition:13d}{cost.psum_banks:6d}")
    speedup = tuned.speedup_vs_baseline
    lines.append("")
    lines.append(f"speedup vs aws-fully-optimized: {speedup:.2f}x" if speedup else
                 "speedup vs aws-fully-optimized: n/a (the preset does not fit this shape)")
    lines.append(f"schedule: {c.schedule.describe()}")
    if len(s.top) > 1:
        lines.append("runners-up:")
        for cand in s.top[1:]:
            lines.append(f"  {cand.latency_us:10.2f} us  {cand.schedule.describe()}")
    return lines


def _fmt(expr: sp.Expr) -> str:
    return sp.sstr(expr)


def _pass_lines(lowered: Lowered | GraphLowered) -> list[str]:
    """The frontend's graph, then the graph after every pass of the pipeline."""
    lines = ["== graph from the frontend", *to_text(lowered.source_graph).splitlines()]
    for step in lowered.pipeline_steps:
        lines += ["", f"== after pass {step.pass_name} ({'changed' if step.changed else 'unchanged'})",
                  *step.text.splitlines()]
    return lines


def _formula_lines(cost: CostReport) -> list[str]:
    """The model's symbols with their values, then each formula and its value."""
    values = cost.values
    symbols = sorted({str(sym) for expr in FORMULAS.values() for sym in expr.free_symbols})
    lines = ["symbols:", *(f"  {name:<18} = {values[name]:.6g}" for name in symbols), "formulas (microseconds):"]
    for name, expr in FORMULAS.items():
        lines.append(f"  {name} = {_fmt(expr)}")
        lines.append(f"  {' ' * len(name)} = {values[name]:.3f}")
    lines.append(f"  latency = {_fmt(LATENCY)} = {cost.latency_us:.3f}  ({cost.bound}-bound)")
    lines.append(f"  lower_bound = {_fmt(LOWER_BOUND)}")
    lines.append(f"  {' ' * 11} = max({values['flops']:.6g} / {values['peak_flops_per_us']:.6g}, "
                 f"{values['compulsory_bytes']:.6g} / {values['bw']:.6g}) = {cost.lower_bound_us:.3f}")
    return lines


def explain_lines(compiled: CompiledKernel) -> list[str]:
    """The IR after each pass, the schedule as a loop nest, the cost formulas with numbers."""
    lowered, cost = compiled.lowered, compiled.cost
    lines = _pass_lines(lowered)
    lines += ["", f"== problem: {compiled.problem.describe()}",
              f"== schedule {compiled.schedule_name}: {compiled.schedule.describe()}",
              "", "== loop nest (NKI 0.3+ spelling)", *NkiPrinter().kernel(compiled.program)]
    lines += ["", f"== cost model on {compiled.target.name}", *_formula_lines(cost)]
    lines += ["", "== predicted figures", *cost_lines(cost)]
    return lines


def tune_graph_lines(tuned: TunedGraph) -> list[str]:
    c, s = tuned.compiled, tuned.search
    lines = [
        f"{c.workload.describe()} on {c.target.name}",
        f"search: {s.method}, {s.trials} trials, {s.evaluated} schedules costed ({s.feasible} fit) "
        f"of {s.space_size}, {s.seconds:.2f} s",
        "",
        f"  {'':<34}{'latency us':>12}{'HBM MiB':>10}{'DMAs':>8}{'kernels':>9}",
    ]
    rows = [("nmmc fused", c.cost, len(c.programs)),
            (tuned.unfused_label, tuned.unfused_baseline, None),
            (tuned.baseline_label, tuned.baseline, None)]
    for name, cost, kernels in rows:
        if cost is None:
            lines.append(f"  {name:<34}{'(not modelled)':>12}")
            continue
        lat = f"{cost.latency_us:12.2f}" if cost.feasible else f"{'(no fit)':>12}"
        hbm = (cost.hbm_bytes_read + cost.hbm_bytes_written) / 2**20
        lines.append(f"  {name:<34}{lat}{hbm:10.2f}{cost.dma_transfers:8d}{kernels or '':>9}")
    lines.append("")
    for name, value in zip(tuned.speedup_labels, (tuned.speedup_vs_baseline, tuned.speedup_vs_unfused), strict=True):
        label = f"speedup vs {name}"
        lines.append(f"{label}: {value:.2f}x" if value else f"{label}: n/a (baseline not modelled or does not fit)")
    lines.append(f"schedule: {c.schedule.describe()}")
    for program, cost in zip(c.programs, c.kernel_costs, strict=True):
        lines.append(f"  {program.name}: {cost.latency_us:.2f} us, {cost.bound}-bound, "
                     f"SBUF {cost.sbuf_bytes_per_partition} B/partition, PSUM {cost.psum_banks} banks")
    return lines


def explain_graph_lines(compiled: CompiledGraph) -> list[str]:
    """explain for fused graphs: passes, every kernel's loop nest and cost formulas."""
    lowered = compiled.lowered
    lines = _pass_lines(lowered)
    lines += ["", f"== workload: {compiled.workload.describe()}",
              f"== schedule {compiled.schedule_name}: {compiled.schedule.describe()}"]
    for kernel, program, cost in zip(lowered.kernels, compiled.programs, compiled.kernel_costs, strict=True):
        views = [f"  (input %{view} is a view of the HBM array {array}, with the other layout)"
                 for view, array in kernel.hbm_aliases.items()]
        lines += ["", f"== kernel {program.name}", *to_text(kernel).splitlines(), *views,
                  "", f"== loop nest of {program.name} (NKI 0.3+ spelling)", *NkiPrinter().kernel(program)]
        lines += ["", f"== cost model of {program.name}", *_formula_lines(cost), *cost_lines(cost)]
    lines += ["", "== whole graph", *cost_lines(compiled.cost)]
    return lines

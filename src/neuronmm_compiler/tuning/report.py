"""Views: the text (and JSON) nmmc prints about compiled, costed and tuned workloads, the
``explain`` walk-through, and the progress bar of long runs. Nothing here compiles or searches; the
CLI passes in what the driver made."""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

from ..codegen.mx import MxNkiPrinter
from ..cost_model import CostReport
from ..cost_model.formulas import symbolic
from ..cost_model.trust import trust_dict, trust_note, typical_range
from ..driver import Compiled, Costed, Lowered, Tuned
from ..frontends.workloads import GemmWorkload, Workload
from ..ir import to_text
from ..targets import Target
from .speedups import context_note, launch_dict, sensitivity, speedup_text


def _mib(nbytes: float) -> str:
    return f"{nbytes / 2**20:.2f} MiB"


def _fused(workload: Workload) -> bool:
    """True when ``workload`` compiles to fused kernels (anything but a plain GEMM), whose latencies the
    published measurements (all of GEMM kernels) do not cover."""
    return not isinstance(workload, GemmWorkload)


def cost_lines(cost: CostReport) -> list[str]:
    """The model's figures for one schedule, one per line."""
    reads = ", ".join(f"{k} {_mib(v)}" for k, v in cost.hbm_bytes_read_by_tensor.items())
    writes = ", ".join(f"{k} {_mib(v)}" for k, v in cost.hbm_bytes_written_by_tensor.items())
    engines = ", ".join(f"{k} {v:.1f}" for k, v in cost.engine_us.items())
    hist = ", ".join(f"{n} x {b} B" for b, n in cost.dma_bytes_per_partition.items())
    programs = []
    if cost.program_latency_us:
        each = " / ".join(f"{t:.2f}" for t in cost.program_latency_us)
        shared = cost.values.get("t_dma_shared", 0.0)
        programs = [f"programs         {len(cost.program_latency_us)} (one per physical core of the logical core): "
                    f"{each} us; the figures below are the slowest program's times and all programs' counts; both "
                    f"programs' steady-state HBM bytes take {shared:.1f} us of the shared stack; exchanges "
                    f"{cost.values.get('T_exchange', 0.0):.1f} us (docs/logical-cores.md)"]
    return [
        f"latency          {cost.latency_us:.2f} us ({cost.bound}-bound); lower bound {cost.lower_bound_us:.2f} us "
        f"({cost.lower_bound_us / cost.latency_us:.0%} of it)",
        *programs,
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
        _rotation_line(cost),
    ]


def _rotation_line(cost: CostReport) -> str:
    """Whether the loop loads have room for the second copy that overlapping them with compute needs."""
    if cost.sbuf_rotating_bytes_per_partition == cost.sbuf_bytes_per_partition:
        return "loads overlap    compute (no loop loads a block in one DMA: docs/cost_model.md, \"Room to rotate\")"
    need = f"{cost.sbuf_rotating_bytes_per_partition} B/partition with a second copy of each one-DMA loop block"
    if cost.rotates:
        return f"loads overlap    compute on the previous copy ({need})"
    return (f"loads SERIALIZED no room to rotate ({need}): each waits for the compute on the last copy, "
            f"+{cost.values.get('T_serial', 0.0):.1f} us (T_serial; docs/cost_model.md, \"Room to rotate\")")


def _fmt(expr: Any) -> str:
    import sympy as sp

    return sp.sstr(expr)


def _formula_lines(cost: CostReport) -> list[str]:
    """The model's symbols with their values, then each formula and its value."""
    import sympy as sp

    formulas, latency, lower_bound = symbolic()
    values = cost.values
    symbols = sorted({str(sym) for expr in formulas.values() for sym in expr.free_symbols})
    lines = ["symbols:", *(f"  {name:<18} = {values[name]:.6g}" for name in symbols), "formulas (microseconds):"]
    for name, expr in formulas.items():
        lines.append(f"  {name} = {_fmt(expr)}")
        lines.append(f"  {' ' * len(name)} = {values[name]:.3f}")
    lines.append(f"  latency = {_fmt(latency)} = {cost.latency_us:.3f}  ({cost.bound}-bound)")
    lines.append(f"  lower_bound = {_fmt(lower_bound)}")
    terms = []
    peak = next(term for term in lower_bound.args if isinstance(term, sp.Max))
    for term in peak.args:  # in the order the formula prints them
        num, den = sp.fraction(term)
        terms.append(f"{values[str(num)]:.6g} / {values[str(den)]:.6g}")
    lines.append(f"  {' ' * 11} = {values['t_launch']:.6g} + max({', '.join(terms)}) = {cost.lower_bound_us:.3f}")
    return lines


def _pass_lines(lowered: Lowered) -> list[str]:
    """The frontend's graph, then the graph after every pass of the pipeline (with its annotations)."""
    lines = ["== graph from the frontend", *to_text(lowered.source_graph).splitlines()]
    for step in lowered.pipeline_steps:
        lines += ["", f"== after pass {step.pass_name} ({'changed' if step.changed else 'unchanged'})",
                  *step.text.splitlines()]
    return lines


def emit_lines(compiled: Compiled, output: str) -> list[str]:
    """What ``nmmc emit -o FILE`` prints after writing the file."""
    names = ", ".join(p.name for p in compiled.programs)
    footprint = "; ".join(fp.describe() for fp in compiled.footprints)
    return [f"wrote {output}: {names} for {compiled.workload.describe()}",
            f"  target {compiled.target.label}, dialect {compiled.dialect}, schedule {compiled.schedule_name}",
            f"  {footprint}",
            f"  predicted {compiled.cost.latency_us:.1f} us ({compiled.cost.bound}-bound; cost model "
            f"{trust_note(compiled.target, _fused(compiled.workload))})"]


def costed_lines(workload: Workload, target: Target, costed: Costed) -> list[str]:
    """``nmmc cost``: the schedule, the whole's figures, then each kernel's when there are several."""
    lines = [f"{workload.describe()} on {target.label}",
             f"schedule {costed.schedule_name}: {costed.schedule.describe()}"]
    lines += [f"  {line}" for line in cost_lines(costed.cost)]
    lines.append(f"  model error      {trust_note(target, _fused(workload))}")
    if len(costed.programs) > 1:
        for program, cost in zip(costed.programs, costed.kernel_costs, strict=True):
            lines += [f"kernel {program.name}:", *(f"  {line}" for line in cost_lines(cost))]
    return lines


def cost_json(workload: Workload, target: Target, costed: Costed) -> dict[str, Any]:
    data = {"workload": workload.describe(), "target": target.name, "schedule": costed.schedule.as_dict(),
            **costed.cost.as_dict(), "model_error": trust_dict(target, _fused(workload))}
    if len(costed.programs) > 1:
        data["kernels"] = [{"name": p.name, **c.as_dict()} for p, c in zip(costed.programs, costed.kernel_costs,
                                                                           strict=True)]
    return data


def columns(rows: list[list[str]], specs: list[tuple[int, str]], indent: str = "  ") -> list[str]:
    """Rows of cells as text columns: each spec ``(width, "<" or ">")`` is a column's least width and
    alignment; a column widens to its longest cell plus one space, so no two cells ever run together
    (a row may have fewer cells than there are columns)."""
    widths = [max([width, *(len(row[i]) + 1 for row in rows if i < len(row))]) for i, (width, _) in enumerate(specs)]
    return [(indent + "".join(f"{cell:{specs[i][1]}{widths[i]}}" for i, cell in enumerate(row))).rstrip()
            for row in rows]


def _g(value: float) -> str:
    """Four significant digits, without an exponent for the values a table holds (``1.075e+06`` -> ``1075000``)."""
    return f"{value:.4g}" if abs(value) < 1e4 else f"{value:.0f}"


def _band(cost: CostReport, target: Target) -> str:
    """The prediction's typical range (cost_model.trust), e.g. ``101-115``; ``-`` where not validated."""
    band = typical_range(cost.latency_us, target) if cost.feasible else None
    return f"{_g(band[0])}-{_g(band[1])}" if band is not None else "-"


#: The columns of ``nmmc tune``'s table: (least width, alignment).
_TUNE_COLUMNS = [(34, "<"), (12, ">"), (16, ">"), (11, "<"), (9, ">"), (8, ">"), (13, ">"), (6, ">"), (9, ">")]


def wrap_note(text: str, indent: str = "  ", hang: str = "    ") -> list[str]:
    """A printed note as lines: wrapped at the terminal's width when the output is a terminal (``indent`` before the
    first line, ``hang`` before the others), one line otherwise (a file or a pipe keeps each note whole for grep)."""
    import shutil
    import textwrap

    if not sys.stdout.isatty():
        return [indent + text]
    width = max(40, shutil.get_terminal_size().columns - 1)
    return textwrap.wrap(text, width=width, initial_indent=indent, subsequent_indent=hang, break_on_hyphens=False,
                         break_long_words=False)


#: How a table names a baseline that cannot run in the launch context: a reference row, compared with nothing.
REFERENCE = "ref: "


def _row(name: str, cost: CostReport | None, kernels: int | None, target: Target, reason: str = "") -> list[str]:
    if cost is None:  # with a reason (an assert of the baseline's, say), the speedup line below gives it
        return [name, "n/a (see below)" if reason else "(not modelled)"]
    lat = f"{cost.latency_us:.2f}" if cost.feasible else "(no fit)"
    hbm = (cost.hbm_bytes_read + cost.hbm_bytes_written) / 2**20
    return [name, lat, _band(cost, target), f"  {cost.bound}", f"{hbm:.2f}", str(cost.dma_transfers),
            str(cost.sbuf_bytes_per_partition), str(cost.psum_banks), str(kernels or "")]


#: Said next to a speedup of an SVD kernel over the dense computation: the two do not compute the same thing.
LOSSY = "an approximation vs exact: the SVD changes the model's outputs"
#: The baselines that compute the dense MLP (or GEMMs) exactly, where the tuned kernel is an SVD approximation.
DENSE_BASELINES = ("nkilib-mlp", "nmmc-dense", "dense")


def quality_note(quality: dict[str, Any] | None, what: str = "the SVD") -> str:
    """What ``what`` (the SVD, FP8, or both) does to the model, as measured by ``nmmc compress --eval`` (or that it
    was not)."""
    verb = "change" if " and " in what else "changes"
    if not quality:
        return (f"{what} {verb} the model's outputs; not measured for these ranks and formats (nmmc compress --eval "
                "measures the perplexity change)")
    return (f"{what} {verb} the model's outputs: measured perplexity {quality['perplexity_original']:.2f} -> "
            f"{quality['perplexity_compressed']:.2f} ({quality['perplexity_increase']:+.1%}) on "
            f"{quality['tokens']} held-out tokens ({quality['source']})")


def tune_lines(tuned: Tuned) -> list[str]:
    """``nmmc tune``: the search, the tuned kernel next to every baseline, speedups, the schedule."""
    c, s = tuned.compiled, tuned.search
    lines = [
        f"{c.workload.describe()} on {c.target.label}",
        f"search: {s.method}, {s.trials} trials, {s.evaluated} schedules costed ({s.feasible} fit) "
        f"of {s.space_size}, {s.seconds:.2f} s",
        "",
        *columns([["", "latency us", "typical range", "  bound", "HBM MiB", "DMAs", "SBUF B/part", "PSUM", "kernels"],
                  _row("nmmc tuned", c.cost, len(c.programs), c.target),
                  *(_row(("" if b.runnable else REFERENCE) + b.label, b.cost, (b.details or {}).get("kernels"),
                         c.target, b.reason)
                    for b in tuned.baselines.values())],
                 _TUNE_COLUMNS),
        *wrap_note(f"latencies and speedups are the cost model's: {trust_note(c.target, _fused(c.workload))}; the "
                   "typical range is the latency within that typical factor"),
        *wrap_note(context_note(c.target)),
        *([] if all(b.runnable for b in tuned.baselines.values()) else
          wrap_note(f"'{REFERENCE.strip()}' rows cannot run in this launch context: references only, no speedup is "
                    "stated over them (why, and what runs there instead, below; --json: baselines.*.not_runnable)")),
        "",
    ]
    for name, speedup in tuned.speedups().items():
        baseline = tuned.baselines[name]
        if not baseline.runnable:  # a reference row: no ratio over a baseline nobody can run here
            lines += wrap_note(f"not compared with {baseline.speedup_label} ({c.target.launch}): "
                               f"{baseline.not_runnable}", indent="")
            continue
        label = f"speedup vs {baseline.speedup_label} ({c.target.launch})"
        notes = [LOSSY] if name in DENSE_BASELINES and c.workload.svd else []
        if (baseline.details or {}).get("prologue"):
            notes.append("nmmc's kernel includes the norm/residual, the baseline is charged without them")
        if c.target.lnc > 1 and baseline.one_core:  # AWS's one-core kernels (lowerings/base.py, one_core_label)
            notes.append(f"nmmc on LNC={c.target.lnc}, the baseline on one physical core")
        if speedup and baseline.cost is not None and sensitivity(baseline.cost, c.cost, c.target):
            notes.append(sensitivity(baseline.cost, c.cost, c.target))
        suffix = f" ({'; '.join(notes)})" if notes else ""
        lines.append(f"{label}: {speedup_text(speedup)}{suffix}" if speedup
                     else f"{label}: n/a ({baseline.reason or 'baseline not modelled or does not fit'})")
    lines.append(f"schedule: {c.schedule.describe()}")
    if len(c.programs) > 1:
        for program, cost in zip(c.programs, c.kernel_costs, strict=True):
            lines.append(f"  {program.name}: {cost.latency_us:.2f} us, {cost.bound}-bound, "
                         f"SBUF {cost.sbuf_bytes_per_partition} B/partition, PSUM {cost.psum_banks} banks")
    if len(s.top) > 1:
        lines.append("runners-up:")
        lines += [f"  {cand.latency_us:10.2f} us  {cand.schedule.describe()}" for cand in s.top[1:]]
    return lines


def tune_json(tuned: Tuned, output: str, report: Any) -> dict[str, Any]:
    """``nmmc tune --json``."""
    c = tuned.compiled
    data: dict[str, Any] = {
        "workload": c.workload.describe(),
        "target": c.target.name,
        "kind": c.kind,
        "schedule": c.schedule.as_dict(),
        "predicted": c.cost.as_dict(),
        "kernels": [{"name": p.name, **k.as_dict()} for p, k in zip(c.programs, c.kernel_costs, strict=True)],
        "baselines": {name: _baseline_json(b) for name, b in tuned.baselines.items()},
        "speedups": tuned.speedups(),
        "launch": launch_dict(c.target),
        "model_error": trust_dict(c.target, _fused(c.workload)),
        "typical_range_us": typical_range(c.cost.latency_us, c.target),
        "search": {**tuned.search.search_summary(), "cached": tuned.search.method == "cache"},
        "top": [{"latency_us": cand.latency_us, "schedule": cand.schedule.as_dict()} for cand in tuned.search.top],
        "output": output,
    }
    if report is not None:
        data["verify"] = report.as_dict()
    return data


def _baseline_json(baseline: Any) -> dict[str, Any] | None:
    """One baseline of ``tune --json``: what it computes, its details, whether it can run in the launch context (and
    why not), its cost and why it has none (or None: not modelled, nothing to say)."""
    if baseline.cost is None and not baseline.reason and baseline.runnable:
        return None
    data: dict[str, Any] = {"computation": baseline.label, **(baseline.details or {}), **baseline.context_dict()}
    if baseline.reason:
        data["reason"] = baseline.reason
    if baseline.cost is not None:
        data.update(baseline.cost.as_dict())
    return data


def explain_heading(compiled: Compiled, tuned: bool, given: bool) -> str:
    """``nmmc explain``'s first line: which schedule it explains (the tuned one, the one the options gave,
    or the default) and, unless it is the tuned one, that ``nmmc tune`` reports another and how to see it."""
    what = f"schedule {compiled.schedule_name}, predicted {compiled.cost.latency_us:.1f} us"
    if tuned:
        return f"explaining the tuned {what}: the schedule 'nmmc tune' searches for (same trials and seed)"
    origin = "as given by --schedule/--param/--pipeline" if given else "the default, not tuned"
    return (f"explaining {what} ({origin}); 'nmmc tune' reports the tuned schedule, usually faster: "
            "add --tuned to explain that one")


def explain_lines(compiled: Compiled, heading: str | None = None) -> list[str]:
    """``heading`` (:func:`explain_heading`), then the IR after each pass, every kernel's subgraph, loop
    nest and cost formulas with numbers."""
    lowered = compiled.lowered
    lines = ([heading, ""] if heading else []) + _pass_lines(lowered)
    lines += ["", f"== workload: {compiled.workload.describe()}",
              f"== lowering: {compiled.kind}",
              f"== schedule {compiled.schedule_name}: {compiled.schedule.describe()}"]
    for kernel, program, cost in zip(lowered.kernels, compiled.programs, compiled.kernel_costs, strict=True):
        views = [f"  (input %{view} is a view of the HBM array {array}, with the other layout)"
                 for view, array in getattr(kernel, "hbm_aliases", {}).items()]
        lines += ["", f"== kernel {program.name}", *to_text(kernel).splitlines(), *views,
                  "", f"== loop nest of {program.name} (NKI 0.3+ spelling)", *MxNkiPrinter().kernel(program)]
        lines += ["", f"== cost model of {program.name} on {compiled.target.label}", *_formula_lines(cost),
                  *cost_lines(cost)]
    if len(compiled.programs) > 1:
        lines += ["", "== whole graph", *cost_lines(compiled.cost)]
    lines += ["", f"== model error on {compiled.target.label}: "
                  f"{trust_note(compiled.target, _fused(compiled.workload))}"]
    return lines


def schedules_lines(workload: Workload, target: Target, rows: list[dict[str, Any]],
                    space: list[dict[str, Any]]) -> list[str]:
    """``nmmc schedules``: the named schedules with their footprint, then the parameters."""
    lines = [f"{workload.describe()}; target {target.name}", "", "presets:"]
    for row in rows:
        fits = "fits" if row["fits"] else "DOES NOT FIT"
        lines += [f"  {row['name']}: {row['description']}",
                  "    " + " ".join(f"{k}={v}" for k, v in row["params"].items()),
                  f"    SBUF {row['sbuf_bytes_per_partition']} B/partition, PSUM {row['psum_banks']} banks: {fits}"]
    lines += ["", "parameters (--param KEY=VALUE):"]
    for p in space:
        accepted = ", ".join(p["choices"]) if p["choices"] else p["type"]
        searched = (f"; the search samples {', '.join(map(str, p['searched']))}" if p["searched"] else
                    "; not sampled by the search")
        polish = f", its polish also visits {', '.join(map(str, p['polish_only']))}" if p["polish_only"] else ""
        lines.append(f"  {p['name']:<24} {p['help']} [{accepted}{searched}{polish}]")
    return lines


def progress_bar(enabled: bool, desc: str = "tuning") -> tuple[Callable[[int, int, float], None] | None,
                                                               Callable[[], None]]:
    """(update, close) of a tqdm bar on stderr labelled ``desc``: ``update(done, total, best_us)``
    (``inf``: nothing fits yet); (None, a no-op) when not ``enabled``."""
    if not enabled:
        return None, lambda: None
    from tqdm import tqdm

    tqdm.monitor_interval = 0  # no monitor thread: a search forks workers only while no other thread runs
    bar = tqdm(total=0, desc=desc, unit="trial", file=sys.stderr, leave=False)

    def update(done: int, total: int, best: float) -> None:
        bar.total = total
        bar.n = done
        bar.set_postfix_str(f"best {best:.1f} us" if best != float("inf") else "no fit yet", refresh=False)
        bar.refresh()

    return update, bar.close

"""Search reports: plots and a Markdown summary of a tuning run or of a lockfile.

:func:`write_report` turns a :class:`~neuronmm_compiler.search.TuneResult` into

* ``history.png``: the optimization history (every evaluated schedule's predicted latency in
  evaluation order when the candidates are known, and the best-so-far line);
* ``importance.png``: each parameter's share of what separates the fastest evaluated schedules
  from the rest (Optuna's PED-ANOVA over the candidates; see :func:`parameter_importance`);
* ``roofline.png``: achieved throughput against arithmetic intensity, with the target's compute
  and DMA-bandwidth ceilings, every evaluated schedule in grey and the chosen one highlighted;
* ``summary.md``: the run's figures, the chosen schedule, the top-k table and the three images.

:func:`write_lock_report` does the same for a lockfile (no search history): a roofline with one
point per entry (each entry's schedule recompiled to get today's cost report), a bar chart of the
predicted latencies and a summary table.

Every file is written atomically (a temporary file in the same directory, then ``os.replace``).
Plots are drawn on matplotlib's Agg canvas directly (no pyplot, no display, no global backend
change); matplotlib is imported only when a report is written.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from ..cost_model import CostReport
from ..errors import NmmcError
from ..frontends.workloads import workload_from_dict
from ..search import Candidate, TuneResult
from ..targets import Target, get_target
from .lockfile import LockEntry, Lockfile
from .plots import (
    LOG_RANGE,
    draw_ceilings,
    figure,
    infer_dtype,
    param_table,
    plottable,
    roofline_limits,
    save_png,
    schedule_params,
    tflops,
    write_md,
)
from .regress import compile_entry

REPORT_FILES = ("history.png", "importance.png", "roofline.png", "summary.md")
LOCK_REPORT_FILES = ("roofline.png", "latency.png", "summary.md")


# ----------------------------------------------------------------------------- search reports


def _candidates(result: TuneResult, candidates: Sequence[Candidate] | None) -> tuple[list[Candidate], bool]:
    """The schedules to plot, and whether they are every evaluated one (else only the top-k)."""
    given = candidates if candidates is not None else getattr(result, "candidates", None)
    if given:
        return list(given), True
    out = list(result.top)
    if all(c.schedule != result.best.schedule for c in out):
        out.insert(0, result.best)
    return out, False


def parameter_importance(candidates: Sequence[Candidate]) -> dict[str, float]:
    """For each schedule parameter, its share of what separates the fastest schedules from the rest,
    over the feasible candidates: Optuna's PED-ANOVA importance
    (``optuna.importance.PedAnovaImportanceEvaluator``) of log10 latency, computed on an in-memory
    study holding one trial per candidate (a report has the candidates, not necessarily a study:
    exhaustive searches never create one). Parameters seen with one value only get 0; with fewer
    than two distinct schedules every share is 0. Sorted, most important first."""
    import optuna
    from optuna.distributions import CategoricalDistribution
    from optuna.trial import create_trial

    feasible = [c for c in candidates if c.cost.feasible and 0 < c.latency_us < math.inf]
    names = list(dict.fromkeys(name for c in feasible for name in schedule_params(c.schedule)))
    shares = dict.fromkeys(names, 0.0)
    values = {name: sorted({repr(schedule_params(c.schedule).get(name)) for c in feasible}) for name in names}
    distributions = {name: CategoricalDistribution(v) for name, v in values.items() if len(v) > 1}
    if len(feasible) >= 2 and distributions:
        optuna.logging.set_verbosity(optuna.logging.WARNING)
        study = optuna.create_study()
        study.add_trials([create_trial(params={n: repr(schedule_params(c.schedule).get(n)) for n in distributions},
                                       distributions=distributions, value=math.log10(c.latency_us))
                          for c in feasible])
        evaluator = optuna.importance.PedAnovaImportanceEvaluator()
        with warnings.catch_warnings():  # few trials: PED-ANOVA warns that its quantiles coincide
            warnings.simplefilter("ignore", UserWarning)
            shares.update(optuna.importance.get_param_importances(study, evaluator=evaluator))
    return dict(sorted(shares.items(), key=lambda kv: (-kv[1], kv[0])))


def _history_png(result: TuneResult, cands: list[Candidate], complete: bool, path: Path) -> Path:
    panels = 2 if result.trial_history else 1
    fig = figure(7.5 if panels == 1 else 11.0, 4.6)
    ax = fig.add_subplot(1, panels, 1)
    values: list[float] = []
    if complete:
        feas = [(i + 1, c.latency_us) for i, c in enumerate(cands) if c.cost.feasible]
        infeas = [(i + 1, c.latency_us) for i, c in enumerate(cands)
                  if not c.cost.feasible and 0 < c.latency_us < math.inf]
        if feas:
            ax.scatter(*zip(*feas, strict=True), s=12, color="tab:blue", alpha=0.55, label="feasible schedule")
        if infeas:
            ax.scatter(*zip(*infeas, strict=True), s=14, marker="x", color="tab:red", alpha=0.55,
                       label="does not fit on chip")
        values += [v for _, v in feas + infeas]
    best = [(i + 1, v) for i, v in enumerate(result.history) if v < math.inf]
    if best:
        ax.step(*zip(*best, strict=True), where="post", color="black", linewidth=1.8, label="best so far")
        values += [v for _, v in best]
    ax.axhline(result.best.latency_us, color="tab:green", linestyle="--", linewidth=1.2,
               label=f"chosen: {result.best.latency_us:.2f} us")
    values.append(result.best.latency_us)
    if max(values) / min(values) > LOG_RANGE:
        ax.set_yscale("log")
    ax.set_xlabel("evaluation (distinct schedules costed, in order)")
    ax.set_ylabel("predicted latency (us)")
    what = "" if complete else " (best-so-far only; per-schedule points need the candidates)"
    ax.set_title(f"Optimization history: {result.method}, {result.evaluated} evaluated{what}", fontsize=10)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8, loc="upper right")
    if panels == 2:
        ax2 = fig.add_subplot(1, 2, 2)
        trial = [(i + 1, v) for i, v in enumerate(result.trial_history) if v < math.inf]
        if trial:
            ax2.step(*zip(*trial, strict=True), where="post", color="tab:purple", linewidth=1.8,
                     label="best so far")
            if max(v for _, v in trial) / min(v for _, v in trial) > LOG_RANGE:
                ax2.set_yscale("log")
        ax2.axhline(result.best.latency_us, color="tab:green", linestyle="--", linewidth=1.2,
                    label="chosen (after polish)")
        ax2.set_xlabel("Optuna trial")
        ax2.set_ylabel("best predicted latency (us)")
        ax2.set_title(f"Per trial ({result.trials} trials)", fontsize=10)
        ax2.grid(True, which="both", alpha=0.3)
        ax2.legend(fontsize=8, loc="upper right")
    return save_png(fig, path)


def _importance_png(cands: list[Candidate], complete: bool, path: Path) -> Path:
    shares = parameter_importance(cands)
    n = sum(c.cost.feasible for c in cands)
    fig = figure(7.5, max(3.0, 0.38 * len(shares) + 1.5))
    ax = fig.add_subplot(1, 1, 1)
    which = "evaluated" if complete else "top-k"
    ax.set_title(f"Parameter importance over {n} feasible {which} schedules", fontsize=10)
    if shares and any(shares.values()):
        names = list(shares)[::-1]  # largest at the top
        vals = [shares[k] for k in names]
        bars = ax.barh(names, vals, color="tab:blue")
        for bar, v in zip(bars, vals, strict=True):
            ax.text(bar.get_width() + 0.005, bar.get_y() + bar.get_height() / 2, f"{v:.0%}",
                    va="center", fontsize=8)
        ax.set_xlim(0, max(vals) * 1.15)
    else:
        ax.text(0.5, 0.5, "not enough variation among the schedules", ha="center", va="center",
                transform=ax.transAxes)
        ax.set_yticks([])
    ax.set_xlabel("share of importance (Optuna PED-ANOVA over log latency)")
    ax.grid(True, axis="x", alpha=0.3)
    return save_png(fig, path)


def _roofline_png(result: TuneResult, cands: list[Candidate], target: Target, dtype: str | None,
                  path: Path) -> Path:
    dtypes = [dtype] if dtype else ["bfloat16", "float32"]
    costs = [c.cost for c in cands if plottable(c.cost)]
    x_lo, x_hi = roofline_limits([*costs, result.best.cost], [target], dtypes)
    fig = figure(7.5, 5.0)
    ax = fig.add_subplot(1, 1, 1)
    draw_ceilings(ax, target, dtypes, x_lo, x_hi)
    others = [c for c in costs if c is not result.best.cost]
    if others:
        ax.scatter([c.arithmetic_intensity for c in others], [tflops(c) for c in others], s=14, color="grey",
                   alpha=0.5, label=f"evaluated schedules ({len(others)})")
    best = result.best.cost
    if plottable(best):
        ax.scatter([best.arithmetic_intensity], [tflops(best)], s=120, marker="*", color="tab:red", zorder=5,
                   label="chosen schedule")
        # the label sits in the free top-left corner, an arrow pointing at the star, so it never covers points
        ax.annotate(f"chosen: {best.latency_us:.2f} us\n{tflops(best):.2f} TFLOP/s ({best.bound}-bound)",
                    (best.arithmetic_intensity, tflops(best)), textcoords="axes fraction", xytext=(0.03, 0.93),
                    va="top", fontsize=8, color="tab:red",
                    bbox={"boxstyle": "round", "fc": "white", "ec": "tab:red", "alpha": 0.9},
                    arrowprops={"arrowstyle": "->", "color": "tab:red", "lw": 0.8})
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlim(x_lo, x_hi)
    ax.set_xlabel("arithmetic intensity (FLOP/byte of HBM traffic)")
    ax.set_ylabel("achieved throughput (TFLOP/s)")
    ax.set_title(f"Roofline on {target.name} ({target.core})", fontsize=10)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8, loc="lower right")
    return save_png(fig, path)


#: Why a report of a search answered from the result cache has no plots (``summary.md`` and ``nmmc tune`` say it).
CACHED_NO_PLOTS = ("answered from nmmc's result cache, which keeps the chosen schedule, not the search's trials: "
                   "no search ran, so there is nothing to plot (rerun with --no-cache to search again and plot it)")


def _summary_md(result: TuneResult, target: Target, title: str, complete: bool) -> str:
    best = result.best
    cost = best.cost
    cached = result.method == "cache"
    search = [f"| search | {CACHED_NO_PLOTS} |"] if cached else [
        f"| method | {result.method} |", f"| trials | {result.trials} |",
        f"| evaluated | {result.evaluated} distinct schedules (space: {result.space_size}) |",
        f"| feasible | {result.feasible} |", f"| search time | {result.time_note()} |"]
    lines = [f"# {title}", "", "| | |", "|---|---|",
             f"| target | {target.name} ({target.core}) |", *search,
             f"| best latency | **{best.latency_us:.2f} us** ({cost.bound}-bound; lower bound "
             f"{cost.lower_bound_us:.2f} us) |",
             f"| throughput | {tflops(cost):.2f} TFLOP/s at {cost.arithmetic_intensity:.1f} FLOP/B |",
             "", "## Chosen schedule", ""]
    lines += param_table([[k, str(v)] for k, v in schedule_params(best.schedule).items()], ["parameter", "value"])
    lines += ["", f"## Top {len(result.top)}", ""]
    names = list(schedule_params(best.schedule))
    rows = [[str(i), f"{c.latency_us:.2f}", c.cost.bound, f"{tflops(c.cost):.2f}",
             f"{c.cost.arithmetic_intensity:.1f}", *(str(schedule_params(c.schedule).get(n, "")) for n in names)]
            for i, c in enumerate(result.top, 1)]
    lines += param_table(rows, ["#", "latency (us)", "bound", "TFLOP/s", "FLOP/B", *names])
    if cached:
        return "\n".join([*lines, "", "## Plots", "", f"None: {CACHED_NO_PLOTS}.", ""])
    note = "" if complete else " Only the top-k schedules were available: the per-schedule points are missing."
    lines += ["", "## Plots", "", f"Optimization history.{note}", "", "![Optimization history](history.png)", "",
              "Parameter importance (Optuna's PED-ANOVA over log latency: what separates the fastest schedules).", "",
              "![Parameter importance](importance.png)", "",
              "Roofline (model predictions; ceilings from the target's hardware table).", "",
              "![Roofline](roofline.png)", ""]
    return "\n".join(lines)


def write_report(result: TuneResult, *, target: Target, out_dir: Path | str, title: str,
                 candidates: Sequence[Candidate] | None = None, dtype: str | None = None) -> list[Path]:
    """Write ``history.png``, ``importance.png``, ``roofline.png`` and ``summary.md`` into ``out_dir``
    (created if missing); return their paths in that order. A result answered from the result cache
    (method ``cache``) ran no trial: only ``summary.md`` is written, saying so.

    ``candidates`` are every evaluated schedule, in evaluation order (a TuneResult only keeps the
    top-k; a ``candidates`` attribute on it is used when present). Without them the history shows the
    best-so-far line only, and importance and roofline use the top-k. ``dtype`` picks the roofline's
    compute ceiling (bf16 peak, fp32 a quarter); by default it is read off the chosen schedule's cost
    report, and both are drawn when that does not say."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    cands, complete = _candidates(result, candidates)
    if result.method == "cache":  # no trials: summary.md only, saying why (CACHED_NO_PLOTS)
        return [write_md(out / "summary.md", _summary_md(result, target, title, complete))]
    dtype = dtype or infer_dtype(result.best.cost, target)
    return [
        _history_png(result, cands, complete, out / "history.png"),
        _importance_png(cands, complete, out / "importance.png"),
        _roofline_png(result, cands, target, dtype, out / "roofline.png"),
        write_md(out / "summary.md", _summary_md(result, target, title, complete)),
    ]


# ----------------------------------------------------------------------------- lockfile reports


@dataclass
class LockPoint:
    """One lock entry recompiled: today's cost report, or why it could not be rebuilt."""

    entry: LockEntry
    target: Target | None
    cost: CostReport | None
    error: str | None = None

    @property
    def name(self) -> str:
        return f"{self.entry.label} ({self.entry.target}/{self.entry.dialect})"


def lock_points(lock: Lockfile) -> list[LockPoint]:
    """Recompile every entry's schedule (as ``nmmc regress`` does) for its current cost report."""
    points = []
    for entry in lock:
        try:
            target = get_target(entry.target)
            compiled = compile_entry(entry, workload_from_dict(entry.workload), target)
        except NmmcError as exc:
            points.append(LockPoint(entry, None, None, str(exc)))
            continue
        points.append(LockPoint(entry, target, compiled.cost))
    return points


def _lock_roofline_png(points: list[LockPoint], path: Path) -> Path:
    ok = [p for p in points if p.cost is not None and p.target is not None and plottable(p.cost)]
    targets = {p.target.name: p.target for p in ok if p.target is not None}
    dtypes = sorted({str(p.entry.workload.get("dtype", "bfloat16")) for p in ok}) or ["bfloat16"]
    x_lo, x_hi = roofline_limits([p.cost for p in ok if p.cost is not None], targets.values(), dtypes)
    fig = figure(8.5, 5.2)
    ax = fig.add_subplot(1, 1, 1)
    styles = ["-", "--", "-.", ":"]
    for i, target in enumerate(targets.values()):
        draw_ceilings(ax, target, dtypes, x_lo, x_hi, style=styles[i % len(styles)], label_target=len(targets) > 1)
    markers = "o^sDvP*X"
    for i, p in enumerate(ok):
        assert p.cost is not None
        ax.scatter([p.cost.arithmetic_intensity], [tflops(p.cost)], s=60, marker=markers[i % len(markers)],
                   color=f"C{(i + 2) % 10}", zorder=5, label=f"{p.name}: {p.cost.latency_us:.2f} us")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlim(x_lo, x_hi)
    ax.set_xlabel("arithmetic intensity (FLOP/byte of HBM traffic)")
    ax.set_ylabel("achieved throughput (TFLOP/s)")
    skipped = len(points) - len(ok)
    ax.set_title(f"Roofline of {len(ok)} locked schedules" + (f" ({skipped} not rebuilt)" if skipped else ""),
                 fontsize=10)
    ax.grid(True, which="both", alpha=0.3)
    if ok or targets:
        ax.legend(fontsize=7, loc="lower right")
    return save_png(fig, path)


def _lock_latency_png(points: list[LockPoint], path: Path) -> Path:
    import numpy as np

    fig = figure(max(6.0, 1.1 * len(points) + 3.0), 4.8)
    ax = fig.add_subplot(1, 1, 1)
    if points:
        xs = np.arange(len(points))
        locked = [p.entry.latency_us for p in points]
        now = [p.cost.latency_us if p.cost is not None else 0.0 for p in points]
        rebuilt = [i for i, p in enumerate(points) if p.cost is not None]
        ax.bar(xs - 0.2, locked, width=0.4, color="tab:blue", label="locked prediction")
        ax.bar([xs[i] + 0.2 for i in rebuilt], [now[i] for i in rebuilt], width=0.4, color="tab:orange",
               label="today's model")
        for i, p in enumerate(points):
            if p.cost is None:  # no bar: say why where it would stand
                ax.text(xs[i] + 0.2, locked[i] * 0.5 if locked[i] > 0 else 0, "not\nrebuilt", ha="center",
                        va="center", fontsize=7, color="tab:red", rotation=90)
        ax.set_xticks(xs, [p.name for p in points], rotation=25, ha="right", fontsize=8)
        positive = [v for v in locked + now if v > 0]
        if positive and max(positive) / min(positive) > LOG_RANGE:
            ax.set_yscale("log")
            ax.set_ylim(top=max(positive) * 4)
        elif positive:
            ax.set_ylim(0, max(positive) * 1.3)  # headroom for the legend
        ax.legend(fontsize=8, loc="upper center", ncols=2)
    else:
        ax.text(0.5, 0.5, "the lockfile has no entries", ha="center", va="center", transform=ax.transAxes)
    ax.set_ylabel("predicted latency (us)")
    ax.set_title("Predicted latency per locked schedule", fontsize=10)
    ax.grid(True, axis="y", alpha=0.3)
    return save_png(fig, path)


def _lock_summary_md(points: list[LockPoint], title: str) -> str:
    lines = [f"# {title}", "", f"{len(points)} locked schedules.", ""]
    rows = []
    for p in points:
        e = p.entry
        if p.cost is not None:
            change = (p.cost.latency_us - e.latency_us) / e.latency_us if e.latency_us > 0 else 0.0
            rows.append([e.label, f"{e.target}/{e.dialect}", e.schedule_kind, e.method, f"{e.latency_us:.2f}",
                         f"{p.cost.latency_us:.2f}", f"{change:+.1%}", p.cost.bound, f"{tflops(p.cost):.2f}",
                         f"{p.cost.arithmetic_intensity:.1f}"])
        else:
            rows.append([e.label, f"{e.target}/{e.dialect}", e.schedule_kind, e.method, f"{e.latency_us:.2f}",
                         "-", "-", f"not rebuilt: {p.error}", "-", "-"])
    lines += param_table(rows, ["workload", "target", "kind", "method", "locked (us)", "now (us)", "change",
                                 "bound", "TFLOP/s", "FLOP/B"])
    lines += ["", "## Plots", "", "![Roofline](roofline.png)", "", "![Predicted latency](latency.png)", ""]
    return "\n".join(lines)


def write_lock_report(lock: Lockfile, *, out_dir: Path | str, title: str = "nmmc lockfile report") -> list[Path]:
    """Write ``roofline.png``, ``latency.png`` and ``summary.md`` for a lockfile into ``out_dir``
    (created if missing); return their paths. Each entry's schedule is recompiled for today's cost
    report (an entry that no longer builds is listed with the reason and left off the roofline)."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    points = lock_points(lock)
    return [
        _lock_roofline_png(points, out / "roofline.png"),
        _lock_latency_png(points, out / "latency.png"),
        write_md(out / "summary.md", _lock_summary_md(points, title)),
    ]


__all__ = [
    "LOCK_REPORT_FILES",
    "REPORT_FILES",
    "LockPoint",
    "lock_points",
    "parameter_importance",
    "tflops",
    "write_lock_report",
    "write_report",
]

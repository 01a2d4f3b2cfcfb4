"""Commands that compile a workload: ``nmmc emit``, ``cost``, ``explain``, ``schedules`` and ``tune``."""

from __future__ import annotations

import json
import sys
from typing import TYPE_CHECKING, Any

import click

from ..errors import InputError
from .options import (
    EXIT_FAILED,
    PROLOGUE_KEYS,
    choice,
    chosen_dialect,
    compile_inputs,
    dialect_option,
    finite_seconds,
    lowercase_name,
    parse_params,
    progress_option,
    resolve_target,
    schedule_options,
    show_progress,
    target_option,
    workload_from,
    workload_options,
)
from .tp import tp_options
from .views import echo_lines, schedules_json

if TYPE_CHECKING:
    from ..jobs import SearchSettings


@click.command()
@workload_options
@schedule_options
@dialect_option
@target_option
@click.option("-o", "--output", required=True, metavar="FILE", help="Kernel file to write ('-' for stdout).")
@tp_options("emit")
def emit(schedule_name: str | None, params: tuple[str, ...], pipeline: str | None, dialect: str, sdk: str | None,
         target: str, output: str, **options: Any) -> None:
    """Emit the NKI kernel(s) of a workload under a schedule preset (GEMM) or the default fused
    schedule (chains, MLPs, graphs), plus --param overrides."""
    from ..driver import compile_workload
    from ..io import check_output_file, write_output
    from ..tuning.report import emit_lines

    if output != "-":
        check_output_file(output)
    wl, tgt = compile_inputs(options, target)
    result = compile_workload(wl, target=tgt, dialect=chosen_dialect(dialect, sdk, tgt), sdk=sdk, preset=schedule_name,
                              params=parse_params(params), pipeline=pipeline)
    if output == "-":
        click.echo(result.kernel.source, nl=False)
        return
    write_output(output, result.kernel.source)
    echo_lines(emit_lines(result, output))


@click.command()
@workload_options
@schedule_options
@target_option
@click.option("--json", "as_json", is_flag=True, help="Print the figures as JSON.")
@tp_options("cost")
def cost(schedule_name: str | None, params: tuple[str, ...], pipeline: str | None, target: str, as_json: bool,
         **options: Any) -> None:
    """Predict the cost of one schedule with the analytic model: latency and what bounds it, HBM
    traffic per tensor, DMA transfers, engine busy times, on-chip footprint and feasibility.
    A schedule that does not fit on chip is reported (feasible: false), not rejected."""
    from ..driver import cost_workload
    from ..tuning.report import cost_json, costed_lines

    wl, tgt = compile_inputs(options, target)
    costed = cost_workload(wl, target=tgt, preset=schedule_name, params=parse_params(params), pipeline=pipeline)
    if as_json:
        click.echo(json.dumps(cost_json(wl, tgt, costed), indent=2))
        return
    echo_lines(costed_lines(wl, tgt, costed))


def search_settings(trials: int | None, seed: int, timeout: float | None, method: str, exhaustive_threshold: int | None,
                    top_k: int, storage: str | None, study_name: str | None, workers: int) -> SearchSettings:
    """``nmmc tune``'s search options as the driver's :class:`~..jobs.SearchSettings` (``auto``: no forced method)."""
    from ..jobs import SearchSettings

    return SearchSettings(trials=trials, seed=seed, timeout=timeout,
                          method=None if method == "auto" else method, exhaustive_threshold=exhaustive_threshold,
                          top_k=top_k, storage=storage, study_name=study_name, workers=workers)


@click.command()
@workload_options
@target_option
@click.option("--trials", default=None, type=click.IntRange(min=1),
              help="Optuna trials [default: 150; 100 for a GEMM]. On 60 MLPs of 1-512 tokens 600 trials found no "
                   "faster fused schedule (benchmarks/search_budget.py; before the polish from eight classes, 4 at 512 "
                   "tokens); on 104 GEMM points 100 found 150's schedule at 102 (lowerings/gemm.py).")
@click.option("--seed", default=0, show_default=True, type=int, help="Seed of the search (same seed, same result).")
@click.option("--timeout", default=None, type=click.FloatRange(min=0.0, min_open=True), callback=finite_seconds,
              help="Stop the search after this many seconds (such a search is not cached).")
@click.option("--method", default="auto", show_default=True, callback=lowercase_name,
              help="auto (exhaustive when the space has at most --exhaustive-threshold schedules), optuna, "
                   "or exhaustive.")
@click.option("--exhaustive-threshold", default=None, type=click.IntRange(min=0),
              help="Largest space enumerated exhaustively by --method auto [default: 1000 for GEMMs, 200 for "
                   "fused graphs, whose schedules take longer to cost].")
@click.option("--top-k", default=5, show_default=True, type=click.IntRange(min=1), help="Runners-up to report.")
@dialect_option
@click.option("--verify", "run_verify", is_flag=True, help="Also run the emitted kernel in the interpreter.")
@progress_option
@click.option("--model", default=None, metavar="PATH",
              help="Tune a model's MLP for every --tokens bucket: a model directory (config.json), a config.json, "
                   "or an 'nmmc compress' output (its ranks; layers of different ranks/formats: one kernel set "
                   "per group, in DIR/<group>/). -o is then a directory: one kernel file per bucket and index.json.")
@click.option("--storage", default=None, metavar="URL",
              help="Optuna storage making the search resumable and shareable: sqlite:///FILE.db, "
                   "journal:///FILE.log, or postgresql://USER:PASSWORD@HOST/DB (needs psycopg2).")
@click.option("--study", "study_name", default=None, metavar="NAME",
              help="Study name in --storage [default: derived from the workload, so a rerun resumes].")
@click.option("--workers", default=1, show_default=True, type=click.IntRange(min=1),
              help="Local worker processes sharing the study (needs --storage).")
@click.option("--jobs", default=None, type=click.IntRange(min=1),
              help="With --model: searches (each bucket's compressed and dense MLP) run at once in this many worker "
                   "processes; for an SVD MLP, its dense baseline is searched in a worker process beside it unless 1; "
                   "the files are those of --jobs 1 [default: the cores].")
@click.option("--report", "report_dir", default=None, metavar="DIR",
              help="Also write plots of the search (history, parameter importance, roofline) and a summary to DIR.")
@click.option("--lock", "lock_path", default=None, metavar="LOCKFILE",
              help="Record the chosen schedule in this lockfile (created if missing) for 'nmmc regress'; with "
                   "--model, each bucket's chosen kernel (its format is in the entry's workload).")
@click.option("--no-cache", is_flag=True, help="Search even if the result cache has an answer (and do not store one).")
@click.option("--cache-dir", default=None, metavar="DIR",
              help="Result cache directory [default: $NMMC_CACHE_DIR, else $XDG_CACHE_HOME/nmmc, else ~/.cache/nmmc].")
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")
@click.option("-o", "--output", required=True, metavar="FILE",
              help="Kernel file to write ('-' for stdout); with --model, the output directory.")
@tp_options("tune")
def tune(target: str, trials: int | None, seed: int, timeout: float | None, method: str,
         exhaustive_threshold: int | None, top_k: int, dialect: str, sdk: str | None, run_verify: bool,
         progress: bool | None,
         model: str | None, storage: str | None, study_name: str | None, workers: int, jobs: int | None,
         report_dir: str | None,
         lock_path: str | None, no_cache: bool, cache_dir: str | None, as_json: bool, output: str,
         **options: Any) -> None:
    """Search the schedule space with the cost model (Optuna TPE, or exhaustive for small spaces),
    write the NKI kernel(s) of the best schedule, and compare with the baselines at the same shape:
    AWS's fully optimized kernel for a GEMM; for chains and MLPs, the dense computation and the
    unfused SVD factors, each with AWS's kernel per matmul; for an SVD MLP, first nmmc's own fused
    dense MLP, tuned the same way. With --model, do that for a model's MLP at every token bucket.
    Every speedup names its launch context (--launch; in-graph by default for MLPs)."""
    from ..tuning.request import TuneRequest, run_model_tune, run_tune
    from ..workers.cores import available_cores as cores

    choice(method, ("auto", "optuna", "exhaustive"), "search method")
    if model is not None and any(options.get(key) not in (None, False) for key in PROLOGUE_KEYS):
        raise InputError("--fuse-norm/--residual apply to one --mlp workload, not to tune --model yet")
    workload = None if model is not None else workload_from(options, target)
    tgt = resolve_target(target, workload)  # --model: a model's MLP, in-graph unless --launch says otherwise
    search = search_settings(trials, seed, timeout, method, exhaustive_threshold, top_k, storage, study_name, workers)
    request = TuneRequest(target=tgt, dialect=chosen_dialect(dialect, sdk, tgt), sdk=sdk, search=search,
                          jobs=jobs or cores(),
                          cache_dir=cache_dir, use_cache=not no_cache, progress=show_progress(progress, as_json))
    if model is not None:
        if report_dir or storage:
            raise InputError("--report and --storage take single workloads; use them per --mlp bucket")
        from ..io import check_output_dir

        check_output_dir(output)
        ok = run_model_tune(model, options, request, target_name=target, verify=run_verify, as_json=as_json,
                            output=output, echo=click.echo, lock_path=lock_path)
    else:
        assert workload is not None
        ok = run_tune(workload, request, verify=run_verify, lock_path=lock_path,
                      report_dir=report_dir, as_json=as_json, output=output, echo=click.echo)
    if not ok:
        sys.exit(EXIT_FAILED)


@click.command()
@workload_options
@schedule_options
@target_option
@click.option("--tuned", is_flag=True, help="Explain the schedule 'nmmc tune' would pick.")
@click.option("--seed", default=0, show_default=True, type=int, help="Seed of the search, with --tuned.")
@tp_options("explain")
def explain(schedule_name: str | None, params: tuple[str, ...], pipeline: str | None, target: str, tuned: bool,
            seed: int, **options: Any) -> None:
    """Show how a workload is compiled: the graph after each pass (with every annotation the passes
    wrote), each kernel's loop nest, and the cost model's formulas with the schedule's numbers."""
    from ..driver import compile_workload
    from ..driver import tune as run_search
    from ..tuning.report import explain_heading, explain_lines

    wl, tgt = compile_inputs(options, target)
    if tuned and (schedule_name or params or pipeline):
        raise InputError("--tuned picks the schedule itself: drop --schedule/--param/--pipeline")
    compiled = (run_search(wl, target=tgt, seed=seed).compiled if tuned else
                compile_workload(wl, target=tgt, preset=schedule_name, params=parse_params(params), pipeline=pipeline))
    echo_lines(explain_lines(compiled, explain_heading(compiled, tuned, bool(schedule_name or params or pipeline))))


@click.command()
@workload_options
@target_option
@click.option("--json", "as_json", is_flag=True, help="Print as JSON.")
def schedules(target: str, as_json: bool, **options: Any) -> None:
    """List the named schedules of a workload (a GEMM's presets, a fused graph's default) with
    their parameters and on-chip footprint, and the parameters --param can set."""
    from ..driver import named_schedules
    from ..tuning.report import schedules_lines
    from .views import parameter_rows

    wl, tgt = compile_inputs(options, target)
    rows, specs = named_schedules(wl, tgt)
    space = parameter_rows(specs)
    if as_json:
        click.echo(json.dumps(schedules_json(wl, tgt, rows, space), indent=2))
        return
    echo_lines(schedules_lines(wl, tgt, rows, space))

"""The ``nmmc`` command line.

Every user error (bad shape, unknown name, a schedule over a hardware limit) prints one line,
``nmmc: error: ...``, and exits with code 2, writing nothing. ``nmmc verify`` (and ``tune --verify``)
exit 1 when a kernel fails verification.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import click

from . import __version__
from .cli_support import (
    EXIT_FAILED,
    NmmcGroup,
    choice,
    parse_params,
    progress_bar,
    schedule_options,
    target_option,
    workload_from,
    workload_options,
    write_atomic,
)
from .codegen import DEFAULT_DIALECT, DIALECTS
from .errors import InputError
from .report import cost_json, costed_lines, emit_lines, explain_lines, schedules_lines
from .targets import TARGETS, get_target

DIALECT_HELP = "NKI dialect: nki (NKI 0.3+, import nki) or neuronxcc (NKI 0.1, import neuronxcc.nki)."


@click.group(cls=NmmcGroup, context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.version_option(__version__, prog_name="nmmc")
def main() -> None:
    """nmmc, the NeuronMM compiler: lowers matmul graphs (GEMMs, SVD-compressed X·U·V chains,
    gated MLPs, graphs described in a graph file) to tuned NKI kernels for AWS Trainium, and
    verifies them on the CPU with its own NKI interpreter.

    \b
    Typical use:
      nmmc tune --shape 1024x2048x1024 -o gemm.py      # search a schedule, write its kernel
      nmmc verify gemm.py                               # run it in the interpreter vs NumPy
      nmmc tune --shape 512x8192x2048 --keep-ratio 0.8 -o chain.py           # fused X·U·V
      nmmc tune --mlp --tokens 128 --hidden 2048 --intermediate 8192 --keep-ratio 0.8 -o mlp.py
      nmmc tune --graph examples/graphs/lora.yaml --dim tokens=256 -o lora.py   # your own graph
      nmmc emit --shape 1024x2048x1024 -o gemm.py      # the kernel of a preset schedule
      nmmc cost --shape 1024x2048x1024                  # the cost model's figures for one schedule
      nmmc explain --shape 1024x2048x1024 --tuned      # passes, loop nest, cost formulas
      nmmc schedules --shape 1024x2048x1024             # presets and schedule parameters
      nmmc targets                                      # the hardware table
      nmmc bench gemm.py --append-csv m.csv             # on a Trainium host: measure a kernel
      nmmc calibrate m.csv -o trn1-cal.json             # fit the cost model; then --target trn1-cal.json
    """


def _compile_options(options: dict[str, Any], target: str) -> tuple[Any, Any]:
    """The workload and Target of a compile command's options."""
    return workload_from(options, target), get_target(target)


@main.command()
@workload_options
@schedule_options
@click.option("--dialect", default=DEFAULT_DIALECT, show_default=True, help=DIALECT_HELP)
@target_option
@click.option("-o", "--output", required=True, metavar="FILE", help="Kernel file to write ('-' for stdout).")
def emit(schedule_name: str | None, params: tuple[str, ...], pipeline: str | None, dialect: str, target: str,
         output: str, **options: Any) -> None:
    """Emit the NKI kernel(s) of a workload under a schedule preset (GEMM) or the default fused
    schedule (chains, MLPs, graphs), plus --param overrides."""
    from .driver import compile_workload

    wl, tgt = _compile_options(options, target)
    choice(dialect, DIALECTS, "dialect")
    result = compile_workload(wl, target=tgt, dialect=dialect, preset=schedule_name, params=parse_params(params),
                              pipeline=pipeline)
    if output == "-":
        click.echo(result.kernel.source, nl=False)
        return
    write_atomic(output, result.kernel.source)
    for line in emit_lines(result, output):
        click.echo(line)


@main.command()
@workload_options
@schedule_options
@target_option
@click.option("--json", "as_json", is_flag=True, help="Print the figures as JSON.")
def cost(schedule_name: str | None, params: tuple[str, ...], pipeline: str | None, target: str, as_json: bool,
         **options: Any) -> None:
    """Predict the cost of one schedule with the analytic model: latency and what bounds it, HBM
    traffic per tensor, DMA transfers, engine busy times, on-chip footprint and feasibility.
    A schedule that does not fit on chip is reported (feasible: false), not rejected."""
    from .driver import cost_workload

    wl, tgt = _compile_options(options, target)
    costed = cost_workload(wl, target=tgt, preset=schedule_name, params=parse_params(params), pipeline=pipeline)
    if as_json:
        click.echo(json.dumps(cost_json(wl, tgt, costed), indent=2))
        return
    for line in costed_lines(wl, tgt, costed):
        click.echo(line)


@main.command()
@workload_options
@target_option
@click.option("--trials", default=None, type=click.IntRange(min=1), help="Optuna trials [default: 150].")
@click.option("--seed", default=0, show_default=True, type=int, help="Seed of the search (same seed, same result).")
@click.option("--timeout", default=None, type=click.FloatRange(min=0.0),
              help="Stop the search after this many seconds (such a search is not cached).")
@click.option("--method", default="auto", show_default=True,
              help="auto (exhaustive when the space has at most --exhaustive-threshold schedules), optuna, "
                   "or exhaustive.")
@click.option("--exhaustive-threshold", default=None, type=click.IntRange(min=0),
              help="Largest space enumerated exhaustively by --method auto [default: 1000 for GEMMs, 200 for "
                   "fused graphs, whose schedules take longer to cost].")
@click.option("--top-k", default=5, show_default=True, type=click.IntRange(min=1), help="Runners-up to report.")
@click.option("--dialect", default=DEFAULT_DIALECT, show_default=True, help=DIALECT_HELP)
@click.option("--verify", "run_verify", is_flag=True, help="Also run the emitted kernel in the interpreter.")
@click.option("--progress/--no-progress", default=None,
              help="Progress bar on stderr [default: when stderr is a terminal].")
@click.option("--model", default=None, metavar="PATH",
              help="Tune a model's MLP for every --tokens bucket: a model directory (config.json), a config.json, "
                   "or an 'nmmc compress' output (its ranks). -o is then a directory: one kernel file per bucket "
                   "and index.json.")
@click.option("--storage", default=None, metavar="URL",
              help="Optuna storage making the search resumable and shareable: sqlite:///FILE.db, "
                   "journal:///FILE.log, or postgresql://USER:PASSWORD@HOST/DB (needs psycopg2).")
@click.option("--study", "study_name", default=None, metavar="NAME",
              help="Study name in --storage [default: derived from the workload, so a rerun resumes].")
@click.option("--workers", default=1, show_default=True, type=click.IntRange(min=1),
              help="Local worker processes sharing the study (needs --storage).")
@click.option("--report", "report_dir", default=None, metavar="DIR",
              help="Also write plots of the search (history, parameter importance, roofline) and a summary to DIR.")
@click.option("--lock", "lock_path", default=None, metavar="LOCKFILE",
              help="Record the chosen schedule in this lockfile (created if missing) for 'nmmc regress'.")
@click.option("--no-cache", is_flag=True, help="Search even if the result cache has an answer (and do not store one).")
@click.option("--cache-dir", default=None, metavar="DIR",
              help="Result cache directory [default: $NMMC_CACHE_DIR, else $XDG_CACHE_HOME/nmmc, else ~/.cache/nmmc].")
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")
@click.option("-o", "--output", required=True, metavar="FILE",
              help="Kernel file to write ('-' for stdout); with --model, the output directory.")
def tune(target: str, trials: int | None, seed: int, timeout: float | None, method: str,
         exhaustive_threshold: int | None, top_k: int, dialect: str, run_verify: bool, progress: bool | None,
         model: str | None, storage: str | None, study_name: str | None, workers: int, report_dir: str | None,
         lock_path: str | None, no_cache: bool, cache_dir: str | None, as_json: bool, output: str,
         **options: Any) -> None:
    """Search the schedule space with the cost model (Optuna TPE, or exhaustive for small spaces),
    write the NKI kernel(s) of the best schedule, and compare with the baselines at the same shape:
    AWS's fully optimized kernel for a GEMM; for chains and MLPs, the dense computation and the
    unfused SVD factors, each with AWS's kernel per matmul. With --model, do that for a model's MLP
    at every token bucket."""
    from .tuning import TuneRequest, run_model_tune, run_tune

    choice(dialect, DIALECTS, "dialect")
    choice(method, ("auto", "optuna", "exhaustive"), "search method")
    show = progress if progress is not None else (sys.stderr.isatty() and not as_json)
    request = TuneRequest(target=get_target(target), dialect=dialect, trials=trials, seed=seed, timeout=timeout,
                          method=None if method == "auto" else method, exhaustive_threshold=exhaustive_threshold,
                          top_k=top_k, storage=storage, study_name=study_name, workers=workers,
                          cache_dir=cache_dir, use_cache=not no_cache, progress=show)
    if model is not None:
        if lock_path or report_dir or storage:
            raise InputError("--lock, --report and --storage take single workloads; use them per --mlp bucket")
        ok = run_model_tune(model, options, request, target_name=target, verify=run_verify, as_json=as_json,
                            output=output, echo=click.echo)
    else:
        ok = run_tune(workload_from(options, target), request, verify=run_verify, lock_path=lock_path,
                      report_dir=report_dir, as_json=as_json, output=output, echo=click.echo)
    if not ok:
        sys.exit(EXIT_FAILED)


@main.command()
@workload_options
@schedule_options
@target_option
@click.option("--tuned", is_flag=True, help="Explain the schedule 'nmmc tune' would pick.")
@click.option("--seed", default=0, show_default=True, type=int, help="Seed of the search, with --tuned.")
def explain(schedule_name: str | None, params: tuple[str, ...], pipeline: str | None, target: str, tuned: bool,
            seed: int, **options: Any) -> None:
    """Show how a workload is compiled: the graph after each pass (with every annotation the passes
    wrote), each kernel's loop nest, and the cost model's formulas with the schedule's numbers."""
    from .driver import compile_workload
    from .driver import tune as run_search

    wl, tgt = _compile_options(options, target)
    if tuned and (schedule_name or params or pipeline):
        raise InputError("--tuned picks the schedule itself: drop --schedule/--param/--pipeline")
    compiled = (run_search(wl, target=tgt, seed=seed).compiled if tuned else
                compile_workload(wl, target=tgt, preset=schedule_name, params=parse_params(params), pipeline=pipeline))
    for line in explain_lines(compiled):
        click.echo(line)


@main.command()
@click.argument("model_dir", type=click.Path(file_okay=False))
@click.option("--keep-ratio", type=float, required=True, help="Fraction of each MLP weight's parameters kept.")
@click.option("--align", default=128, show_default=True, type=click.IntRange(min=1),
              help="Ranks are multiples of this (the tile size).")
@click.option("--rank-gate", type=click.IntRange(min=1), default=None, help="Override the gate projection's rank.")
@click.option("--rank-up", type=click.IntRange(min=1), default=None, help="Override the up projection's rank.")
@click.option("--rank-down", type=click.IntRange(min=1), default=None, help="Override the down projection's rank.")
@click.option("--factor-dtype", default="float32", show_default=True,
              help="dtype of the stored factors: float32, bfloat16, float16, or model (the model's torch_dtype).")
@click.option("--progress/--no-progress", default=None,
              help="Progress bar on stderr [default: when stderr is a terminal].")
@click.option("--json", "as_json", is_flag=True, help="Print the manifest as JSON.")
@click.option("-o", "--output", required=True, metavar="OUT_DIR", help="Directory for the factors and manifest.json.")
def compress(model_dir: str, keep_ratio: float, align: int, rank_gate: int | None, rank_up: int | None,
             rank_down: int | None, factor_dtype: str, progress: bool | None, as_json: bool, output: str) -> None:
    """Compress every MLP projection (gate, up, down) of the model in MODEL_DIR (config.json and
    safetensors weights) with block-aligned SVD: one safetensors file of factors per layer, and a
    manifest with ranks, parameter counts and reconstruction errors. Layer by layer, resumable: an
    interrupted run continues where it stopped."""
    from .models import compress_model

    ranks = {k: v for k, v in (("gate", rank_gate), ("up", rank_up), ("down", rank_down)) if v is not None}
    show = progress if progress is not None else (sys.stderr.isatty() and not as_json)
    bar_update, close = progress_bar(show)
    try:
        manifest = compress_model(model_dir, output, keep_ratio, align=align, ranks=ranks or None,
                                  dtype=factor_dtype,
                                  progress=(lambda done, total: bar_update(done, total, float("inf")))
                                  if bar_update else None)
    finally:
        close()
    if as_json:
        from pathlib import Path

        from .models.manifest import MANIFEST_FILE

        click.echo((Path(output) / MANIFEST_FILE).read_text())
        return
    click.echo(f"{manifest.model.describe()}")
    click.echo(f"  ranks gate/up/down {'/'.join(str(r) for r in manifest.ranks.values())}, "
               f"MLP parameters {manifest.params_before} -> {manifest.params_after} "
               f"(kept {manifest.kept_fraction:.3f}, compression {manifest.compression_ratio:.2f}x)")
    worst = max(p.relative_error for layer in manifest.layers for p in layer.projections.values())
    click.echo(f"  worst relative reconstruction error {worst:.4f}")
    click.echo(f"wrote {len(manifest.layers)} layer files and manifest.json to {output}")


@main.command()
@click.argument("file", type=click.Path(dir_okay=False))
@click.option("--seed", default=0, show_default=True, type=int, help="Seed of the random inputs.")
@click.option("--target", default=None, help="Check limits of this target instead of the one in the file.")
@click.option("--backend", default="interpreter", show_default=True,
              type=click.Choice(["interpreter", "nki-simulator"]),
              help="Run the kernels in nmmc's interpreter, or in AWS's NKI simulator (needs the file's NKI package: "
                   "nki for --dialect nki, neuronx-cc for neuronxcc; from AWS's Neuron pip index).")
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON.")
def verify(file: str, seed: int, target: str | None, backend: str, as_json: bool) -> None:
    """Run an emitted kernel FILE on random inputs (every kernel of the file, in order), compare with a
    float64 NumPy evaluation of its graph, and print the relative error and, in the interpreter, its
    counters (HBM bytes, DMA transfers, matmuls, peak SBUF/PSUM).

    The interpreter checks Trainium's tile limits and SBUF/PSUM capacity as well; --backend
    nki-simulator runs the file under AWS's own simulator instead (same inputs, reference and
    tolerance; it checks no capacity and keeps no counters).

    Exits 0 when the kernel is within tolerance (bf16 1e-2, fp32 1e-5), 1 on a mismatch or a
    violated hardware limit, 2 when FILE is not an nmmc kernel or the backend's package is missing."""
    from .verification import verify_file

    report = verify_file(file, seed=seed, target=get_target(target) if target else None, backend=backend)
    if as_json:
        click.echo(json.dumps(report.as_dict(), indent=2, sort_keys=True))
    else:
        status = "OK" if report.ok else "FAILED"
        where = "" if backend == "interpreter" else f", {backend}"
        click.echo(f"{status}: {file} ({report.kernel}, {report.dialect}, {report.target}, seed {report.seed}{where})")
        if report.rel_error is not None:
            click.echo(f"  relative error {report.rel_error:.3e} (tolerance {report.tolerance:.0e}), "
                       f"max abs error {report.max_abs_error:.3e}")
        if report.error:
            click.echo(f"  {report.error}")
        c = report.counters
        if c:
            reads = {k: v for k, v in c["hbm_bytes_read"].items() if v}
            writes = {k: v for k, v in c["hbm_bytes_written"].items() if v}
            click.echo(f"  HBM read {c['total_hbm_bytes_read']} B {reads}, written {c['total_hbm_bytes_written']} B "
                       f"{writes}")
            click.echo(f"  DMA transfers {c['dma_transfers']} (transposing {c['dma_transposes']}), "
                       f"matmuls {c['matmul_instructions']}, TensorE transposes {c['transposes']}")
            click.echo(f"  peak SBUF {c['sbuf_peak_bytes']} B/partition, PSUM {c['psum_peak_banks']} banks")
    sys.exit(0 if report.ok else EXIT_FAILED)


@main.command()
@workload_options
@target_option
@click.option("--json", "as_json", is_flag=True, help="Print as JSON.")
def schedules(target: str, as_json: bool, **options: Any) -> None:
    """List the named schedules of a workload (a GEMM's presets, a fused graph's default) with
    their parameters and on-chip footprint, and the parameters --param can set."""
    from .driver import named_schedules

    wl, tgt = _compile_options(options, target)
    rows, specs = named_schedules(wl, tgt)
    space = [{"name": p.name, "type": p.kind.__name__, "choices": list(p.choices) if p.choices else None,
              "help": p.help} for p in specs]
    if as_json:
        click.echo(json.dumps({"workload": wl.describe(), "target": tgt.name, "presets": rows,
                               "parameters": space}, indent=2))
        return
    for line in schedules_lines(wl, tgt, rows, space):
        click.echo(line)


@main.command()
@click.argument("lockfile", type=click.Path(dir_okay=False))
@click.option("--tolerance", default=0.02, show_default=True, type=click.FloatRange(min=0.0),
              help="Relative change of predicted latency (and fresh-search gain) that fails an entry.")
@click.option("--update", is_flag=True, help="Rewrite the lockfile with today's schedules and predictions.")
@click.option("--no-search", is_flag=True, help="Skip the fresh search (no stale-lock check).")
@click.option("--no-verify", is_flag=True, help="Skip running the kernels in the interpreter.")
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON.")
def regress(lockfile: str, tolerance: float, update: bool, no_search: bool, no_verify: bool, as_json: bool) -> None:
    """Re-derive every schedule of a lockfile and check it: still valid and fitting on chip, its
    kernel still verifies in the interpreter, the target table unchanged, its predicted latency
    within --tolerance, and no fresh search (same seed and trials) better by more than --tolerance.

    Exits 0 when every entry passes, 1 when one fails (with the reasons), 2 on a bad lockfile.
    With --update, rewrites the lockfile and exits 1 only if an entry could not be repaired."""
    from .artifacts.lockfile import Lockfile
    from .artifacts.regress import regress as run_regress
    from .artifacts.regress import update_lock

    if not Path(lockfile).is_file():
        raise InputError(f"lockfile not found: {lockfile} (create one with 'nmmc tune ... --lock {lockfile}')")
    lock = Lockfile.load(lockfile)
    report = run_regress(lock, tolerance=tolerance, search=not no_search, verify=not no_verify)
    if as_json:
        click.echo(json.dumps(report.as_dict(), indent=2))
    else:
        click.echo(report.table())
    if update:
        updated = update_lock(lock, report)
        updated.save(lockfile)
        stuck = [r for r in report.failures if updated.entries.get(r.entry.key) == r.entry]
        click.echo(f"updated {lockfile}" + (f"; {len(stuck)} entr{'y' if len(stuck) == 1 else 'ies'} could not "
                                            "be repaired" if stuck else ""), err=as_json)
        sys.exit(EXIT_FAILED if stuck else 0)
    if not report.ok:
        click.echo(f"{len(report.failures)} of {len(report.results)} entries failed", err=True)
        sys.exit(EXIT_FAILED)


@main.command()
@click.argument("source", metavar="STUDY_OR_LOCK")
@click.option("--study", "study_name", default=None, metavar="NAME",
              help="Study to report when STUDY_OR_LOCK is a storage URL holding several.")
@click.option("-o", "--output", required=True, metavar="DIR", help="Directory for the PNG plots and summary.md.")
def report(source: str, study_name: str | None, output: str) -> None:
    """Plot a search or a lockfile, with a Markdown summary.

    STUDY_OR_LOCK is an Optuna storage URL written by 'nmmc tune --storage' (sqlite:///FILE.db,
    journal:///FILE.log, postgresql://...): optimization history, parameter importance and a roofline
    chart (arithmetic intensity vs predicted throughput, with the target's compute and bandwidth
    ceilings) placing the chosen schedule among every evaluated one. Or a lockfile: a roofline chart
    of its schedules and their predicted latencies."""
    if "://" not in source:
        from .artifacts.lockfile import Lockfile
        from .artifacts.report import write_lock_report

        if not Path(source).is_file():
            raise InputError(f"lockfile not found: {source} (or give a storage URL such as sqlite:///tune.db)")
        paths = write_lock_report(Lockfile.load(source), out_dir=Path(output))
    else:
        paths = _study_report(source, study_name, Path(output))
    click.echo(f"wrote {', '.join(p.name for p in paths)} to {output}")


def optuna_load_study(name: str, storage: Any) -> Any:
    import optuna

    return optuna.load_study(study_name=name, storage=storage)


def _study_report(url: str, study_name: str | None, out_dir: Path) -> list[Path]:
    """Rebuild the search of a stored study (no new trials) and plot it."""
    import optuna

    from .artifacts.report import write_report
    from .driver import tune_cached
    from .search.storage import open_storage
    from .workloads import workload_from_dict

    storage = open_storage(url)
    names = [s.study_name for s in optuna.get_all_study_summaries(storage)]
    if study_name is None:
        if len(names) != 1:
            raise InputError(f"{url} holds {len(names)} studies; choose one with --study: {', '.join(names)}")
        study_name = names[0]
    if study_name not in names:
        raise InputError(f"no study {study_name!r} in {url}; studies: {', '.join(names) or 'none'}")
    study = optuna.load_study(study_name=study_name, storage=storage)
    attrs = study.user_attrs
    if "nmmc_workload" not in attrs:
        raise InputError(f"study {study_name!r} was not written by 'nmmc tune' (no workload recorded)")
    wl = workload_from_dict(attrs["nmmc_workload"])
    tgt = get_target(attrs.get("nmmc_target", "trn1"))
    done = sum(t.state == optuna.trial.TrialState.COMPLETE for t in study.trials)
    tuned, _ = tune_cached(wl, target=tgt, dialect=attrs.get("nmmc_dialect", DEFAULT_DIALECT), cache=None,
                           exhaustive_threshold=0, trials=max(done, 1), seed=0, method="optuna", storage=url,
                           study_name=study_name)
    return write_report(tuned.search, target=tgt, out_dir=out_dir, title=f"{wl.describe()} (study {study_name})",
                        candidates=tuned.search.candidates or None)


@main.group()
def cache() -> None:
    """The result cache of 'nmmc tune': tuning decisions (schedules, never code) keyed by the graph's
    structure, target, dialect, cost-model and nmmc versions."""


def _cache(cache_dir: str | None) -> Any:
    from .artifacts.cache import ResultCache

    return ResultCache(Path(cache_dir) if cache_dir else None)


_cache_dir_option = click.option(
    "--cache-dir", default=None, metavar="DIR",
    help="Cache directory [default: $NMMC_CACHE_DIR, $XDG_CACHE_HOME/nmmc, ~/.cache/nmmc].")


@cache.command("list")
@_cache_dir_option
@click.option("--json", "as_json", is_flag=True, help="Print as JSON.")
def cache_list(cache_dir: str | None, as_json: bool) -> None:
    """List the cached tuning decisions."""
    store = _cache(cache_dir)
    records = store.list()
    for warning in store.warnings:
        click.echo(f"nmmc: warning: {warning}", err=True)
    if as_json:
        click.echo(json.dumps([json.loads(r.to_json()) for r in records], indent=2))
        return
    click.echo(f"{len(records)} entries in {store.tune_dir}")
    for r in records:
        click.echo(f"  {r.key[:12]}  {r.target:<5} {r.dialect:<9} {r.latency_us:10.2f} us  {r.workload}")


@cache.command("show")
@click.argument("key_prefix")
@_cache_dir_option
def cache_show(key_prefix: str, cache_dir: str | None) -> None:
    """Print one cached decision (KEY_PREFIX: the start of its key)."""
    click.echo(_cache(cache_dir).show(key_prefix).to_json())


@cache.command("clear")
@_cache_dir_option
def cache_clear(cache_dir: str | None) -> None:
    """Delete every cached decision."""
    store = _cache(cache_dir)
    click.echo(f"removed {store.clear()} entries from {store.tune_dir}")


@main.command()
@click.option("--json", "as_json", is_flag=True, help="Print as JSON.")
def targets(as_json: bool) -> None:
    """Print the hardware table nmmc uses (per NeuronCore)."""
    if as_json:
        click.echo(json.dumps({name: t.as_dict() for name, t in TARGETS.items()}, indent=2))
        return
    for name, tgt in TARGETS.items():
        click.echo(f"{name}: {tgt.description}")
        for key, value in tgt.summary_rows():
            click.echo(f"  {key:<22} {value}")


@main.command()
@click.argument("measurements", type=click.Path(dir_okay=False))
@click.option("--target", default="trn1", show_default=True,
              help="The target to calibrate (trn1, trn2, trn3), or a calibrated target file to refine.")
@click.option("--fit", default=None, metavar="NAME,...",
              help="The parameters to fit [default: dma_fixed_cost_us, dma_transpose_efficiency, "
                   "dma_bandwidth_efficiency, tensor_engine_efficiency, matmul_fp32_factor, "
                   "engine_instruction_cycles]; also engine_access_cycles, matmul_min_cycles, "
                   "transpose_min_cycles, dma_queues_in_flight.")
@click.option("--max-iter", default=100, show_default=True, type=click.IntRange(min=1),
              help="Levenberg-Marquardt iterations at most.")
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON.")
@click.option("-o", "--output", required=True, metavar="FILE.json",
              help="Calibrated target file to write; give it to --target of any command.")
def calibrate(measurements: str, target: str, fit: str | None, max_iter: int, as_json: bool, output: str) -> None:
    """Fit the cost model's efficiency parameters to measured latencies.

    MEASUREMENTS is a CSV with a header and one row per measurement: 'kernel' (an emitted kernel file,
    relative to the CSV's directory) and 'latency_us' (its measured latency in microseconds), as
    'nmmc bench --append-csv' writes it. Every kernel is rebuilt from its metadata and predicted by
    the cost model; a Levenberg-Marquardt least-squares fit of log(predicted/measured) refits the
    chosen parameters. Prints each measurement with its prediction before and after and the RMS
    relative error, and writes the calibrated target (see docs/calibration.md)."""
    from .calibration.fit import DEFAULT_FIT
    from .calibration.run import calibrate as run_calibration
    from .target_file import target_file_text

    names = DEFAULT_FIT if fit is None else tuple(n.strip() for n in fit.split(",") if n.strip())
    report = run_calibration(measurements, get_target(target), output=output, fit=names, max_iter=max_iter)
    write_atomic(output, target_file_text(report.target))
    if as_json:
        click.echo(json.dumps(report.as_dict(), indent=2))
        return
    for line in report.lines():
        click.echo(line)
    click.echo(f"wrote {output}; use it with --target {output}")


@main.command()
@click.argument("file", type=click.Path(dir_okay=False))
@click.option("--warmup", default=10, show_default=True, type=click.IntRange(min=0), help="Untimed runs per kernel.")
@click.option("--iters", default=100, show_default=True, type=click.IntRange(min=1), help="Timed runs per kernel.")
@click.option("--target", default=None,
              help="Target whose cost model predicts the kernel [default: the file's]; a calibrated target file "
                   "compares with its fit.")
@click.option("--append-csv", default=None, metavar="CSV",
              help="Append the measurement to this CSV (created with a header if missing), for 'nmmc calibrate'.")
@click.option("--json", "as_json", is_flag=True, help="Print the measurements as JSON.")
def bench(file: str, warmup: int, iters: int, target: str | None, append_csv: str | None, as_json: bool) -> None:
    """Benchmark an emitted kernel FILE on this host's Neuron device with AWS's benchmark API
    (needs a Trainium instance and the file's NKI package), and print the median, p10 and p90
    latencies next to the cost model's prediction. With --append-csv, record the measurement in the
    format 'nmmc calibrate' reads: bench, calibrate, then --target the calibrated file."""
    from .calibration.bench import bench_file
    from .calibration.measurements import appended_text, check_appendable

    if append_csv:
        check_appendable(append_csv)  # fail before the device time is spent
    report = bench_file(file, warmup=warmup, iters=iters, target=get_target(target) if target else None)
    if append_csv:
        write_atomic(append_csv, appended_text(append_csv, report.csv_values(append_csv)))
    if as_json:
        click.echo(json.dumps(report.as_dict(), indent=2))
        return
    for line in report.lines():
        click.echo(line)
    if append_csv:
        click.echo(f"appended to {append_csv}")


from .opt_command import opt  # noqa: E402

main.add_command(opt)

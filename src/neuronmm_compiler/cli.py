"""The ``nmmc`` command line.

Every user error (bad shape, unknown name, a schedule over a hardware limit) prints one line,
``nmmc: error: ...``, and exits with code 2, writing nothing. ``nmmc verify`` exits 1 when a kernel
fails verification.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click

from . import __version__
from .codegen import DEFAULT_DIALECT, DIALECTS
from .errors import InputError, NmmcError
from .ir import A_LAYOUTS, parse_shape
from .schedule import PARAMS, PRESETS, GemmProblem, lower_gemm, preset, preset_doc
from .targets import DEFAULT_TARGET, TARGETS, get_target

EXIT_USAGE = 2
EXIT_FAILED = 1


class _Group(click.Group):
    """Turn click's usage errors and nmmc's user errors into one line and exit code 2."""

    def main(self, *args: Any, **kwargs: Any) -> Any:  # type: ignore[override]
        kwargs["standalone_mode"] = False
        try:
            return super().main(*args, **kwargs)
        except click.exceptions.Exit as exc:
            sys.exit(exc.exit_code)
        except click.exceptions.Abort:
            click.echo("nmmc: aborted", err=True)
            sys.exit(EXIT_FAILED)
        except click.UsageError as exc:
            cmd = f" {exc.ctx.info_name}" if exc.ctx and exc.ctx.parent else ""
            click.echo(f"nmmc: error: {exc.format_message()} (see 'nmmc{cmd} --help')", err=True)
            sys.exit(EXIT_USAGE)
        except NmmcError as exc:
            click.echo(f"nmmc: error: {exc}", err=True)
            sys.exit(EXIT_USAGE)


def _write_atomic(path: str, text: str) -> None:
    """Write the whole file or nothing: a temporary file in the same directory, then a rename."""
    target = Path(path)
    directory = target.parent if str(target.parent) else Path(".")
    if not directory.is_dir():
        raise InputError(f"cannot write {path!r}: directory {str(directory)!r} does not exist")
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=directory)
    try:
        with os.fdopen(fd, "w") as handle:
            handle.write(text)
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _parse_params(values: tuple[str, ...]) -> dict[str, str]:
    params: dict[str, str] = {}
    for item in values:
        key, sep, value = item.partition("=")
        if not sep or not key.strip() or not value.strip():
            raise InputError(f"--param takes key=value (e.g. tiles_in_block_m=4); got {item!r}")
        params[key.strip()] = value.strip()
    return params


def _choice(value: str, accepted: dict[str, Any] | tuple[str, ...], what: str) -> str:
    if value not in accepted:
        raise InputError(f"unknown {what} {value!r}; accepted: {', '.join(accepted)}")
    return value


def _problem_options(fn: Callable[..., Any]) -> Callable[..., Any]:
    fn = click.option("--a-layout", default="mk", show_default=True,
                      help="How A is stored in HBM: mk = row-major [M,K] (activations), km = transposed [K,M].")(fn)
    fn = click.option("--dtype", default="bf16", show_default=True,
                      help="Element type of A, B and C: bf16 (bfloat16) or fp32 (float32).")(fn)
    fn = click.option("--shape", required=True, metavar="MxNxK",
                      help="GEMM C[M,N] = A[M,K] @ B[K,N], e.g. 1024x2048x512.")(fn)
    return fn


def _problem(shape: str, dtype: str, a_layout: str) -> GemmProblem:
    from .ir import canonical_dtype

    m, n, k = parse_shape(shape)
    return GemmProblem(m, n, k, dtype=canonical_dtype(dtype), a_layout=_choice(a_layout, A_LAYOUTS, "A layout"))


def _schedule_options(fn: Callable[..., Any]) -> Callable[..., Any]:
    fn = click.option("--param", "params", multiple=True, metavar="KEY=VALUE",
                      help="Override one schedule parameter; repeatable. See 'nmmc schedules'.")(fn)
    fn = click.option("--schedule", "schedule_name", default=None, metavar="PRESET",
                      help=f"Schedule preset: {', '.join(PRESETS)} (default aws-fully-optimized).")(fn)
    return fn


def _target_option(fn: Callable[..., Any]) -> Callable[..., Any]:
    return click.option("--target", default=DEFAULT_TARGET, show_default=True,
                        help=f"Hardware: {', '.join(TARGETS)}.")(fn)


@click.group(cls=_Group, context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.version_option(__version__, prog_name="nmmc")
def main() -> None:
    """nmmc, the NeuronMM compiler: lowers matmul graphs to NKI kernels for AWS Trainium,
    and verifies them on the CPU with its own NKI interpreter.

    \b
    Typical use:
      nmmc tune --shape 1024x2048x1024 -o gemm.py     # search a schedule, write its kernel
      nmmc verify gemm.py                              # run it in the interpreter vs NumPy
      nmmc emit --shape 1024x2048x1024 -o gemm.py     # the kernel of a preset schedule
      nmmc cost --shape 1024x2048x1024                 # the cost model's figures for one schedule
      nmmc explain --shape 1024x2048x1024 --tuned     # passes, loop nest, cost formulas
      nmmc schedules --shape 1024x2048x1024            # presets and schedule parameters
      nmmc targets                                     # the hardware table
    """


@main.command()
@_problem_options
@_schedule_options
@click.option("--dialect", default=DEFAULT_DIALECT, show_default=True,
              help="NKI dialect: nki (NKI 0.3+, import nki) or neuronxcc (NKI 0.1, import neuronxcc.nki).")
@_target_option
@click.option("-o", "--output", required=True, metavar="FILE", help="Kernel file to write ('-' for stdout).")
def emit(shape: str, dtype: str, a_layout: str, schedule_name: str | None, params: tuple[str, ...],
         dialect: str, target: str, output: str) -> None:
    """Emit the NKI kernel of a GEMM under a schedule preset (plus --param overrides)."""
    from .compiler import compile_gemm

    m, n, k = parse_shape(shape)
    _choice(dialect, DIALECTS, "dialect")
    result = compile_gemm(m, n, k, dtype=dtype, a_layout=a_layout, target=target, dialect=dialect,
                          schedule=schedule_name, params=_parse_params(params))
    if output == "-":
        click.echo(result.kernel.source, nl=False)
        return
    _write_atomic(output, result.kernel.source)
    click.echo(f"wrote {output}: {result.program.name} for {result.problem.describe()}")
    click.echo(f"  target {result.target.name}, dialect {dialect}, schedule {result.schedule_name}")
    click.echo(f"  {result.footprint.describe()}")
    click.echo(f"  predicted {result.cost.latency_us:.1f} us ({result.cost.bound}-bound)")


@main.command()
@_problem_options
@_schedule_options
@_target_option
@click.option("--json", "as_json", is_flag=True, help="Print the figures as JSON.")
def cost(shape: str, dtype: str, a_layout: str, schedule_name: str | None, params: tuple[str, ...],
         target: str, as_json: bool) -> None:
    """Predict the cost of one schedule with the analytic model: latency and what bounds it, HBM
    traffic per tensor, DMA transfers, engine busy times, on-chip footprint and feasibility.
    A schedule that does not fit on chip is reported (feasible: false), not rejected."""
    from .compiler import lower_frontend, resolve_schedule
    from .cost_model import estimate
    from .report import cost_lines

    m, n, k = parse_shape(shape)
    tgt = get_target(target)
    lowered = lower_frontend(m, n, k, dtype=dtype, a_layout=a_layout)
    sched = resolve_schedule(lowered.problem, schedule_name, _parse_params(params), tgt)
    report = estimate(lower_gemm(lowered.problem, sched), tgt)
    if as_json:
        data = {"problem": lowered.problem.describe(), "target": tgt.name, "schedule": sched.as_dict(),
                **report.as_dict()}
        click.echo(json.dumps(data, indent=2))
        return
    click.echo(f"{lowered.problem.describe()} on {tgt.name}")
    click.echo(f"schedule {schedule_name or 'aws-fully-optimized'}: {sched.describe()}")
    for line in cost_lines(report):
        click.echo(f"  {line}")


def _progress_bar(enabled: bool) -> tuple[Callable[[int, int, float], None] | None, Callable[[], None]]:
    if not enabled:
        return None, lambda: None
    from tqdm import tqdm

    bar = tqdm(total=0, desc="tuning", unit="trial", file=sys.stderr, leave=False)

    def update(done: int, total: int, best: float) -> None:
        bar.total = total
        bar.n = done
        bar.set_postfix_str(f"best {best:.1f} us" if best != float("inf") else "no fit yet", refresh=False)
        bar.refresh()

    return update, bar.close


@main.command()
@_problem_options
@_target_option
@click.option("--trials", default=None, type=click.IntRange(min=1), help="Optuna trials [default: 150].")
@click.option("--seed", default=0, show_default=True, type=int, help="Seed of the search (same seed, same result).")
@click.option("--timeout", default=None, type=click.FloatRange(min=0.0),
              help="Stop the search after this many seconds.")
@click.option("--method", default="auto", show_default=True,
              help="auto (exhaustive when the space has at most --exhaustive-threshold schedules), optuna, "
                   "or exhaustive.")
@click.option("--exhaustive-threshold", default=None, type=click.IntRange(min=0),
              help="Largest space enumerated exhaustively by --method auto [default: 1000].")
@click.option("--top-k", default=5, show_default=True, type=click.IntRange(min=1), help="Runners-up to report.")
@click.option("--dialect", default=DEFAULT_DIALECT, show_default=True,
              help="NKI dialect of the kernel: nki (NKI 0.3+) or neuronxcc (NKI 0.1).")
@click.option("--verify", "run_verify", is_flag=True, help="Also run the emitted kernel in the interpreter.")
@click.option("--progress/--no-progress", default=None,
              help="Progress bar on stderr [default: when stderr is a terminal].")
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")
@click.option("-o", "--output", required=True, metavar="FILE", help="Kernel file to write ('-' for stdout).")
def tune(shape: str, dtype: str, a_layout: str, target: str, trials: int | None, seed: int,
         timeout: float | None, method: str, exhaustive_threshold: int | None, top_k: int, dialect: str,
         run_verify: bool, progress: bool | None, as_json: bool, output: str) -> None:
    """Search the schedule space with the cost model (Optuna TPE, or exhaustive for small spaces),
    write the NKI kernel of the best schedule, and compare it with AWS's fully optimized kernel
    (aws-fully-optimized) at the same shape."""
    from .compiler import tune as run_tune
    from .report import tune_lines
    from .search import DEFAULT_EXHAUSTIVE_THRESHOLD, DEFAULT_TRIALS

    m, n, k = parse_shape(shape)
    _choice(dialect, DIALECTS, "dialect")
    _choice(method, ("auto", "optuna", "exhaustive"), "search method")
    show = progress if progress is not None else (sys.stderr.isatty() and not as_json)
    update, close = _progress_bar(show)
    try:
        tuned = run_tune(m, n, k, dtype=dtype, a_layout=a_layout, target=target, dialect=dialect,
                         trials=trials or DEFAULT_TRIALS, seed=seed, timeout=timeout, top_k=top_k,
                         exhaustive_threshold=DEFAULT_EXHAUSTIVE_THRESHOLD if exhaustive_threshold is None
                         else exhaustive_threshold,
                         method=None if method == "auto" else method, progress=update)
    finally:
        close()
    report = None
    if run_verify:
        from .verification import verify_source

        report = verify_source(tuned.compiled.kernel.source, filename=output)
    if output != "-":
        _write_atomic(output, tuned.compiled.kernel.source)
    if as_json:
        speedup = tuned.speedup_vs_baseline
        data = {
            "problem": tuned.compiled.problem.describe(),
            "target": tuned.compiled.target.name,
            "schedule": tuned.compiled.schedule.as_dict(),
            "predicted": tuned.compiled.cost.as_dict(),
            "baseline": {"schedule": "aws-fully-optimized", **tuned.baseline.as_dict()},
            "speedup_vs_baseline": speedup,
            "search": tuned.search.search_summary(),
            "top": [{"latency_us": c.latency_us, "schedule": c.schedule.as_dict()} for c in tuned.search.top],
            "output": output,
        }
        if report is not None:
            data["verify"] = report.as_dict()
        click.echo(json.dumps(data, indent=2))
    else:
        if output == "-":
            click.echo(tuned.compiled.kernel.source, nl=False)
        else:
            for line in tune_lines(tuned):
                click.echo(line)
            click.echo(f"wrote {output}")
        if report is not None:
            status = "verified" if report.ok else "VERIFICATION FAILED"
            rel = f"{report.rel_error:.3e}" if report.rel_error is not None else "n/a"
            click.echo(f"{status}: relative error {rel}"
                       + (f"; {report.error}" if report.error else ""), err=output == "-")
    if report is not None and not report.ok:
        sys.exit(EXIT_FAILED)


@main.command()
@_problem_options
@_schedule_options
@_target_option
@click.option("--tuned", is_flag=True, help="Explain the schedule 'nmmc tune' would pick instead of a preset.")
@click.option("--seed", default=0, show_default=True, type=int, help="Seed of the search, with --tuned.")
def explain(shape: str, dtype: str, a_layout: str, schedule_name: str | None, params: tuple[str, ...],
            target: str, tuned: bool, seed: int) -> None:
    """Show how a GEMM is compiled: the graph after each pass, the chosen schedule as a loop nest,
    and the cost model's formulas with this schedule's numbers plugged in."""
    from .compiler import compile_gemm
    from .compiler import tune as run_tune
    from .report import explain_lines

    m, n, k = parse_shape(shape)
    if tuned:
        if schedule_name or params:
            raise InputError("--tuned picks the schedule itself: drop --schedule/--param")
        compiled = run_tune(m, n, k, dtype=dtype, a_layout=a_layout, target=target, seed=seed).compiled
    else:
        compiled = compile_gemm(m, n, k, dtype=dtype, a_layout=a_layout, target=target,
                                schedule=schedule_name, params=_parse_params(params))
    for line in explain_lines(compiled):
        click.echo(line)


@main.command()
@click.argument("file", type=click.Path(dir_okay=False))
@click.option("--seed", default=0, show_default=True, type=int, help="Seed of the random inputs.")
@click.option("--target", default=None, help="Check limits of this target instead of the one in the file.")
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON.")
def verify(file: str, seed: int, target: str | None, as_json: bool) -> None:
    """Run an emitted kernel FILE in the CPU interpreter on random inputs, compare it with a float64
    NumPy evaluation of its graph, and print the relative error and the interpreter's counters.

    Exits 0 when the kernel is within tolerance (bf16 1e-2, fp32 1e-5), 1 on a mismatch or a
    violated hardware limit, 2 when FILE is not an nmmc kernel."""
    from .verification import verify_file

    report = verify_file(file, seed=seed, target=get_target(target) if target else None)
    if as_json:
        click.echo(json.dumps(report.as_dict(), indent=2, sort_keys=True))
    else:
        status = "OK" if report.ok else "FAILED"
        click.echo(f"{status}: {file} ({report.kernel}, {report.dialect}, {report.target}, seed {report.seed})")
        if report.rel_error is not None:
            click.echo(f"  relative error {report.rel_error:.3e} (tolerance {report.tolerance:.0e}), "
                       f"max abs error {report.max_abs_error:.3e}")
        if report.error:
            click.echo(f"  {report.error}")
        c = report.counters
        if c:
            click.echo(f"  HBM read {c['total_hbm_bytes_read']} B {c['hbm_bytes_read']}, "
                       f"written {c['total_hbm_bytes_written']} B {c['hbm_bytes_written']}")
            click.echo(f"  DMA transfers {c['dma_transfers']} (transposing {c['dma_transposes']}), "
                       f"matmuls {c['matmul_instructions']}, TensorE transposes {c['transposes']}")
            click.echo(f"  peak SBUF {c['sbuf_peak_bytes']} B/partition, PSUM {c['psum_peak_banks']} banks")
    sys.exit(0 if report.ok else EXIT_FAILED)


@main.command()
@_problem_options
@click.option("--target", default=DEFAULT_TARGET, show_default=True, help=f"Hardware: {', '.join(TARGETS)}.")
@click.option("--json", "as_json", is_flag=True, help="Print as JSON.")
def schedules(shape: str, dtype: str, a_layout: str, target: str, as_json: bool) -> None:
    """List the schedule presets for a GEMM shape (their parameters and on-chip footprint) and the
    parameters of the schedule space that --param can set."""
    from .cost_model.footprint import footprint

    problem = _problem(shape, dtype, a_layout)
    tgt = get_target(target)
    rows = []
    for name in PRESETS:
        sched = preset(name, problem)
        fp = footprint(lower_gemm(problem, sched), tgt)
        rows.append({"name": name, "description": preset_doc(name), "params": sched.as_dict(),
                     "sbuf_bytes_per_partition": fp.sbuf_bytes_per_partition, "psum_banks": fp.psum_banks,
                     "fits": fp.fits})
    space = [{"name": p.name, "type": p.kind.__name__, "choices": list(p.choices) if p.choices else None,
              "help": p.help} for p in PARAMS]
    if as_json:
        click.echo(json.dumps({"problem": problem.describe(), "target": tgt.name, "presets": rows,
                               "parameters": space}, indent=2))
        return
    click.echo(f"{problem.describe()}; target {tgt.name}")
    click.echo("\npresets:")
    for row in rows:
        fits = "fits" if row["fits"] else "DOES NOT FIT"
        click.echo(f"  {row['name']}: {row['description']}")
        click.echo("    " + " ".join(f"{k}={v}" for k, v in row["params"].items()))
        click.echo(f"    SBUF {row['sbuf_bytes_per_partition']} B/partition, PSUM {row['psum_banks']} banks: {fits}")
    click.echo("\nparameters (--param KEY=VALUE):")
    for p in space:
        accepted = ", ".join(p["choices"]) if p["choices"] else p["type"]
        click.echo(f"  {p['name']:<18} {p['help']} [{accepted}]")


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

"""Commands that run an emitted kernel: ``nmmc verify`` (interpreter or AWS's simulator) and ``nmmc
bench`` (a Neuron device)."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import click

from ..support import KNOWN_SDKS, LATER_SDKS, NEURONXCC_REMOVED_IN, SUPPORT
from .options import EXIT_FAILED
from .tp import tp_verify
from .views import echo_lines, verify_lines

SDK_HELP = (
    "Neuron SDK release whose NKI rules the static pass checks (rules bounded by release, e.g. neuronxcc.nki "
    "imports are an error from 2.30, nisa.sendrecv is deprecated for nki.lnc.sendrecv from 2.34; docs/nki-rules.md). "
    "Default: the release the file was emitted for, where its header records one (a kernel whose programs exchange), "
    "else the newest release that supports the file's dialect on its target ("
    + "; ".join(f"{s.dialect} on {'/'.join(s.targets)}: {s.sdk_max}" for s in SUPPORT)
    + "; where no release supports the pairing, e.g. nki on trn1, the newest that has the dialect). A neuronxcc file "
    "on " + NEURONXCC_REMOVED_IN + " or later is refused with the reason: that release removes neuronxcc.nki"
    + ("" if not LATER_SDKS else "; " + ", ".join(LATER_SDKS) + " is refused: nmmc's rule book stops at "
       + KNOWN_SDKS[-1]) + ".")


def dir_verify(fn: Any) -> Any:
    """Let ``nmmc verify`` take an export package or a ``tune --model`` directory (or their manifest/index)."""
    import functools

    @functools.wraps(fn)
    def run(file: str, seed: int, target: str | None, backend: str, sdk: str | None, as_json: bool,
            max_memory: str | None = None) -> Any:
        from ..errors import InputError
        from ..export.verify import is_model_dir, verify_dir
        from ..tensor_parallel.plan import is_plan
        from ..verification.memory import parse_size

        if not is_model_dir(file):
            if Path(file).is_dir() and not is_plan(file):  # a plan's directory goes on to tp_verify
                raise InputError(f"{file} is a directory but neither an 'nmmc export' package (manifest.json), a "
                                 "'tune --model' output (index.json) nor a tensor-parallel plan (plan.json)")
            return fn(file=file, seed=seed, target=target, backend=backend, sdk=sdk, as_json=as_json,
                      max_memory=max_memory)
        if backend != "interpreter" or target or sdk:
            raise InputError("verify of a directory runs nmmc's interpreter on each file's own target; drop "
                             "--backend/--target/--sdk")
        report = verify_dir(file, seed=seed, max_memory=parse_size(max_memory) if max_memory else None)
        if as_json:
            click.echo(json.dumps(report.as_dict(), indent=2, sort_keys=True))
        else:
            echo_lines(report.lines(file))
        sys.exit(0 if report.ok else EXIT_FAILED)

    return run


@click.command()
@click.argument("file", type=click.Path())
@click.option("--seed", default=0, show_default=True, type=click.IntRange(min=0),
              help="Seed of the random inputs (a non-negative integer).")
@click.option("--target", default=None,
              help="Check limits and NKI rules of this target instead of the one in the file.")
@click.option("--backend", default="interpreter", show_default=True,
              type=click.Choice(["interpreter", "nki-simulator"]),
              help="Run the kernels in nmmc's interpreter, or in AWS's NKI simulator (needs the file's NKI package: "
                   "nki for --dialect nki, neuronx-cc for neuronxcc; from AWS's Neuron pip index). The simulator "
                   "imports the file as a module and runs AWS's code, outside nmmc's sandbox: only the check of the "
                   "file against the NKI subset still applies.")
@click.option("--sdk", default=None, type=click.Choice(KNOWN_SDKS + LATER_SDKS, case_sensitive=False), help=SDK_HELP)
@click.option("--json", "as_json", is_flag=True,
              help="Print the report as JSON (with 'sdk' and 'violations': [{rule, line, message, citation}]).")
@click.option("--max-memory", default=None, metavar="SIZE",
              help="Refuse, before anything runs, a file whose verification is estimated to need more memory than "
                   "this (e.g. 1.5G, 800M; MiB without a unit) [default: no limit].")
@dir_verify
@tp_verify
def verify(file: str, seed: int, target: str | None, backend: str, sdk: str | None, as_json: bool,
           max_memory: str | None) -> None:
    """Run an emitted kernel FILE on random inputs (every kernel of the file, in order), compare with a
    float64 NumPy evaluation of its graph, and print the relative error and, in the interpreter, its
    counters (HBM bytes, DMA transfers, matmuls, peak SBUF/PSUM).

    Before anything runs, FILE must hold only the NKI subset nmmc emits (docs/nki-subset.md): any
    other Python (open, imports beyond numpy and NKI, dunder attributes, lambdas, ...) is refused.
    Then a static pass checks the source against AWS's documented NKI rules (docs/nki-rules.md) for
    the file's dialect, its target (or --target) and the Neuron SDK release --sdk; each violation is
    printed with its rule id, the kernel line and the doc page it comes from. The kernels run either
    way. The interpreter checks Trainium's tile limits and SBUF/PSUM capacity as well; --backend
    nki-simulator runs the file under AWS's own simulator instead (same inputs, reference and
    tolerance; it checks no capacity and keeps no counters; AWS's code, outside the sandbox).

    Exits 0 when the kernel is within tolerance (bf16 1e-2, fp32 1e-5) and violates no NKI rule, 1
    on a mismatch, a violated hardware limit or a violated NKI rule, 2 when FILE is not an nmmc
    kernel, not a regular UTF-8 file of at most 8 MiB, uses Python outside the subset, or the
    backend's package is missing.

    FILE may also be a tensor-parallel plan (DIR/plan.json from --tp): every rank's kernels run in the
    interpreter on its slices, the collectives in NumPy; docs/tensor-parallel.md. Or a directory: an 'nmmc
    export' package (DIR or DIR/manifest.json) or a 'tune --model' output (DIR or DIR/index.json), whose every
    kernel file and plan is verified so (and an export's manifest checked against its kernel files)."""
    from ..targets import get_target
    from ..verification import verify_file
    from ..verification.memory import parse_size

    report = verify_file(file, seed=seed, target=get_target(target) if target else None, backend=backend,
                         rules=True, sdk=sdk, max_memory=parse_size(max_memory) if max_memory else None)
    if as_json:
        click.echo(json.dumps(report.as_dict(), indent=2, sort_keys=True))
    else:
        echo_lines(verify_lines(report, file, backend))
    sys.exit(0 if report.ok else EXIT_FAILED)


@click.command()
@click.argument("file", type=click.Path(dir_okay=False))
@click.option("--warmup", default=10, show_default=True, type=click.IntRange(min=0), help="Untimed runs per kernel.")
@click.option("--iters", default=100, show_default=True, type=click.IntRange(min=1),
              help="Timed runs per kernel (nki.benchmark; the neuron-explorer route times one).")
@click.option("--target", default=None,
              help="Target whose cost model predicts the kernel [default: the file's]; a calibrated target file "
                   "compares with its fit.")
@click.option("--append-csv", default=None, metavar="CSV",
              help="Append the measurement to this CSV (created with a header if missing), for 'nmmc calibrate'.")
@click.option("--json", "as_json", is_flag=True, help="Print the measurements as JSON.")
def bench(file: str, warmup: int, iters: int, target: str | None, append_csv: str | None, as_json: bool) -> None:
    """Time an emitted kernel FILE on this host's Neuron device (needs a Trainium instance and the
    file's NKI package), and print the median, p10 and p90 latencies next to the cost model's
    prediction, and the route used:

    
    - nki.benchmark, where the file's package has it (neuronxcc.nki, NKI 0.1): --warmup + --iters runs;
    - neuron-explorer, for the nki dialect on NKI 0.2+ (which has no nki.benchmark): the kernel runs
      once with NEURON_FRAMEWORK_DEBUG=1 to save its NEFF, then 'neuron-explorer capture
      --profile-nth-exec=WARMUP+1' profiles one run after the warm-up and the latency is the
      profile summary's total_time ('view --output-format summary-json'); needs aws-neuronx-tools
      (neuron-explorer on PATH or in /opt/aws/neuron/bin); --iters does not apply (recorded as 1).

    Exits 2 with one line naming what is missing when neither route (or no device) is available.
    With --append-csv, record the measurement in the format 'nmmc calibrate' reads: bench,
    calibrate, then --target the calibrated file."""
    from ..calibration.bench import bench_file
    from ..calibration.measurements import appended_text, check_appendable
    from ..io import write_output
    from ..targets import get_target

    if append_csv:
        check_appendable(append_csv)  # fail before the device time is spent
    report = bench_file(file, warmup=warmup, iters=iters, target=get_target(target) if target else None)
    if append_csv:
        write_output(append_csv, appended_text(append_csv, report.csv_values(append_csv)))
    if as_json:
        click.echo(json.dumps(report.as_dict(), indent=2))
        return
    echo_lines(report.lines())
    if append_csv:
        click.echo(f"appended to {append_csv}")


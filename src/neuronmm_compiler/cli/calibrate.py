"""Commands about the hardware and the cost model's fit to it: ``nmmc targets`` and ``nmmc calibrate``."""

from __future__ import annotations

import json

import click

from .views import echo_lines, targets_lines


@click.command()
@click.option("--json", "as_json", is_flag=True, help="Print as JSON.")
def targets(as_json: bool) -> None:
    """Print the hardware table nmmc uses (per physical NeuronCore), each target on the logical core it deploys on
    by default (LNC=2 on trn2/trn3; --lnc 1 in the other commands for one physical core)."""
    from ..targets import TARGETS, with_lnc

    deployed = {name: with_lnc(t, None) for name, t in TARGETS.items()}
    if as_json:
        click.echo(json.dumps({name: t.as_dict() for name, t in deployed.items()}, indent=2))
        return
    echo_lines(targets_lines(deployed))


@click.command()
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
    from ..calibration.fit import DEFAULT_FIT
    from ..calibration.run import calibrate as run_calibration
    from ..calibration.target_file import target_file_text
    from ..io import check_output_file, write_output
    from ..targets import get_target

    check_output_file(output)
    names = DEFAULT_FIT if fit is None else tuple(n.strip() for n in fit.split(",") if n.strip())
    report = run_calibration(measurements, get_target(target), output=output, fit=names, max_iter=max_iter)
    write_output(output, target_file_text(report.target))
    if as_json:
        click.echo(json.dumps(report.as_dict(), indent=2))
        return
    echo_lines(report.lines())
    click.echo(f"wrote {output}; use it with --target {output}")

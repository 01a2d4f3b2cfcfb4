"""Views of the commands that have no place in :mod:`neuronmm_compiler.report`: the text and JSON
of ``nmmc verify``, ``compress``, ``schedules --json``, ``targets``, ``cache list`` and ``regress
--update``. Nothing here computes; the commands pass in what they got."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import click

from ..frontends.workloads import Workload
from ..targets import Target


def echo_lines(lines: Iterable[str]) -> None:
    """Print each line on stdout."""
    for line in lines:
        click.echo(line)


def parameter_rows(specs: Sequence[Any]) -> list[dict[str, Any]]:
    """The parameters ``--param`` can set (schedule ParamSpecs) as ``nmmc schedules`` shows them."""
    return [{"name": p.name, "type": p.kind.__name__, "choices": list(p.choices) if p.choices else None,
             "help": p.help} for p in specs]


def schedules_json(workload: Workload, target: Target, rows: list[dict[str, Any]],
                   space: list[dict[str, Any]]) -> dict[str, Any]:
    """``nmmc schedules --json``."""
    return {"workload": workload.describe(), "target": target.name, "presets": rows, "parameters": space}


def verify_lines(report: Any, file: str, backend: str) -> list[str]:
    """``nmmc verify``: the verdict, the static rule pass (the SDK checked, each violation with its rule id, kernel
    line and doc citation), the error against the reference and the interpreter's counters."""
    status = "OK" if report.ok else "FAILED"
    where = "" if backend == "interpreter" else f", {backend}"
    lines = [f"{status}: {file} ({report.kernel}, {report.dialect}, {report.target}, seed {report.seed}{where})"]
    if report.sdk is not None:
        count = len(report.violations)
        lines.append(f"  NKI rules of Neuron SDK {report.sdk}: " + (
            f"{count} violation{'s' if count > 1 else ''}" if count else "no violation"))
        lines += [f"  {v}" for v in report.violations]  # line N: RULE-ID: message [citation]
    if report.rel_error is not None:
        lines.append(f"  relative error {report.rel_error:.3e} (tolerance {report.tolerance:.0e}), "
                     f"max abs error {report.max_abs_error:.3e}")
    if report.error:
        lines.append(f"  {report.error}")
    c = report.counters
    if c:
        reads = {k: v for k, v in c["hbm_bytes_read"].items() if v}
        writes = {k: v for k, v in c["hbm_bytes_written"].items() if v}
        lines += [f"  HBM read {c['total_hbm_bytes_read']} B {reads}, written {c['total_hbm_bytes_written']} B "
                  f"{writes}",
                  f"  DMA transfers {c['dma_transfers']} (transposing {c['dma_transposes']}), "
                  f"matmuls {c['matmul_instructions']}, TensorE transposes {c['transposes']}",
                  f"  peak SBUF {c['sbuf_peak_bytes']} B/partition, PSUM {c['psum_peak_banks']} banks"]
    return lines


def compress_lines(manifest: Any, output: str) -> list[str]:
    """``nmmc compress``: the model, ranks, parameter counts, worst reconstruction error."""
    worst = max(p.relative_error for layer in manifest.layers for p in layer.projections.values())
    return [f"{manifest.model.describe()}",
            f"  ranks gate/up/down {'/'.join(str(r) for r in manifest.ranks.values())}, "
            f"MLP parameters {manifest.params_before} -> {manifest.params_after} "
            f"(kept {manifest.kept_fraction:.3f}, compression {manifest.compression_ratio:.2f}x)",
            f"  worst relative reconstruction error {worst:.4f}",
            f"wrote {len(manifest.layers)} layer files and manifest.json to {output}"]


def targets_lines(targets: Mapping[str, Target]) -> list[str]:
    """``nmmc targets``: each target's description and hardware rows."""
    lines = []
    for name, tgt in targets.items():
        lines.append(f"{name}: {tgt.description}")
        lines += [f"  {key:<22} {value}" for key, value in tgt.summary_rows()]
    return lines


def cache_lines(records: Sequence[Any], tune_dir: Any) -> list[str]:
    """``nmmc cache list``: one row per cached decision."""
    return [f"{len(records)} entries in {tune_dir}",
            *(f"  {r.key[:12]}  {r.target:<5} {r.dialect:<9} {r.latency_us:10.2f} us  {r.workload}" for r in records)]


def lock_updated_line(lockfile: str, stuck: int) -> str:
    """``nmmc regress --update``: the lockfile rewritten, and how many entries could not be repaired."""
    return f"updated {lockfile}" + (f"; {stuck} entr{'y' if stuck == 1 else 'ies'} could not be repaired"
                                    if stuck else "")

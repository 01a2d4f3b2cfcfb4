"""Commands over what nmmc stores: ``nmmc regress`` (lockfiles), ``nmmc report`` (plots of a study
or a lockfile) and the ``nmmc cache`` group (the result cache)."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import click

from ..errors import InputError
from .options import EXIT_FAILED
from .views import cache_lines, echo_lines, lock_updated_line


@click.command()
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
    from ..artifacts.lockfile import Lockfile
    from ..artifacts.regress import regress as run_regress

    if not Path(lockfile).is_file():
        raise InputError(f"lockfile not found: {lockfile} (create one with 'nmmc tune ... --lock {lockfile}')")
    lock = Lockfile.load(lockfile)
    report = run_regress(lock, tolerance=tolerance, search=not no_search, verify=not no_verify)
    click.echo(json.dumps(report.as_dict(), indent=2) if as_json else report.table())
    if update:
        stuck = update_lockfile(lock, report, lockfile)
        click.echo(lock_updated_line(lockfile, stuck), err=as_json)
        sys.exit(EXIT_FAILED if stuck else 0)
    if not report.ok:
        click.echo(f"{len(report.failures)} of {len(report.results)} entries failed", err=True)
        sys.exit(EXIT_FAILED)


def update_lockfile(lock: Any, report: Any, path: str) -> int:
    """``nmmc regress --update``: save ``lock`` repaired from its regress ``report`` to ``path``;
    the number of failed entries that could not be repaired (left as they were)."""
    from ..artifacts.regress import update_lock

    updated = update_lock(lock, report)
    updated.save(path)
    return sum(updated.entries.get(r.entry.key) == r.entry for r in report.failures)


@click.command()
@click.argument("source", metavar="STUDY_OR_LOCK_OR_FACTORS")
@click.option("--study", "study_name", default=None, metavar="NAME",
              help="Study to report when STUDY_OR_LOCK is a storage URL holding several.")
@click.option("-o", "--output", required=True, metavar="DIR", help="Directory for the PNG plots and summary.md.")
def report(source: str, study_name: str | None, output: str) -> None:
    """Plot a search or a lockfile, with a Markdown summary.

    STUDY_OR_LOCK is an Optuna storage URL written by 'nmmc tune --storage' (sqlite:///FILE.db,
    journal:///FILE.log, postgresql://...): optimization history, parameter importance and a roofline
    chart (arithmetic intensity vs predicted throughput, with the target's compute and bandwidth
    ceilings) placing the chosen schedule among every evaluated one. Or a lockfile: a roofline chart
    of its schedules and their predicted latencies. Or an 'nmmc compress' output directory: its
    ranks, measured quality and the rank choice's Pareto front (predicted latency vs whitened loss)."""
    from ..io import check_output_dir

    if Path(source).is_dir():
        from ..compression import read_manifest
        from ..compression.compress_report import write_compression_report

        manifest = read_manifest(source)
        check_output_dir(output)
        paths = write_compression_report(manifest, Path(output))
    elif "://" in source:
        from ..search.storage import check_storage
        from ..tuning.request import study_report

        check_storage(source, must_exist=True)  # reading a study must not create an empty one
        check_output_dir(output)
        paths = study_report(source, study_name, Path(output))
    else:
        from ..artifacts.lockfile import Lockfile
        from ..artifacts.report import write_lock_report

        if not Path(source).is_file():
            raise InputError(f"lockfile not found: {source} (or give a storage URL such as sqlite:///tune.db)")
        check_output_dir(output)
        paths = write_lock_report(Lockfile.load(source), out_dir=Path(output))
    click.echo(f"wrote {', '.join(p.name for p in paths)} to {output}")


@click.group()
def cache() -> None:
    """The result cache of 'nmmc tune': tuning decisions (schedules, never code) keyed by the graph's
    structure, target (with its logical-core degree and launch context), dialect, search request, cost-model and
    nmmc versions."""


def _cache(cache_dir: str | None) -> Any:
    from ..artifacts.cache import ResultCache

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
    echo_lines(cache_lines(records, store.tune_dir))


@cache.command("show")
@click.argument("key_prefix")
@_cache_dir_option
def cache_show(key_prefix: str, cache_dir: str | None) -> None:
    """Print one cached decision (KEY_PREFIX: the start of its key)."""
    click.echo(_cache(cache_dir).show(key_prefix).to_json())


@cache.command("prune")
@_cache_dir_option
def cache_prune(cache_dir: str | None) -> None:
    """Delete the cached decisions this nmmc can no longer use: those written by another nmmc version, cost model
    or source (every change to nmmc's code makes new keys), and unreadable files. The rest are kept."""
    store = _cache(cache_dir)
    removed, kept = store.prune()
    click.echo(f"removed {removed} entries this nmmc cannot use from {store.tune_dir}; kept {kept}")


@cache.command("clear")
@_cache_dir_option
def cache_clear(cache_dir: str | None) -> None:
    """Delete every cached decision."""
    store = _cache(cache_dir)
    click.echo(f"removed {store.clear()} entries from {store.tune_dir}")

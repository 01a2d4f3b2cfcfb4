"""Check a schedule lockfile against the current compiler: ``nmmc regress``.

Every entry is re-derived: the workload is rebuilt, the locked schedule recompiled through the same
path ``nmmc tune`` used (same schedule name, so an unchanged compiler prints the same bytes), the
kernel verified in the interpreter, and (optionally) the search rerun with the recorded seed, trials
and method. Each entry gets statuses and one reason per finding:

=================  =========  ==========================================================================
status             fails CI   when
=================  =========  ==========================================================================
``invalid``        yes        the workload, target, dialect or schedule no longer builds: an unknown or
                              out-of-range parameter, or a ScheduleError on compile (incl. not fitting
                              on chip)
``unverified``     yes        the emitted kernel fails ``verify_source`` (wrong result or a violated
                              limit in the interpreter)
``target-changed`` yes        the target's hardware table differs from the one the lock was made with
``drift``          yes        the predicted latency of the locked schedule moved by more than
                              ``tolerance`` (relative), in either direction
``stale``          yes        a fresh search finds a schedule faster than the locked one (both costed by
                              today's model) by more than ``tolerance``
``kernel-changed`` no         the emitted kernel's sha256 differs from the locked one; informational,
                              because the header records versions and predictions and codegen may
                              legitimately change: correctness is what ``unverified`` checks
``ok``             no         none of the above
=================  =========  ==========================================================================

An entry's ``status`` is its most severe one, in the order of the table. :func:`update_lock` writes
the fresh state back: the locked schedule re-recorded (new predictions, fingerprint, kernel sha,
versions) where it still compiles, verifies and is not stale, otherwise the fresh search's winner.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ..codegen import check_dialect
from ..driver import Compiled, recompile, tune
from ..errors import InputError, NmmcError
from ..frontends.workloads import Workload, workload_from_dict, workload_label
from ..jobs import resolve
from ..targets import Target, get_target
from ..verification import verify_source
from .lockfile import LockEntry, Lockfile, entry_from_compiled, entry_from_tuned, target_fingerprint

DEFAULT_TOLERANCE = 0.02
#: Statuses in order of severity; all but the last two fail a regression check.
STATUSES = ("invalid", "unverified", "target-changed", "drift", "stale", "kernel-changed", "ok")
FAILING = frozenset(STATUSES[:5])


@dataclass
class EntryResult:
    """What re-deriving one lock entry found."""

    entry: LockEntry
    statuses: list[str] = field(default_factory=list)
    reasons: list[str] = field(default_factory=list)
    current: LockEntry | None = None  # the locked schedule as today's compiler records it (None: invalid)
    fresh: LockEntry | None = None  # the fresh search's winner (None: search off or failed)
    fresh_verified: bool | None = None  # whether the fresh winner's kernel verified (None: not checked)

    @property
    def status(self) -> str:
        return min(self.statuses, key=STATUSES.index) if self.statuses else "ok"

    @property
    def failing(self) -> bool:
        return any(s in FAILING for s in self.statuses)

    @property
    def now_us(self) -> float | None:
        return self.current.latency_us if self.current else None

    @property
    def fresh_us(self) -> float | None:
        return self.fresh.latency_us if self.fresh else None

    @property
    def change(self) -> float | None:
        """Relative change of the locked schedule's predicted latency (None when it no longer compiles)."""
        if self.now_us is None or self.entry.latency_us <= 0:
            return None
        return (self.now_us - self.entry.latency_us) / self.entry.latency_us

    def flag(self, status: str, reason: str) -> None:
        if status not in self.statuses:
            self.statuses.append(status)
        self.reasons.append(f"{status}: {reason}")

    def as_dict(self) -> dict[str, Any]:
        return {"key": self.entry.key, "workload": self.entry.workload, "target": self.entry.target,
                "dialect": self.entry.dialect, "status": self.status, "statuses": sorted(self.statuses,
                key=STATUSES.index), "reasons": list(self.reasons), "locked_us": self.entry.latency_us,
                "now_us": self.now_us, "change": self.change, "fresh_us": self.fresh_us,
                "fresh_schedule": self.fresh.schedule if self.fresh else None}


@dataclass
class RegressReport:
    """The outcome of :func:`regress` over a whole lockfile."""

    results: list[EntryResult]
    tolerance: float

    @property
    def ok(self) -> bool:
        return not any(r.failing for r in self.results)

    @property
    def failures(self) -> list[EntryResult]:
        return [r for r in self.results if r.failing]

    def as_dict(self) -> dict[str, Any]:
        return {"ok": self.ok, "tolerance": self.tolerance, "entries": [r.as_dict() for r in self.results]}

    def table(self) -> str:
        """One row per entry: workload, target, locked/now us, change, fresh-search us, status, reasons."""
        def us(value: float | None) -> str:
            return "-" if value is None else f"{value:.2f}"

        header = ("workload", "target", "locked us", "now us", "change", "fresh us", "status", "reasons")
        rows = [header]
        for r in self.results:
            change = "-" if r.change is None else f"{r.change:+.1%}"
            sdk = "" if r.entry.sdk is None else f" {r.entry.sdk}"  # the release an entry records (lockfile.py)
            rows.append((r.entry.label, f"{r.entry.target}/{r.entry.dialect}{sdk}", us(r.entry.latency_us),
                         us(r.now_us), change, us(r.fresh_us), r.status, "; ".join(r.reasons) or "-"))
        widths = [max(len(row[i]) for row in rows) for i in range(len(header) - 1)]
        lines = ["  ".join(cell.ljust(w) for cell, w in zip(row[:-1], widths, strict=True)) + "  " + row[-1]
                 for row in rows]
        failed = len(self.failures)
        lines.append(f"{len(self.results)} entries, {failed} failing (tolerance {self.tolerance:.1%})")
        return "\n".join(line.rstrip() for line in lines)


def compile_entry(entry: LockEntry, workload: Workload, target: Target) -> Compiled:
    """Recompile the locked schedule through the path ``tune`` used (same schedule name); an unknown
    or out-of-range parameter, or a schedule of another kind than the workload's, is an InputError."""
    return recompile(resolve(workload, target, entry.dialect, entry.sdk), entry.schedule_kind, entry.schedule,
                     schedule_name=entry.schedule_name)


def fresh_search(entry: LockEntry, workload: Workload, target: Target, trials: int) -> tuple[LockEntry, str]:
    """Rerun the search the entry records (seed, trials, method): its winner as an entry, and its kernel."""
    force = entry.method if entry.method in ("optuna", "exhaustive") else None
    tuned = tune(workload, target=target, dialect=entry.dialect, sdk=entry.sdk, trials=trials, seed=entry.seed,
                 method=force)
    return entry_from_tuned(workload, tuned, seed=entry.seed, trials=trials), tuned.compiled.kernel.source


def _verify(source: str, label: str, target: Target) -> str | None:
    """None when the kernel verifies, else why not."""
    try:
        report = verify_source(source, filename=f"<{label}>", target=target, rules=True)
    except NmmcError as exc:
        return str(exc)
    return None if report.ok else (report.error or "verification failed")


def _prediction_changes(old: dict[str, Any], new: dict[str, Any]) -> str:
    changed = [f"{name} {old.get(name)!r} -> {new.get(name)!r}" for name in sorted(new)
               if name != "latency_us" and old.get(name) != new.get(name)]
    return f" ({', '.join(changed)})" if changed else ""


def check_entry(entry: LockEntry, *, tolerance: float = DEFAULT_TOLERANCE, search: bool = True,
                verify: bool = True, trials: int | None = None) -> EntryResult:
    """Re-derive one entry (see the module docstring for the statuses)."""
    result = EntryResult(entry)
    try:
        workload = workload_from_dict(entry.workload)
        target = get_target(entry.target)
        check_dialect(entry.dialect)
    except NmmcError as exc:
        result.flag("invalid", str(exc))
        return result
    label = f"{entry.label} on {entry.target}"
    if target_fingerprint(target) != entry.target_fingerprint:
        result.flag("target-changed", f"{entry.target}'s hardware table changed since the lock was written")
    try:
        compiled = compile_entry(entry, workload, target)
    except NmmcError as exc:  # InputError (bad parameter), ScheduleError (limits, does not fit), ...
        result.flag("invalid", f"locked schedule no longer compiles: {exc}")
    else:
        current = entry_from_compiled(workload, compiled, seed=entry.seed, trials=entry.trials, method=entry.method)
        result.current = current
        if current.kernel_sha256 != entry.kernel_sha256:
            result.flag("kernel-changed", f"kernel sha256 {entry.kernel_sha256[:12]} -> {current.kernel_sha256[:12]}")
        if verify:
            error = _verify(compiled.kernel.source, label, target)
            if error is not None:
                result.flag("unverified", error)
        change = result.change
        if change is not None and abs(change) > tolerance:
            result.flag("drift", f"predicted {entry.latency_us:.2f} -> {current.latency_us:.2f} us ({change:+.1%})"
                        + _prediction_changes(entry.predicted, current.predicted))
        if (entry.nmmc_version, entry.cost_model_version) != (current.nmmc_version, current.cost_model_version):
            result.reasons.append(f"note: locked with nmmc {entry.nmmc_version} / cost model "
                                  f"v{entry.cost_model_version}, now {current.nmmc_version} / "
                                  f"v{current.cost_model_version}")
    fresh_source = ""
    if search:
        try:
            result.fresh, fresh_source = fresh_search(entry, workload, target,
                                                      trials if trials is not None else entry.trials)
        except NmmcError as exc:
            result.reasons.append(f"note: fresh search failed: {exc}")
    if result.fresh is not None and result.now_us is not None:
        gain = (result.now_us - result.fresh.latency_us) / result.now_us
        if gain > tolerance:
            diff = " ".join(f"{k}={v}" for k, v in sorted(result.fresh.schedule.items())
                            if result.current is not None and result.current.schedule.get(k) != v)
            result.flag("stale", f"a fresh search ({result.fresh.method}, seed {entry.seed}, {result.fresh.trials} "
                        f"trials) finds {result.fresh.latency_us:.2f} us, {gain:.1%} faster ({diff})")
    if verify and result.fresh is not None and (result.current is None or "stale" in result.statuses
                                                 or "unverified" in result.statuses):
        # the fresh winner is what update_lock would write: check it too
        error = _verify(fresh_source, f"fresh {label}", target)
        result.fresh_verified = error is None
        if error is not None:
            result.reasons.append(f"note: the fresh search's kernel does not verify either: {error}")
    return result


def regress(lock: Lockfile, *, tolerance: float = DEFAULT_TOLERANCE, search: bool = True, verify: bool = True,
            trials: int | None = None) -> RegressReport:
    """Re-derive every entry of ``lock``. ``trials`` overrides the recorded trial counts of the fresh
    searches; ``search=False`` skips them (no ``stale`` check), ``verify=False`` skips the interpreter."""
    if not tolerance >= 0:
        raise InputError(f"--tolerance must be a non-negative fraction (0.02 = 2%); got {tolerance}")
    if trials is not None and trials < 1:
        raise InputError(f"--trials must be at least 1; got {trials}")
    results = [check_entry(entry, tolerance=tolerance, search=search, verify=verify, trials=trials)
               for entry in lock]
    return RegressReport(results, tolerance)


def update_lock(lock: Lockfile, report: RegressReport) -> Lockfile:
    """A new lock with each checked entry rewritten (what ``nmmc regress --update`` writes).

    An entry keeps its schedule when it still compiles, verifies (if checked) and is not stale; it is
    re-recorded with today's predictions, target fingerprint, kernel sha256 and versions. Otherwise the
    fresh search's winner replaces it, when there is one that did not fail verification; otherwise the
    entry is left as it was (and still fails). Entries the report does not cover are copied."""
    updated = Lockfile(dict(lock.entries))
    for r in report.results:
        keep = r.current is not None and "unverified" not in r.statuses and "stale" not in r.statuses
        if keep and r.current is not None:
            updated.add(r.current)
        elif r.fresh is not None and r.fresh_verified is not False:
            updated.add(r.fresh)
    return updated


__all__ = [
    "DEFAULT_TOLERANCE",
    "FAILING",
    "STATUSES",
    "EntryResult",
    "RegressReport",
    "check_entry",
    "regress",
    "update_lock",
    "workload_label",
]

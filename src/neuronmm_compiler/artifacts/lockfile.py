"""Schedule lockfiles: the schedules a project chose, recorded so CI can check they still hold.

A lockfile (``nmmc.lock.json``, written by ``nmmc tune ... --lock FILE``) holds one
:class:`LockEntry` per (workload, target, dialect, Neuron SDK release): the chosen schedule's parameters, what the cost
model predicted for it, the sha256 of the kernel file that was emitted, the search settings that
found it (seed, trials, method), the nmmc and cost-model versions, and a fingerprint of the target's
hardware table. A schedule tuned for a calibrated target records the target file's path (as given to
``--target``), so ``nmmc regress`` reloads the same fit and reports ``target-changed`` after a
recalibration. ``nmmc regress`` (:mod:`.regress`) re-derives every entry and reports what moved.

The file is JSON with sorted keys, two-space indentation and a trailing newline, entries in key
order, so equal locks are equal bytes and a change shows as a small diff. It is written atomically
(temporary file in the same directory, then ``os.replace``).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator, Mapping
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

from .. import __version__
from ..cost_model import COST_MODEL_VERSION, CostReport
from ..driver import Compiled, Tuned
from ..errors import InputError
from ..frontends.workloads import Workload, workload_label
from ..io import write_text_atomic
from ..lowerings import registered_lowerings
from ..targets import Target, get_target

LOCK_FORMAT = "nmmc-lock"
LOCK_VERSION = 1
#: The CostReport fields a lock entry records as the prediction.
PREDICTED_FIELDS = ("latency_us", "bound", "hbm_bytes_read", "hbm_bytes_written", "dma_transfers", "feasible")


def _sha256(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def _canonical(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"))


def target_fingerprint(target: str | Target) -> str:
    """sha256 of the target's hardware table (every field and derived figure, sorted JSON)."""
    tgt = target if isinstance(target, Target) else get_target(target)
    return _sha256(json.dumps(tgt.as_dict(), sort_keys=True))


def kernel_sha256(source: str) -> str:
    """sha256 of an emitted kernel file's text: equal to ``sha256sum`` of the file ``-o`` wrote."""
    return _sha256(source)


def entry_key(workload: Mapping[str, Any], target: str, dialect: str, sdk: str | None = None) -> str:
    """The stable key of an entry: sha256 of its workload, target name, dialect and (when the entry records one, as
    every entry written since nmmc knew Neuron 2.34 does) Neuron SDK release."""
    fields_ = {"workload": dict(workload), "target": target, "dialect": dialect} | ({} if sdk is None else {"sdk": sdk})
    return _sha256(_canonical(fields_))


# ----------------------------------------------------------------------------- entries


@dataclass(frozen=True)
class LockEntry:
    """One locked schedule (see the module docstring). ``key`` is derived, never set by hand."""

    workload: dict[str, Any]
    target: str  # the stock target's name, or the calibrated target file the schedule was tuned with
    target_fingerprint: str
    dialect: str
    schedule_kind: str  # "gemm" or "fused"
    schedule: dict[str, Any]
    schedule_name: str  # recorded in the kernel header; kept so a recompile prints the same bytes
    predicted: dict[str, Any]
    kernel_sha256: str
    seed: int
    trials: int
    method: str  # the search method that found the schedule ("exhaustive" or "optuna")
    nmmc_version: str = __version__
    cost_model_version: str = COST_MODEL_VERSION
    #: the Neuron SDK release the kernel was emitted for (None in entries written before nmmc recorded it: re-derived
    #: for the newest release of the dialect on the target)
    sdk: str | None = None
    key: str = field(default="")

    def __post_init__(self) -> None:
        object.__setattr__(self, "key", entry_key(self.workload, self.target, self.dialect, self.sdk))

    @property
    def latency_us(self) -> float:
        return float(self.predicted["latency_us"])

    @property
    def label(self) -> str:
        return workload_label(self.workload)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Any) -> LockEntry:
        """An entry from its JSON form; InputError (without a file name) when malformed."""
        if not isinstance(data, dict):
            raise InputError(f"an entry must be a JSON object; got {type(data).__name__}")
        names = {f.name for f in fields(cls)}
        missing = sorted(names - {"key", "sdk"} - set(data))
        unknown = sorted(set(data) - names)
        if missing or unknown:
            raise InputError(f"entry has missing fields {missing} / unknown fields {unknown}")
        types = {"workload": dict, "schedule": dict, "predicted": dict, "seed": int, "trials": int}
        spelled = {dict: "a JSON object", int: "an integer", str: "a string"}
        for name in names - {"key"} - ({"sdk"} if data.get("sdk") is None else set()):
            want = types.get(name, str)
            if not isinstance(data[name], want) or isinstance(data[name], bool):
                raise InputError(f"entry field {name!r} must be {spelled[want]}; got {data[name]!r}")
        kinds = registered_lowerings()
        if data["schedule_kind"] not in kinds:
            raise InputError(f"entry schedule_kind must be one of {', '.join(kinds)}")
        if not isinstance(data["predicted"].get("latency_us"), (int, float)):
            raise InputError("entry 'predicted' has no numeric latency_us")
        entry = cls(**{k: v for k, v in data.items() if k != "key"})
        if "key" in data and data["key"] != entry.key:
            raise InputError(f"entry key {data['key']!r} does not match its workload, target, dialect and SDK "
                             f"(expected {entry.key!r}; edited by hand?)")
        return entry


def predicted_fields(cost: CostReport) -> dict[str, Any]:
    """The CostReport figures a lock records (:data:`PREDICTED_FIELDS`)."""
    return {name: getattr(cost, name) for name in PREDICTED_FIELDS}


def entry_from_compiled(workload: Workload, compiled: Compiled, *, seed: int, trials: int,
                        method: str | None = None) -> LockEntry:
    """A lock entry for one compiled kernel (GEMM or fused) and the search settings behind it
    (``method`` defaults to the one named in a tuned kernel's schedule name)."""
    return LockEntry(
        workload=workload.to_dict(),
        target=compiled.target.spec,
        target_fingerprint=target_fingerprint(compiled.target),
        dialect=compiled.dialect,
        sdk=compiled.sdk,
        schedule_kind=compiled.kind,
        schedule=dict(compiled.schedule.as_dict()),
        schedule_name=compiled.schedule_name,
        predicted=predicted_fields(compiled.cost),
        kernel_sha256=kernel_sha256(compiled.kernel.source),
        seed=seed,
        trials=trials,
        method=method or compiled_method(compiled),
    )


def compiled_method(compiled: Compiled) -> str:
    """The search method named in a tuned kernel's schedule name (``tuned (exhaustive, seed 0)``)."""
    name = compiled.schedule_name
    return name.split("(", 1)[1].split(",", 1)[0] if name.startswith("tuned (") else "auto"


def entry_from_tuned(workload: Workload, tuned: Tuned, *, target: str | Target | None = None,
                     dialect: str | None = None, seed: int, trials: int) -> LockEntry:
    """The lock entry of a ``tune`` / ``tune_graph`` result. ``target`` and ``dialect``, when given,
    must be the ones the kernel was compiled for (they default to those)."""
    compiled = tuned.compiled
    name = target.spec if isinstance(target, Target) else target
    if name is not None and name != compiled.target.spec:
        raise InputError(f"tuned kernel is for target {compiled.target.spec}, not {name}")
    if dialect is not None and dialect != compiled.dialect:
        raise InputError(f"tuned kernel is in dialect {compiled.dialect}, not {dialect}")
    if workload != compiled.workload:
        raise InputError(f"the tuned kernel is for {compiled.workload.describe()}, not {workload.describe()}")
    return entry_from_compiled(workload, compiled, seed=seed, trials=trials, method=tuned.search.method)


# ----------------------------------------------------------------------------- the lockfile


@dataclass
class Lockfile:
    """Entries keyed by :attr:`LockEntry.key`; adding an entry for the same workload replaces it."""

    entries: dict[str, LockEntry] = field(default_factory=dict)

    def add(self, entry: LockEntry) -> None:
        self.entries[entry.key] = entry

    def __len__(self) -> int:
        return len(self.entries)

    def __iter__(self) -> Iterator[LockEntry]:
        return iter(self.entries[key] for key in sorted(self.entries))

    def to_json(self) -> str:
        """The file's text: deterministic (sorted keys, entries in key order, trailing newline)."""
        body = {"format": LOCK_FORMAT, "version": LOCK_VERSION, "entries": [e.as_dict() for e in self]}
        return json.dumps(body, sort_keys=True, indent=2) + "\n"

    @classmethod
    def from_json(cls, text: str, *, filename: str = "<lock>") -> Lockfile:
        """Parse a lockfile's text; InputError naming ``filename`` when it is not a valid lock."""
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise InputError(f"{filename}: not a valid nmmc lockfile (invalid JSON: {exc})") from None
        if not isinstance(data, dict) or data.get("format") != LOCK_FORMAT:
            raise InputError(f"{filename}: not an nmmc lockfile (no \"format\": \"{LOCK_FORMAT}\")")
        if data.get("version") != LOCK_VERSION:
            raise InputError(f"{filename}: lockfile version {data.get('version')!r} is not supported "
                             f"(this nmmc reads version {LOCK_VERSION})")
        if not isinstance(data.get("entries"), list):
            raise InputError(f"{filename}: malformed nmmc lockfile ('entries' must be a list)")
        lock = cls()
        for i, raw in enumerate(data["entries"]):
            try:
                entry = LockEntry.from_dict(raw)
            except InputError as exc:
                raise InputError(f"{filename}: malformed lock entry {i}: {exc}") from None
            if entry.key in lock.entries:
                raise InputError(f"{filename}: lock entry {i} repeats the workload of an earlier entry")
            lock.add(entry)
        return lock

    @classmethod
    def load(cls, path: str | Path) -> Lockfile:
        """Read a lockfile; a missing file is an empty lock, a malformed one an InputError."""
        p = Path(path)
        try:
            text = p.read_text(encoding="utf-8")
        except FileNotFoundError:
            return cls()
        except (OSError, UnicodeDecodeError) as exc:
            raise InputError(f"cannot read lockfile {str(p)!r}: {exc}") from None
        return cls.from_json(text, filename=str(p))

    def save(self, path: str | Path) -> None:
        """Write the lockfile atomically (temporary file, then ``os.replace``)."""
        write_text_atomic(path, self.to_json())

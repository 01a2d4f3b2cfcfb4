"""Schedule lockfiles: the schedules a project chose, recorded so CI can check they still hold.

A lockfile (``nmmc.lock.json``, written by ``nmmc tune ... --lock FILE``) holds one
:class:`LockEntry` per (workload, target, dialect): the chosen schedule's parameters, what the cost
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
import re
from collections.abc import Iterator, Mapping
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

from .. import __version__
from ..compiler import CompiledKernel, Tuned
from ..cost_model import COST_MODEL_VERSION, CostReport
from ..errors import InputError
from ..fused_compiler import CompiledGraph, TunedGraph
from ..io import write_text_atomic
from ..schedule.gemm import A_LAYOUTS, DTYPES
from ..targets import Target, get_target
from ..workloads import Workload

LOCK_FORMAT = "nmmc-lock"
LOCK_VERSION = 1
#: The CostReport fields a lock entry records as the prediction.
PREDICTED_FIELDS = ("latency_us", "bound", "hbm_bytes_read", "hbm_bytes_written", "dma_transfers", "feasible")
SCHEDULE_KINDS = ("gemm", "fused")
WORKLOAD_KINDS = ("gemm", "chain", "mlp", "graph")


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


def entry_key(workload: Mapping[str, Any], target: str, dialect: str) -> str:
    """The stable key of an entry: sha256 of its workload, target name and dialect."""
    return _sha256(_canonical({"workload": dict(workload), "target": target, "dialect": dialect}))


# ----------------------------------------------------------------------------- workloads


def workload_to_dict(workload: Workload) -> dict[str, Any]:
    """The fields that rebuild ``workload`` (only those its kind uses), as plain JSON values."""
    out: dict[str, Any] = {"kind": workload.kind, "dtype": workload.dtype}
    if workload.kind in ("gemm", "chain"):
        out.update(m=workload.m, n=workload.n, k=workload.k, a_layout=workload.a_layout)
        if workload.kind == "chain":
            out["rank"] = workload.rank
    elif workload.kind == "graph":
        out.update(graph=workload.graph_text, source=workload.source)
    else:
        out.update(tokens=workload.tokens, hidden=workload.hidden, intermediate=workload.intermediate,
                   ranks=None if workload.ranks is None else list(workload.ranks))
    return out


def _positive_int(data: Mapping[str, Any], name: str) -> int:
    value = data.get(name)
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise InputError(f"workload field {name!r} must be a positive integer; got {value!r}")
    return value


def _graph_from_dict(data: Mapping[str, Any]) -> Workload:
    """A user graph recorded as its IR text: parsed and its names checked as a graph file's are
    (a lockfile is edited by hand, and its names become identifiers in emitted code)."""
    from ..graph_file import check_user_name
    from ..ir import parse_text
    from ..workloads import graph_workload

    text, source = data.get("graph"), data.get("source", "lockfile")
    if not isinstance(text, str) or not isinstance(source, str):
        raise InputError("a graph workload needs 'graph' (the graph's text form) and 'source' strings")
    graph = parse_text(text)
    check_user_name(graph.name, "graph name")
    for node in graph.nodes():
        check_user_name(node.name if node.kind in ("input", "output") else node.id, node.kind)
    return graph_workload(graph, source)


def workload_from_dict(data: Mapping[str, Any]) -> Workload:
    """Rebuild a :class:`Workload` from :func:`workload_to_dict`'s output; InputError when malformed."""
    if not isinstance(data, Mapping):
        raise InputError(f"a workload must be a JSON object; got {data!r}")
    kind, dtype = data.get("kind"), data.get("dtype", "bfloat16")
    if kind not in WORKLOAD_KINDS:
        raise InputError(f"unknown workload kind {kind!r}; kinds: {', '.join(WORKLOAD_KINDS)}")
    if dtype not in DTYPES:
        raise InputError(f"unknown dtype {dtype!r}; accepted: {', '.join(DTYPES)}")
    if kind in ("gemm", "chain"):
        layout = data.get("a_layout", "mk")
        if layout not in A_LAYOUTS:
            raise InputError(f"unknown A layout {layout!r}; accepted: {', '.join(A_LAYOUTS)}")
        rank = _positive_int(data, "rank") if kind == "chain" else 0
        return Workload(kind, dtype=dtype, m=_positive_int(data, "m"), n=_positive_int(data, "n"),
                        k=_positive_int(data, "k"), rank=rank, a_layout=layout)
    if kind == "graph":
        return _graph_from_dict(data)
    ranks = data.get("ranks")
    if ranks is not None:
        if not isinstance(ranks, list) or len(ranks) != 3:
            raise InputError(f"workload field 'ranks' must be null or three ranks gate, up, down; got {ranks!r}")
        ranks = tuple(_positive_int({"rank": r}, "rank") for r in ranks)
    return Workload("mlp", dtype=dtype, tokens=_positive_int(data, "tokens"), hidden=_positive_int(data, "hidden"),
                    intermediate=_positive_int(data, "intermediate"), ranks=ranks)


def workload_label(data: Mapping[str, Any]) -> str:
    """A short label of a workload dict for tables: ``gemm 128x512x256 bf16``, ``chain ... r128``."""
    dtype = {"bfloat16": "bf16", "float32": "fp32"}.get(str(data.get("dtype")), str(data.get("dtype")))
    kind = data.get("kind")
    if kind in ("gemm", "chain"):
        text = f"{kind} {data.get('m')}x{data.get('n')}x{data.get('k')}"
        text += f" r{data.get('rank')}" if kind == "chain" else ""
        text += " A^T" if data.get("a_layout") == "km" else ""
        return f"{text} {dtype}"
    if kind == "graph":
        match = re.search(r"graph\s+(\w+)", str(data.get("graph", "")))
        return f"graph {match.group(1) if match else '?'} {dtype}"
    ranks = data.get("ranks")
    rank_text = "dense" if ranks is None else "r" + "/".join(map(str, ranks))
    return f"mlp t{data.get('tokens')} h{data.get('hidden')} i{data.get('intermediate')} {rank_text} {dtype}"


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
    key: str = field(default="")

    def __post_init__(self) -> None:
        object.__setattr__(self, "key", entry_key(self.workload, self.target, self.dialect))

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
        missing = sorted(names - {"key"} - set(data))
        unknown = sorted(set(data) - names)
        if missing or unknown:
            raise InputError(f"entry has missing fields {missing} / unknown fields {unknown}")
        types = {"workload": dict, "schedule": dict, "predicted": dict, "seed": int, "trials": int}
        for name in names - {"key"}:
            want = types.get(name, str)
            if not isinstance(data[name], want) or isinstance(data[name], bool):
                raise InputError(f"entry field {name!r} must be a {want.__name__}; got {data[name]!r}")
        if data["schedule_kind"] not in SCHEDULE_KINDS:
            raise InputError(f"entry schedule_kind must be one of {', '.join(SCHEDULE_KINDS)}")
        if not isinstance(data["predicted"].get("latency_us"), (int, float)):
            raise InputError("entry 'predicted' has no numeric latency_us")
        entry = cls(**{k: v for k, v in data.items() if k != "key"})
        if "key" in data and data["key"] != entry.key:
            raise InputError(f"entry key {data['key']!r} does not match its workload, target and dialect "
                             f"(expected {entry.key!r}; edited by hand?)")
        return entry


def predicted_fields(cost: CostReport) -> dict[str, Any]:
    """The CostReport figures a lock records (:data:`PREDICTED_FIELDS`)."""
    return {name: getattr(cost, name) for name in PREDICTED_FIELDS}


def entry_from_compiled(workload: Workload, compiled: CompiledKernel | CompiledGraph, *, seed: int, trials: int,
                        method: str | None = None) -> LockEntry:
    """A lock entry for one compiled kernel (GEMM or fused) and the search settings behind it
    (``method`` defaults to the one named in a tuned kernel's schedule name)."""
    return LockEntry(
        workload=workload_to_dict(workload),
        target=compiled.target.spec,
        target_fingerprint=target_fingerprint(compiled.target),
        dialect=compiled.dialect,
        schedule_kind="fused" if isinstance(compiled, CompiledGraph) else "gemm",
        schedule=dict(compiled.schedule.as_dict()),
        schedule_name=compiled.schedule_name,
        predicted=predicted_fields(compiled.cost),
        kernel_sha256=kernel_sha256(compiled.kernel.source),
        seed=seed,
        trials=trials,
        method=method or compiled_method(compiled),
    )


def compiled_method(compiled: CompiledKernel | CompiledGraph) -> str:
    """The search method named in a tuned kernel's schedule name (``tuned (exhaustive, seed 0)``)."""
    name = compiled.schedule_name
    return name.split("(", 1)[1].split(",", 1)[0] if name.startswith("tuned (") else "auto"


def entry_from_tuned(workload: Workload, tuned: Tuned | TunedGraph, *, target: str | Target | None = None,
                     dialect: str | None = None, seed: int, trials: int) -> LockEntry:
    """The lock entry of a ``tune`` / ``tune_graph`` result. ``target`` and ``dialect``, when given,
    must be the ones the kernel was compiled for (they default to those)."""
    compiled = tuned.compiled
    name = target.spec if isinstance(target, Target) else target
    if name is not None and name != compiled.target.spec:
        raise InputError(f"tuned kernel is for target {compiled.target.spec}, not {name}")
    if dialect is not None and dialect != compiled.dialect:
        raise InputError(f"tuned kernel is in dialect {compiled.dialect}, not {dialect}")
    if workload.fused != isinstance(tuned, TunedGraph):
        raise InputError(f"workload {workload.kind} does not match a {type(tuned).__name__} result")
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

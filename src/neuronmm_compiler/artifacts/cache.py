"""The tuning result cache: a search's decision (the winning schedule), stored under a key and reused.

Only decisions are cached, never generated code: a hit rebuilds the schedule object
(:func:`cached_schedule`) and the kernel is lowered and printed again, so a cached kernel is exactly
what the same schedule compiles to today. The key (:func:`cache_key`) is a SHA-256 over everything
the decision depends on: the graph's structural signature (shapes, dtypes, layouts), the target, the
dialect and the Neuron SDK release the kernel is for, the lowering entry whose schedule it is (``gemm`` or
``fused``), the search request (method, trials, seed, exhaustive threshold) with a fingerprint of the schedule
space, the cost model version, the nmmc version and a digest of nmmc's own source files (an editable install or a
checkout between releases keeps one version number while its lowerings change). A change to any of them is a
different key; stale files are never read again, and :meth:`ResultCache.prune` (``nmmc cache prune``)
removes them: a record names the versions and source digest it was written by.

Layout: ``<cache dir>/tune/<key>.json``, one :class:`CacheRecord` per file. Files are written to a
temporary name in the same directory and renamed over the final name (atomic on POSIX), so readers
never see a partial file, and writers and ``clear`` serialize on an ``fcntl.flock`` of
``tune/.lock``. A file that is not valid JSON, has another format marker, is missing fields or
holds another key is reported in :attr:`ResultCache.warnings` and treated as absent, never an error.
"""

from __future__ import annotations

import builtins
import contextlib
import functools
import hashlib
import json
import math
import os
import re
from collections.abc import Callable, Iterator, Mapping
from dataclasses import asdict, dataclass, fields
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import neuronmm_compiler

from ..cost_model import params as cost_model_params
from ..errors import InputError
from ..io import stale_temp_files, write_text_atomic
from ..ir import Graph
from ..targets import Target, get_target

try:  # POSIX only; elsewhere writes are still atomic, just not serialized.
    import fcntl
except ImportError:  # pragma: no cover
    fcntl = None  # type: ignore[assignment]

CACHE_FORMAT = "nmmc-tune-cache"
CACHE_FORMAT_VERSION = 1
_KEY_RE = re.compile(r"[0-9a-f]{64}")


def _versions() -> dict[str, str]:
    """The current nmmc and cost model versions (read at call time, so a bump changes every key)."""
    return {"nmmc_version": neuronmm_compiler.__version__,
            "cost_model_version": str(cost_model_params.COST_MODEL_VERSION)}


@functools.cache
def source_digest() -> str:
    """SHA-256 (16 hex digits) over the names and bytes of nmmc's Python sources, read once per process: a key
    part that changes with any change to a lowering, pass or search between two releases of one version."""
    package = Path(neuronmm_compiler.__file__).parent
    digest = hashlib.sha256()
    for path in sorted(package.rglob("*.py")):
        digest.update(path.relative_to(package).as_posix().encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()[:16]


def _target(target: str | Target) -> Target:
    """The target itself, or the one a name (or calibrated target file) names."""
    return target if isinstance(target, Target) else get_target(target)


def cache_key(graph: Graph, *, target: str | Target, dialect: str, kind: str,
              search: Mapping[str, str] | None = None, sdk: str | None = None) -> str:
    """The cache key of tuning ``graph`` for ``target``/``dialect`` (and Neuron SDK release ``sdk``, which the kernel's
    exchange spelling depends on; the driver always gives it): a 64-digit SHA-256 hex string.
    ``search`` is what else the decision depends on (the driver's ``search_fingerprint``: method,
    trials, seed, exhaustive threshold, a fingerprint of the schedule space). A calibrated target
    adds the fingerprint of its fitted values, so it never shares decisions with its stock target
    nor with another fit."""
    _schedule_class(kind)
    tgt = _target(target)
    # the logical-core degree and the launch context are part of the target a decision was made for: a schedule
    # searched on one physical core is not the best on a logical core (dense 512x576x1536 MLP on trn2 in-graph:
    # 33.1 us re-costed at LNC=2 against 28.0 searched there), and the launch context is kept apart conservatively
    fields_: dict[str, str] = {"graph": graph.signature(), "target": tgt.name, "lnc": str(tgt.lnc),
                               "launch": tgt.launch, "dialect": dialect, "kind": kind, **_versions(),
                               "source": source_digest()}
    if search:
        fields_["search"] = json.dumps(dict(search), sort_keys=True)
    if sdk is not None:
        fields_["sdk"] = sdk
    if tgt.calibrated:
        fields_["target_model"] = tgt.model_fingerprint()
    text = json.dumps(fields_, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()


def describe_graph(graph: Graph) -> str:
    """One line naming a graph and its inputs: ``gemm: a[64,256] bfloat16, b[256,128] bfloat16``."""
    parts = []
    for node in graph.inputs():
        layout = node.attrs.get("layout", "row_major")
        shape = ",".join(map(str, node.shape))
        parts.append(f"{node.id}[{shape}] {node.dtype}" + ("" if layout == "row_major" else f" {layout}"))
    return f"{graph.name}: " + ", ".join(parts)


def describe_key(graph: Graph, *, target: str | Target, dialect: str, kind: str,
                 workload: str | None = None) -> dict[str, str]:
    """The human-readable fields stored next to a key (``workload`` defaults to :func:`describe_graph`)."""
    return {"workload": workload or describe_graph(graph), "target": _target(target).label, "dialect": dialect,
            "kind": kind, **_versions()}


@dataclass(frozen=True)
class CacheRecord:
    """One cached tuning decision. ``created`` is metadata only; it is not part of the key."""

    key: str
    kind: str  # "gemm" or "fused"
    schedule_name: str
    params: dict[str, Any]  # the schedule's as_dict()
    latency_us: float  # predicted by the cost model
    search: dict[str, Any]  # TuneResult.search_summary()
    created: str  # ISO 8601, UTC
    workload: str
    target: str
    dialect: str
    nmmc_version: str
    cost_model_version: str
    source: str = ""  # source_digest() of the nmmc that wrote it ("" in records of nmmc before 2026-12-03)
    sdk: str = ""  # the Neuron SDK release the kernel is for ("" in records written before nmmc recorded it)

    def to_json(self) -> str:
        """The file text: the fields plus the ``format``/``format_version`` marker."""
        data = {"format": CACHE_FORMAT, "format_version": CACHE_FORMAT_VERSION, **asdict(self)}
        return json.dumps(data, indent=2, sort_keys=True, allow_nan=False) + "\n"

    @classmethod
    def from_json(cls, text: str) -> CacheRecord:
        """Parse and check a record; InputError says what is wrong with a malformed or foreign one."""
        try:
            data = json.loads(text)
        except ValueError as exc:
            raise InputError(f"not valid JSON ({exc})") from None
        if not isinstance(data, dict) or data.get("format") != CACHE_FORMAT:
            raise InputError(f"not an {CACHE_FORMAT} file")
        if data.get("format_version") != CACHE_FORMAT_VERSION:
            raise InputError(f"format version {data.get('format_version')!r}, expected {CACHE_FORMAT_VERSION}")
        values = {}
        for f in fields(cls):
            if f.name in ("source", "sdk") and f.name not in data:
                continue  # written by an nmmc that did not record it: the default, unknown
            if f.name not in data:
                raise InputError(f"missing field {f.name!r}")
            value, want = data[f.name], {"params": dict, "search": dict, "latency_us": (int, float)}.get(f.name, str)
            if not isinstance(value, want) or isinstance(value, bool):
                raise InputError(f"field {f.name!r} has the wrong type ({type(value).__name__})")
            values[f.name] = value
        record = cls(**values)
        if not _KEY_RE.fullmatch(record.key):
            raise InputError(f"malformed key {record.key!r}")
        if not math.isfinite(record.latency_us):
            raise InputError("latency_us is not finite")
        cached_schedule(record)  # the parameters must rebuild a schedule
        return record


def _schedule_class(kind: str) -> type:
    """The schedule class of a lowering entry's ``kind`` (InputError for an unknown kind)."""
    from ..lowerings import registered_lowerings

    entries = registered_lowerings()
    if kind not in entries:
        raise InputError(f"unknown cache kind {kind!r}; kinds: {', '.join(entries)}")
    return entries[kind].schedule_class


def cached_schedule(record: CacheRecord) -> Any:
    """Rebuild the schedule object a record stores (InputError if its parameters do not fit its kind)."""
    cls = _schedule_class(record.kind)
    names = {f.name for f in fields(cls)}
    quiet = set(cls.QUIET)  # parameters a record leaves out at their default (ScheduleParams.QUIET)
    missing, extra = sorted(names - set(record.params) - quiet), sorted(set(record.params) - names)
    if missing or extra:
        raise InputError(f"{record.kind} schedule parameters: missing {missing}, unexpected {extra}")
    if any(not isinstance(v, (int, str)) or isinstance(v, bool) for v in record.params.values()):
        raise InputError(f"{record.kind} schedule parameters must be integers or strings")
    return cls().with_params(dict(record.params))


def new_record(graph: Graph, *, target: str | Target, dialect: str, kind: str, schedule: Any,
               schedule_name: str, latency_us: float, search: dict[str, Any], workload: str | None = None,
               key: str | None = None, sdk: str | None = None) -> CacheRecord:
    """A record of tuning ``graph`` (``key`` defaults to :func:`cache_key` without a search request;
    descriptive fields computed here, ``created`` = now)."""
    target = _target(target)  # a calibrated target file is read once
    desc = describe_key(graph, target=target, dialect=dialect, kind=kind, workload=workload)
    key = key or cache_key(graph, target=target, dialect=dialect, kind=kind, sdk=sdk)
    return CacheRecord(key=key, kind=kind,
                       schedule_name=schedule_name, params=schedule.as_dict(), latency_us=float(latency_us),
                       search=dict(search), created=datetime.now(timezone.utc).isoformat(timespec="seconds"),
                       workload=desc["workload"], target=desc["target"], dialect=dialect,
                       nmmc_version=desc["nmmc_version"], cost_model_version=desc["cost_model_version"],
                       source=source_digest(), sdk=sdk or "")


def usable_here(record: CacheRecord) -> bool:
    """Whether a request of this nmmc can hit ``record``: its key holds the nmmc and cost-model versions and the
    source digest, so a record written under others is never read again."""
    now = _versions()
    return (record.nmmc_version, record.cost_model_version, record.source) == (
        now["nmmc_version"], now["cost_model_version"], source_digest())


def default_cache_dir() -> Path:
    """``$NMMC_CACHE_DIR``, else ``$XDG_CACHE_HOME/nmmc`` (if absolute, per the XDG spec), else ``~/.cache/nmmc``."""
    explicit = os.environ.get("NMMC_CACHE_DIR")
    if explicit:
        return Path(explicit).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME")
    if xdg and Path(xdg).is_absolute():
        return Path(xdg) / "nmmc"
    return Path.home() / ".cache" / "nmmc"


class ResultCache:
    """Tuning records under ``directory/tune/``; see the module docstring for the guarantees."""

    def __init__(self, directory: Path | str | None = None) -> None:
        self.directory = Path(directory) if directory is not None else default_cache_dir()
        self.tune_dir = self.directory / "tune"
        self.warnings: list[str] = []

    def path(self, key: str) -> Path:
        """The file of ``key`` (InputError unless ``key`` is a 64-digit lower-case hex string)."""
        if not isinstance(key, str) or not _KEY_RE.fullmatch(key):
            raise InputError(f"malformed cache key {key!r} (expected 64 hex digits)")
        return self.tune_dir / f"{key}.json"

    def _warn(self, path: Path, reason: str) -> None:
        self.warnings.append(f"ignoring cache file {path}: {reason}")

    def _load(self, path: Path, key: str) -> CacheRecord | None:
        try:
            text = path.read_text(encoding="utf-8")
        except FileNotFoundError:
            return None
        except (OSError, UnicodeDecodeError) as exc:
            self._warn(path, f"unreadable ({exc})")
            return None
        try:
            record = CacheRecord.from_json(text)
        except InputError as exc:
            self._warn(path, str(exc))
            return None
        if record.key != key:
            self._warn(path, f"holds key {record.key}, not {key}")
            return None
        return record

    def get(self, key: str) -> CacheRecord | None:
        """The record of ``key``, or None when absent or unusable (then a warning says why)."""
        return self._load(self.path(key), key)

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        self.tune_dir.mkdir(parents=True, exist_ok=True)
        with open(self.tune_dir / ".lock", "a+b") as handle:
            if fcntl is not None:
                fcntl.flock(handle.fileno(), fcntl.LOCK_EX)
            try:
                yield
            finally:
                if fcntl is not None:
                    fcntl.flock(handle.fileno(), fcntl.LOCK_UN)

    def put(self, record: CacheRecord) -> bool:
        """Store ``record`` atomically, replacing any record of its key. An invalid record is an
        InputError; a cache directory that cannot be written is a warning and returns False."""
        try:
            text = record.to_json()
        except ValueError as exc:  # NaN or infinite latency
            raise InputError(f"cannot cache a record with {exc}") from None
        CacheRecord.from_json(text)  # never write what could not be read back
        path = self.path(record.key)
        try:
            with self._locked():
                write_text_atomic(path, text)
        except OSError as exc:
            self.warnings.append(f"could not write cache file {path}: {exc}")
            return False
        return True

    def _files(self) -> list[Path]:
        if not self.tune_dir.is_dir():
            return []
        return sorted(p for p in self.tune_dir.glob("*.json") if _KEY_RE.fullmatch(p.stem))

    def list(self) -> builtins.list[CacheRecord]:
        """Every valid record, by key; unusable files are skipped with a warning."""
        records = (self._load(p, p.stem) for p in self._files())
        return [r for r in records if r is not None]

    def show(self, key_prefix: str) -> CacheRecord:
        """The record whose key starts with ``key_prefix`` (InputError if none, several, or unusable)."""
        prefix = key_prefix.strip().lower()
        if not re.fullmatch(r"[0-9a-f]+", prefix):
            raise InputError(f"cache key prefix must be hex digits; got {key_prefix!r}")
        matches = [p.stem for p in self._files() if p.stem.startswith(prefix)]
        if not matches:
            raise InputError(f"no cached result has a key starting with {prefix!r} (in {self.tune_dir})")
        if len(matches) > 1:
            shown = ", ".join(m[:12] for m in matches[:5]) + (", ..." if len(matches) > 5 else "")
            raise InputError(f"cache key prefix {prefix!r} is ambiguous: {len(matches)} keys match ({shown})")
        record = self.get(matches[0])
        if record is None:
            raise InputError(f"cached result {matches[0]} is unusable: "
                             + (self.warnings[-1] if self.warnings else "it was removed"))
        return record

    def prune(self) -> tuple[int, int]:
        """Remove the record files this nmmc can no longer use (:func:`usable_here`: written by another nmmc version,
        cost model or source, or unusable) and stale temporary files; return (removed, kept)."""
        def usable(path: Path) -> bool:
            record = self._load(path, path.stem)
            return record is not None and usable_here(record)

        return self._remove(self._files, usable)

    def clear(self) -> int:
        """Remove every record file (valid or not) and stale temporary files; return the records removed."""
        return self._remove(lambda: builtins.list(self.tune_dir.glob("*.json")), lambda path: False)[0]

    def _remove(self, files: Callable[[], builtins.list[Path]], keep: Callable[[Path], bool]) -> tuple[int, int]:
        """Under the lock, delete the ``files()`` that ``keep`` rejects and the stale temporary files; return
        (removed, kept)."""
        if not self.tune_dir.is_dir():
            return 0, 0
        removed = kept = 0
        with self._locked():
            for path in files():
                if keep(path):
                    kept += 1
                    continue
                with contextlib.suppress(FileNotFoundError):
                    path.unlink()
                    removed += 1
            for path in stale_temp_files(self.tune_dir, "*.json"):
                with contextlib.suppress(FileNotFoundError):
                    path.unlink()
        return removed, kept

"""The tuning result cache: keys, records, directory choice, damaged files, concurrent use."""

from __future__ import annotations

import json
import multiprocessing
import os
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import pytest

import neuronmm_compiler
from neuronmm_compiler.artifacts import (
    CACHE_FORMAT,
    CacheRecord,
    ResultCache,
    cache_key,
    cached_schedule,
    default_cache_dir,
    describe_key,
    new_record,
)
from neuronmm_compiler.artifacts import cache as cache_module
from neuronmm_compiler.cost_model import params as cost_model_params
from neuronmm_compiler.errors import InputError
from neuronmm_compiler.frontends.shapes import gemm_graph
from neuronmm_compiler.frontends.workloads import chain_workload, gemm_workload, mlp_workload
from neuronmm_compiler.ir import Graph
from neuronmm_compiler.schedule.fused import FusedSchedule
from neuronmm_compiler.schedule.gemm import GemmSchedule
from neuronmm_compiler.targets import get_target

SRC = Path(__file__).resolve().parent.parent / "src"


def _gemm_record(m: int = 64, n: int = 128, k: int = 256, **changes) -> CacheRecord:
    schedule = GemmSchedule(tile_m=64, tiles_in_block_k=2, loop_order="kmn", accumulate="sbuf")
    return new_record(gemm_graph(m, n, k), target="trn1", dialect="nki", kind="gemm", schedule=schedule,
                      schedule_name="tuned (exhaustive, seed 0)", latency_us=12.5,
                      search={"method": "exhaustive", "evaluated": 42}, **changes)


def _fake(key: str, **changes) -> CacheRecord:
    """A valid record under a chosen key (keys are hashes; tests of prefixes need chosen ones)."""
    return replace(_gemm_record(), key=key, **changes)


def test_round_trip_gemm_and_fused(tmp_path):
    cache = ResultCache(tmp_path)
    gemm = _gemm_record()
    workload = mlp_workload(64, 256, 512, rank=128)
    fused_schedule = FusedSchedule(tokens_per_block=64, cache_weights="stage1", mlp="split", x_transpose="pe")
    fused = new_record(workload.graph(), target=get_target("trn2"), dialect="neuronxcc", kind="fused",
                       schedule=fused_schedule, schedule_name="tuned", latency_us=7,
                       search={"method": "optuna", "trials": 150}, workload=workload.describe())
    assert cache.get(gemm.key) is None and cache.list() == []
    assert cache.put(gemm) and cache.put(fused)
    assert cache.get(gemm.key) == gemm and cache.get(fused.key) == fused
    assert sorted(r.key for r in cache.list()) == sorted([gemm.key, fused.key])
    assert cached_schedule(cache.get(gemm.key)) == GemmSchedule(tile_m=64, tiles_in_block_k=2, loop_order="kmn",
                                                                accumulate="sbuf")
    assert cached_schedule(cache.get(fused.key)) == fused_schedule
    assert fused.target == "trn2" and fused.workload == workload.describe() and fused.latency_us == 7.0
    assert gemm.workload == "gemm: a[64,256] bfloat16, b[256,128] bfloat16"
    data = json.loads((tmp_path / "tune" / f"{gemm.key}.json").read_text())
    assert data["format"] == CACHE_FORMAT and data["format_version"] == 1 and data["key"] == gemm.key
    assert CacheRecord.from_json(gemm.to_json()) == gemm
    assert cache.warnings == []


def test_put_replaces_the_record_of_its_key(tmp_path):
    cache = ResultCache(tmp_path)
    first = _gemm_record()
    second = replace(first, latency_us=3.0, schedule_name="better")
    cache.put(first)
    cache.put(second)
    assert cache.get(first.key) == second and len(cache.list()) == 1


def test_key_is_stable_and_covers_what_the_decision_depends_on(monkeypatch):
    def key(graph: Graph, target: str = "trn1", dialect: str = "nki", kind: str = "gemm") -> str:
        return cache_key(graph, target=target, dialect=dialect, kind=kind)

    base = key(gemm_graph(64, 128, 256))
    assert len(base) == 64 and int(base, 16) >= 0
    assert key(gemm_graph(64, 128, 256)) == base
    assert key(gemm_workload(64, 128, 256).graph()) == base
    assert cache_key(gemm_graph(64, 128, 256), target=get_target("trn1"), dialect="nki", kind="gemm") == base
    # structurally equal, built by hand (dtype spelled differently) or copied
    by_hand = Graph("gemm")
    a, b = by_hand.add_input("a", (64, 256), "bf16"), by_hand.add_input("b", (256, 128), "bfloat16")
    by_hand.add_output("c", by_hand.add_matmul(a, b))
    assert by_hand == gemm_graph(64, 128, 256) and key(by_hand) == base
    assert key(gemm_graph(64, 128, 256).copy()) == base
    different = {
        "target": key(gemm_graph(64, 128, 256), target="trn2"),
        # a logical core and a launch context are other targets (the schedule searched at LNC=1 is not LNC=2's)
        "logical core": key(gemm_graph(64, 128, 256), target="trn2:lnc=2"),
        "launch": key(gemm_graph(64, 128, 256), target="trn1:launch=in-graph"),
        "dialect": key(gemm_graph(64, 128, 256), dialect="neuronxcc"),
        "kind": key(gemm_graph(64, 128, 256), kind="fused"),
        "shape": key(gemm_graph(64, 128, 512)),
        "transposed shape": key(gemm_graph(128, 64, 256)),
        "dtype": key(gemm_graph(64, 128, 256, dtype="float32")),
        "layout": key(gemm_graph(64, 128, 256, a_layout="km")),
        "chain": key(chain_workload(64, 128, 256, rank=128).graph(), kind="fused"),
        "chain rank": key(chain_workload(64, 128, 256, rank=256).graph(), kind="fused"),
    }
    assert len({base, *different.values()}) == len(different) + 1, different
    # the Neuron SDK release a kernel is for (the driver always gives it: an exchange is spelled per release)
    releases = {sdk: cache_key(gemm_graph(64, 128, 256), target="trn1", dialect="nki", kind="gemm", sdk=sdk)
                for sdk in ("2.33", "2.34")}
    assert len({base, *releases.values()}) == 3
    monkeypatch.setattr(cost_model_params, "COST_MODEL_VERSION", "999")
    assert key(gemm_graph(64, 128, 256)) != base
    assert describe_key(gemm_graph(64, 128, 256), target="trn1", dialect="nki", kind="gemm")["cost_model_version"] \
        == "999"
    monkeypatch.undo()
    monkeypatch.setattr(neuronmm_compiler, "__version__", "9.9.9")
    assert key(gemm_graph(64, 128, 256)) != base
    monkeypatch.undo()
    # a change to nmmc's code between releases (an editable install, a checkout) is a change of key too
    monkeypatch.setattr(cache_module, "source_digest", lambda: "0" * 16)
    assert key(gemm_graph(64, 128, 256)) != base
    monkeypatch.undo()
    assert key(gemm_graph(64, 128, 256)) == base
    with pytest.raises(InputError):
        key(gemm_graph(64, 128, 256), kind="chain")


def test_key_is_the_same_in_another_process():
    code = ("from neuronmm_compiler.artifacts import cache_key; "
            "from neuronmm_compiler.frontends.shapes import gemm_graph;"
            "print(cache_key(gemm_graph(64, 128, 256, a_layout='km'), target='trn2', dialect='nki', kind='gemm'))")
    env = {**os.environ, "PYTHONPATH": str(SRC), "PYTHONHASHSEED": "12345"}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == cache_key(gemm_graph(64, 128, 256, a_layout="km"), target="trn2", dialect="nki",
                                           kind="gemm")


def test_default_directory_precedence(monkeypatch, tmp_path):
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.delenv("NMMC_CACHE_DIR", raising=False)
    monkeypatch.delenv("XDG_CACHE_HOME", raising=False)
    assert default_cache_dir() == tmp_path / "home" / ".cache" / "nmmc"
    monkeypatch.setenv("XDG_CACHE_HOME", "relative/ignored")  # the XDG spec: relative paths are invalid
    assert default_cache_dir() == tmp_path / "home" / ".cache" / "nmmc"
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert default_cache_dir() == tmp_path / "xdg" / "nmmc"
    monkeypatch.setenv("NMMC_CACHE_DIR", str(tmp_path / "explicit"))
    assert default_cache_dir() == tmp_path / "explicit"
    cache = ResultCache()
    cache.put(_gemm_record())
    assert len(list((tmp_path / "explicit" / "tune").glob("*.json"))) == 1
    assert ResultCache(tmp_path / "given").directory == tmp_path / "given"


def _damage(kind: str, good: CacheRecord, other: CacheRecord) -> bytes:
    text = good.to_json()
    data = json.loads(text)
    if kind == "truncated":
        return text[: len(text) // 2].encode()
    if kind == "empty":
        return b""
    if kind == "not json":
        return b"\x00\xff garbage"
    if kind == "foreign":
        return json.dumps({**data, "format": "something-else"}).encode()
    if kind == "future version":
        return json.dumps({**data, "format_version": 2}).encode()
    if kind == "json list":
        return b"[1, 2, 3]"
    if kind == "missing field":
        return json.dumps({k: v for k, v in data.items() if k != "params"}).encode()
    if kind == "wrong type":
        return json.dumps({**data, "latency_us": "fast"}).encode()
    if kind == "nan latency":
        return json.dumps({**data, "latency_us": float("nan")}).encode()  # json.loads accepts NaN
    if kind == "bad params":
        return json.dumps({**data, "params": {**data["params"], "tile_q": 3}}).encode()
    assert kind == "key mismatch"
    return other.to_json().encode()


DAMAGE = ("truncated", "empty", "not json", "foreign", "future version", "json list", "missing field",
          "wrong type", "nan latency", "bad params", "key mismatch")


@pytest.mark.parametrize("kind", DAMAGE)
def test_damaged_file_is_ignored_with_a_warning(tmp_path, kind):
    cache = ResultCache(tmp_path)
    good, other, survivor = _gemm_record(), _gemm_record(m=32), _gemm_record(m=16)
    cache.put(good)
    cache.put(survivor)
    path = tmp_path / "tune" / f"{good.key}.json"
    path.write_bytes(_damage(kind, good, other))
    assert cache.get(good.key) is None
    assert len(cache.warnings) == 1 and str(path) in cache.warnings[0]
    assert cache.list() == [survivor]
    assert len(cache.warnings) == 2
    with pytest.raises(InputError, match="unusable"):
        cache.show(good.key[:10])
    assert cache.put(good) and cache.get(good.key) == good  # a later put repairs it


def test_invalid_records_are_not_written(tmp_path):
    cache = ResultCache(tmp_path)
    good = _gemm_record()
    for bad in (replace(good, latency_us=float("nan")), replace(good, kind="chain"),
                replace(good, params={"tile_m": 64}), replace(good, key="not-a-key")):
        with pytest.raises(InputError):
            cache.put(bad)
    assert list(tmp_path.rglob("*.json")) == []
    with pytest.raises(InputError):
        cache.get("../../etc/passwd")


def test_unwritable_directory_is_a_warning_not_a_crash(tmp_path):
    blocker = tmp_path / "not-a-directory"
    blocker.write_text("a file where the cache directory should be")
    cache = ResultCache(blocker)
    record = _gemm_record()
    assert cache.put(record) is False and "could not write" in cache.warnings[0]
    assert cache.get(record.key) is None and cache.list() == [] and cache.clear() == 0


def test_show_by_unique_prefix(tmp_path):
    cache = ResultCache(tmp_path)
    first, second, third = _fake("ab0" + "0" * 61), _fake("ab1" + "0" * 61), _fake("cd" + "0" * 62)
    for record in (first, second, third):
        cache.put(record)
    assert cache.show("ab0") == first and cache.show("AB1") == second and cache.show("c") == third
    assert cache.show(third.key) == third
    with pytest.raises(InputError, match="ambiguous: 2 keys"):
        cache.show("ab")
    with pytest.raises(InputError, match="no cached result"):
        cache.show("ef")
    with pytest.raises(InputError, match="hex"):
        cache.show("")
    with pytest.raises(InputError, match="hex"):
        cache.show("../x")


def test_clear(tmp_path):
    cache = ResultCache(tmp_path)
    assert cache.clear() == 0  # no directory yet
    for m in (16, 32, 64):
        cache.put(_gemm_record(m=m))
    (tmp_path / "tune" / f"{'e' * 64}.json").write_text("{broken")
    stale = tmp_path / "tune" / f".{'f' * 64}.json.123.abcd.tmp"
    stale.write_text("partial")
    assert cache.clear() == 4
    assert cache.list() == [] and not stale.exists()
    assert list((tmp_path / "tune").glob("*.json")) == []
    assert cache.clear() == 0


def test_prune_removes_what_this_nmmc_cannot_hit_and_keeps_the_rest(tmp_path):
    """A record written by other code (another source digest, nmmc or cost-model version, or none recorded, as
    before 2026-12-03) is under a key no request of this nmmc makes; prune removes those and broken files only."""
    cache = ResultCache(tmp_path)
    assert cache.prune() == (0, 0)  # no directory yet
    current = _gemm_record()
    others = [_fake(c * 64, **field) for c, field in
              (("a", {"source": "0" * 16}), ("b", {"nmmc_version": "0.0.1"}), ("c", {"cost_model_version": "0"}))]
    for record in (current, *others):
        assert cache.put(record)
    legacy = json.loads(_fake("d" * 64).to_json())
    del legacy["source"]  # a record of an nmmc that did not store its source digest still reads
    (tmp_path / "tune" / f"{'d' * 64}.json").write_text(json.dumps(legacy))
    assert cache.get("d" * 64) is not None and cache.get("d" * 64).source == ""
    (tmp_path / "tune" / f"{'e' * 64}.json").write_text("{broken")
    assert cache.prune() == (5, 1)
    assert [r.key for r in cache.list()] == [current.key]
    assert cache.prune() == (0, 1)


def test_prune_through_the_cli(tmp_path):
    from click.testing import CliRunner

    from neuronmm_compiler.cli import main

    cache = ResultCache(tmp_path)
    cache.put(_gemm_record())
    cache.put(_fake("a" * 64, source="0" * 16))
    result = CliRunner().invoke(main, ["cache", "prune", "--cache-dir", str(tmp_path)])
    assert result.exit_code == 0, result.output
    assert result.output.startswith("removed 1 entries this nmmc cannot use") and result.output.rstrip().endswith(
        "kept 1")


# ----------------------------------------------------------------------------- concurrency

SHARED_KEY = "a" * 64
PADDING = "x" * 50_000  # large files make a torn read likely if writes were not atomic


def _stamped(key: str, writer: int, step: int) -> CacheRecord:
    """A record whose fields all encode (writer, step), so a mix of two writes is detectable."""
    return _fake(key, latency_us=writer * 1e6 + step, schedule_name=f"w{writer} s{step}",
                 params=GemmSchedule(tile_m=writer + 1, tiles_in_block_k=step % 7 + 1).as_dict(),
                 search={"writer": writer, "step": step, "padding": PADDING})


def _consistent(record: CacheRecord) -> bool:
    writer, step = record.search["writer"], record.search["step"]
    return (record.latency_us == writer * 1e6 + step and record.schedule_name == f"w{writer} s{step}"
            and record.params["tile_m"] == writer + 1 and record.params["tiles_in_block_k"] == step % 7 + 1
            and record.search["padding"] == PADDING)


def _worker(args: tuple[str, int, int, float]) -> tuple[int, int, list[str], list[str]]:
    directory, writer, writers, seconds = args
    cache = ResultCache(directory)
    keys = [SHARED_KEY] + [f"{w + 1:x}" * 64 for w in range(writers)]
    own = keys[writer + 1]
    reads = complete = 0
    bad: list[str] = []
    deadline = time.monotonic() + seconds
    step = 0
    while time.monotonic() < deadline and step < 5000:
        if writer == 0 and step % 25 == 24:
            cache.clear()  # before the puts, so every writer's last act is a put
        cache.put(_stamped(SHARED_KEY, writer, step))
        cache.put(_stamped(own, writer, step))
        for key in keys:
            record = cache.get(key)
            reads += 1
            if record is not None:
                complete += 1
                if record.key != key or not _consistent(record):
                    bad.append(f"{key[:4]}: {record.schedule_name}")
        step += 1
    return reads, complete, bad, cache.warnings


def test_concurrent_writers_and_readers(tmp_path):
    writers = 4
    method = "fork" if "fork" in multiprocessing.get_all_start_methods() else "spawn"
    with multiprocessing.get_context(method).Pool(writers) as pool:
        results = pool.map(_worker, [(str(tmp_path), w, writers, 1.5) for w in range(writers)])
    assert all(reads > 0 for reads, *_ in results)
    assert sum(complete for _, complete, *_ in results) > 0
    assert [b for *_, bad, _ in results for b in bad] == []
    assert [w for *_, warnings in results for w in warnings] == []
    cache = ResultCache(tmp_path)
    files = sorted(p.name for p in (tmp_path / "tune").iterdir() if p.name != ".lock")
    records = cache.list()
    assert cache.warnings == [] and all(_consistent(r) for r in records)
    assert files == sorted(f"{r.key}.json" for r in records)  # no temporary or damaged file left behind
    assert {SHARED_KEY, "1" * 64} <= {r.key for r in records}  # writer 0's last act was a put


def test_a_search_on_one_core_does_not_answer_for_a_logical_core(tmp_path):
    from neuronmm_compiler.driver import tune_cached
    from neuronmm_compiler.jobs import SearchSettings, resolve

    cache, settings = ResultCache(tmp_path), SearchSettings(trials=8, seed=0)
    workload = gemm_workload(256, 512, 256)
    _, hit = tune_cached(resolve(workload, get_target("trn2:lnc=1")), settings, cache)
    assert not hit
    two, hit = tune_cached(resolve(workload, get_target("trn2:lnc=2")), settings, cache)
    assert not hit  # searched on the logical core, not the one-core decision re-costed
    again, hit = tune_cached(resolve(workload, get_target("trn2:lnc=2")), settings, cache)
    assert hit and again.compiled.cost.latency_us == two.compiled.cost.latency_us

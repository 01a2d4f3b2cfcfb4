"""Schedule lockfiles and ``regress``: a fresh lock passes; each kind of drift fails with its reason."""

from __future__ import annotations

import dataclasses
import json

import pytest

import neuronmm_compiler.driver as driver_module
from helpers import tune_gemm as tune
from helpers import tune_graph
from neuronmm_compiler import targets
from neuronmm_compiler.artifacts.lockfile import (
    LOCK_FORMAT,
    LockEntry,
    Lockfile,
    entry_from_compiled,
    entry_from_tuned,
    entry_key,
)
from neuronmm_compiler.artifacts.regress import check_entry, compile_entry, regress, update_lock
from neuronmm_compiler.errors import InputError
from neuronmm_compiler.frontends.workloads import (
    Workload,
    chain_workload,
    gemm_workload,
    mlp_workload,
    workload_from_dict,
)
from neuronmm_compiler.targets import get_target

pytestmark = pytest.mark.usefixtures("one_polish_start")  # what surrounds a search, not the search (conftest.py)

TRIALS = 20
GEMM = gemm_workload(128, 512, 256)
CHAIN = chain_workload(64, 512, 256, rank=128)
# valid for GEMM but slow: one DMA per tile, transposing loads of A, no blocking
SLOW_GEMM = {"tile_m": 128, "tile_n": 128, "tile_k": 128, "tiles_in_block_m": 1, "tiles_in_block_n": 1,
             "tiles_in_block_k": 1, "loop_order": "mnk", "tile_order": "mn", "accumulate": "psum", "dma": "tile",
             "a_transpose": "dma", "accumulator_dtype": "float32"}


@pytest.fixture(scope="module")
def base_lock() -> Lockfile:
    lock = Lockfile()
    gemm = tune(GEMM.m, GEMM.n, GEMM.k, target="trn1", trials=TRIALS, seed=0)
    lock.add(entry_from_tuned(GEMM, gemm, target="trn1", dialect="neuronxcc", seed=0, trials=TRIALS))
    chain = tune_graph(CHAIN, target=get_target("trn1"), trials=TRIALS, seed=0)
    lock.add(entry_from_tuned(CHAIN, chain, target="trn1", dialect="neuronxcc", seed=0, trials=TRIALS))
    return lock


@pytest.fixture
def lock(base_lock: Lockfile) -> Lockfile:
    return Lockfile(dict(base_lock.entries))


def entry_of(lock: Lockfile, kind: str):
    (entry,) = [e for e in lock if e.workload["kind"] == kind]
    return entry


def with_edit(lock: Lockfile, kind: str, **changes) -> Lockfile:
    edited = Lockfile(dict(lock.entries))
    edited.add(dataclasses.replace(entry_of(lock, kind), **changes))
    return edited


def result_of(report, kind: str):
    (result,) = [r for r in report.results if r.entry.workload["kind"] == kind]
    return result


def test_fresh_lock_passes(lock: Lockfile) -> None:
    report = regress(lock)
    assert report.ok, report.table()
    assert [r.status for r in report.results] == ["ok", "ok"]
    for r in report.results:
        assert r.now_us == pytest.approx(r.entry.latency_us) and r.fresh_us == pytest.approx(r.entry.latency_us)
        assert r.current is not None and r.current.kernel_sha256 == r.entry.kernel_sha256
    table = report.table().splitlines()
    assert len(table) == 1 + 2 + 1 and "gemm 128x512x256 bf16" in report.table()  # rows in key order (sha256)
    assert any(row.startswith("chain 64x512x256 r128") for row in table[1:3])


def test_entries_record_what_was_tuned(lock: Lockfile) -> None:
    gemm, chain = entry_of(lock, "gemm"), entry_of(lock, "chain")
    assert (gemm.schedule_kind, chain.schedule_kind) == ("gemm", "fused")
    assert set(gemm.predicted) == {"latency_us", "bound", "hbm_bytes_read", "hbm_bytes_written", "dma_transfers",
                                   "feasible"}
    assert gemm.key != chain.key and len(gemm.key) == 64 and gemm.seed == 0 and gemm.trials == TRIALS
    assert gemm.method in ("exhaustive", "optuna") and gemm.target_fingerprint != ""
    again = Lockfile(dict(lock.entries))
    again.add(dataclasses.replace(gemm, seed=7))  # same workload: replaces, does not append
    assert len(again) == 2 and entry_of(again, "gemm").seed == 7


def test_round_trip_is_byte_identical(lock: Lockfile, tmp_path) -> None:
    path = tmp_path / "nmmc.lock.json"
    lock.save(path)
    first = path.read_bytes()
    loaded = Lockfile.load(path)
    assert loaded.entries == lock.entries
    loaded.save(path)
    assert path.read_bytes() == first
    assert json.loads(first)["format"] == LOCK_FORMAT and first.endswith(b"\n")
    assert [p.name for p in tmp_path.iterdir()] == ["nmmc.lock.json"]  # no temporary left behind
    assert len(Lockfile.load(tmp_path / "missing.json")) == 0


@pytest.mark.parametrize("mutate", [
    lambda d: "{not json",
    lambda d: json.dumps({**d, "format": "other"}),
    lambda d: json.dumps({**d, "version": 99}),
    lambda d: json.dumps({**d, "entries": {}}),
    lambda d: json.dumps({**d, "entries": [{k: v for k, v in d["entries"][0].items() if k != "seed"}]}),
    lambda d: json.dumps({**d, "entries": [{**d["entries"][0], "key": "0" * 64}]}),
    lambda d: json.dumps({**d, "entries": [{**d["entries"][0], "trials": "many"}]}),
    lambda d: json.dumps({**d, "entries": [d["entries"][0], d["entries"][0]]}),
])
def test_malformed_lock_is_an_input_error(lock: Lockfile, tmp_path, mutate) -> None:
    path = tmp_path / "bad.lock.json"
    path.write_text(mutate(json.loads(lock.to_json())))
    with pytest.raises(InputError, match=r"bad\.lock\.json"):
        Lockfile.load(path)


def test_entries_record_the_sdk_and_regress_rederives_the_kernel_of_that_release() -> None:
    """A lock entry records the Neuron SDK release its kernel was emitted for (in its key too): a kernel whose programs
    exchange is spelled per release (nki.lnc.sendrecv on 2.34, nisa.sendrecv on 2.33), and regress recompiles each
    entry for its own release, to the same bytes. An entry written before nmmc recorded the release keeps its key and
    is re-derived for the newest release."""
    from neuronmm_compiler.driver import compile_workload
    from neuronmm_compiler.targets import with_lnc

    workload, target = mlp_workload(1, 512, 1024, dense=True), with_lnc(get_target("trn2"), 2)
    entries = {}
    for sdk in ("2.33", "2.34"):
        compiled = compile_workload(workload, target=target, sdk=sdk, params={"lnc_split": "hidden"})
        entries[sdk] = entry_from_compiled(workload, compiled, seed=0, trials=1)
        assert entries[sdk].sdk == sdk
        result = check_entry(entries[sdk], search=False)
        assert result.status == "ok" and result.current.kernel_sha256 == entries[sdk].kernel_sha256, result.reasons
    assert entries["2.33"].key != entries["2.34"].key and entries["2.33"].kernel_sha256 != entries["2.34"].kernel_sha256
    old = {k: v for k, v in entries["2.34"].as_dict().items() if k not in ("sdk", "key")}
    loaded = LockEntry.from_dict({**old, "key": entry_key(old["workload"], old["target"], old["dialect"])})
    assert loaded.sdk is None and compile_entry(loaded, workload, target).sdk == "2.34"


@pytest.mark.parametrize("workload", [GEMM, CHAIN, gemm_workload(3, 5, 7, dtype="float32", a_layout="km"),
                                      mlp_workload(16, 256, 512, ranks=(128, 128, 256)),
                                      mlp_workload(16, 256, 512, dense=True)])
def test_workload_dict_round_trip(workload: Workload) -> None:
    data = json.loads(json.dumps(workload.to_dict()))
    assert workload_from_dict(data) == workload


@pytest.mark.parametrize("data", [{"kind": "conv"}, {"kind": "gemm", "m": 0, "n": 1, "k": 1},
                                  {"kind": "chain", "m": 1, "n": 1, "k": 1},
                                  {"kind": "mlp", "tokens": 1, "hidden": 1, "intermediate": 1, "ranks": [1, 2]}])
def test_malformed_workload_is_an_input_error(data) -> None:
    with pytest.raises(InputError):
        workload_from_dict(data)


@pytest.mark.parametrize(("kind", "params", "match"), [
    ("gemm", {"tile_m": 4096}, "tile_m=4096"),
    ("gemm", {"tile_q": 64}, "unknown schedule parameter 'tile_q'"),
    ("gemm", {"loop_order": "mmm"}, "loop_order"),
    ("fused", {"tokens_per_block": 4096}, "tokens_per_block=4096"),
    # out of the declared range: once silently clamped by the lowering, now invalid
    ("fused", {"k_tiles_per_block": 100000}, "k_tiles_per_block=100000"),
    ("fused", {"weight_block_kib": 100000}, "weight_block_kib=100000"),
    ("gemm", {"tiles_in_block_k": 100000}, "tiles_in_block_k=100000"),
])
def test_edited_params_that_no_longer_validate_are_invalid(lock: Lockfile, kind, params, match) -> None:
    workload_kind = "gemm" if kind == "gemm" else "chain"
    entry = entry_of(lock, workload_kind)
    report = regress(with_edit(lock, workload_kind, schedule={**entry.schedule, **params}), search=False)
    result = result_of(report, workload_kind)
    assert not report.ok and result.status == "invalid" and result.now_us is None
    assert any(match in reason for reason in result.reasons), result.reasons
    assert result_of(report, "chain" if kind == "gemm" else "gemm").status == "ok"


def test_slower_params_are_stale_and_drift_and_update_fixes_them(lock: Lockfile) -> None:
    edited = with_edit(lock, "gemm", schedule=SLOW_GEMM)
    report = regress(edited)
    result = result_of(report, "gemm")
    assert not report.ok and {"stale", "drift"} <= set(result.statuses), report.table()
    assert result.now_us > result.entry.latency_us * 1.02 and result.fresh_us == pytest.approx(result.entry.latency_us)
    assert "faster" in report.table() and result.status == "drift"
    updated = update_lock(edited, report)
    assert entry_of(updated, "gemm").schedule == entry_of(lock, "gemm").schedule
    assert regress(updated).ok
    # a generous tolerance accepts the same lock
    assert regress(edited, tolerance=result.change + 0.01, search=False).ok


def test_a_consistently_recorded_slow_schedule_is_stale_only(lock: Lockfile) -> None:
    entry = entry_of(lock, "gemm")
    slow = compile_entry(dataclasses.replace(entry, schedule=SLOW_GEMM), GEMM, get_target("trn1"))
    edited = Lockfile(dict(lock.entries))
    edited.add(entry_from_compiled(GEMM, slow, seed=0, trials=TRIALS, method=entry.method))
    report = regress(edited)
    assert result_of(report, "gemm").statuses == ["stale"] and not report.ok
    assert regress(edited, search=False).ok  # without a fresh search nothing else is wrong


def test_changed_target_constant_is_target_changed_and_drift(lock: Lockfile, monkeypatch) -> None:
    slower_dma = dataclasses.replace(targets.TARGETS["trn1"], dma_fixed_cost_us=2.6)
    monkeypatch.setitem(targets.TARGETS, "trn1", slower_dma)
    report = regress(lock, search=False)
    assert not report.ok
    for result in report.results:
        assert {"target-changed", "drift"} <= set(result.statuses), report.table()
        assert result.status == "target-changed" and result.change > 0.02
    updated = update_lock(lock, report)
    assert regress(updated, search=False).ok  # re-locked against the new table


def test_target_change_without_latency_change_is_target_changed_only(lock: Lockfile, monkeypatch) -> None:
    renamed = dataclasses.replace(targets.TARGETS["trn1"], description="Trainium1, relabelled")
    monkeypatch.setitem(targets.TARGETS, "trn1", renamed)
    report = regress(lock, search=False)
    assert [r.statuses for r in report.results] == [["target-changed"], ["target-changed"]]
    assert not report.ok


def _corrupt(emit):
    """Wrap emit_kernel so every kernel runs its first matmul twice (a wrong result, same interface)."""
    def wrapped(*args, **kwargs):
        kernel = emit(*args, **kwargs)
        lines = kernel.source.split("\n")
        i = next(n for n, line in enumerate(lines) if "nisa.nc_matmul(" in line)
        lines.insert(i, lines[i])
        return dataclasses.replace(kernel, source="\n".join(lines))
    return wrapped


def test_kernel_that_no_longer_verifies_is_unverified(lock: Lockfile, monkeypatch) -> None:
    monkeypatch.setattr(driver_module, "emit_kernel", _corrupt(driver_module.emit_kernel))
    report = regress(lock)
    assert not report.ok
    for result in report.results:
        assert result.status == "unverified" and "kernel-changed" in result.statuses, report.table()
        assert result.fresh_verified is False
    assert "unverified" in report.table()
    assert update_lock(lock, report).entries == lock.entries  # nothing verified to write instead
    assert regress(lock, verify=False).ok  # without the interpreter the change is informational


def test_kernel_change_alone_is_informational(lock: Lockfile) -> None:
    edited = with_edit(lock, "chain", kernel_sha256="0" * 64)
    report = regress(edited, search=False)
    assert report.ok and result_of(report, "chain").statuses == ["kernel-changed"]
    assert regress(update_lock(edited, report), search=False).results[1].statuses == []

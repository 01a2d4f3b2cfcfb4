"""Search reports: plots and Markdown summaries of tuning runs and lockfiles."""

from __future__ import annotations

from pathlib import Path

import matplotlib.image
import pytest

from helpers import tune_gemm as tune
from helpers import tune_graph
from neuronmm_compiler.artifacts.lockfile import Lockfile, entry_from_tuned
from neuronmm_compiler.artifacts.report import (
    LOCK_REPORT_FILES,
    REPORT_FILES,
    parameter_importance,
    write_lock_report,
    write_report,
)
from neuronmm_compiler.frontends.workloads import chain_workload, gemm_workload
from neuronmm_compiler.targets import get_target

TRIALS = 20
GEMM = gemm_workload(128, 512, 256)
CHAIN = chain_workload(64, 512, 256, rank=128)
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def gemm_run():
    tuned = tune(GEMM.m, GEMM.n, GEMM.k, target="trn1", trials=TRIALS, seed=0, method="optuna")
    return tuned, tuned.search.candidates  # every costed schedule, in evaluation order


@pytest.fixture(scope="module")
def chain_run():
    tuned = tune_graph(CHAIN, target=get_target("trn1"), trials=TRIALS, seed=0)
    return tuned, tuned.search.candidates


def assert_png(path: Path) -> None:
    assert path.read_bytes()[:8] == PNG_MAGIC
    image = matplotlib.image.imread(path)
    assert image.ndim in (2, 3)
    height, width = image.shape[:2]
    assert 250 <= height <= 3000 and 400 <= width <= 3000, image.shape


def assert_no_temp_files(directory: Path) -> None:
    leftovers = [p.name for p in directory.iterdir() if p.name.startswith(".") or p.suffix == ".tmp"]
    assert leftovers == []


def test_gemm_report(gemm_run, tmp_path):
    tuned, candidates = gemm_run
    assert len(candidates) == tuned.search.evaluated
    out = tmp_path / "new" / "report"  # created if missing
    paths = write_report(tuned.search, target=get_target("trn1"), out_dir=out, title="GEMM 128x512x256",
                         candidates=candidates)
    assert [p.name for p in paths] == list(REPORT_FILES)
    assert sorted(p.name for p in out.iterdir()) == sorted(REPORT_FILES)
    for path in paths[:3]:
        assert_png(path)
    summary = (out / "summary.md").read_text()
    assert summary.startswith("# GEMM 128x512x256")
    assert f"{tuned.search.best.latency_us:.2f} us" in summary
    for name in ("history.png", "importance.png", "roofline.png"):
        assert f"]({name})" in summary
    assert "| method | optuna |" in summary and f"| trials | {tuned.search.trials} |" in summary
    assert_no_temp_files(out)


def test_report_without_candidates_uses_top_k(gemm_run, tmp_path):
    tuned, _ = gemm_run
    import dataclasses

    top_only = dataclasses.replace(tuned.search, candidates=[])  # e.g. a result rebuilt from a cache entry
    paths = write_report(top_only, target=get_target("trn1"), out_dir=tmp_path, title="top-k only")
    for path in paths[:3]:
        assert_png(path)
    assert "Only the top-k" in paths[3].read_text()
    # rewriting in place replaces the files atomically, leaving no temporaries
    write_report(top_only, target=get_target("trn1"), out_dir=tmp_path, title="again")
    assert "# again" in (tmp_path / "summary.md").read_text()
    assert_no_temp_files(tmp_path)


def test_chain_report(chain_run, tmp_path):
    tuned, candidates = chain_run
    paths = write_report(tuned.search, target=get_target("trn1"), out_dir=tmp_path, title="SVD chain",
                         candidates=candidates)
    for path in paths[:3]:
        assert_png(path)
    summary = paths[3].read_text()
    assert f"{tuned.search.best.latency_us:.2f} us" in summary
    assert "cache_weights" in summary  # the fused schedule's parameters
    assert_no_temp_files(tmp_path)


def test_parameter_importance(gemm_run):
    _, candidates = gemm_run
    shares = parameter_importance(candidates)
    assert set(shares) == set(candidates[0].schedule.as_dict())
    assert sum(shares.values()) == pytest.approx(1.0)
    assert list(shares.values()) == sorted(shares.values(), reverse=True)
    assert parameter_importance(candidates[:1]) == dict.fromkeys(sorted(shares), 0.0)


def test_lock_report(gemm_run, chain_run, tmp_path):
    lock = Lockfile()
    lock.add(entry_from_tuned(GEMM, gemm_run[0], seed=0, trials=TRIALS))
    lock.add(entry_from_tuned(CHAIN, chain_run[0], seed=0, trials=TRIALS))
    paths = write_lock_report(lock, out_dir=tmp_path / "lock")
    assert [p.name for p in paths] == list(LOCK_REPORT_FILES)
    for path in paths[:2]:
        assert_png(path)
    summary = paths[2].read_text()
    for entry in lock:
        assert entry.label in summary
        assert f"{entry.latency_us:.2f}" in summary
    assert "](roofline.png)" in summary and "](latency.png)" in summary
    assert_no_temp_files(tmp_path / "lock")


def test_empty_lock_report(tmp_path):
    paths = write_lock_report(Lockfile(), out_dir=tmp_path)
    for path in paths[:2]:
        assert_png(path)
    assert "0 locked schedules" in paths[2].read_text()

"""The nmmc command line, driven as a user would."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from click.testing import CliRunner

from neuronmm_compiler.cli import main

pytestmark = pytest.mark.usefixtures("one_polish_start")  # what surrounds a search, not the search (conftest.py)


def run(*args: str):
    return CliRunner().invoke(main, list(args), catch_exceptions=False)


def test_emit_then_verify(tmp_path):
    out = tmp_path / "gemm.py"
    result = run("emit", "--shape", "200x700x300", "-o", str(out))
    assert result.exit_code == 0, result.output
    assert "wrote" in result.output and out.exists()
    result = run("verify", str(out), "--json")
    assert result.exit_code == 0, result.output
    report = json.loads(result.output)
    for key in ("ok", "rel_error", "hbm_bytes_read", "hbm_bytes_written", "dma_transfers",
                "matmul_instructions", "transposes", "sbuf_peak_bytes", "psum_peak_banks"):
        assert key in report
    assert report["ok"] is True and report["rel_error"] < 1e-2
    human = run("verify", str(out))
    assert human.exit_code == 0 and human.output.startswith("OK:")


def test_emit_to_stdout_is_the_file():
    result = run("emit", "--shape", "1x512x128", "--dialect", "neuronxcc", "-o", "-")
    assert result.exit_code == 0
    assert "import neuronxcc.nki as nki" in result.output and "def reference(" in result.output


def test_verify_fails_on_a_broken_kernel(tmp_path):
    out = tmp_path / "gemm.py"
    assert run("emit", "--shape", "256x512x256", "--schedule", "aws-tiled", "--dialect", "nki", "--target", "trn2",
               "-o", str(out)).exit_code == 0
    text = out.read_text()
    # Drop the last K tile's contribution: the kernel now computes the wrong thing.
    broken = text.replace("for k_blk in range(2):", "for k_blk in range(1):")
    assert broken != text
    out.write_text(broken)
    result = run("verify", str(out), "--json")
    assert result.exit_code == 1
    assert json.loads(result.output)["ok"] is False


def test_verify_reports_a_violated_limit(tmp_path):
    out = tmp_path / "gemm.py"
    assert run("emit", "--shape", "256x512x256", "--schedule", "aws-tiled", "--dialect", "nki", "--target", "trn2",
               "-o", str(out)).exit_code == 0
    source = out.read_text()
    text = source.replace("nl.ndarray((TILE_M, TILE_N), dtype=nl.float32, buffer=nl.psum)",
                          "nl.ndarray((TILE_M, 1024), dtype=nl.float32, buffer=nl.psum)")
    text = text.replace("acc_psum[0:TILE_M, 0:TILE_N]", "acc_psum[0:TILE_M, 0:1024]", 1)
    assert text.count("1024") == source.count("1024") + 2  # both mutations applied
    out.write_text(text)
    result = run("verify", str(out))
    assert result.exit_code == 1
    assert "FAILED" in result.output


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        (["emit", "--shape", "12x34", "-o", "X"], "MxNxK"),
        (["emit", "--shape", "0x512x128", "-o", "X"], "positive"),
        (["emit", "--shape", "-1x512x128", "-o", "X"], "MxNxK"),
        (["emit", "--shape", "axbxc", "-o", "X"], "MxNxK"),
        (["emit", "--shape", "128x512x128", "--target", "trn9", "-o", "X"], "trn1"),
        (["emit", "--shape", "128x512x128", "--dialect", "cuda", "-o", "X"], "neuronxcc"),
        (["emit", "--shape", "128x512x128", "--schedule", "fast", "-o", "X"], "aws-tiled"),
        (["emit", "--shape", "128x512x128", "--param", "speed=9", "-o", "X"], "tile_m"),
        (["emit", "--shape", "128x512x128", "--param", "tile_m", "-o", "X"], "key=value"),
        (["emit", "--shape", "128x512x128", "--param", "tile_m=256", "-o", "X"], "128"),
        (["emit", "--shape", "128x512x128", "--param", "loop_order=mmk", "-o", "X"], "one of"),
        (["emit", "--shape", "128x512x128", "--dtype", "int8", "-o", "X"], "bf16"),
        (["emit", "--shape", "128x512x128", "--a-layout", "nm", "-o", "X"], "km"),
        (["emit", "--shape", "8192x8192x8192", "--param", "tiles_in_block_m=64", "-o", "X"], "SBUF"),
        (["emit", "--shape", "2048x4096x2048", "--schedule", "aws-tiled", "--param", "loop_order=kmn",
          "--param", "tiles_in_block_k=1", "-o", "X"], "PSUM"),
        (["emit", "--shape", "128x512x128"], "--output"),
        (["emit", "--shape", "128x512x128", "--bogus", "-o", "X"], "bogus"),
        (["frobnicate"], "frobnicate"),
        (["schedules", "--shape", "1x2"], "MxNxK"),
        (["verify", "/nonexistent/kernel.py"], "cannot read"),
    ],
)
def test_bad_input_is_one_line_exit_2(tmp_path, monkeypatch, args, fragment):
    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 2, (args, result.output)
    err = result.stderr.strip()
    assert err.startswith("nmmc: error:") and "\n" not in err, err
    assert fragment in err
    assert "Traceback" not in result.output + result.stderr
    assert list(tmp_path.iterdir()) == []


def test_verify_rejects_a_file_that_is_not_a_kernel(tmp_path):
    path = tmp_path / "plain.py"
    path.write_text("print('hello')\n")
    result = CliRunner().invoke(main, ["verify", str(path)])
    assert result.exit_code == 2 and "not an nmmc kernel" in result.stderr


def test_schedules_and_targets_list_everything():
    result = run("schedules", "--shape", "1024x2048x1024", "--json")
    data = json.loads(result.output)
    assert [p["name"] for p in data["presets"]] == ["aws-tiled", "aws-hoist-load", "aws-block-free",
                                                   "aws-fully-optimized"]
    assert all(p["fits"] for p in data["presets"])
    assert {p["name"] for p in data["parameters"]} >= {"tile_m", "loop_order", "a_transpose"}
    human = run("schedules", "--shape", "1024x2048x1024")
    assert "aws-fully-optimized" in human.output and "--param" in human.output
    fused = run("schedules", "--mlp", "--dense", "--hidden", "512", "--intermediate", "1024", "--tokens", "8").output
    assert "the search samples 4, 8, 16, 32, 64, 128, 192, its polish also visits 48, 96]" in fused
    assert "[weights, tokens; not sampled by the search]" in fused
    rows = json.loads(run("schedules", "--mlp", "--dense", "--hidden", "512", "--intermediate", "1024", "--tokens",
                          "8", "--json").output)["parameters"]
    assert {p["name"]: p["polish_only"] for p in rows}["k_tiles_per_block"] == [2, 4]
    targets = json.loads(run("targets", "--json").output)
    assert set(targets) == {"trn1", "trn2", "trn3"}
    assert targets["trn2"]["sbuf_bytes_per_partition"] == 224 * 1024
    text = run("targets").output
    assert "NeuronCore-v2" in text and "no double_row mode" in text  # trn1
    assert "float8_e4m3, float8_e5m2, float8_e4m3fn; double_row" in text  # trn3


@pytest.mark.parametrize("command", ["emit", "verify", "schedules", "targets", "cost", "tune", "explain"])
def test_help_is_complete(command):
    result = run(command, "--help")
    assert result.exit_code == 0
    assert "Usage: " in result.output
    assert "--help" in result.output


def test_version():
    assert run("--version").output.startswith("nmmc, version ")


def test_cost_json_has_the_documented_keys():
    result = run("cost", "--shape", "1024x2048x1024", "--schedule", "aws-block-free", "--json")
    assert result.exit_code == 0
    data = json.loads(result.output)
    for key in ("latency_us", "bound", "flops", "arithmetic_intensity", "hbm_bytes_read", "hbm_bytes_written",
                "dma_transfers", "engine_us", "sbuf_bytes_per_partition", "psum_banks", "feasible",
                "lower_bound_us"):
        assert key in data, key
    assert set(data["engine_us"]) == {"tensor", "vector", "scalar", "dma"}
    assert data["flops"] == 2 * 1024 * 2048 * 1024 and data["feasible"] is True


def test_cost_reports_an_infeasible_schedule_without_failing():
    result = run("cost", "--shape", "8192x8192x8192", "--param", "tiles_in_block_m=64", "--json")
    assert result.exit_code == 0
    assert json.loads(result.output)["feasible"] is False
    assert "DOES NOT FIT" in run("cost", "--shape", "8192x8192x8192", "--param", "tiles_in_block_m=64").output


def test_tune_json_and_kernel(tmp_path):
    out = tmp_path / "tuned.py"
    result = run("tune", "--shape", "200x700x300", "--trials", "30", "--verify", "--json", "-o", str(out))
    assert result.exit_code == 0, result.output
    data = json.loads(result.output)
    for key in ("kind", "schedule", "predicted", "baselines", "speedups", "search", "kernels"):
        assert key in data
    assert data["kind"] == "gemm" and list(data["baselines"]) == ["aws-fully-optimized"]
    assert set(data["search"]) >= {"method", "evaluated", "feasible", "seconds"}
    assert data["predicted"]["latency_us"] <= data["baselines"]["aws-fully-optimized"]["latency_us"]
    assert data["speedups"]["aws-fully-optimized"] >= 1.0
    assert data["verify"]["ok"] is True
    assert "tuned (" in out.read_text()
    human = run("tune", "--shape", "200x700x300", "--trials", "30", "-o", str(tmp_path / "t2.py"))
    assert "speedup vs aws-fully-optimized" in human.output and "wrote" in human.output


def test_tune_is_reproducible(tmp_path):
    paths = [tmp_path / "a.py", tmp_path / "b.py"]
    for path in paths:
        assert run("tune", "--shape", "64x1536x768", "--seed", "7", "--trials", "40", "-o", str(path)).exit_code == 0
    assert paths[0].read_bytes() == paths[1].read_bytes()


def test_explain_shows_passes_loop_nest_and_formulas():
    result = run("explain", "--shape", "256x1024x512", "--a-layout", "km")
    assert result.exit_code == 0
    out = result.output
    assert "== after pass fold-transposes (changed)" in out and "layout=transposed" in out
    assert "def gemm_kernel(a_t, b):" in out and "nisa.nc_matmul" in out
    assert "T_dma = " in out and "latency = " in out and "lower_bound = " in out
    tuned = run("explain", "--shape", "256x1024x512", "--tuned")
    assert tuned.exit_code == 0 and "== schedule tuned" in tuned.output


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        (["tune", "--shape", "128x512x128", "--method", "random", "-o", "X"], "exhaustive"),
        (["tune", "--shape", "128x512x128", "--trials", "0", "-o", "X"], "trials"),
        (["cost", "--shape", "128x512x128", "--target", "inf1"], "trn2"),
        (["explain", "--shape", "128x512x128", "--tuned", "--schedule", "aws-tiled"], "--tuned"),
    ],
)
def test_bad_tune_cost_explain_input(tmp_path, monkeypatch, args, fragment):
    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 2, result.output
    assert result.stderr.startswith("nmmc: error:") and fragment in result.stderr
    assert list(tmp_path.iterdir()) == []


def test_fused_chain_and_mlp_through_the_cli(tmp_path):
    chain = tmp_path / "chain.py"
    result = run("emit", "--shape", "77x700x300", "--rank", "128", "--dialect", "neuronxcc", "-o", str(chain))
    assert result.exit_code == 0, result.output
    assert json.loads(run("verify", str(chain), "--json").output)["ok"] is True
    mlp = tmp_path / "mlp.py"
    result = run("tune", "--mlp", "--tokens", "33", "--hidden", "256", "--intermediate", "640", "--keep-ratio", "0.8",
                 "--trials", "20", "--verify", "--json", "-o", str(mlp))
    assert result.exit_code == 0, result.output
    data = json.loads(result.output)
    for key in ("kind", "schedule", "predicted", "baselines", "speedups", "search", "kernels"):
        assert key in data, key
    assert data["kind"] == "fused" and list(data["baselines"]) == list(data["speedups"]) == [
        "nkilib-mlp", "nmmc-dense", "dense", "unfused"]
    nkilib = data["baselines"]["nkilib-mlp"]
    assert nkilib["variant"] == "tkg" and nkilib["latency_us"] > 0 and "nki-library" in nkilib["source"]
    assert data["verify"]["ok"] is True and data["verify"]["transposes"] >= 0
    assert "ranks gate/up/down 128/128/128" in data["workload"]
    split = run("emit", "--mlp", "--tokens", "33", "--hidden", "256", "--intermediate", "640", "--ranks", "128,128,256",
                "--param", "mlp=split", "-o", str(tmp_path / "split.py"))
    assert split.exit_code == 0 and "svd_mlp_k0, svd_mlp_k1" in split.output
    verify_split = json.loads(run("verify", str(tmp_path / "split.py"), "--json").output)
    assert verify_split["ok"] is True and [k["name"] for k in verify_split["kernels"]] == ["svd_mlp_k0", "svd_mlp_k1"]
    cost = json.loads(run("cost", "--mlp", "--tokens", "33", "--hidden", "256", "--intermediate", "640",
                          "--rank", "128", "--param", "mlp=split", "--json").output)
    assert len(cost["kernels"]) == 2 and cost["feasible"] is True


def test_explain_fused_shows_passes_and_every_kernel():
    result = run("explain", "--mlp", "--tokens", "16", "--hidden", "256", "--intermediate", "512", "--rank", "128",
                 "--param", "mlp=split")
    assert result.exit_code == 0, result.output
    out = result.output
    for text in ("== after pass implicit-transpose (changed)", "== after pass fuse{mlp=split} (changed)",
                 "== after pass place (changed)", "orient=transposed", "== kernel svd_mlp_k0",
                 "== loop nest of svd_mlp_k1", "nisa.activation(", "op=nl.silu", "op=nl.multiply", "T_dma = "):
        assert text in out, text
    assert "nc_transpose" not in out.split("== loop nest of svd_mlp_k1")[1]


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        (["emit", "--shape", "128x512x128", "--rank", "0", "-o", "X"], "--rank"),
        (["emit", "--shape", "128x512x128", "--rank", "128", "--keep-ratio", "0.5", "-o", "X"], "exactly one"),
        (["emit", "--shape", "128x512x128", "--keep-ratio", "1.5", "-o", "X"], "keep"),
        (["emit", "--mlp", "--tokens", "8", "--hidden", "256", "-o", "X"], "--intermediate"),
        (["emit", "--mlp", "--tokens", "8", "--hidden", "256", "--intermediate", "512", "-o", "X"], "exactly one"),
        (["emit", "--mlp", "--tokens", "8", "--hidden", "256", "--intermediate", "512", "--ranks", "1,2", "-o", "X"],
         "three"),
        (["emit", "--mlp", "--tokens", "8", "--hidden", "256", "--intermediate", "512", "--rank", "128",
          "--schedule", "aws-tiled", "-o", "X"], "GEMM"),
        (["emit", "--mlp", "--tokens", "8", "--hidden", "256", "--intermediate", "512", "--rank", "128",
          "--param", "tokens_per_block=9999", "-o", "X"], "tokens_per_block"),
        (["emit", "--shape", "128x512x128", "--rank", "128", "--param", "mlp=split", "-o", "X"], "MLP"),
        (["emit", "--tokens", "8", "--shape", "128x512x128", "-o", "X"], "--mlp"),
        (["emit", "--shape", "128x512x128", "--dense", "-o", "X"], "--mlp"),
    ],
)
def test_bad_fused_input(tmp_path, monkeypatch, args, fragment):
    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 2, result.output
    assert result.stderr.startswith("nmmc: error:") and fragment in result.stderr, result.stderr
    assert list(tmp_path.iterdir()) == []


def test_repeated_tune_is_answered_from_the_cache(tmp_path):
    first, second = tmp_path / "a.py", tmp_path / "b.py"
    cold = run("tune", "--shape", "96x640x384", "--trials", "20", "--json", "-o", str(first))
    assert json.loads(cold.output)["search"]["cached"] is False
    warm = run("tune", "--shape", "96x640x384", "--trials", "20", "--json", "-o", str(second))
    data = json.loads(warm.output)
    assert data["search"]["cached"] is True and data["search"]["method"] == "cache"
    assert first.read_bytes() == second.read_bytes()  # the decision is cached; the file is regenerated identically
    human = run("tune", "--shape", "96x640x384", "--trials", "20", "-o", str(second))
    assert "answered from the cache" in human.output
    bypass = json.loads(run("tune", "--shape", "96x640x384", "--trials", "20", "--no-cache", "--json",
                            "-o", str(second)).output)
    assert bypass["search"]["cached"] is False
    fused = run("tune", "--shape", "64x512x256", "--rank", "128", "--trials", "10", "-o", str(tmp_path / "c.py"))
    assert fused.exit_code == 0
    listing = run("cache", "list", "--json")
    entries = json.loads(listing.output)
    assert {e["kind"] for e in entries} == {"gemm", "fused"}
    shown = json.loads(run("cache", "show", entries[0]["key"][:10]).output)
    assert shown["key"] == entries[0]["key"]
    assert "removed 2 entries" in run("cache", "clear").output
    assert json.loads(run("cache", "list", "--json").output) == []


def test_corrupt_cache_entry_is_reported_and_ignored(tmp_path):
    out = tmp_path / "k.py"
    assert run("tune", "--shape", "64x512x128", "--trials", "10", "-o", str(out)).exit_code == 0
    cache_dir = Path(os.environ["NMMC_CACHE_DIR"]) / "tune"
    (entry,) = list(cache_dir.glob("*.json"))
    entry.write_text("{ not json")
    result = CliRunner().invoke(main, ["tune", "--shape", "64x512x128", "--trials", "10", "-o", str(out)])
    assert result.exit_code == 0 and "nmmc: warning:" in result.stderr
    assert "answered from the cache" not in result.output


def test_lock_and_regress_through_the_cli(tmp_path):
    lock = tmp_path / "nmmc.lock.json"
    for args in (["--shape", "128x512x256"], ["--shape", "64x512x256", "--rank", "128"]):
        result = run("tune", *args, "--target", "trn1", "--trials", "15", "--lock", str(lock),
                     "-o", str(tmp_path / "k.py"))
        assert result.exit_code == 0, result.output
    data = json.loads(lock.read_text())
    assert len(data["entries"]) == 2
    ok = run("regress", str(lock))
    assert ok.exit_code == 0, ok.output
    # Edit a locked GEMM schedule to a valid but slower one: the regress run fails and says why.
    for entry in data["entries"].values() if isinstance(data["entries"], dict) else data["entries"]:
        if entry["schedule_kind"] == "gemm":
            entry["schedule"]["tiles_in_block_k"] = 1
            entry["schedule"]["loop_order"] = "mnk"
            entry["schedule"]["dma"] = "tile"
    lock.write_text(json.dumps(data, indent=2))
    failing = CliRunner().invoke(main, ["regress", str(lock)])
    assert failing.exit_code == 1, failing.output
    assert "drift" in failing.output or "stale" in failing.output
    updated = CliRunner().invoke(main, ["regress", str(lock), "--update"])
    assert updated.exit_code == 0, updated.output + updated.stderr
    assert run("regress", str(lock)).exit_code == 0
    missing = CliRunner().invoke(main, ["regress", str(tmp_path / "none.json")])
    assert missing.exit_code == 2 and "lockfile not found" in missing.stderr


def test_reports_of_a_search_and_of_a_lockfile(tmp_path):
    lock = tmp_path / "nmmc.lock.json"
    result = run("tune", "--shape", "128x512x256", "--trials", "15", "--report", str(tmp_path / "search"),
                 "--lock", str(lock), "-o", str(tmp_path / "k.py"))
    assert result.exit_code == 0, result.output
    for name in ("history.png", "importance.png", "roofline.png"):
        assert (tmp_path / "search" / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "roofline.png" in (tmp_path / "search" / "summary.md").read_text()
    result = run("report", str(lock), "-o", str(tmp_path / "lock"))
    assert result.exit_code == 0, result.output
    assert (tmp_path / "lock" / "roofline.png").read_bytes()[:4] == b"\x89PNG"
    assert (tmp_path / "lock" / "summary.md").is_file()
    # the same tune again is answered from the cache, which keeps no trials: no (empty) plots, and it says why
    cached = run("tune", "--shape", "128x512x256", "--trials", "15", "--report",
                 str(tmp_path / "cached"), "-o", str(tmp_path / "k2.py"))
    assert cached.exit_code == 0 and "answered from the cache" in cached.output
    assert sorted(p.name for p in (tmp_path / "cached").iterdir()) == ["summary.md"]
    summary = (tmp_path / "cached" / "summary.md").read_text()
    assert "no search ran, so there is nothing to plot" in summary and ".png" not in summary
    assert "no plots, only summary.md" in cached.stderr and "--no-cache" in cached.stderr


def test_tune_with_storage_resumes_the_study(tmp_path):
    storage = f"sqlite:///{tmp_path / 'tune.db'}"
    args = ["tune", "--shape", "256x1024x512", "--trials", "12", "--storage", storage, "--no-cache", "--json"]
    first = json.loads(run(*args, "-o", str(tmp_path / "a.py")).output)
    assert first["search"]["study"]["trials_in_study"] == 12
    more = json.loads(run(*args[:4], "20", *args[5:], "-o", str(tmp_path / "b.py")).output)
    assert more["search"]["study"]["trials_in_study"] == 20 and more["search"]["study"]["trials_run"] == 8
    bad = CliRunner().invoke(main, ["tune", "--shape", "64x64x64", "--workers", "2", "-o", str(tmp_path / "c.py")])
    assert bad.exit_code == 2 and "--storage" in bad.stderr


def test_report_of_a_stored_study(tmp_path):
    storage = f"sqlite:///{tmp_path / 'tune.db'}"
    tuned = run("tune", "--shape", "200x700x300", "--trials", "15", "--storage", storage, "--no-cache",
                "-o", str(tmp_path / "k.py"))
    assert tuned.exit_code == 0, tuned.output
    result = CliRunner().invoke(main, ["report", storage, "-o", str(tmp_path / "study")])
    assert result.exit_code == 0, result.output + result.stderr
    for name in ("history.png", "importance.png", "roofline.png"):
        assert (tmp_path / "study" / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    summary = (tmp_path / "study" / "summary.md").read_text()
    assert "200" in summary and "roofline.png" in summary
    missing = CliRunner().invoke(main, ["report", storage, "--study", "nope", "-o", str(tmp_path / "x")])
    assert missing.exit_code == 2 and "no study" in missing.stderr


def test_report_of_a_study_runs_no_trial(tmp_path, monkeypatch):
    """``nmmc report`` rebuilds the search from the stored trials: no search runs, no trial is
    asked for, the study holds the same trials afterwards, and the summary's best is the schedule
    'nmmc tune' chose."""
    import sqlite3

    import optuna

    from neuronmm_compiler.search import trials as trials_module
    from neuronmm_compiler.search import tuner

    db = tmp_path / "tune.db"
    storage = f"sqlite:///{db}"
    tuned = run("tune", "--shape", "256x640x384", "--trials", "12", "--storage", storage, "--no-cache", "--json",
                "-o", str(tmp_path / "k.py"))
    assert tuned.exit_code == 0, tuned.output

    def trials() -> list[tuple]:
        with sqlite3.connect(db) as con:
            return con.execute("SELECT number, state FROM trials ORDER BY number").fetchall()

    before = trials()
    assert len(before) == 12 and {state for _, state in before} == {"COMPLETE"}

    def no_search(*args, **kwargs):
        raise AssertionError("nmmc report ran a search")

    monkeypatch.setattr(tuner, "search", no_search)
    monkeypatch.setattr(trials_module, "_trial_loop", no_search)
    monkeypatch.setattr(optuna.Study, "ask", no_search)
    result = CliRunner().invoke(main, ["report", storage, "-o", str(tmp_path / "plots")])
    assert result.exit_code == 0, result.output + result.stderr
    assert trials() == before
    assert result.output == f"wrote history.png, importance.png, roofline.png, summary.md to {tmp_path / 'plots'}\n"
    summary = (tmp_path / "plots" / "summary.md").read_text()
    assert "| method | optuna |" in summary and "| trials | 12 |" in summary
    assert f"**{json.loads(tuned.output)['predicted']['latency_us']:.2f} us**" in summary
    # the search time stated is the one 'nmmc tune' measured (storage included), not the rebuild's (issue 28)
    seconds = json.loads(tuned.output)["search"]["seconds"]
    assert f"| search time | {seconds:.2f} s (wall time of the 'nmmc tune' runs" in summary
    assert "rebuilt from the study in" in summary


def test_the_cache_key_includes_the_search_request(tmp_path):
    """Another trial count, seed, method or threshold is another search: it is not answered by an
    earlier one (the cached kernel would say the other seed); a --timeout search is never cached."""
    out = tmp_path / "k.py"
    shape = ("tune", "--shape", "96x640x384", "--json", "-o", str(out))
    assert json.loads(run(*shape, "--trials", "20").output)["search"]["cached"] is False
    for extra in (("--trials", "150", "--seed", "3"), ("--trials", "20", "--seed", "3"),
                  ("--trials", "20", "--method", "optuna"), ("--trials", "20", "--exhaustive-threshold", "5")):
        data = json.loads(run(*shape, *extra).output)
        assert data["search"]["cached"] is False, extra
        if "--seed" in extra:
            assert "seed 3" in out.read_text()
    assert json.loads(run(*shape, "--trials", "150", "--seed", "3").output)["search"]["cached"] is True
    timed = ("--trials", "20", "--timeout", "60")
    assert json.loads(run(*shape, *timed).output)["search"]["cached"] is False
    assert json.loads(run(*shape, *timed).output)["search"]["cached"] is False


def test_chain_with_x_given_transposed_tunes_and_verifies_without_transposes(tmp_path):
    """X stored as X_t[K,M] (the output of a previous fused kernel) is the paper's case: the chain
    tunes, verifies, its baselines are modelled, and the kernel transposes nothing."""
    out = tmp_path / "chain_km.py"
    result = run("tune", "--shape", "77x1000x600", "--rank", "256", "--a-layout", "km", "--trials", "20",
                 "--verify", "--json", "-o", str(out))
    assert result.exit_code == 0, result.output
    data = json.loads(result.output)
    assert data["verify"]["ok"] is True
    assert data["verify"]["transposes"] == 0 and data["predicted"]["dma_transposes"] == 0
    assert data["predicted"]["transposes"] == 0
    assert all(b is not None for b in data["baselines"].values()) and all(data["speedups"].values())

"""From a model to tuned, verified kernels: tune --model, compress, and the end-to-end example."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from neuronmm_compiler.checkpoints.config import known_config
from neuronmm_compiler.cli import main
from neuronmm_compiler.errors import InputError
from neuronmm_compiler.model_tuning.pipeline import parse_buckets, resolve_model, tune_model
from neuronmm_compiler.targets import get_target

pytestmark = pytest.mark.usefixtures("one_polish_start")  # what surrounds a search, not the search (conftest.py)

ROOT = Path(__file__).resolve().parent.parent
PAPER_RANKS = {"llama-3.2-1b": 1280, "llama-3.2-3b": 1792, "llama-3.1-8b": 2560, "qwen3-1.7b": 1280,
               "qwen3-4b": 1664}


@pytest.mark.parametrize(("name", "rank"), PAPER_RANKS.items())
def test_shipped_configs_give_the_papers_ranks(name, rank):
    source = resolve_model(known_config(name), 0.8)
    assert source.ranks == (rank, rank, rank) and source.ranks_from == "formula"


def _small_model(tmp_path: Path, hidden: int = 512, intermediate: int = 1536) -> Path:
    """A config.json of a Qwen3-shaped model small enough to verify its kernels in seconds (the shipped models'
    shapes are tested above; the pipeline does not depend on the size)."""
    config = tmp_path / "config.json"
    config.write_text(json.dumps({"model_type": "qwen3", "hidden_size": hidden, "intermediate_size": intermediate,
                                  "num_hidden_layers": 2}))
    return config


def test_tune_model_emits_verified_kernels_for_every_bucket(tmp_path):
    out = tmp_path / "kernels"
    # buckets 1, 8 and 3 at 5 trials (was 1, 32, 3 at 20): what is checked is the pipeline (a bucket per distinct
    # token count, each kernel written and verified, the baselines' runnability), not the search's quality; the
    # smaller spaces and fewer trials cost less CPU
    result = CliRunner().invoke(main, ["tune", "--model", str(_small_model(tmp_path)), "--keep-ratio", "0.8",
                                       "--tokens", "1,8,8,3", "--trials", "5", "--verify", "--json",
                                       "-o", str(out)])
    assert result.exit_code == 0, result.output + result.stderr
    index = json.loads(result.output)
    assert [b["tokens"] for b in index["buckets"]] == [1, 8, 3]  # a repeated bucket is tuned once
    assert index["ranks"] == {"gate": 256, "up": 256, "down": 256}
    for bucket in index["buckets"]:
        assert bucket["verified"] is True
        assert (out / bucket["file"]).is_file()
        # trn2 LNC=2 in-graph: AWS's LNC=1 kernels cannot run in the model graph (NCC_EVRF066), so no speedup over
        # them, and the bucket says why
        assert bucket["speedup_vs_unfused"] is None and bucket["unfused_baseline_us"] > bucket["predicted_us"]
        unfused = next(b for b in bucket["baselines"] if b["name"] == "unfused")
        assert unfused["runnable"] is False and "NCC_EVRF066" in unfused["not_runnable"]
    written = json.loads((out / "index.json").read_text())
    assert written["buckets"][0]["file"] == "mlp_t1.py"
    assert [b["verified"] for b in written["buckets"]] == [True] * 3  # --verify's result is in the file too


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        (["--tokens", "1,32"], "--keep-ratio"),
        (["--keep-ratio", "0.8"], "--tokens"),
        (["--keep-ratio", "0.8", "--tokens", "1,x"], "comma"),
        (["--keep-ratio", "0.8", "--tokens", "0"], "positive"),
        (["--keep-ratio", "0.8", "--tokens", "8", "--shape", "8x8x8"], "--shape"),
    ],
)
def test_tune_model_bad_input(tmp_path, args, fragment):
    result = CliRunner().invoke(main, ["tune", "--model", str(known_config("llama-3.2-1b")), *args,
                                       "-o", str(tmp_path / "k")])
    assert result.exit_code == 2 and fragment in result.stderr, result.stderr
    assert not (tmp_path / "k").exists()


def test_a_failed_bucket_search_leaves_no_output(tmp_path):
    """Every search runs before anything is written: a failing one leaves no directory and no bucket file."""

    def failing(workload, bucket):
        raise InputError(f"search of bucket {bucket} failed")

    source = resolve_model(known_config("llama-3.2-1b"), 0.8)
    with pytest.raises(InputError, match="bucket 0 failed"):
        tune_model(source, [1, 32], tmp_path / "k", target=get_target("trn1"), dialect="neuronxcc",
                   tune_bucket=failing)
    assert not (tmp_path / "k").exists()


def test_tune_model_rejects_a_missing_model(tmp_path):
    result = CliRunner().invoke(main, ["tune", "--model", str(tmp_path / "nope"), "--keep-ratio", "0.8",
                                       "--tokens", "1", "-o", str(tmp_path / "k")])
    assert result.exit_code == 2 and "model not found" in result.stderr


def test_parse_buckets():
    assert parse_buckets("1,32,1,128") == [1, 32, 128]


def _example():
    """examples/svd_mlp_end_to_end.py as a module (its ``main`` is what running the file runs)."""
    sys.path.insert(0, str(ROOT / "examples"))
    try:
        import svd_mlp_end_to_end
    finally:
        sys.path.pop(0)
    return svd_mlp_end_to_end


def test_end_to_end_example_runs(tmp_path, monkeypatch, capsys):
    """The example writes a tiny model, compresses it, exports the SVD MLP kernels as a package (trn2, LNC=2, the
    nki dialect) that verifies, patches a torch Llama with it and matches the logits within the rank truncation's
    error. Its ``main`` runs in this process with the script's arguments (``python svd_mlp_end_to_end.py --workdir
    DIR`` runs ``sys.exit(main())`` and nothing else): the same code and output without a second interpreter
    importing torch and nmmc again (~2 CPU s)."""
    pytest.importorskip("torch", reason="the example needs the 'torch' extra")
    example = _example()
    monkeypatch.setattr(sys, "argv", [str(ROOT / "examples" / "svd_mlp_end_to_end.py"), "--workdir", str(tmp_path)])
    monkeypatch.setattr(sys, "path", list(sys.path))  # main() puts the package's directory on the path
    status = example.main()
    stdout = capsys.readouterr().out
    assert status == 0, stdout
    assert stdout.strip().endswith("OK")
    assert "OK: every kernel verifies" in stdout and "launch kernel[2](*args)" in stdout
    assert (tmp_path / "factors" / "manifest.json").is_file()
    assert (tmp_path / "nmmc_tiny_llama" / "manifest.json").is_file()


def test_compress_cli_writes_the_manifest(tmp_path):
    pytest.importorskip("torch", reason="the example's model writer needs the 'torch' extra")
    _example().write_tiny_model(tmp_path / "model")
    result = CliRunner().invoke(main, ["compress", str(tmp_path / "model"), "--keep-ratio", "0.8", "--rank-down",
                                       "256", "-o", str(tmp_path / "factors")])
    assert result.exit_code == 0, result.output + result.stderr
    assert "ranks gate/up/down 128/128/256" in result.output
    manifest = json.loads((tmp_path / "factors" / "manifest.json").read_text())
    assert manifest["keep_ratio"] == 0.8
    bad = CliRunner().invoke(main, ["compress", str(tmp_path / "missing"), "--keep-ratio", "0.8", "-o",
                                    str(tmp_path / "f2")])
    assert bad.exit_code == 2 and bad.stderr.startswith("nmmc: error:")


def _tree_bytes(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def test_sigkilled_compress_resumes_to_identical_output(tmp_path):
    """Kill `nmmc compress` with SIGKILL once its first layer file exists, rerun it, and compare every
    output byte with an uninterrupted run."""
    import json as _json
    import os
    import signal
    import time

    import numpy as np
    from safetensors.numpy import save_file

    model = tmp_path / "model"
    model.mkdir()
    # 4 layers (was 6): the kill still lands with layers left to write (each takes ~0.5 CPU s, the poll is 5 ms), and
    # killed_early below says when it did not; each of the three runs compresses 2 layers less
    hidden, inter, layers = 512, 1536, 4
    (model / "config.json").write_text(_json.dumps({
        "model_type": "llama", "hidden_size": hidden, "intermediate_size": inter, "num_hidden_layers": layers,
        "torch_dtype": "float32"}))
    rng = np.random.default_rng(0)
    save_file({f"model.layers.{i}.mlp.{p}_proj.weight": rng.standard_normal(s).astype(np.float32)
               for i in range(layers) for p, s in (("gate", (inter, hidden)), ("up", (inter, hidden)),
                                                   ("down", (hidden, inter)))}, str(model / "model.safetensors"))
    # one BLAS thread in every run (the bytes compared must not depend on the thread count); the uninterrupted and
    # the resumed runs in this process, the killed one a process of its own (what SIGKILL needs)
    args = ["compress", str(model), "--keep-ratio", "0.8", "--threads", "1", "--no-progress"]
    command = [sys.executable, "-c", "from neuronmm_compiler.cli import main; main()", *args]
    env = {**os.environ, "OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1"}
    reference = CliRunner().invoke(main, [*args, "-o", str(tmp_path / "reference")])
    assert reference.exit_code == 0, reference.output + reference.stderr
    interrupted = tmp_path / "interrupted"
    proc = subprocess.Popen([*command, "-o", str(interrupted)], env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 120
    while not (interrupted / "layer_000.safetensors").exists() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.005)
    killed_early = proc.poll() is None
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    if killed_early:
        assert not (interrupted / "manifest.json").exists()  # the manifest is written last
    resumed = CliRunner().invoke(main, [*args, "-o", str(interrupted)])
    assert resumed.exit_code == 0, resumed.output + resumed.stderr
    assert _tree_bytes(interrupted) == _tree_bytes(tmp_path / "reference")


def test_tune_model_honours_progress(tmp_path):
    """--progress draws the bar over the buckets (it was silently ignored with --model)."""
    args = ["tune", "--model", str(_small_model(tmp_path)), "--keep-ratio", "0.8", "--tokens", "1,2",
            "--trials", "5"]
    shown = CliRunner().invoke(main, [*args, "--progress", "-o", str(tmp_path / "a")])
    assert shown.exit_code == 0, shown.output + shown.stderr
    assert "tuning" in shown.stderr and "2/2" in shown.stderr
    hidden = CliRunner().invoke(main, [*args, "--no-progress", "-o", str(tmp_path / "b")])
    assert hidden.exit_code == 0 and "tuning" not in hidden.stderr


def test_tune_model_takes_the_search_options(tmp_path):
    """--method, --timeout, --top-k, --exhaustive-threshold and the cache apply to every bucket;
    --workers (which needs a stored study) is refused rather than ignored (issue 14, item 6)."""
    config = tmp_path / "config.json"  # a small model: --method exhaustive costs every schedule of the space
    config.write_text(json.dumps({"model_type": "llama", "hidden_size": 256, "intermediate_size": 512,
                                  "num_hidden_layers": 2}))
    base = ["tune", "--model", str(config), "--keep-ratio", "0.8", "--tokens", "1", "--trials", "4", "--json"]
    first = CliRunner().invoke(main, [*base, "--method", "optuna", "-o", str(tmp_path / "a")])
    assert first.exit_code == 0, first.stderr
    again = CliRunner().invoke(main, [*base, "--method", "optuna", "--top-k", "2", "-o", str(tmp_path / "b")])
    assert again.exit_code == 0
    assert (tmp_path / "a" / "mlp_t1.py").read_bytes() == (tmp_path / "b" / "mlp_t1.py").read_bytes()
    # trn1, one physical core, the dense MLP: the space without the logical core's splits, with the fewest column
    # tiles and no rank blocking (still every schedule of it, costed: 3 CPU s where the SVD MLP's took 8)
    dense = [arg for arg in base if arg not in ("--keep-ratio", "0.8")] + ["--dense"]
    exhaustive = CliRunner().invoke(main, [*dense, "--method", "exhaustive", "--target", "trn1", "--no-cache", "-o",
                                           str(tmp_path / "c")])
    assert exhaustive.exit_code == 0 and "exhaustive" in (tmp_path / "c" / "mlp_t1.py").read_text()
    workers = CliRunner().invoke(main, [*base, "--workers", "2", "-o", str(tmp_path / "d")])
    assert workers.exit_code == 2 and "--workers" in workers.stderr and not (tmp_path / "d").exists()


def test_tune_model_jobs_write_what_one_job_writes(tmp_path, monkeypatch, one_polish_start):
    """--jobs 2 runs the buckets' searches in worker processes; the kernel files and the index are
    those of --jobs 1, byte for byte. The spawned workers search with every polish start, so this process does too
    (conftest.one_polish_start yields the default)."""
    from neuronmm_compiler.search import tuner

    monkeypatch.setattr(tuner, "POLISH_STARTS", one_polish_start)
    args = ["tune", "--model", str(_small_model(tmp_path, 1024, 3072)), "--keep-ratio", "0.8", "--tokens", "1,2",
            "--trials", "5", "--no-cache"]
    for jobs in ("1", "2"):
        result = CliRunner().invoke(main, [*args, "--jobs", jobs, "-o", str(tmp_path / jobs)])
        assert result.exit_code == 0, result.output + result.stderr
    assert _tree_bytes(tmp_path / "2") == _tree_bytes(tmp_path / "1")
    assert {p.name for p in (tmp_path / "1").iterdir()} == {"index.json", "mlp_t1.py", "mlp_t2.py"}


def test_tune_model_takes_a_shipped_name_and_dense(tmp_path):
    """`--model llama-3.2-1b` resolves the config shipped in the package; `--dense` tunes the lossless MLP per
    bucket; index.json states each argument's shape and dtype, the target spec, LNC and SDK range; `nmmc verify
    DIR` and `verify DIR/index.json` verify every kernel."""
    out = tmp_path / "k"
    result = CliRunner().invoke(main, ["tune", "--model", "llama-3.2-1b", "--dense", "--tokens", "1", "--trials", "3",
                                       "--target", "trn1", "--no-progress", "-o", str(out)])
    assert result.exit_code == 0, result.output + result.stderr
    assert "the dense MLP" in result.output
    index = json.loads((out / "index.json").read_text())
    assert index["ranks"] is None and index["model"]["name"] == "meta-llama/Llama-3.2-1B"
    assert index["target_spec"] == "trn1:launch=in-graph" and index["lnc"] == 1
    assert index["sdk"] == {"min": "2.26", "max": "2.29"} and index["dtype"] == "bfloat16"
    kernel = index["buckets"][0]["kernels"][0]
    assert kernel["arguments"][1] == {"name": "w_gate", "shape": [2048, 8192], "dtype": "bfloat16",
                                      "layout": "row_major"}
    for target in (out, out / "index.json"):
        verified = CliRunner().invoke(main, ["verify", str(target)])
        assert verified.exit_code == 0, verified.output
        assert "OK  mlp_t1.py" in verified.output
    both = CliRunner().invoke(main, ["tune", "--model", "llama-3.2-1b", "--dense", "--keep-ratio", "0.8",
                                     "--tokens", "1", "-o", str(tmp_path / "x")])
    assert both.exit_code == 2 and "--dense" in both.stderr


def test_an_interrupted_tune_model_writes_no_cache_entry(tmp_path, monkeypatch):
    """Ctrl-C after the first bucket's searches: no kernel file, no index and no result-cache entry; an
    uninterrupted run then stores every search."""
    from neuronmm_compiler.model_tuning import pipeline as model_tuning

    calls = []
    original = model_tuning._run_searches

    def interrupted(tune_bucket, searches, jobs, progress, buckets):
        def first_then_interrupt(workload, bucket):
            if calls:
                raise KeyboardInterrupt
            calls.append(bucket)
            return tune_bucket(workload, bucket)
        return original(first_then_interrupt, searches, 1, progress, buckets)

    cache = tmp_path / "cache"
    args = ["tune", "--model", str(_small_model(tmp_path)), "--keep-ratio", "0.8", "--tokens", "1,2", "--trials", "3",
            "--jobs", "1", "--cache-dir", str(cache), "--no-progress", "-o", str(tmp_path / "k")]
    monkeypatch.setattr(model_tuning, "_run_searches", interrupted)
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 130 and calls == [0]
    assert not list(cache.rglob("*.json")) and not (tmp_path / "k").exists()
    monkeypatch.setattr(model_tuning, "_run_searches", original)
    assert CliRunner().invoke(main, args).exit_code == 0
    assert len(list(cache.rglob("*.json"))) == 4  # two buckets, each the SVD MLP and nmmc's dense MLP

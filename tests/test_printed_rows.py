"""What ``nmmc tune``, ``explain`` and ``cost`` print: only the rows and notes that apply to the
workload, columns that stay apart, and the provenance of every figure (issue 28)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from neuronmm_compiler.cli import main

pytestmark = pytest.mark.usefixtures("one_polish_start")  # what surrounds a search, not the search (conftest.py)

MLP = ("--mlp", "--tokens", "16", "--hidden", "256", "--intermediate", "512")


def run(*args: str):
    result = CliRunner().invoke(main, list(args), catch_exceptions=False)
    assert result.exit_code == 0, result.output
    return result.output


def test_dense_mlp_prints_no_svd_rows(tmp_path):
    out = run("tune", *MLP, "--dense", "--trials", "5", "-o", str(tmp_path / "k.py"))
    # trn2 LNC=2 in-graph: AWS's LNC=1 kernels are a reference row (NCC_EVRF066), compared with nothing
    assert "ref: dense (AWS kernels, LNC=1)" in out and "not compared with dense (in-graph):" in out
    assert "speedup vs dense" not in out
    assert "SVD" not in out and "unfused" not in out
    svd = run("tune", *MLP, "--rank", "128", "--trials", "5", "-o", str(tmp_path / "s.py"))
    assert "ref: SVD factors unfused (AWS kernels, LNC=1)" in svd and "not compared with unfused SVD (in-graph):" in svd
    standalone = run("tune", *MLP, "--dense", "--launch", "standalone", "--trials", "5", "-o", str(tmp_path / "t.py"))
    assert "speedup vs dense (standalone):" in standalone and "ref:" not in standalone  # run on its own, it runs


def test_explain_says_which_schedule_it_explains(tmp_path):
    first = run("explain", *MLP, "--rank", "128").splitlines()[0]
    assert "default" in first and "not tuned" in first and "--tuned" in first and "nmmc tune" in first
    given = run("explain", "--shape", "128x512x256", "--param", "tiles_in_block_m=2").splitlines()[0]
    assert "aws-fully-optimized + tiles_in_block_m=2" in given and "--tuned" in given
    tuned = run("explain", *MLP, "--rank", "128", "--tuned").splitlines()[0]
    data = json.loads(run("tune", *MLP, "--rank", "128", "--json", "-o", str(tmp_path / "k.py")))
    assert tuned.startswith("explaining the tuned schedule")
    assert f"predicted {data['predicted']['latency_us']:.1f} us" in tuned  # the latency tune reports


def test_table_columns_stay_apart_for_large_values(tmp_path):
    """A million tokens: every cell of the tune table is separated from the next (was
    ``1033112.249.933e+05-1.075e+06``), and the typical range is written without exponents."""
    out = run("tune", *MLP[:1], "--tokens", "1000000", *MLP[3:], "--rank", "128", "--trials", "3",
              "-o", str(tmp_path / "k.py"))
    lines = out.splitlines()
    header = next(i for i, line in enumerate(lines) if "latency us" in line)
    rows = lines[header + 1:header + 6]
    # nki-library's MLP, nmmc's dense MLP, then AWS's (references in an LNC=2 graph)
    assert [r.split()[0] for r in rows] == ["nmmc", "nki-library", "dense", "ref:", "ref:"]
    for row in rows:
        cells = row.split(")")[-1].split() if "(" in row else row.split()[2:]
        latency, band, bound = cells[:3]
        low, high = band.split("-")
        assert float(low) < float(latency) < float(high), row
        assert bound.isalpha(), row
        assert "e+" not in row


def test_svd_speedup_over_dense_says_it_is_an_approximation(tmp_path):
    lossy = "speedup vs dense ("
    for args in ((*MLP, "--rank", "128", "--launch", "standalone"), ("--shape", "64x512x256", "--rank", "128")):
        out = run("tune", *args, "--trials", "3", "-o", str(tmp_path / "k.py"))
        line = next(x for x in out.splitlines() if x.startswith(lossy))
        assert "an approximation vs exact: the SVD changes the model's outputs" in line, line
    dense = run("tune", *MLP, "--dense", "--trials", "3", "-o", str(tmp_path / "d.py"))
    assert "approximation" not in dense
    config = Path(__file__).parents[1] / "src" / "neuronmm_compiler" / "checkpoints" / "configs" / "llama-3.2-1b.json"
    model = run("tune", "--model", str(config), "--keep-ratio", "0.8",
                "--tokens", "1", "--trials", "3", "-o", str(tmp_path / "K"))
    assert "speedups over the dense MLPs: the SVD changes the model's outputs; not measured" in model

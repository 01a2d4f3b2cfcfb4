"""What ``nmmc tune``, ``explain`` and ``cost`` print: only the rows and notes that apply to the
workload, columns that stay apart, and the provenance of every figure (issue 28)."""

from __future__ import annotations

from click.testing import CliRunner

from neuronmm_compiler.cli import main

MLP = ("--mlp", "--tokens", "16", "--hidden", "256", "--intermediate", "512")


def run(*args: str):
    result = CliRunner().invoke(main, list(args), catch_exceptions=False)
    assert result.exit_code == 0, result.output
    return result.output


def test_dense_mlp_prints_no_svd_rows(tmp_path):
    out = run("tune", *MLP, "--dense", "--trials", "5", "-o", str(tmp_path / "k.py"))
    assert "dense (AWS kernels)" in out and "speedup vs dense:" in out
    assert "SVD" not in out and "unfused" not in out
    svd = run("tune", *MLP, "--rank", "128", "--trials", "5", "-o", str(tmp_path / "s.py"))
    assert "SVD factors unfused (AWS kernels)" in svd and "speedup vs unfused SVD:" in svd

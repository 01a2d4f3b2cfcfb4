"""nki-library's FP8 ROW prefill path as nmmc models it (lowerings/nkilib_cte_fp8.py): two kernels (rmsnorm_quant,
then mlp_cte) that run in the interpreter against their own quantized reference, a mutation caught, the baseline
priced as two launches and labelled with both commits, and where it does not run the reason with its numbers."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from neuronmm_compiler.cli import main
from neuronmm_compiler.cost_model import combine_reports, estimate
from neuronmm_compiler.frontends.shapes import Fp8Weights
from neuronmm_compiler.frontends.workloads import mlp_workload
from neuronmm_compiler.lowerings import nkilib_cte_fp8
from neuronmm_compiler.lowerings.nkilib_fp8 import verify_fp8_prefill
from neuronmm_compiler.lowerings.nkilib_mlp import NotModelled, nkilib_baseline, nkilib_program, nkilib_programs
from neuronmm_compiler.targets import IN_GRAPH, get_target, with_launch, with_lnc

TRN2 = {lnc: with_lnc(get_target("trn2"), lnc) for lnc in (1, 2)}
ROW = Fp8Weights(act_scale="row")


@pytest.mark.parametrize(("tokens", "hidden", "inter", "lnc", "split"), [
    (200, 384, 384, 1, ""),               # a ragged token tile, an odd 128-row tile of I after a double_row pair
    (128, 256, 4352, 2, "intermediate"),  # I > 4096: each core half of I, the bf16 reduce-scatter over H
])
def test_both_kernels_verify_against_their_quantized_reference(tokens, hidden, inter, lnc, split):
    programs = nkilib_cte_fp8.fp8_prefill_programs(tokens, hidden, inter, TRN2[lnc])
    assert [p.name for p in programs] == ["nkilib_rmsnorm_quant", "nkilib_mlp_cte_fp8"] and programs[1].split == split
    check = verify_fp8_prefill(tokens, hidden, inter, TRN2[lnc])
    assert check.ok, (check.error, check.violations, check.rel_error)
    assert check.rel_error < 6e-3


def test_a_missing_token_scale_fails_verification():
    programs = nkilib_cte_fp8.fp8_prefill_programs(200, 384, 384, TRN2[1])
    quant, mlp = nkilib_cte_fp8.fp8_prefill_sources(programs, TRN2[1])
    line = next(x for x in mlp.splitlines() if "op=nl.silu" in x and "scale=x_scale_cols[0:128, 0:1]" in x)
    mutated = mlp.replace(line, line.replace(", scale=x_scale_cols[0:128, 0:1]", ""))
    check = verify_fp8_prefill(200, 384, 384, TRN2[1], sources=[quant, mutated])
    assert not check.ok and check.rel_error > 0.05


def test_the_baseline_is_two_launches_labelled_with_both_commits():
    baseline = nkilib_baseline(mlp_workload(512, 2048, 8192, dense=True, fp8=ROW), TRN2[2])
    assert baseline.runnable and baseline.cost is not None and baseline.cost.feasible, baseline.reason
    assert "rmsnorm_quant @d2ad3a57" in baseline.label and "@092a49dc" in baseline.label
    assert baseline.details["kernels"] == 2 and "rmsnorm_quant" in baseline.details["fp8_prefill"]
    programs = nkilib_programs(512, 2048, 8192, TRN2[2], fp8="float8_e4m3")
    reports = [estimate(p, TRN2[2]) for p in programs]
    assert baseline.cost.latency_us == pytest.approx(combine_reports(reports).latency_us)
    # in a model graph each kernel pays its own launch: the sum, not one launch less (standalone: one launch)
    graph = with_launch(TRN2[2], IN_GRAPH)
    in_graph = nkilib_baseline(mlp_workload(512, 2048, 8192, dense=True, fp8=ROW), graph).cost
    assert in_graph.latency_us == pytest.approx(sum(estimate(p, graph).latency_us for p in programs))
    assert baseline.cost.latency_us < sum(r.latency_us for r in reports)
    # the FP8 weights are read as one byte each: less HBM traffic than the bf16 prefill kernel at the same shape
    bf16 = nkilib_baseline(mlp_workload(512, 2048, 8192, dense=True), TRN2[2]).cost
    assert baseline.cost.hbm_bytes_read < 0.7 * bf16.hbm_bytes_read
    with pytest.raises(NotModelled, match="two kernels"):
        nkilib_program(512, 2048, 8192, TRN2[2], fp8="float8_e4m3")


def test_where_it_does_not_run_says_why_with_numbers():
    whole = nkilib_baseline(mlp_workload(2048, 4096, 14336, dense=True, fp8=ROW), TRN2[2])  # 7168 columns per core
    assert whole.cost is None and not whole.runnable and "cannot tile 7168 intermediate columns" in whole.reason
    assert "empty list" in nkilib_baseline(mlp_workload(128, 4096, 3584, dense=True, fp8=ROW), TRN2[2]).reason
    with pytest.raises(NotModelled, match="multiple of 128"):
        nkilib_cte_fp8.fp8_prefill_programs(256, 512, 1000, TRN2[1])
    with pytest.raises(nkilib_cte_fp8.DoesNotRun, match="not one gate/up slab of 1024 x 4096 FP8"):
        nkilib_cte_fp8.fp8_slab_buffers(180224, 4096, 1)


def test_tune_prints_the_two_kernel_baseline_with_its_commits(tmp_path):
    result = CliRunner().invoke(main, ["tune", "--mlp", "--tokens", "256", "--hidden", "512", "--intermediate", "1024",
                                       "--dense", "--dtype", "fp8", "--act-scale", "row", "--trials", "2", "--jobs",
                                       "1", "-o", str(tmp_path / "k.py")])
    assert result.exit_code == 0, result.output
    row = next(x for x in result.output.splitlines() if "nki-library MLP (prefill: rmsnorm_quant @d2ad3a57" in x)
    assert "@092a49dc" in row and row.split()[-1] == "2"  # the kernels column
    assert "speedup vs nki-library's fused MLP (in-graph)" in result.output

"""nki-library's MX prefill MLP as nmmc models it (lowerings/nkilib_cte_mx.py): it runs in the interpreter against
its own quantized float64 reference (LNC=1 and LNC=2, a ragged 128-token subtile), a dropped or doubled scale fails,
and the baseline row of an MX tune above 96 tokens is priced with its commit, or says why not."""

from __future__ import annotations

import pytest

from neuronmm_compiler.frontends.mx import MxWeights
from neuronmm_compiler.frontends.workloads import mlp_workload
from neuronmm_compiler.lowerings import nkilib_cte_mx
from neuronmm_compiler.lowerings.nkilib_mlp import nkilib_baseline
from neuronmm_compiler.lowerings.nkilib_mx import mx_source
from neuronmm_compiler.lowerings.nkilib_source import DoesNotRun, NotModelled
from neuronmm_compiler.targets import get_target, with_lnc

TRN3 = {lnc: with_lnc(get_target("trn3"), lnc) for lnc in (1, 2)}


@pytest.mark.parametrize(("tokens", "hidden", "inter", "lnc"), [
    (256, 512, 512, 1),     # one 256-token subtile, one tile of H and of I
    (384, 1024, 1536, 1),   # a 384-token tile: a 256-token subtile then a 128-token one; bf16 PSUM over 2/3 tiles
    (512, 512, 1024, 2),    # tokens split between the two programs
])
def test_mx_prefill_verifies_against_its_quantized_reference(tokens, hidden, inter, lnc):
    check = nkilib_cte_mx.verify_nkilib_mx_prefill(tokens, hidden, inter, TRN3[lnc])
    assert check.ok, (check.error, check.violations, check.rel_error)
    assert check.rel_error < 1e-4  # the reference rounds where the kernel does: near-exact


@pytest.mark.parametrize("mutation", ["drop", "double"])
def test_a_wrong_scale_fails_verification(mutation):
    source = mx_source(nkilib_cte_mx.mx_cte_program(256, 512, 512, TRN3[1]), TRN3[1])
    line = next(x for x in source.splitlines() if "nc_matmul_mx(dst=down_psum_0" in x)
    if mutation == "drop":  # the down weights' scales in place of the intermediate's (same shape, other values)
        mutated = source.replace(line, line.replace("stationary_scale=intermediate_scale_0[0:128, 0, 0:128]",
                                                    "stationary_scale=down_weight_scale_ring[0:128, 0, 0, 0:128]"))
    else:  # the down product accumulated twice
        mutated = source.replace(line, f"{line}\n{line}")
    assert mutated != source
    check = nkilib_cte_mx.verify_nkilib_mx_prefill(256, 512, 512, TRN3[1], source=mutated)
    assert not check.ok


def test_tile_sizes_and_refusals_follow_its_source():
    assert nkilib_cte_mx.mx_cte_tile(256, 3584) == 256       # 7 PSUM banks per 256 tokens: one subtile
    assert nkilib_cte_mx.mx_cte_tile(1024, 1024) == 512      # 2 banks: 8 // 2 * 256 = 1024, capped at 512
    with pytest.raises(DoesNotRun, match="PSUM room"):
        nkilib_cte_mx.mx_cte_tile(512, 4608)                 # 9 tiles of 512 columns
    with pytest.raises(NotModelled, match="float8_e4m3fn_x4"):
        nkilib_cte_mx.mx_cte_program(512, 512, 512, TRN3[1], "mxfp4")


def test_mx_prefill_is_the_baseline_row_above_96_tokens():
    baseline = nkilib_baseline(mlp_workload(512, 4096, 3584, dense=True, mx=MxWeights("mxfp8_e4m3")), TRN3[2])
    assert baseline.cost is not None and baseline.cost.feasible, baseline.reason
    assert "prefill kernel" in baseline.label and "@092a49dc" in baseline.label and "not charged" in baseline.label
    assert baseline.details["lnc_split"] == "tokens" and "rmsnorm_mx_prefill" in baseline.details["mx_prefill"]
    fp4 = nkilib_baseline(mlp_workload(512, 4096, 3584, dense=True, mx=MxWeights("mxfp4")), TRN3[2])
    assert fp4.cost is None and "float8_e4m3fn_x4" in fp4.reason

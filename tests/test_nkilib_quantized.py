"""nki-library's quantized MLPs as nmmc models them (lowerings/nkilib_mx.py; the FP8 ROW path of nkilib_mlp.py): the
MX decode kernel is a baseline with its commit, runs in the interpreter against its own quantized reference, a
mutation is caught, and where a path is not modelled or does not run the row says why."""

from __future__ import annotations

import pytest

from neuronmm_compiler.frontends.mx import MxWeights
from neuronmm_compiler.frontends.shapes import Fp8Weights
from neuronmm_compiler.frontends.workloads import mlp_workload
from neuronmm_compiler.lowerings import nkilib_mx
from neuronmm_compiler.lowerings.nkilib_mlp import DoesNotRun, NotModelled, nkilib_baseline, nkilib_program
from neuronmm_compiler.targets import get_target, with_lnc

TRN3 = {lnc: with_lnc(get_target("trn3"), lnc) for lnc in (1, 2)}


def test_mx_decode_is_a_baseline_with_its_commit():
    baseline = nkilib_baseline(mlp_workload(1, 4096, 3584, dense=True, mx=MxWeights("mxfp4")), TRN3[2])
    assert baseline.cost is not None and baseline.cost.feasible and baseline.runnable
    assert "@d2ad3a57" in baseline.label and "QuantizationType.MX" in baseline.label
    assert "mlp_tkg_mx.py" in baseline.details["mx"]
    # half the weight bytes of MXFP8 (plus the same scales): the model reads what the kernel loads
    mxfp8 = nkilib_baseline(mlp_workload(1, 4096, 3584, dense=True, mx=MxWeights("mxfp8_e4m3")), TRN3[2]).cost
    assert baseline.cost.hbm_bytes_read < 0.6 * mxfp8.hbm_bytes_read


@pytest.mark.parametrize(("tokens", "hidden", "inter", "lnc", "fmt"), [
    (3, 1024, 1024, 2, "mxfp8_e4m3"),  # T padded to 4, H split, the two bf16 exchanges
    (6, 512, 1536, 1, "mxfp4"),        # two 4-token groups, FP4 weights x E4M3 activations
])
def test_mx_decode_kernel_verifies(tokens, hidden, inter, lnc, fmt):
    check = nkilib_mx.verify_nkilib_mx(tokens, hidden, inter, TRN3[lnc], fmt)
    assert check.ok, (check.error, check.violations, check.rel_error)
    assert check.rel_error < 5e-3


def test_mx_mutation_missing_exchange_fails():
    program = nkilib_mx.mx_tkg_program(3, 1024, 1024, TRN3[2], "mxfp8_e4m3")
    source = nkilib_mx.mx_source(program, TRN3[2])
    exchange = next(line for line in source.splitlines() if "nki.lnc.sendrecv(" in line and "up_recv" in line)
    check = nkilib_mx.verify_nkilib_mx(3, 1024, 1024, TRN3[2], "mxfp8_e4m3", source=source.replace(exchange, ""))
    assert not check.ok


def test_where_the_quantized_paths_are_not_modelled_or_do_not_run_says_why():
    mx = MxWeights("mxfp8_e4m3")
    prefill = nkilib_baseline(mlp_workload(512, 4096, 14336, dense=True, mx=mx), TRN3[2])
    # 7168 intermediate columns per core: 14 PSUM banks per 256 tokens (tests/test_nkilib_mx_prefill.py)
    assert prefill.cost is None and "calc_batch_seqlen_dim_tile_size" in prefill.reason and "@092a49dc" in prefill.label
    whole = nkilib_baseline(mlp_workload(1, 4096, 14336, dense=True, mx=mx), TRN3[2])  # 28 PSUM tiles of gate
    assert whole.cost is not None and not whole.cost.feasible and "PSUM 28 of 8 banks" in whole.reason
    with pytest.raises(DoesNotRun, match="I % 512"):
        nkilib_program(1, 4096, 1792, TRN3[2], mx="mxfp4")  # Llama-3.1-8B's tp 8 slice
    with pytest.raises(NotModelled, match="I < 512"):
        nkilib_program(1, 1024, 256, TRN3[2], mx="mxfp4")
    fp8 = nkilib_baseline(mlp_workload(512, 2048, 8192, dense=True, fp8=Fp8Weights(act_scale="row")),
                          with_lnc(get_target("trn2"), 2))  # modelled: two kernels (test_nkilib_fp8_prefill.py)
    assert fp8.cost is not None and "2 kernels" in fp8.label and "per-token FP8 activations" in fp8.label

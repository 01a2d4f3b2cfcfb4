"""nki-library's FP8 MLP as nmmc models it (lowerings/nkilib_tkg.py with ``fp8``, lowerings/nkilib_fp8.py): the
decode kernel verified in the interpreter against its own reference, a mutation caught, and where it does not run
the limit is named."""

from __future__ import annotations

import pytest

from neuronmm_compiler.frontends.shapes import Fp8Weights
from neuronmm_compiler.frontends.workloads import mlp_workload
from neuronmm_compiler.lowerings import nkilib_fp8
from neuronmm_compiler.lowerings.nkilib_mlp import NotModelled, nkilib_baseline, nkilib_program, nkilib_source
from neuronmm_compiler.targets import get_target, with_lnc

TRN2 = {lnc: with_lnc(get_target("trn2"), lnc) for lnc in (1, 2)}


@pytest.mark.parametrize(("tokens", "hidden", "inter", "lnc"), [
    (8, 256, 1000, 2),   # four column tiles, a ragged I tile, the fp32 exchange
    (48, 256, 640, 1),   # two column tiles
])
def test_fp8_decode_kernel_verifies(tokens, hidden, inter, lnc):
    check = nkilib_fp8.verify_nkilib_fp8(tokens, hidden, inter, TRN2[lnc])
    assert check.ok, (check.error, check.violations)
    assert check.rel_error < 1e-2


def test_fp8_decode_is_weight_only_and_halves_weight_bytes():
    source = nkilib_source(8, 512, 1000, TRN2[2], fp8="float8_e4m3")
    assert "perf_mode" not in source  # bf16 activations x FP8 weights: no double_row
    assert "w_ring = nl.ndarray((128, 2, 32, 1000), dtype=nl.float8_e4m3" in source  # 4096-row slabs
    fp8 = nkilib_program(8, 512, 1000, TRN2[2], fp8="float8_e4m3")
    assert [b.name for b in fp8.params][-3:] == ["w_gate_scale", "w_up_scale", "w_down_scale"]
    costs = [nkilib_baseline(mlp_workload(1, 4096, 3584, dense=True, fp8=f), TRN2[2]).cost
             for f in (None, Fp8Weights())]
    assert costs[1].hbm_bytes_read < 0.51 * costs[0].hbm_bytes_read
    assert costs[1].latency_us < costs[0].latency_us


def test_mutation_missing_dequantization_fails(monkeypatch):
    real = nkilib_fp8.nkilib_source

    def mutated(*args, **kwargs):
        source = real(*args, **kwargs)
        line = next(x for x in source.splitlines() if "data2=up_scale_rows" in x)
        return source.replace(line, "")

    monkeypatch.setattr(nkilib_fp8, "nkilib_source", mutated)
    check = nkilib_fp8.verify_nkilib_fp8(8, 256, 640, TRN2[2])
    assert not check.ok and check.rel_error > 0.05


def test_where_it_does_not_run_says_why():
    fp8 = Fp8Weights()
    decode = nkilib_baseline(mlp_workload(1, 4096, 14336, dense=True, fp8=fp8), TRN2[2])
    assert decode.cost is None and "Stack out of memory" in decode.reason  # fp32 [T, 2I] twice: 229632 B
    small = nkilib_baseline(mlp_workload(1, 2048, 8192, dense=True, fp8=fp8), TRN2[2])  # bf16 runs, FP8 does not
    assert small.cost is None and "mlp_tkg_constants.py:315-319" in small.reason
    assert nkilib_baseline(mlp_workload(1, 2048, 8192, dense=True), TRN2[2]).cost is not None
    assert "bf16 activations" in decode.label and "QuantizationType.ROW" in decode.details["fp8"]
    assert "empty list" in nkilib_baseline(mlp_workload(128, 2048, 8192, dense=True, fp8=fp8), TRN2[2]).reason
    prefill = nkilib_baseline(mlp_workload(512, 2048, 8192, dense=True, fp8=fp8), TRN2[2])  # two kernels, modelled
    assert prefill.cost is not None and prefill.details["kernels"] == 2  # tests/test_nkilib_fp8_prefill.py
    assert "cannot tile 7168" in nkilib_baseline(mlp_workload(512, 4096, 14336, dense=True, fp8=fp8), TRN2[2]).reason
    with pytest.raises(NotModelled, match="float8_e4m3"):
        nkilib_program(8, 512, 1024, TRN2[2], fp8="float8_e5m2")

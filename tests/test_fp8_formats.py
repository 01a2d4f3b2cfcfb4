"""The FP8 formats per target (docs/quantization.md "Formats"): float8_e4m3fn (OCP, largest 448) compiles and verifies
on
trn3 only, is refused on trn1/trn2 by rule id, and one kernel never mixes it with legacy float8_e4m3; an MX format is
not an element dtype: where MX weights are not compiled it is refused in a sentence naming docs/mx.md (MX kernels:
tests/test_mx.py). Small shapes: the file runs in a few seconds."""

from __future__ import annotations

import functools

import ml_dtypes
import numpy as np
import pytest

from neuronmm_compiler.driver import compile_workload
from neuronmm_compiler.errors import InputError, ScheduleError
from neuronmm_compiler.frontends.shapes import Fp8Weights, mlp_graph
from neuronmm_compiler.frontends.workloads import mlp_workload
from neuronmm_compiler.ir.node import canonical_dtype
from neuronmm_compiler.ir.quantized import calibrate, unquantized
from neuronmm_compiler.passes.quantize_fp8 import quantize_fp8
from neuronmm_compiler.targets import TARGETS, get_target
from neuronmm_compiler.verification import verify_source


@functools.cache
def _kernel() -> str:
    workload = mlp_workload(3, 256, 384, dense=True, fp8=Fp8Weights("float8_e4m3fn"))
    return compile_workload(workload, target=get_target("trn3")).kernel.source


def test_only_trn3_lists_float8_e4m3fn() -> None:
    assert canonical_dtype("fp8_e4m3fn") == "float8_e4m3fn"
    assert {name for name, t in TARGETS.items() if "float8_e4m3fn" in t.fp8_formats} == {"trn3"}
    assert "fp8_formats" not in TARGETS["trn3"].as_dict()  # the target's fingerprint is unchanged by the list


def test_e4m3fn_scales_use_its_largest_value_448() -> None:
    graph = quantize_fp8(mlp_graph(4, 256, 384, None, fp8=Fp8Weights("float8_e4m3fn")))
    rng = np.random.default_rng(0)
    raw = {n.name: rng.standard_normal(n.storage_shape).astype(ml_dtypes.bfloat16) for n in unquantized(graph).inputs()}
    quantized = calibrate(graph, raw)
    w = quantized["w_gate"]
    assert w.dtype == np.dtype(ml_dtypes.float8_e4m3fn)
    assert np.all(np.abs(w.astype(np.float32)).max(axis=0) == 448.0)  # per channel: max|W| / s lands on 448


def test_e4m3fn_kernel_verifies_on_trn3_with_double_row() -> None:
    source = _kernel()
    assert "dtype=nl.float8_e4m3fn" in source and "operand1=448.0" in source and "nl.float8_e4m3," not in source
    report = verify_source(source, rules=True)
    assert report.ok, report.error
    assert not report.violations
    assert report.rel_error is not None and report.rel_error < 1e-2
    assert report.counters["double_row_matmuls"] == report.counters["matmul_instructions"]


@pytest.mark.parametrize("target", ["trn1", "trn2"])
def test_e4m3fn_is_refused_before_v4_with_the_rule_id(target: str) -> None:
    workload = mlp_workload(3, 256, 384, dense=True, fp8=Fp8Weights("float8_e4m3fn"))
    with pytest.raises(ScheduleError, match=r"NKI-MATMUL-E4M3FN.*nki\.isa\.nc_matmul, 'Data types'"):
        compile_workload(workload, target=get_target(target))


def test_an_e4m3fn_kernel_run_on_trn2_fails_with_the_rule_id() -> None:
    report = verify_source(_kernel(), target=get_target("trn2:lnc=2"))
    assert not report.ok and "NKI-MATMUL-E4M3FN" in (report.error or "")


def test_mixing_legacy_e4m3_and_e4m3fn_fails_with_the_rule_id() -> None:
    """x quantized into a legacy float8_e4m3 strip (clamped at its 240) read with float8_e4m3fn weights."""
    source = _kernel()
    mutated = source.replace("x_q_strip = nl.ndarray((P, 2, T), dtype=nl.float8_e4m3fn",
                             "x_q_strip = nl.ndarray((P, 2, T), dtype=nl.float8_e4m3", 1)
    mutated = mutated.replace("operand0=x_scale_col[0:F_TILE, 0:1], op1=nl.minimum, operand1=448.0)",
                              "operand0=x_scale_col[0:F_TILE, 0:1], op1=nl.minimum, operand1=240.0)", 1)
    mutated = mutated.replace("op0=nl.maximum, operand0=-448.0)", "op0=nl.maximum, operand0=-240.0)", 1)
    assert mutated.count("448.0)") == source.count("448.0)") - 2
    report = verify_source(mutated, rules=True)
    assert not report.ok and "NKI-FP8-E4M3-MODE" in (report.error or "")
    assert "NKI-FP8-E4M3-MODE" in {v.rule_id for v in report.violations}


def test_an_unclamped_e4m3fn_write_is_nan_and_fails_with_the_rule_id() -> None:
    source = _kernel()
    unclamped = source.replace("op1=nl.minimum, operand1=448.0", "op1=nl.multiply, operand1=1000.0", 1)
    assert unclamped != source
    report = verify_source(unclamped)
    assert not report.ok and "NKI-FP8-SATURATE" in (report.error or "")


@pytest.mark.parametrize("dtype", ["mxfp8", "mxfp4"])
def test_mx_formats_are_refused_in_one_sentence(dtype: str) -> None:
    with pytest.raises(InputError, match="nc_matmul_mx") as err:
        canonical_dtype(dtype)
    assert "\n" not in str(err.value) and "docs/mx.md" in str(err.value)


def test_e4m3fn_layer_files_keep_values_past_240(tmp_path) -> None:
    """``compress --dtype fp8_e4m3fn``'s files: weights reach 448 and read back as e4m3fn (as legacy e4m3 those bit
    patterns would be inf/NaN). (``compress --dtype mxfp8`` measures MX layers: test_compress_mx.)"""

    from neuronmm_compiler.checkpoints.weights import write_tensor_file
    from neuronmm_compiler.compression.formats import fp8_format, fp8_layer
    from neuronmm_compiler.compression.fp8_files import fp8_tensors, read_fp8_layer

    rng = np.random.default_rng(0)
    f = {p: rng.standard_normal((96, 64) if p == "down" else (64, 96)) for p in ("gate", "up", "down")}
    q = fp8_layer(f, {"x": 3.0, "h": 5.0}, fp8_format("fp8_e4m3fn"))
    write_tensor_file(tmp_path / "layer.safetensors", fp8_tensors(0, q), {})
    back, dequantized = read_fp8_layer(tmp_path / "layer.safetensors", 0, dict.fromkeys(f), "float8_e4m3fn")
    w = back.weights["gate"][0]
    assert w.dtype == np.dtype(ml_dtypes.float8_e4m3fn) and float(np.abs(w.astype(np.float32)).max()) == 448.0
    assert np.array_equal(w.view(np.uint8), q.weights["gate"][0].view(np.uint8))
    assert back.activation_scales == pytest.approx({"x": 3.0 / 448, "h": 5.0 / 448})
    assert np.abs(dequantized["gate"] - f["gate"]).max() < 0.07 * np.abs(f["gate"]).max()

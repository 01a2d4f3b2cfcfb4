"""OCP MX formats on trn3 (``--dtype mxfp8_e4m3|mxfp8_e5m2|mxfp4``; docs/mx.md): ir/mx.py's arithmetic against
ml_dtypes and the documented quantize_mx scale, the stored layout, the kernels (nc_matmul_mx, quantize_mx) verifying
against the quantized graph with the cost model counting what the interpreter runs and never predicting below the
physical floor, the mutations the rule book names (a scale applied twice, scales outside their quadrant, MX on trn2),
and the one-line refusals. Small shapes: a few seconds."""

from __future__ import annotations

import functools
import inspect

import ml_dtypes
import numpy as np
import pytest
from click.testing import CliRunner

from neuronmm_compiler.cli import main as nmmc
from neuronmm_compiler.codegen.reference import reference_source
from neuronmm_compiler.driver import compile_workload
from neuronmm_compiler.frontends.mx import MxWeights
from neuronmm_compiler.frontends.workloads import gemm_workload, mlp_workload
from neuronmm_compiler.ir import mx
from neuronmm_compiler.ir.evaluate import evaluate
from neuronmm_compiler.ir.mx_quantized import calibrate_mx, unquantized_mx
from neuronmm_compiler.passes.quantize_mx import quantize_mx
from neuronmm_compiler.targets import get_target
from neuronmm_compiler.verification import verify_source


# ----------------------------------------------------------------------------- arithmetic and layout
@pytest.mark.parametrize("element", list(mx.MX_ELEMENTS))
def test_rounding_into_an_element_type_is_ml_dtypes_cast(element: str) -> None:
    """Within the finite range, round_element is the ml_dtypes cast (round to nearest even), subnormals included."""
    fmt = mx.MX_ELEMENTS[element]
    rng = np.random.default_rng(0)
    x = np.concatenate([rng.uniform(-fmt.max, fmt.max, 4000), rng.standard_normal(4000) * 2.0 ** fmt.min_exponent,
                        [0.0, fmt.max, -fmt.max]])
    want = x.astype(np.float32).astype(getattr(ml_dtypes, element)).astype(np.float64)
    assert np.array_equal(mx.round_element(x, element), want)
    # beyond the largest finite value the element saturates (the OCP sample algorithm clamps; nc_matmul_mx reads no inf)
    assert mx.round_element(np.array([4 * fmt.max, -4 * fmt.max]), element).tolist() == [fmt.max, -fmt.max]


def test_the_packed_layout_holds_positions_128_apart() -> None:
    """Packed row 128 kt + p, element j is contraction position 512 kt + 128 j + p; to_logical undoes to_packed."""
    k = 1024
    positions = np.arange(k, dtype=np.int64)[:, None] * np.ones((1, 3), np.int64)
    packed = mx.to_packed(positions, 0)
    assert packed.shape == (k // 4, 3, 4)
    for kt, p, j in ((0, 0, 0), (0, 5, 3), (1, 127, 2), (1, 8, 1)):
        assert packed[128 * kt + p, 0, j] == 512 * kt + 128 * j + p
    assert np.array_equal(mx.to_logical(packed, 0), positions)
    assert np.array_equal(mx.to_logical(mx.to_packed(positions.T, 1), 1), positions.T)
    # a block (one scale) is 8 packed rows x 4 elements; its scale sits in the first 4 partitions of its quadrant
    assert [mx.scale_partition(g) for g in (0, 3, 4, 15)] == [0, 3, 32, 99]


def test_quantize_mx_takes_twice_the_ocp_block_scale() -> None:
    """max|V| = 3 in a float8_e4m3fn group: quantize_mx's scale is 2^(1 - 7) (its element 192), the OCP sample
    algorithm's (the offline weights') 2^(1 - 8) (element 384); an all-zero group takes 2^-127 (nki.isa.quantize_mx,
    "Scale calculation")."""
    x = np.zeros((1, 512))
    x[0, 0] = 3.0  # group 0: positions 0..7 of each j-slice 128 apart
    x[0, 128] = 1.0
    q = mx.quantize_activation(x, "float8_e4m3fn")
    assert q[0, 0] == 3.0 and q[0, 128] == 1.0
    elements, exps = mx._quantize(mx.to_packed(x, 1), 1, "float8_e4m3fn", doubled=True)
    assert exps[0, 0] == -6 and elements[0, 0, 0] == 192.0 and exps[0, 1] == -127
    elements, exps = mx.quantize_weight(x.T, "float8_e4m3fn")
    assert exps[0, 0] == -7 and elements[0, 0, 0] == 384.0
    # the doubled scale keeps the group's largest value below the element maximum: no saturation where OCP's may round
    # 1.9375 * 2^e onto the 448 clamp; an E4M3 group of max 479 * 2^-8 rounds to 480 * 2^-8 under the OCP scale
    y = np.zeros((1, 512))
    y[0, 0] = 479 / 256
    assert mx.quantize_activation(y, "float8_e4m3fn")[0, 0] == 480 / 256


@pytest.mark.parametrize("element", list(mx.MX_ELEMENTS))
def test_pack_stores_elements_and_e8m0_scales_that_unpack_exactly(element: str) -> None:
    rng = np.random.default_rng(1)
    w = rng.standard_normal((1024, 24)) * np.exp2(rng.integers(-6, 6, (1024, 1)))
    data, scales = mx.pack(w, element)
    assert data.dtype == mx.numpy_dtype(mx.MX_ELEMENTS[element].packed) and data.shape == (256, 24)
    assert scales.dtype == np.uint8 and scales.shape == (16, 2, 24)
    elements, exps = mx.quantize_weight(w, element)
    assert np.array_equal(mx.unpack(data, scales), mx.dequantize(elements, exps, 0))
    # element j of a packed word is in its byte (float8) or nibble (float4) j, as nki-library's unpack reads them
    bits = np.asarray(elements[3, 5], np.float32).astype(getattr(ml_dtypes, element)).view(np.uint8)
    width = 8 * mx.MX_ELEMENTS[element].packed_bytes // 4
    word = int(data[3, 5][0])
    assert [(word >> (width * j)) & ((1 << width) - 1) for j in range(4)] == [int(b) & ((1 << width) - 1) for b in bits]
    # the E8M0 exponents: uint8 e + 127, each 16 groups of a 512-position tile in one slice
    assert np.array_equal(mx.scales_from_storage(scales), exps)


# ----------------------------------------------------------------------------- kernels
@functools.cache
def _compiled(kind: str, fmt: str, *dims: int, target: str = "trn3", **params: str):
    mxw = MxWeights(fmt)
    workload = (mlp_workload(*dims, dense=True, mx=mxw) if kind == "mlp" else gemm_workload(*dims, mx=mxw))
    return compile_workload(workload, target=get_target(target), params=params)


KERNELS = {
    "mlp-mxfp4-decode-lnc2": ("mlp", "mxfp4", 1, 1024, 2048),
    "mlp-mxfp8-e5m2-3-tokens": ("mlp", "mxfp8_e5m2", 3, 512, 1024),
    "gemm-mxfp8-e4m3": ("gemm", "mxfp8_e4m3", 77, 512, 1024),
}


@pytest.mark.parametrize("name", list(KERNELS))
def test_mx_kernels_verify_and_the_model_counts_what_runs(name: str) -> None:
    compiled = _compiled(*KERNELS[name])
    source = compiled.kernel.source
    assert "nisa.nc_matmul_mx(" in source and "nisa.quantize_mx(" in source
    assert "nisa.nc_matmul(" not in source  # every matmul of the kernel is an MX one
    report = verify_source(source, rules=True)
    assert report.ok, report.error
    assert report.rel_error is not None and report.rel_error < 1e-2
    # the unquantized graph's error is reported (MX quantization error: far above the bf16 tolerance for mxfp4)
    assert report.unquantized_rel_error is not None and report.unquantized_rel_error > report.rel_error
    cost, counters = compiled.cost, report.counters
    assert cost.dma_transfers == counters["dma_transfers"]
    assert cost.matmul_instructions == counters["matmul_instructions"]
    assert cost.sbuf_bytes_per_partition == counters["sbuf_peak_bytes"]
    assert cost.psum_banks == counters["psum_peak_banks"]
    assert cost.hbm_bytes_read_by_tensor == {k: v for k, v in counters["hbm_bytes_read"].items() if v}


def test_an_mx_weight_moves_its_elements_and_one_scale_byte_per_32() -> None:
    """mxfp4: half a byte per weight plus 1/32 byte of scale, a quarter (and 1/64) of bf16's two bytes; mxfp8 a half."""
    bf16 = compile_workload(mlp_workload(1, 1024, 2048, dense=True), target=get_target("trn3")).cost
    for fmt, share in (("mxfp4", 0.25), ("mxfp8_e4m3", 0.5)):
        by = _compiled("mlp", fmt, 1, 1024, 2048).cost.hbm_bytes_read_by_tensor
        assert by["w_gate"] == share * bf16.hbm_bytes_read_by_tensor["w_gate"]
        assert by["w_gate_scale"] == 1024 * 2048 // 32


@pytest.mark.parametrize("fmt", ["mxfp4", "mxfp8_e4m3"])
def test_no_mx_prediction_below_the_physical_floor(fmt: str) -> None:
    """Latency >= HBM bytes at both cores' full bandwidth and >= every FLOP at the MX peak of both cores (Target:
    hbm_gbytes_per_s_per_core, peak_mx_tflops), for a decode and a prefill MLP of the headline shape's family."""
    target = get_target("trn3")
    for tokens in (1, 256):
        cost = compile_workload(mlp_workload(tokens, 2048, 4096, dense=True, mx=MxWeights(fmt)), target=target).cost
        cores = target.lnc
        hbm_floor = (cost.hbm_bytes_read + cost.hbm_bytes_written) / (cores * target.hbm_gbytes_per_s_per_core * 1e3)
        flop_floor = cost.flops / (cores * target.peak_mx_tflops * 1e6)
        assert cost.latency_us >= cost.lower_bound_us >= max(hbm_floor, flop_floor) > 0


def test_the_unquantized_graph_is_the_plain_mlp_and_the_printed_reference_the_quantized_one() -> None:
    graph = quantize_mx(mlp_workload(2, 512, 1024, dense=True, mx=MxWeights("mxfp4")).graph())
    plain = mlp_workload(2, 512, 1024, dense=True).graph()
    rng = np.random.default_rng(4)
    raw = {n.name: rng.standard_normal(n.shape).astype(ml_dtypes.bfloat16) for n in plain.inputs()}
    assert np.array_equal(evaluate(unquantized_mx(graph), raw)["out"], evaluate(plain, raw)["out"])
    inputs = calibrate_mx(graph, raw)
    namespace: dict = {"np": np}
    exec("\n".join(reference_source(graph)), namespace)
    names = inspect.signature(namespace["reference"]).parameters
    printed = namespace["reference"](*(inputs[n] for n in names))
    assert np.array_equal(printed, evaluate(graph, inputs)["out"])


# ----------------------------------------------------------------------------- mutations
_GATE_X_SCALE = ("stationary_scale=w_gate_block_scale[0:P, kt, F_TILE * ft:F_TILE * ft + F_TILE], "
                 "moving_scale=x_q_strip_scale[0:P, kt, 0:TOKEN_TILE])")
MUTATIONS = {
    # the gate matmul reads its weight's scales for both operands: the weight scale applied twice, x's never
    "scale applied twice": (_GATE_X_SCALE, _GATE_X_SCALE.replace("x_q_strip_scale", "w_gate_block_scale"),
                            "NMMC-MX-SCALE-PAIR"),
    # a quadrant's 4 scale rows land at partitions 4q.. instead of the first 4 of quadrant q (32q..)
    "scales outside their quadrant": ("dst=w_up_block_scale[32 * q:32 * q + 4,",
                                      "dst=w_up_block_scale[4 * q:4 * q + 4,", "NKI-MX-SCALE-LAYOUT"),
}


@pytest.mark.parametrize("mutation", list(MUTATIONS))
def test_a_mutated_mx_kernel_fails_with_the_rule_id(mutation: str) -> None:
    old, new, rule = MUTATIONS[mutation]
    source = _compiled(*KERNELS["mlp-mxfp4-decode-lnc2"]).kernel.source
    assert source.count(old) == 1
    report = verify_source(source.replace(old, new), rules=True)
    assert not report.ok and rule in (report.error or ""), report.error


def test_an_mx_kernel_verified_for_trn2_fails_with_the_rule_id() -> None:
    source = _compiled(*KERNELS["gemm-mxfp8-e4m3"]).kernel.source
    report = verify_source(source, target=get_target("trn2"), rules=True)
    assert not report.ok and "NKI-MX-TARGET" in (report.error or "")


_MLP = ["--mlp", "--tokens", "1", "--intermediate", "2048", "--dense", "--dtype", "mxfp4"]
REFUSALS = {
    "trn2": ([*_MLP, "--hidden", "1024", "--target", "trn2"], "NKI-MX-TARGET"),
    "trn1": ([*_MLP, "--hidden", "1024", "--target", "trn1"], "NKI-MX-TARGET"),
    "hidden not a multiple of 512": ([*_MLP, "--hidden", "768", "--target", "trn3"], "not a multiple of 512"),
    "norm prologue": ([*_MLP, "--hidden", "1024", "--target", "trn3", "--fuse-norm", "rmsnorm"], "--fuse-norm"),
    "MX chain": (["--shape", "128x1024x512", "--dtype", "mxfp4", "--keep-ratio", "0.5", "--target", "trn3"],
                 "MX SVD chain"),
    "tensor parallelism": ([*_MLP, "--hidden", "1024", "--target", "trn3", "--tp", "2"], "not sharded by --tp"),
    "A stored transposed": (["--shape", "128x512x1024", "--dtype", "mxfp8", "--a-layout", "km", "--target", "trn3"],
                            "--a-layout km"),
}


@pytest.mark.parametrize("case", list(REFUSALS))
def test_mx_refusals_are_one_line(case: str, tmp_path) -> None:
    args, words = REFUSALS[case]
    out = tmp_path / "k.py"
    result = CliRunner().invoke(nmmc, ["emit", *args, "-o", str(out)])
    assert result.exit_code == 2, result.output
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("nmmc: error: ") and words in lines[0], result.output
    assert not out.exists()


def test_an_mx_workload_is_compared_with_its_bf16_twin_and_nki_library_mx_row() -> None:
    from neuronmm_compiler.lowerings.nkilib_mlp import nkilib_baseline
    from neuronmm_compiler.model_tuning.entries import dense_counterpart

    mlp = mlp_workload(1, 1024, 2048, dense=True, mx=MxWeights("mxfp4"))
    assert dense_counterpart(mlp) == mlp_workload(1, 1024, 2048, dense=True)
    gemm = gemm_workload(77, 512, 1024, mx=MxWeights("mxfp8_e4m3"))
    assert dense_counterpart(gemm) == gemm_workload(77, 512, 1024)
    row = nkilib_baseline(mlp, get_target("trn3:lnc=2:launch=in-graph"))
    assert row.cost is not None and "mlp_tkg_mx.py" in row.details["mx"] and "QuantizationType.MX" in row.label


def test_explain_prints_the_mx_pass_and_instructions() -> None:
    args = ["--mlp", "--tokens", "1", "--hidden", "512", "--intermediate", "1024", "--dense", "--dtype", "mxfp4",
            "--target", "trn3"]
    result = CliRunner().invoke(nmmc, ["explain", *args])
    assert result.exit_code == 0, result.output
    assert "== after pass quantize-mx (changed)" in result.output
    assert "nisa.quantize_mx(" in result.output and "nisa.nc_matmul_mx(" in result.output


# ----------------------------------------------------------------------------- scales hoisted before the K blocks
# A decode MLP whose contractions all stream in K blocks of one tile (gate/up over hidden 1024, down over intermediate
# 1024: 2 K tiles of 512 positions each), on a logical core of 2 (lnc_split=gather: each program its column block)
_BLOCKED = {"k_tiles_per_block": "1", "row_k_tiles": "1", "lnc_split": "gather"}
_HOIST_SHAPE = ("mlp", "mxfp4", 1, 1024, 1024)


def _hoisting(form: str, **params: str):
    return _compiled(*_HOIST_SHAPE, target="trn3:lnc=2", **_BLOCKED, mx_scales=form, **params)


def _scale_loads(compiled) -> dict[str, int]:
    """Executions of each DMA reading an MX scale argument, per program (loops evaluated in closed form)."""
    from neuronmm_compiler.kernel_ir.program import DmaCopy, instruction_counts

    loads: dict[str, int] = {}
    for stmt, _, mult in instruction_counts(compiled.programs[0].body):
        if isinstance(stmt, DmaCopy) and stmt.src.buffer.name.endswith("_scale"):
            loads[stmt.src.buffer.name] = loads.get(stmt.src.buffer.name, 0) + mult
    return loads


def test_hoisted_scales_load_once_per_column_block_and_verify() -> None:
    """mx_scales=hoisted: each weight's scales of both K tiles in one buffer [128, 2, columns], loaded before the
    K-block loop by one DMA per quadrant (4 per weight and column block, instead of 4 per K block), and read at the
    global K tile; the kernel verifies, and the cost model counts what the interpreter runs (the bigger buffer too)."""
    block, hoisted = _hoisting("block"), _hoisting("hoisted")
    weights = ("w_gate_scale", "w_up_scale", "w_down_scale")
    assert _scale_loads(block) == dict.fromkeys(weights, 4 * 2)  # 4 quadrants x 2 K blocks, one column block
    assert _scale_loads(hoisted) == dict.fromkeys(weights, 4)
    source = hoisted.kernel.source
    for w in ("w_gate", "w_up"):
        assert f"{w}_scales_hoisted = nl.ndarray((P, 2, H_BLOCK), dtype=nl.uint8" in source
        assert f"stationary_scale={w}_scales_hoisted[0:P, k_blk, " in source  # K block k_blk of 1 tile: tile k_blk
    assert "_block_scale" not in source
    report = verify_source(source, rules=True)
    assert report.ok, report.error
    cost, counters = hoisted.cost, report.counters
    assert cost.dma_transfers == counters["dma_transfers"] == block.cost.dma_transfers - 2 * 3 * 4  # 2 programs
    assert cost.sbuf_bytes_per_partition == counters["sbuf_peak_bytes"] > block.cost.sbuf_bytes_per_partition
    # every scale byte still crosses from HBM once
    assert cost.hbm_bytes_read_by_tensor == block.cost.hbm_bytes_read_by_tensor
    assert cost.latency_us < block.cost.latency_us


def test_a_hoisted_scale_read_at_the_local_k_tile_fails_verification() -> None:
    """The mutation the global index guards against: gate's hoisted scales read at the K tile within its block (0
    for every block), so the second K block is dequantized with the first one's scales."""
    source = _hoisting("hoisted").kernel.source
    old = "stationary_scale=w_gate_scales_hoisted[0:P, k_blk, "
    assert source.count(old) == 1
    report = verify_source(source.replace(old, "stationary_scale=w_gate_scales_hoisted[0:P, 0, "), rules=True)
    assert not report.ok and report.rel_error is not None and report.rel_error > 1e-2, report.error


def test_k_blocked_weights_loaded_tile_by_tile_load_their_scales() -> None:
    """weight_dma=tile over K blocks of several feature tiles loads the block's scales too (one DMA per quadrant and
    K block): before, such a kernel read scale tiles it never allocated."""
    compiled = _hoisting("block", weight_dma="tile", weight_block_kib="2")
    assert "for wt in range(" in compiled.kernel.source
    assert _scale_loads(compiled)["w_gate_scale"] == 4 * 2  # per K block, for the column block's 4 feature tiles
    report = verify_source(compiled.kernel.source, rules=True)
    assert report.ok, report.error


def test_the_search_costs_hoisted_scales_beside_mx_schedules_only() -> None:
    """hoisted is a form of every MX schedule that blocks a contraction (a variant and, in the last descent, beside
    each late form), never of a bf16 one; a bf16 --param mx_scales=hoisted is refused in one line."""
    from neuronmm_compiler.errors import ScheduleError
    from neuronmm_compiler.lowerings.fused import FusedLowering, hoisted_forms
    from neuronmm_compiler.schedule.fused import FusedSchedule

    target = get_target("trn3:lnc=2")
    blocked = FusedSchedule(k_tiles_per_block=2, weight_dma="row")
    assert hoisted_forms(blocked) == [FusedSchedule(k_tiles_per_block=2, weight_dma="row", mx_scales="hoisted")]
    assert hoisted_forms(FusedSchedule()) == [] and hoisted_forms(hoisted_forms(blocked)[0]) == []
    mx_eval = FusedLowering().search_setup(mlp_workload(1, 1024, 1024, dense=True, mx=MxWeights("mxfp4")), target,
                                           200)[1]
    forms = mx_eval.variants(blocked)
    assert {(f.weight_dma, f.mx_scales) for f in forms} == {("block", "block"), ("row", "hoisted"),
                                                             ("block", "hoisted")}
    assert any(f.mx_scales == "hoisted" and f.row_k_tiles for f in mx_eval.late_variants(blocked))
    bf16_eval = FusedLowering().search_setup(mlp_workload(1, 1024, 1024, dense=True), target, 200)[1]
    assert all(f.mx_scales == "block" for f in [*bf16_eval.variants(blocked), *bf16_eval.late_variants(blocked)])
    with pytest.raises(ScheduleError, match="only MX weights"):
        compile_workload(mlp_workload(1, 1024, 1024, dense=True), target=target, params={"mx_scales": "hoisted"})

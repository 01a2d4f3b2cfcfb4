"""Emit GEMM kernels and run them in the interpreter against a float64 reference."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from conftest import compile_and_verify
from helpers import compile_gemm
from neuronmm_compiler.cli.views import verify_lines
from neuronmm_compiler.codegen import read_metadata
from neuronmm_compiler.errors import ScheduleError
from neuronmm_compiler.schedule import PRESETS
from neuronmm_compiler.schedule.gemm import LOOP_ORDERS
from neuronmm_compiler.verification import random_inputs

GRID = [(1, 512, 128), (200, 700, 300), (1024, 2048, 1024), (1, 4096, 4096)]


@pytest.mark.parametrize("shape", GRID, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("preset", list(PRESETS))
@pytest.mark.parametrize("dialect", ["nki"])  # neuronxcc (trn1's default): test_cost_model.py verifies the same
@pytest.mark.parametrize("layout", ["mk", "km"])  # kernels (test_model_counts_equal_interpreter_for_presets)
def test_presets_verify_bf16(shape, preset, dialect, layout):
    _, report = compile_and_verify(*shape, schedule=preset, dialect=dialect, a_layout=layout)
    assert report.rel_error < 1e-2


@pytest.mark.parametrize("shape", [(1, 512, 128), (200, 700, 300), (384, 1024, 256)], ids=str)
@pytest.mark.parametrize("preset", list(PRESETS))
@pytest.mark.parametrize("dialect", ["nki", "neuronxcc"])
def test_presets_verify_fp32(shape, preset, dialect):
    _, report = compile_and_verify(*shape, schedule=preset, dialect=dialect, dtype="fp32")
    assert report.rel_error < 1e-5


@pytest.mark.parametrize(("order", "accumulate", "dma", "a_transpose"),
                         list(itertools.product(LOOP_ORDERS, ("psum", "sbuf"), ("tile", "row"), ("dma", "pe"))))
def test_schedule_space_verifies_on_ragged_shape(order, accumulate, dma, a_transpose):
    params = {"tiles_in_block_m": 2, "tiles_in_block_n": 2, "tiles_in_block_k": 2, "loop_order": order,
              "accumulate": accumulate, "dma": dma, "a_transpose": a_transpose}
    for dialect, target in (("nki", "trn2"), ("neuronxcc", "trn1")):  # nisa.dma_transpose is trn2+
        compile_and_verify(130, 600, 300, schedule="aws-tiled", params=params, dialect=dialect, target=target)


@pytest.mark.parametrize(("target", "dtype", "rule"), [("trn1", "bf16", "NKI-DMA-TRANSPOSE-TARGET"),
                                                       ("trn2", "fp32", "NKI-DMA-TRANSPOSE-DTYPE")])
def test_dma_transpose_only_where_documented(target, dtype, rule):
    """Issue 12 finding 3: nisa.dma_transpose is documented on trn2+ for 2-byte dtypes. Elsewhere a preset makes
    A^T on the TensorEngine, an explicit a_transpose=dma is an error naming the rule, and the neuronxcc dialect
    keeps its documented nl.load_transpose2d."""
    compiled, report = compile_and_verify(256, 512, 384, schedule="aws-tiled", dialect="nki", target=target,
                                          dtype=dtype)
    assert compiled.schedule.a_transpose == "pe" and "dma_transpose" not in compiled.kernel.source
    assert report.counters["dma_transposes"] == 0 and report.counters["transposes"] > 0
    with pytest.raises(ScheduleError, match=rule):
        compile_gemm(256, 512, 384, schedule="aws-tiled", dialect="nki", target=target, dtype=dtype,
                     params={"a_transpose": "dma"})
    legacy, _ = compile_and_verify(256, 512, 384, schedule="aws-tiled", dialect="neuronxcc", target=target,
                                   dtype=dtype, params={"a_transpose": "dma"})
    assert "nl.load_transpose2d" in legacy.kernel.source
    documented, _ = compile_and_verify(256, 512, 384, schedule="aws-tiled", dialect="nki", target="trn2")
    assert "nisa.dma_transpose" in documented.kernel.source


def test_pe_transpose_is_counted():
    _, report = compile_and_verify(256, 512, 384, schedule="aws-block-free", params={"a_transpose": "pe"})
    assert report.counters["transposes"] == 2 * 3  # every A tile once: 2 m tiles x 3 k tiles
    assert report.counters["dma_transposes"] == 0


def _bytes(report, direction, tensor):
    return report.counters[f"hbm_bytes_{direction}"].get(tensor, 0)


@pytest.mark.parametrize("shape", [(512, 1024, 512), (200, 700, 300), (1, 4096, 2048), (640, 1536, 1280)],
                         ids=str)
@pytest.mark.parametrize("layout", ["mk", "km"])
def test_hbm_bytes_equal_hand_counts(shape, layout):
    """HBM traffic per tensor, counted by the interpreter, against the tutorial's reuse pattern."""
    m, n, k = shape
    s = 2  # bf16
    a = "a" if layout == "mk" else "a_t"
    tiles_m, tiles_n, tiles_k = math.ceil(m / min(128, m)), math.ceil(n / min(512, n)), math.ceil(k / 128)
    expected = {
        # tiled: A^T tile and B tile reloaded for every matmul
        "aws-tiled": (m * k * s * tiles_n, k * n * s * tiles_m),
        # hoisted: A^T strip once per m tile, B strip once per (m, n) tile
        "aws-hoist-load": (m * k * s, k * n * s * tiles_m),
        # blocked free dims: A^T once, B once per block of 2 m tiles
        "aws-block-free": (m * k * s, k * n * s * math.ceil(tiles_m / 2)),
        # fully optimized: B once, A^T once per block of 2 n tiles
        "aws-fully-optimized": (m * k * s * math.ceil(tiles_n / 2), k * n * s),
    }
    for preset, (a_bytes, b_bytes) in expected.items():
        _, report = compile_and_verify(m, n, k, schedule=preset, a_layout=layout)
        assert _bytes(report, "read", a) == a_bytes, preset
        assert _bytes(report, "read", "b") == b_bytes, preset
        assert _bytes(report, "written", "c") == m * n * s, preset
        assert report.counters["matmul_instructions"] == tiles_m * tiles_n * tiles_k, preset


def test_fully_optimized_dma_counts():
    """One DMA per K-tile row of each block, and one packed store per output tile row."""
    m, n, k = 2048, 2048, 2048
    _, report = compile_and_verify(m, n, k, schedule="aws-fully-optimized", a_layout="km")
    blocks_m, blocks_n, tiles_k, tiles_m = m // 2048, n // 1024, k // 128, m // 128
    loads = blocks_n * tiles_k + blocks_n * blocks_m * tiles_k
    assert report.counters["dma_transfers"] == loads + blocks_n * tiles_m
    # a row of a B block is 1024 bf16 values per partition; of an A^T block, 2048
    hist = report.counters["dma_bytes_per_partition"]
    assert hist[str(1024 * 2)] == blocks_n * tiles_k + blocks_n * tiles_m
    assert hist[str(2048 * 2)] == blocks_n * blocks_m * tiles_k


def test_verify_reads_the_absolute_error_against_the_reference_scale():
    """verify prints the largest reference magnitude next to the largest absolute error, so a large absolute
    error on large values (an 8B MLP on standard-normal inputs) reads as what it is."""
    compiled, report = compile_and_verify(200, 700, 300, schedule="aws-tiled")
    inputs = random_inputs(read_metadata(compiled.kernel.source).inputs, 0)
    reference = np.asarray(inputs["a"], dtype=np.float64) @ np.asarray(inputs["b"], dtype=np.float64)
    assert report.max_abs_reference == pytest.approx(float(np.max(np.abs(reference))))
    assert 0 < report.max_abs_error < report.max_abs_reference
    line = next(text for text in verify_lines(report, "k.py", "interpreter") if "relative error" in text)
    assert f"reference values up to {report.max_abs_reference:.3e}" in line


def test_emitted_file_is_deterministic():
    first = compile_gemm(300, 700, 200, schedule="aws-block-free").kernel.source
    second = compile_gemm(300, 700, 200, schedule="aws-block-free").kernel.source
    assert first == second


def test_footprint_matches_interpreter_peak():
    compiled, report = compile_and_verify(1024, 2048, 2048, schedule="aws-fully-optimized")
    assert report.counters["sbuf_peak_bytes"] == compiled.footprints[0].sbuf_bytes_per_partition
    assert report.counters["psum_peak_banks"] == compiled.footprints[0].psum_banks


@settings(max_examples=60)  # the suite's time budget; scripts/verify_grid.py covers GEMM shapes at scale
@given(
    m=st.integers(1, 400), n=st.integers(1, 1300), k=st.integers(1, 700),
    preset=st.sampled_from(list(PRESETS)), dialect=st.sampled_from(["nki", "neuronxcc"]),
    layout=st.sampled_from(["mk", "km"]), dtype=st.sampled_from(["bf16", "fp32"]),
    a_transpose=st.sampled_from(["dma", "pe"]), seed=st.integers(0, 2**16), psum_buffers=st.sampled_from([0, 1, 2, 3]),
    operand_buffers=st.sampled_from([0, 2, 3]),
)
def test_property_emit_and_verify_any_shape(m, n, k, preset, dialect, layout, dtype, a_transpose, seed, psum_buffers,
                                            operand_buffers):
    target = "trn2" if dialect == "nki" else "trn1"
    if dialect == "nki" and dtype == "fp32" and layout == "mk" and a_transpose == "dma":
        with pytest.raises(ScheduleError, match="NKI-DMA-TRANSPOSE-DTYPE"):
            compile_gemm(m, n, k, schedule=preset, dialect=dialect, a_layout=layout, dtype=dtype, target=target,
                         params={"a_transpose": a_transpose})
        return
    compile_and_verify(m, n, k, schedule=preset, dialect=dialect, a_layout=layout, dtype=dtype, target=target,
                       params={"a_transpose": a_transpose, "psum_buffers": psum_buffers,
                               "operand_buffers": operand_buffers}, seed=seed)

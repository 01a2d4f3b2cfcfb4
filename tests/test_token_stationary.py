"""Values held transposed computed with the activations stationary (``stationary=tokens``,
lowerings/fused_stationary.py): the emitted kernels verify, the form is taken only where it applies, and the
search costs it in its last descent for decode-sized token counts."""

from __future__ import annotations

import re

import pytest

from helpers import compile_graph, tune_graph
from neuronmm_compiler.frontends.workloads import chain_workload, mlp_workload
from neuronmm_compiler.lowerings import lowering_for
from neuronmm_compiler.schedule.fused import ROW_K_TILES, FusedSchedule
from neuronmm_compiler.search.candidates import schedule_key
from neuronmm_compiler.targets import get_target, with_lnc
from neuronmm_compiler.verification import verify_source

TRN2 = get_target("trn2")
MARK = "each row transposed into the strip on the TensorEngine"


def _verified(workload, target=TRN2, dialect="nki", **params):
    compiled = compile_graph(workload, target=target, dialect=dialect, params=params)
    report = verify_source(compiled.kernel.source, filename=workload.describe())
    assert report.ok, f"{workload.describe()} {params}: {report.error}"
    return compiled, report


CASES = [  # workload, schedule parameters, groups held transposed that take the form
    (mlp_workload(96, 512, 1024, dense=True), {"k_tiles_per_block": 2, "weight_dma": "block"}, 1),
    (mlp_workload(96, 512, 1024, dense=True), {}, 1),
    (mlp_workload(37, 640, 1000, dense=True), {"k_tiles_per_block": 2, "out_tile": 256}, 1),  # ragged everything
    (mlp_workload(200, 512, 1536, dense=True), {"cache_weights": "all"}, 1),  # two token tiles, resident weights
    (mlp_workload(96, 512, 1024, keep_ratio=0.8), {"k_tiles_per_block": 2}, 4),  # x U, the gated V, h U_down
    (chain_workload(96, 1024, 512, rank=256), {"x_transpose": "pe"}, 1),
    (mlp_workload(16, 512, 1024, keep_ratio=0.8), {"column_tiles": 4}, 4),  # PE column tiles (tile_position)
]


@pytest.mark.parametrize(("workload", "params", "groups"), CASES, ids=[str(i) for i in range(len(CASES))])
def test_token_stationary_kernels_verify(workload, params, groups):
    """Every case verifies against float64; the groups held transposed say they use the form, and the kernel has
    fewer matmuls than the weights-stationary one (up to out_tile columns each instead of 128)."""
    compiled, report = _verified(workload, stationary="tokens", **params)
    _, base_report = _verified(workload, **params)
    assert compiled.kernel.source.count(MARK) == groups
    assert report.counters["matmul_instructions"] < base_report.counters["matmul_instructions"]
    assert report.counters["transposes"] > base_report.counters["transposes"]
    assert report.counters["total_hbm_bytes_read"] == base_report.counters["total_hbm_bytes_read"]



@pytest.mark.parametrize("params", [{"k_tiles_per_block": 2, "weight_dma": "block"}, {}], ids=["k-blocked", "whole"])
def test_the_forms_output_tiles_print_by_name(params):
    """The form's [tokens, out_tile] tiles are OUT_TILE wide in the kernel, as the row-major matmul's are, not 512."""
    compiled, _ = _verified(mlp_workload(96, 512, 1024, dense=True), stationary="tokens", **params)
    matmuls = [line for line in compiled.kernel.source.splitlines() if "stationary=x_strip" in line]
    assert len(matmuls) == 2 and all("0:OUT_TILE]" in line and "512" not in line for line in matmuls)


def test_the_legacy_dialect_and_a_logical_core_verify():
    _verified(mlp_workload(64, 384, 768, dense=True), target=get_target("trn1"), dialect="neuronxcc",
              stationary="tokens", k_tiles_per_block=1)
    compiled, _ = _verified(mlp_workload(96, 512, 1024, dense=True), target=with_lnc(TRN2, 2), stationary="tokens",
                            lnc_split="features")
    assert MARK in compiled.kernel.source


@pytest.mark.parametrize(("workload", "target", "params"), [
    (mlp_workload(8, 512, 1024, dense=True), with_lnc(TRN2, 2), {"lnc_split": "hidden"}),  # contraction divided
    (mlp_workload(8, 512, 1024, dense=True), with_lnc(TRN2, 2), {"lnc_split": "gather"}),  # features divided
    (mlp_workload(32, 512, 1024, dense=True), TRN2, {"mlp": "split"}),  # h^T streamed to HBM
], ids=["hidden", "gather", "split"])
def test_groups_the_form_does_not_apply_to_keep_the_weights_stationary(workload, target, params):
    """Where a group's features or contraction are divided between programs, or its value streams to HBM, the
    kernel is the weights-stationary one, byte for byte but for the schedule line."""
    tokens = compile_graph(workload, target=target, params={**params, "stationary": "tokens"}).kernel.source
    weights = compile_graph(workload, target=target, params=params).kernel.source
    assert MARK not in tokens
    strip = re.compile(r".*(schedule|parameters|nmmc-metadata).*\n")
    assert strip.sub("", tokens) == strip.sub("", weights)


def test_decode_search_takes_the_form_where_the_model_says_it_is_faster():
    """Llama-3.2-3B's MLP at 96 tokens on one trn2 core: K-blocked token-stationary gate/up (1536-column weight
    blocks, one bank per 512 columns and term) beat the best weights-stationary schedule; the search finds it."""
    workload = mlp_workload(96, 3072, 8192, dense=True)
    tuned = tune_graph(workload, target=TRN2, trials=40)
    best = tuned.search.best
    assert best.schedule.stationary == "tokens" and best.schedule.k_tiles_per_block > 0
    weights = compile_graph(workload, target=TRN2, params={**best.schedule.as_dict(), "stationary": "weights"})
    assert best.latency_us < weights.cost.latency_us


def test_ties_rank_the_quiet_default_first():
    """A variant that changes nothing costs the same as its schedule; the tie-break keeps the schedule without it
    (and compares names, never an int with a string)."""
    plain, variant = FusedSchedule(), FusedSchedule(stationary="tokens")
    assert schedule_key(plain) < schedule_key(variant)
    assert schedule_key(FusedSchedule(column_tiles=2)) < schedule_key(variant)


def test_the_form_is_costed_in_the_last_descent_only():
    """A late variant: a plain evaluation costs the schedule (and its block variant) only; with ``late`` set it also
    costs the activations-stationary forms and the row-major matmul's own K blocks (``row_k_tiles``), and returns the
    fastest."""
    workload = mlp_workload(96, 3072, 8192, dense=True)
    _, evaluate = lowering_for(workload).search_setup(workload, TRN2, 1000)
    point = FusedSchedule(tokens_per_block=96, token_tile=96, weight_block_kib=32, k_tiles_per_block=8)
    plain = evaluate(point)
    assert plain.schedule.stationary == "weights" and len(evaluate.memo) == 2  # row and block
    evaluate.late = True
    late = evaluate(point)
    assert late.schedule.stationary == "tokens" and late.latency_us < plain.latency_us
    assert len(evaluate.memo) == 2 * 2 * (1 + len(ROW_K_TILES))  # row and block, each in both orientations


def test_the_last_descent_also_moves_the_structural_parameters_of_a_refined_optimum():
    """A refined optimum (a 48 KiB block lies only in the merged lists) is off the coarse lists, so the late coarse
    descent cannot leave it; the descent over the structural parameters that follows can: Llama-3.2-3B's SVD MLP at
    128 tokens on LNC=2 ended at lnc_split=hidden (207.5 us) where intermediate costs 201.5."""
    from neuronmm_compiler.search.tuner import _late
    from neuronmm_compiler.targets import IN_GRAPH, with_launch

    workload = mlp_workload(128, 3072, 8192, keep_ratio=0.8)
    target = with_launch(with_lnc(TRN2, 2), IN_GRAPH)
    spec, evaluate = lowering_for(workload).search_setup(workload, target, 150, exchange=True)
    refined = FusedSchedule(tokens_per_block=128, token_tile=128, weight_block_kib=48, out_tile=256, x_transpose="pe",
                            lnc_split="hidden")  # its one-DMA block variant is what the evaluator returns
    final = evaluate(refined)
    assert spec.space.point_of(refined) is None and spec.space.point_of(refined, fine=True)
    best = _late(evaluate, spec, final)
    assert best.schedule.lnc_split == "intermediate" and best.latency_us < final.latency_us - 5

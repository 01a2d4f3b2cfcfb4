"""Passes decide, lowerings obey: the group-epilogues pass, the legality rules shared by fuse and the
fused lowering, the lowering's refusal of graphs without the passes' annotations, and hardware limits
taken from the Target rather than from constants in the lowerings."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from neuronmm_compiler.errors import IRError, ScheduleError
from neuronmm_compiler.frontends.graph_file import load_graph_spec
from neuronmm_compiler.frontends.shapes import mlp_graph
from neuronmm_compiler.ir import parse_text, to_text
from neuronmm_compiler.kernel_ir.program import Alloc, DmaCopy, walk
from neuronmm_compiler.lowerings.fused import FusedLowering
from neuronmm_compiler.lowerings.fused_groups import read_groups
from neuronmm_compiler.lowerings.lower_elementwise import lower_elementwise
from neuronmm_compiler.lowerings.lower_fused import lower_fused_kernel
from neuronmm_compiler.lowerings.lower_gemm import lower_gemm
from neuronmm_compiler.passes import GroupEpilogues, run_pipeline, split_kernels
from neuronmm_compiler.passes.legality import RULES, check_kernel, join_conflict, kernel_conflicts
from neuronmm_compiler.schedule import GemmProblem, preset
from neuronmm_compiler.schedule.fused import FusedSchedule
from neuronmm_compiler.targets import KIB, get_target
from test_fusion_passes import (
    SVD_CHAIN,
    SVD_MLP,
    SVD_MLP_SPLIT,
    SVD_MLP_SPLIT_GROUPED,
    SVD_MLP_WHOLE,
    SVD_MLP_WHOLE_GROUPED,
    check_pass,
    split_pipeline,
    strip,
)

TRN1 = get_target("trn1")
LORA = Path(__file__).resolve().parents[1] / "examples" / "graphs" / "lora.yaml"

SVD_CHAIN_GROUPED = """\
graph svd_chain {
  %x = input "x" [4, 16] float32 layout=row_major
  %u = input "u" [16, 2] float32 layout=row_major
  %v = input "v" [2, 8] float32 layout=row_major
  %xu = matmul %x, %u : [4, 2] float32 {acc=xu, group=xu, kernel=k0, orient=transposed, place=sbuf}
  %xuv = matmul %xu, %v : [4, 8] float32 {acc=xuv, group=xuv, kernel=k0, orient=normal, place=hbm}
  %y = output "y" %xuv
}
"""
# y = x W + (x A) B: both products are summed into merged's PSUM accumulator; x A is its own group.
LORA_GROUPED = """\
graph lora {
  %x = input "x" [4, 2048] bfloat16 layout=row_major
  %w = input "w" [2048, 2048] bfloat16 layout=row_major
  %lora_a = input "lora_a" [2048, 16] bfloat16 layout=row_major
  %lora_b = input "lora_b" [16, 2048] bfloat16 layout=row_major
  %base = matmul %x, %w : [4, 2048] bfloat16 {acc=merged, group=merged, kernel=k0, orient=normal, place=sbuf}
  %xa = matmul %x, %lora_a : [4, 16] bfloat16 {acc=xa, group=xa, kernel=k0, orient=transposed, place=sbuf}
  %delta = matmul %xa, %lora_b : [4, 2048] bfloat16 {acc=merged, group=merged, kernel=k0, orient=normal, \
place=sbuf}
  %merged = elementwise add %base, %delta : [4, 2048] bfloat16 {acc=merged, group=merged, kernel=k0, \
orient=normal, place=hbm}
  %y = output "y" %merged
}
"""
# silu(x W) * b on a row-major output: x W is absorbed as an accumulator, the product's tree is
# silu then multiply, and b (a kernel input) is read tile by tile.
EPILOGUE = """\
graph g {
  %x = input "x" [4, 8] float32 layout=row_major
  %w = input "w" [8, 8] float32 layout=row_major
  %b = input "b" [4, 8] float32 layout=row_major
  %xw = matmul %x, %w : [4, 8] float32 {kernel=k0, orient=normal, place=sbuf}
  %s = elementwise silu %xw : [4, 8] float32 {kernel=k0, orient=normal, place=sbuf}
  %m = elementwise multiply %s, %b : [4, 8] float32 {kernel=k0, orient=normal, place=hbm}
  %y = output "y" %m
}
"""


# ----------------------------------------------------------------------------- the pass


def test_group_epilogues_on_the_mlp():
    check_pass(GroupEpilogues(), SVD_MLP_WHOLE, SVD_MLP_WHOLE_GROUPED)
    # split: h goes to HBM, the down projection's groups are in k1
    check_pass(GroupEpilogues(), SVD_MLP_SPLIT, SVD_MLP_SPLIT_GROUPED)


def test_group_epilogues_on_a_chain():
    assert to_text(run_pipeline(parse_text(SVD_CHAIN), split_pipeline("whole")).graph) == SVD_CHAIN_GROUPED


def test_group_epilogues_on_the_lora_example():
    graph = load_graph_spec(LORA).graph({"tokens": 4})
    assert to_text(run_pipeline(graph, split_pipeline("whole")).graph) == LORA_GROUPED


def test_group_epilogues_absorbs_a_tree_and_reads_inputs_from_outside():
    expected = (EPILOGUE.replace("{kernel=k0, orient=normal, place=sbuf}\n  %s", "{acc=xw, kernel=k0, orient=normal, "
                                 "place=sbuf}\n  %s")
                .replace("{kernel=k0", "{group=m, kernel=k0").replace("{acc=xw, kernel", "{acc=xw, group=m, kernel"))
    check_pass(GroupEpilogues(), EPILOGUE, expected)
    [group] = read_groups(parse_text(expected), "g")
    assert [t.node.id for t in group.terms] == ["xw"] and [n.id for n in group.tree] == ["s", "m"]
    assert [n.id for n in group.operands] == ["b"]


def test_group_epilogues_replaces_stale_groups():
    graph = parse_text(SVD_MLP_WHOLE_GROUPED)
    graph.annotate("act", acc="act", group="act")
    graph.annotate("gate", group="gate")
    assert GroupEpilogues().apply(graph) is True
    assert to_text(graph) == SVD_MLP_WHOLE_GROUPED


def test_group_epilogues_needs_kernels_and_orientations():
    with pytest.raises(IRError, match=r"run implicit-transpose and fuse first\); missing on %xu \(kernel\), "
                                      r"%xu \(orient\)"):
        GroupEpilogues().apply(parse_text(SVD_CHAIN))


def test_groups_survive_the_text_form_and_split_kernels():
    # calibration and verification re-lower from the metadata graph text: the groups are in it
    fused = run_pipeline(parse_text(SVD_MLP), split_pipeline("split")).graph
    again = parse_text(to_text(fused))
    assert again == fused
    k0, k1 = split_kernels(again)
    assert [g.root.id for g in read_groups(k0, "k0")] == ["x_ug", "x_uu", "h"]
    assert [g.root.id for g in read_groups(k1, "k1")] == ["h_ud", "down"]


# ----------------------------------------------------------------------------- legality: one set of rules


def test_fuse_and_the_lowering_share_the_rules():
    text = """\
graph g {
  %x = input "x" [8, 8] float32 layout=row_major
  %a = input "a" [8, 8] float32 layout=row_major
  %ab = matmul %a, %a : [8, 8] float32 {kernel=k0, orient=normal, place=sbuf}
  %y0 = matmul %x, %ab : [8, 8] float32 {kernel=k0, orient=normal, place=hbm}
  %y = output "y" %y0
}
"""
    graph = parse_text(text)
    # fuse would not let y0 join ab's kernel ...
    conflict = join_conflict(graph, "y0", 0, {"ab": 0}, {0: 8})
    assert conflict is not None and conflict.rule == "computed weight"
    # ... and the lowering refuses a kernel holding both, for the same reason
    assert [(c.node, c.operand, c.rule) for c in kernel_conflicts(graph)] == [("y0", "ab", "computed weight")]
    with pytest.raises(ScheduleError, match=r"kernel g cannot hold %y0 \(reading %ab\): it multiplies by a weight "
                                            r".* \(run the fuse pass to split kernels\)"):
        check_kernel(graph, "g")
    assert set(RULES) >= {c.rule for c in kernel_conflicts(graph)}


def test_the_lowering_refuses_what_legality_forbids():
    graph = parse_text(SVD_CHAIN_GROUPED.replace("orient=transposed", "orient=normal"))
    with pytest.raises(ScheduleError, match=r"cannot hold %xuv \(reading %xu\): its left operand is held row-major"):
        lower_fused_kernel(graph, FusedSchedule(), TRN1)


# ----------------------------------------------------------------------------- the lowering obeys


@pytest.mark.parametrize(("key", "writer"), [("group", "group-epilogues"), ("acc", "group-epilogues"),
                                             ("place", "place"), ("orient", "implicit-transpose"),
                                             ("kernel", "fuse")])
def test_the_lowering_needs_every_annotation(key, writer):
    graph = parse_text(SVD_CHAIN_GROUPED)
    graph.clear_annotations("xuv", key)
    with pytest.raises(IRError, match=rf"kernel svd_chain_kernel: %xuv has no {key} annotation; .* whose {writer} "
                                      "pass writes it"):
        lower_fused_kernel(graph, FusedSchedule(), TRN1)


def test_the_lowering_reads_the_groups_and_places_it_is_given():
    graph = parse_text(SVD_MLP_WHOLE_GROUPED)
    # a group that does not describe one: gate claims to be summed into act's accumulator
    graph.annotate("gate", acc="act")
    with pytest.raises(IRError, match=r"%gate .* is summed into an accumulator its reader is not; rerun group-"):
        lower_fused_kernel(graph, FusedSchedule(), TRN1)
    # place=sbuf on a value the kernel stores
    graph = parse_text(SVD_MLP_WHOLE_GROUPED.replace("orient=normal, place=hbm", "orient=normal, place=sbuf"))
    with pytest.raises(IRError, match=r"%down is annotated place=sbuf but has outputs in the kernel graph"):
        lower_fused_kernel(graph, FusedSchedule(), TRN1)


def test_stripped_annotations_fail_and_the_pipeline_output_lowers():
    with pytest.raises(IRError, match=r"has no group annotation"):
        lower_fused_kernel(parse_text(strip(SVD_MLP_WHOLE_GROUPED, "group", "acc")), FusedSchedule(), TRN1)
    assert lower_fused_kernel(parse_text(SVD_MLP_WHOLE_GROUPED), FusedSchedule(), TRN1).name == "svd_mlp_kernel"


# ----------------------------------------------------------------------------- target in, constants out


def _allocs(program) -> dict[str, tuple[int, ...]]:
    return {stmt.buffer.name: stmt.buffer.shape for stmt, _ in walk(program.body) if isinstance(stmt, Alloc)}


def test_fused_lowering_takes_psum_banks_and_partitions_from_the_target():
    fused = FusedLowering()
    graph = run_pipeline(mlp_graph(128, 512, 1024, (512, 512, 512)), fused.pipeline(FusedSchedule())).graph
    [kernel] = fused.kernels(graph)
    blocked = FusedSchedule(k_tiles_per_block=2)  # gate and up accumulate across K blocks: a bank per tile
    stock = _allocs(lower_fused_kernel(kernel, blocked, TRN1))
    assert stock["gate_psum"] == (128, 3, 512)  # (8 banks - 2 reserved) // 2 terms = 3 feature tiles
    four_banks = dataclasses.replace(TRN1, psum_banks=4, psum_bytes_per_partition=8 * KIB)
    # 4 banks leave one per term, fewer than the 4 feature tiles of 128 tokens one bank holds side by side: packed
    assert _allocs(lower_fused_kernel(kernel, blocked, four_banks))["gate_psum"] == (128, 4, 128)
    wide_banks = dataclasses.replace(TRN1, psum_bytes_per_partition=32 * KIB)  # 8 banks of 4 KiB
    # a 4 KiB bank holds 8 feature tiles of 128 tokens side by side, more than the 3 banks a term may hold: packed
    assert _allocs(lower_fused_kernel(kernel, blocked, wide_banks))["gate_psum"] == (128, 8, 128)
    half = dataclasses.replace(TRN1, pmax=64, gemm_stationary_fmax=64)
    assert stock["x_strip"] == (128, 4, 128)
    assert _allocs(lower_fused_kernel(kernel, FusedSchedule(), half))["x_strip"] == (64, 8, 128)


def test_gemm_and_elementwise_lowerings_take_limits_from_the_target():
    problem = GemmProblem(1024, 2048, 1024)
    schedule = preset("aws-block-free", problem).with_params({"tiles_in_block_k": 2, "accumulate": "psum"})
    wide_banks = dataclasses.replace(TRN1, psum_bytes_per_partition=32 * KIB)
    assert _allocs(lower_gemm(problem, schedule, TRN1))["acc_psum"][-1] == 512
    assert _allocs(lower_gemm(problem, schedule, wide_banks))["acc_psum"][-1] == 1024
    stock = lower_elementwise("silu", (300, 5000), "bfloat16", TRN1)
    assert _allocs(stock)["a_tile"] == (128, 2048)  # a 4 KiB bf16 row: the DMA efficiency plateau
    flat = dataclasses.replace(TRN1, pmax=64, dma_efficiency_curve=((1 * KIB, 0.5), (2 * KIB, 0.96)))
    assert _allocs(lower_elementwise("silu", (300, 5000), "bfloat16", flat))["a_tile"] == (64, 1024)
    assert sum(isinstance(s, DmaCopy) for s, _ in walk(stock.body)) == 2

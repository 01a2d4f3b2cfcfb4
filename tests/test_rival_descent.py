"""The polish keeps rivals of the winner's logical-core split (search/tuner.py ``_rivals``): the best start of each
other split, held within its structural class."""

from __future__ import annotations

import pytest

from neuronmm_compiler.frontends.workloads import mlp_workload
from neuronmm_compiler.lowerings import lowering_for
from neuronmm_compiler.schedule.fused import FusedSchedule
from neuronmm_compiler.schedule.params import CLASS, ORDINAL, categorical
from neuronmm_compiler.search import tuner
from neuronmm_compiler.targets import IN_GRAPH, get_target, with_launch, with_lnc


@pytest.fixture(scope="module")
def llama_8b_decode():
    """Llama-3.1-8B's SVD MLP at keep 0.9, 1 token, on a trn2 logical core in a graph: the search's evaluator and a
    start of the `hidden` split, as the sampled trials give it."""
    workload = mlp_workload(1, 4096, 14336, keep_ratio=0.9)
    target = with_launch(with_lnc(get_target("trn2"), 2), IN_GRAPH)
    spec, evaluate = lowering_for(workload).search_setup(workload, target, 150, exchange=True)
    start = evaluate(FusedSchedule(tokens_per_block=32, token_tile=128, weight_block_kib=64, k_tiles_per_block=0,
                                   out_tile=512, weight_dma="row", x_transpose="pe", lnc_split="hidden"))
    return spec, evaluate, start


def test_a_split_the_free_descent_left_is_polished_within_its_class(llama_8b_decode):
    """From the `hidden` start the free descent crosses to `gather` (454.6 us); held in its class, the start reaches
    192 KiB blocks of 2 K tiles on 2 PE column tiles, 448.1 us, which needs several parameters to move together."""
    spec, evaluate, start = llama_8b_decode
    free = tuner._refine(evaluate, spec, tuner._polish(evaluate, spec, start))
    assert free.schedule.lnc_split == "gather"
    [rival] = tuner._rivals(evaluate, spec, [start], [free])
    assert rival.schedule.lnc_split == "hidden" and rival.latency_us < free.latency_us - 5
    assert (rival.schedule.weight_block_kib, rival.schedule.k_tiles_per_block, rival.schedule.column_tiles) == \
        (192, 2, 2)


def test_no_rival_where_the_descents_reached_the_class_or_the_split_is_the_winners(llama_8b_decode):
    spec, evaluate, start = llama_8b_decode
    assert tuner._rivals(evaluate, spec, [start], [start]) == []  # a descent ended in the start's class
    same = evaluate(FusedSchedule(tokens_per_block=32, token_tile=128, weight_block_kib=64, k_tiles_per_block=0,
                                  out_tile=512, weight_dma="row", x_transpose="dma", lnc_split="hidden"))
    assert tuner._rivals(evaluate, spec, [same], [start]) == []  # another class, the winner's split


def test_each_other_split_gets_one_rival_descent(llama_8b_decode, monkeypatch):
    """Two starts of the `hidden` split and one of `intermediate` against a `gather` winner: one descent per split,
    from the best-ranked start of each; ``RIVAL_DESCENTS`` caps them."""
    spec, evaluate, start = llama_8b_decode
    free = tuner._refine(evaluate, spec, tuner._polish(evaluate, spec, start))
    other = evaluate(FusedSchedule(tokens_per_block=32, token_tile=128, weight_block_kib=64, k_tiles_per_block=0,
                                   out_tile=512, weight_dma="row", x_transpose="dma", lnc_split="hidden"))
    inter = evaluate(FusedSchedule(tokens_per_block=32, token_tile=128, weight_block_kib=64, k_tiles_per_block=0,
                                   out_tile=512, weight_dma="row", x_transpose="pe", lnc_split="intermediate"))
    rivals = tuner._rivals(evaluate, spec, [start, other, inter], [free])
    assert [r.schedule.lnc_split for r in rivals] == ["hidden", "intermediate"]
    monkeypatch.setattr(tuner, "RIVAL_DESCENTS", 1)
    assert [r.schedule.lnc_split for r in tuner._rivals(evaluate, spec, [start, other, inter], [free])] == ["hidden"]


def test_only_a_structural_class_parameter_keeps_a_rival():
    assert categorical("s", ("a", "b"), ("a", "b"), "", role=CLASS, rival=True).rival
    with pytest.raises(ValueError, match="only a structural class parameter"):
        categorical("s", ("a", "b"), ("a", "b"), "", role=ORDINAL, rival=True)

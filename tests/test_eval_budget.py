"""The measured rank choice's budget held on the eval files: bisection along the accepted steps
(compression/eval_budget.py)."""

from __future__ import annotations

import pytest

from neuronmm_compiler.compression.eval_budget import check_lines, hold_budget_on_eval, prefix_choice, worst_increase
from neuronmm_compiler.compression.measured_choice import MeasuredChoice


def _choice(accepted: list[tuple[int, int]], layers: int = 6) -> MeasuredChoice:
    steps, choice = [], [None] * layers
    for i, (layer, rank) in enumerate(accepted):
        steps.append({"layer": layer, "rank": rank, "kept": 1.0 - 0.1 * (i + 1), "ppl_increase": 0.01,
                      "accepted": True})
        steps.append({"layer": (layer + 1) % layers, "rank": 16, "kept": 0.5, "ppl_increase": 0.9,
                      "accepted": False})
        choice[layer] = rank
    return MeasuredChoice(choice, 0.05, 10.0, [0.0] * layers, steps)


def _quality(choice, per_step: float, extra_file: float = 0.0) -> dict:
    count = sum(r is not None for r in choice) + sum(r == 32 for r in choice)  # a layer at rank 32 counts twice
    overall = per_step * count
    return {"perplexity_increase": overall,
            "per_file": [{"perplexity_increase": overall}, {"perplexity_increase": overall + extra_file}]}


def test_prefix_replays_the_accepted_steps_in_order():
    chosen = _choice([(2, 64), (4, 64), (2, 32)])
    assert prefix_choice(chosen, 0) == ([None] * 6, None)
    assert prefix_choice(chosen, 2) == ([None, None, 64, None, 64, None], None)
    assert prefix_choice(chosen, 3) == (chosen.choice, None)


@pytest.mark.parametrize("per_step, kept", [(0.01, 5), (0.03, 3), (0.06, 1), (0.2, 0)])
def test_backs_off_to_a_prefix_measured_within_budget_and_leaves_it_built(per_step, kept):
    chosen = _choice([(0, 64), (1, 64), (2, 64), (3, 64), (0, 32)])  # counts 1, 2, 3, 4, 6 after each step
    built = []

    def build(choice, formats):
        built.append(list(choice))
        return _quality(choice, per_step, extra_file=0.005)  # one file measures worse than the overall

    quality = hold_budget_on_eval(chosen, 0.1, build)
    assert worst_increase(quality) <= 0.1
    assert chosen.eval_check["kept_steps"] == kept and built[-1] == chosen.choice == prefix_choice(chosen, kept)[0]
    assert len(built) <= 5  # full choice, at most 3 bisection steps, one rebuild
    assert all(c["within"] == (c["worst_ppl_increase"] <= 0.1) for c in chosen.eval_check["checked"])
    lines = check_lines(chosen.eval_check)
    assert ("within budget" in lines[0]) == (kept == 5) and ("backed off" in lines[0]) == (kept < 5)
    assert chosen.to_dict()["eval_check"]["kept_steps"] == kept


def test_the_worst_file_decides_not_only_the_overall_figure():
    chosen = _choice([(0, 64), (1, 64)])
    quality = hold_budget_on_eval(chosen, 0.05, lambda c, f: _quality(c, 0.02, extra_file=0.02))
    # overall 0.04 at two steps is within 0.05, but one file measures 0.06: one step is kept
    assert chosen.eval_check["kept_steps"] == 1 and worst_increase(quality) == pytest.approx(0.04)


def test_format_choices_replay_their_formats():
    chosen = MeasuredChoice([None, 64], 0.05, 10.0, [0.0, 0.0], [
        {"layer": 0, "rank": None, "format": "float8_e4m3", "kept": 0.8, "ppl_increase": 0.0, "accepted": True},
        {"layer": 1, "rank": 64, "format": "bfloat16", "kept": 0.6, "ppl_increase": 0.0, "accepted": True},
        {"layer": 0, "rank": None, "format": "bfloat16", "kept": 0.6, "ppl_increase": 0.0, "accepted": True}],
        formats=["bfloat16", "bfloat16"])
    assert prefix_choice(chosen, 2) == ([None, 64], ["float8_e4m3", "bfloat16"])
    hold_budget_on_eval(chosen, 0.1, lambda c, f: {"perplexity_increase": 0.2 if f[0] == "bfloat16" and c[1] else 0})
    # the full choice (both layers bf16, layer 1 at rank 64) is over; the first two steps (layer 0 FP8) are within
    assert (chosen.choice, chosen.formats) == ([None, 64], ["float8_e4m3", "bfloat16"])

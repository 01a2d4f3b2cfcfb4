"""``--choose-ranks`` with ``--eval``: the accuracy budget held on the eval files, where the user measures it.

The measured choice (:mod:`.measured_choice`, :mod:`.format_choice`) spends half of ``--max-ppl-increase`` on
calibration tokens. Text of other domains loses more (on SmolLM2-135M two to three times more,
benchmarks/results/compression-runs.md),
so a choice within budget there measured +15.7% on the eval files for a +10% budget. With ``--eval`` (unless
``--no-eval-check``) nmmc therefore builds the chosen model as it will be written -- healed, FP8 where chosen --
measures it on every eval file, and when any file or all of them together measure over the budget, backs off along
the front: the model made of the first ``k`` accepted steps of the greedy, for a ``k`` found by bisection between
the last count measured within budget and the first measured over it. ``k = 0`` is the original dense model. Every
model kept is one that *measured* within the budget on every eval file (the greedy's increase need not be monotone on
other text, so the ``k`` found is within budget, not necessarily the largest such ``k``).

The eval files then decided the choice: their figures are no longer held-out estimates, and the output says so.
Cost: one build (healing included) and one evaluation per bisection step, ``ceil(log2(accepted steps + 1)) + 2``
at most.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .measured_choice import MeasuredChoice

__all__ = ["check_lines", "hold_budget_on_eval", "prefix_choice", "worst_increase"]


def prefix_choice(chosen: MeasuredChoice, count: int) -> tuple[list[int | None], list[str] | None]:
    """The per-layer ranks (and formats, for a format choice) after the first ``count`` accepted steps."""
    layers = len(chosen.choice)
    choice: list[int | None] = [None] * layers
    formats = None if chosen.formats is None else ["bfloat16"] * layers
    for step in [s for s in chosen.steps if s["accepted"]][:count]:
        choice[step["layer"]] = step["rank"]
        if formats is not None:
            formats[step["layer"]] = step["format"]
    return choice, formats


def worst_increase(quality: dict[str, Any]) -> float:
    """The largest perplexity increase of a quality record: over every eval file and all of them together."""
    return max([quality["perplexity_increase"]] + [q["perplexity_increase"] for q in quality.get("per_file", [])])


Build = Callable[[Sequence[int | None], Sequence[str] | None], dict[str, Any]]


def hold_budget_on_eval(chosen: MeasuredChoice, budget: float, build: Build) -> dict[str, Any]:
    """Build and measure the choice, backing off along its accepted steps until every eval file measures within
    ``budget``; ``build(choice, formats)`` writes that model and returns its quality record. Leaves the model kept
    as the last one built, updates ``chosen`` to it (its ``eval_check`` records every measurement) and returns its
    quality."""
    accepted = sum(s["accepted"] for s in chosen.steps)
    if prefix_choice(chosen, accepted) != (chosen.choice, chosen.formats):
        raise AssertionError("the accepted steps do not replay to the choice")  # an invariant of the greedy
    checked: list[dict[str, Any]] = []
    built: dict[int, dict[str, Any]] = {}

    def within(count: int) -> bool:
        quality = built[count] = build(*prefix_choice(chosen, count))
        worst = worst_increase(quality)
        steps = [s for s in chosen.steps if s["accepted"]]
        checked.append({"accepted_steps": count, "kept": steps[count - 1]["kept"] if count else 1.0,
                        "worst_ppl_increase": worst, "overall_ppl_increase": quality["perplexity_increase"],
                        "within": worst <= budget})
        return worst <= budget

    last = keep = accepted
    if not within(accepted):
        low, high = 0, accepted  # low: within (0 is the original model) or not yet measured; high: over budget
        while high - low > 1:
            last = (low + high) // 2
            low, high = (last, high) if within(last) else (low, last)
        keep = low
        if last != keep:  # the files on disk are a later trial's: write the kept model again
            within(keep)
    chosen.choice, chosen.formats = prefix_choice(chosen, keep)
    chosen.eval_check = {"budget_ppl_increase": budget, "rule": "every eval file and all of them together",
                         "accepted_steps": accepted, "kept_steps": keep, "checked": checked}
    return built[keep]


def check_lines(check: dict[str, Any]) -> list[str]:
    """What the terminal says of the eval check."""
    first = check["checked"][0]
    head = (f"  checked on the --eval files (budget +{check['budget_ppl_increase']:.1%} on every file and overall): "
            f"the choice of {check['accepted_steps']} accepted steps measured {first['worst_ppl_increase']:+.2%} "
            "at worst")
    if check["kept_steps"] == check["accepted_steps"]:
        return [head + ": within budget"]
    lines = [head + f": over budget, backed off along the front to the first {check['kept_steps']} steps"]
    lines += [f"    first {c['accepted_steps']:>2} steps: kept {c['kept']:.3f}, worst {c['worst_ppl_increase']:+.2%} "
              f"({'within' if c['within'] else 'over'})" for c in check["checked"][1:]]
    lines.append("  the --eval files decided the choice: their figures are not held-out estimates any more (evaluate "
                 "on other text for one, or pass --no-eval-check)")
    return lines

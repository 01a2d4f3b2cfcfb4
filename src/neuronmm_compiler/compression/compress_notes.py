"""What ``nmmc compress`` says about a request and its result (:mod:`.workflow` runs it): the plan said before the
work starts (:func:`planned_note`), the warnings after it, and the small rules behind them (a keep ratio of 1.0 keeps
every layer dense, calibration files share the token budget)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..checkpoints.config import projection_shape, read_config
from .compress import plan_ranks
from .formats import fp8_format

if TYPE_CHECKING:
    from .workflow import CompressRequest

__all__ = ["all_dense_warning", "keeps_everything", "planned_note", "ppl_fraction", "rise_advice", "share_budget"]


def all_dense_warning(request: CompressRequest, record: dict[str, Any]) -> str:
    """What a joint rank choice that kept every layer dense says: that the output is the original
    weights, and why (the SVD MLP predicted no faster than the dense one at the requested buckets)."""
    latency = record["latency"]
    where = (f"at token bucket{'s' if len(latency['buckets']) > 1 else ''} "
             f"{','.join(map(str, latency['buckets']))} on {latency['target']}")
    dense = record["dense"]["predicted_us"]
    if request.target_speedup is not None:
        why = (f"--target-speedup {request.target_speedup} allows the fused dense MLP's predicted latency "
               f"({dense:.1f} us {where}), and dense is exact")
    else:
        uniform = record["uniform"]
        why = (f"the SVD MLP is predicted slower than the fused dense MLP {where}: uniform ranks "
               f"{'/'.join(map(str, uniform['ranks']))} {uniform['predicted_us']:.1f} us vs dense {dense:.1f} us "
               "(summed over layers and buckets), so dense, which is exact, is the most accurate choice within "
               "that latency")
    return (f"--choose-ranks kept every layer dense: the output holds the original weights, uncompressed; {why}. "
            "Compression buys no predicted speed there: choose larger token buckets (--tokens), or compress "
            "without --choose-ranks")


def ppl_fraction(value: float) -> float:
    """``--max-ppl-increase``: a fraction (0.10) or, above 1, a percentage (10 means +10%)."""
    return value / 100.0 if value > 1 else value


def share_budget(sizes: list[int], budget: int | None) -> list[int]:
    """How many tokens each calibration file gives: equal shares of ``budget`` (None: every token), a file shorter
    than its share giving all it has and its unused share going to the others in equal parts."""
    if budget is None:
        return list(sizes)
    takes = [0] * len(sizes)
    left, open_ = budget, sorted(range(len(sizes)), key=lambda i: sizes[i])
    while open_:
        share = left // len(open_)
        index = open_.pop(0)  # the shortest first: what it cannot use passes on
        takes[index] = min(sizes[index], share if open_ else left)
        left -= takes[index]
    return takes


def keeps_everything(request: CompressRequest) -> bool:
    """Whether the request keeps every MLP parameter: ``--keep-ratio 1.0`` with no per-projection ranks and no rank
    choice. Such a compression writes dense layers (FP8 ones with ``--dtype fp8``): the parameter-equal block-aligned
    rank is below full rank (a [k, n] weight's rank-r factors hold r (k + n) values), so factoring would lose what
    the user asked to keep."""
    return (request.keep_ratio >= 1.0 and not request.ranks and not request.choose_ranks
            and request.target_speedup is None)


def planned_note(request: CompressRequest) -> str | None:
    """What the keep ratio turns into, said before the work starts when it is not what was asked: every layer dense
    (:func:`keeps_everything`), or block-aligned ranks whose kept fraction differs from the requested ratio by more
    than half a percent (rounded to multiples of ``--align``). None when the ranks are the user's or chosen."""
    if keeps_everything(request):
        return ("--keep-ratio 1.0 keeps every MLP weight dense" + (" in FP8" if fp8_format(request.dtype) else "")
                + ": no factorization (the parameter-equal rank would keep less)")
    if request.ranks or request.choose_ranks or request.target_speedup is not None:
        return None
    config = read_config(request.model_dir)
    ranks = plan_ranks(config, request.keep_ratio, request.align)
    shapes = {p: projection_shape(config, p) for p in ranks}
    kept = sum(r * sum(shapes[p]) for p, r in ranks.items()) / sum(k * n for k, n in shapes.values())
    if abs(kept - request.keep_ratio) <= 0.005:
        return None
    return (f"--keep-ratio {request.keep_ratio} gives ranks gate {ranks['gate']}, up {ranks['up']}, down "
            f"{ranks['down']}: {kept:.3f} of the MLP parameters kept (ranks are multiples of --align {request.align})")


def rise_advice(request: CompressRequest) -> str:
    """What to try when perplexity rose over the budget, leaving out what this run already did."""
    options = ["keep more rank", "calibrate on broader text"]
    if request.heal == "none":
        options.append("heal (--heal closed-form|finetune)")
    elif request.heal != "finetune":
        options.append("heal by fine-tuning (--heal finetune)")
    return ", ".join(options[:-1]) + " or " + options[-1]

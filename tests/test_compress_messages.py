"""What ``nmmc compress`` says about its result must not mislead: the advice after a perplexity rise leaves out what
the run already did, a kept fraction off the requested ratio is blamed on its real cause, and a worst-tokens share
above 100% says that the other tokens improved."""

from __future__ import annotations

import pytest

from neuronmm_compiler.compression.compress_notes import keeps_everything, rise_advice
from neuronmm_compiler.compression.quality import WORST_KEY, spread_note
from neuronmm_compiler.compression.workflow import CompressRequest


def _request(**fields) -> CompressRequest:
    return CompressRequest(model_dir="m", out_dir="o", keep_ratio=fields.pop("keep_ratio", 0.8), **fields)


@pytest.mark.parametrize(("heal", "advised", "not_advised"), [
    ("none", "heal (--heal closed-form|finetune)", None),
    ("closed-form", "heal by fine-tuning (--heal finetune)", "closed-form|finetune"),
    ("finetune", "keep more rank or calibrate on broader text", "heal"),
])
def test_the_advice_after_a_rise_leaves_out_what_the_run_did(heal, advised, not_advised):
    advice = rise_advice(_request(heal=heal))
    assert advised in advice
    if not_advised:
        assert not_advised not in advice


def test_a_share_above_all_of_the_rise_says_the_other_tokens_improved():
    assert "the other tokens improved" in spread_note({WORST_KEY: 1.45})
    assert "improved" not in spread_note({WORST_KEY: 0.6})


def test_only_keep_ratio_one_without_ranks_or_choice_keeps_everything():
    assert keeps_everything(_request(keep_ratio=1.0))
    assert not keeps_everything(_request(keep_ratio=0.99))
    assert not keeps_everything(_request(keep_ratio=1.0, ranks={"down": 128}))
    assert not keeps_everything(_request(keep_ratio=1.0, choose_ranks=True))


@pytest.mark.parametrize(("sizes", "budget", "takes"), [
    ([100, 10_000], 1000, [100, 900]),      # the short file's unused share goes to the other
    ([10_000, 10_000], 1000, [500, 500]),   # equal shares as before
    ([10, 20, 10_000], 999, [10, 20, 969]),
    ([5, 5], 1000, [5, 5]),                 # fewer tokens than asked: all of them (and a warning, in the workflow)
    ([10, 20], None, [10, 20]),
])
def test_calibration_files_share_the_token_budget(sizes, budget, takes):
    from neuronmm_compiler.compression.compress_notes import share_budget

    assert share_budget(sizes, budget) == takes


def test_threads_is_one_setting_for_blas_and_torch(monkeypatch):
    """--threads, or by default every core this process may use, is the thread count of every stage: the BLAS
    library's (NumPy stages) and the one the torch stages and the heal record read (request.threads). Before, an
    unset --threads left BLAS at its own default (OPENBLAS_NUM_THREADS: 1 in this suite) while torch took every core."""
    from threadpoolctl import threadpool_info

    from neuronmm_compiler.compression import workflow

    seen = []

    def fake_run(request, progress, note=None):
        blas = [pool["num_threads"] for pool in threadpool_info() if pool["user_api"] == "blas"]
        seen.append((request.threads, blas))

    monkeypatch.setattr(workflow, "_run_compress", fake_run)
    monkeypatch.setattr(workflow, "available_cores", lambda: 2)
    workflow.run_compress(workflow.CompressRequest("m", "o", 0.5))
    workflow.run_compress(workflow.CompressRequest("m", "o", 0.5, threads=1))
    assert seen[0][0] == 2 and seen[0][1] and set(seen[0][1]) == {2}
    assert seen[1] == (1, [1] * len(seen[1][1]))

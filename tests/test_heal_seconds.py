"""The heal record's stage seconds as `nmmc compress` prints them (the recording itself: test_finetune_resume)."""

from __future__ import annotations

from neuronmm_compiler.cli.models import _clock, _heal_time_line


def test_the_time_line_sums_the_stages_in_order_and_names_a_resume_and_the_tp_blocks():
    heal = {"threads": 2, "seconds": {"finetune": 504.4, "closed_form": 287.3, "fisher": 56.1, "whitened_svd": 14.4},
            "finetune_run": {"resumed_at_step": 0}}
    assert _heal_time_line(heal) == ("  healing took 14:22 on 2 threads (wall time): whitened SVD 14 s, Fisher 56 s, "
                                     "closed form 4:47, fine-tuning 8:24")
    heal["seconds"] |= {"finetune_tp": 600.0, "finetune_sampling": 30.0}
    heal["finetune_run"] = {"resumed_at_step": 120}
    heal["threads"] = 1
    line = _heal_time_line(heal)
    assert line.startswith("  healing took 14:52 on 1 thread (wall time): ")  # the --tp blocks are not in the sum
    assert "closed form 4:47, sampling the fine-tuning data 30 s, fine-tuning 8:24" in line
    assert line.endswith("; fine-tuning resumed at step 120, the stages before it timed in the run that wrote the "
                         "checkpoint; the --tp blocks' fine-tuning 10:00 more")
    assert _heal_time_line({"method": "closed-form"}) is None  # a manifest from before the stages were timed
    assert (_clock(59.4), _clock(59.5), _clock(272.9), _clock(3599.4)) == ("59 s", "1:00", "4:33", "59:59")

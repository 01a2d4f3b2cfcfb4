"""Fine-tuning's matmul type: "auto" times both, chooses by a stated rule, perturbs nothing, and a resumed run keeps
what the first run chose (the tiny random Llama of test_compress_calibrated; a few seconds)."""

from __future__ import annotations

import numpy as np
import pytest

from neuronmm_compiler.compression.calibration import calibrate
from neuronmm_compiler.compression.forward import CausalLM
from neuronmm_compiler.compression.workflow import whitened_factors
from test_compress_calibrated import LAYERS, VOCAB, make_llama

pytestmark = pytest.mark.usefixtures("one_blas_thread")


def test_choose_dtype_takes_bfloat16_only_when_ten_percent_faster():
    from neuronmm_compiler.compression.finetune import choose_dtype

    assert choose_dtype({"bfloat16": 1.0, "float32": 1.1}) == "bfloat16"
    assert choose_dtype({"bfloat16": 1.0, "float32": 1.05}) == "float32"  # too close: the exact one
    assert choose_dtype({"bfloat16": 3.4, "float32": 2.3}) == "float32"  # the measured host without AMX


def test_auto_chooses_by_timing_changes_nothing_else_and_a_resume_keeps_its_choice(tmp_path, monkeypatch):
    pytest.importorskip("torch")
    from dataclasses import replace

    import neuronmm_compiler.compression.finetune as finetune
    from neuronmm_compiler.cli.models import _tuned_note

    model = CausalLM(make_llama(tmp_path / "m", seed=4))
    ids = np.random.default_rng(5).integers(0, VOCAB, 512)
    start = whitened_factors(model, calibrate(model, ids, source="t", length=64),
                             [{"gate": 16, "up": 16, "down": 16}] * LAYERS, 1e-4)
    settings = finetune.FinetuneSettings(steps=4, learning_rate=3e-3, length=32, warmup=1, threads=1,
                                         checkpoint_seconds=0.0)
    assert settings.dtype == "auto"
    auto, record = finetune.finetune_heal(model, ids, start, settings=settings)
    probe = record["dtype_probe_seconds"]
    assert record["dtype"] == finetune.choose_dtype(probe) and all(probe[d] > 0 for d in ("bfloat16", "float32"))
    fixed, fixed_record = finetune.finetune_heal(model, ids, start, settings=replace(settings, dtype=record["dtype"]))
    assert fixed_record["dtype_probe_seconds"] is None and fixed_record["dtype"] == record["dtype"]
    for layer in auto:  # the timed passes neither moved the factors nor left gradients behind
        for p in auto[layer]:
            assert all(np.array_equal(a, b) for a, b in zip(auto[layer][p], fixed[layer][p], strict=True))

    class Killed(Exception):
        pass

    def kill(step, steps, loss):
        if step == 2:
            raise Killed

    for first in ("bfloat16", "float32"):  # whatever the probe says on the resume, the checkpoint's choice holds
        checkpoint = tmp_path / f"{first}.ckpt"
        other = "float32" if first == "bfloat16" else "bfloat16"
        monkeypatch.setattr(finetune, "choose_dtype", lambda seconds, d=first: d)
        with pytest.raises(Killed):
            finetune.finetune_heal(model, ids, start, settings=settings, checkpoint=checkpoint, on_step=kill)
        monkeypatch.setattr(finetune, "choose_dtype", lambda seconds, d=other: d)
        _, resumed = finetune.finetune_heal(model, ids, start, settings=settings, checkpoint=checkpoint)
        # saved after step 1 (step 2 was lost with the kill), in the dtype chosen then, without a new probe
        assert (resumed["resumed_at_step"], resumed["dtype"], resumed["dtype_probe_seconds"]) == (1, first, None)

    note = _tuned_note({"finetune": {"steps": 4}, "finetune_run": record}, "finetune_run")
    assert f"fine-tuned 4 steps in {record['dtype']} (" in note
    assert f"a step {probe['float32']:.2f} s in float32, {probe['bfloat16']:.2f} in bfloat16" in note
    older = {k: v for k, v in record.items() if k not in ("dtype", "dtype_probe_seconds")}  # a manifest before auto
    assert "; fine-tuned 4 steps (" in _tuned_note({"finetune": {"steps": 4}, "finetune_run": older}, "finetune_run")

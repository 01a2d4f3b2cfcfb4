"""`compress --heal finetune` interrupted by Ctrl-C and resumed: the checkpoint is written at the interrupted
step, the resumed run skips the whitened SVD, the closed form and the sampling of the fine-tuning data, and its
factors equal an uninterrupted run's
(tiny random Llama of test_compress_calibrated; a few seconds)."""

from __future__ import annotations

import os
import signal

import numpy as np
import pytest
from safetensors import safe_open
from threadpoolctl import threadpool_limits

from neuronmm_compiler.compression import read_manifest
from neuronmm_compiler.compression.heal_steps import FINETUNE_CHECKPOINT
from neuronmm_compiler.compression.workflow import CompressRequest, run_compress
from test_compress_calibrated import LAYERS, make_llama, token_file


def _factors(out) -> dict[str, np.ndarray]:
    tensors = {}
    for layer in range(LAYERS):
        with safe_open(str(out / f"layer_{layer:03d}.safetensors"), framework="np") as f:
            tensors.update({k: f.get_tensor(k) for k in f.keys()})  # noqa: SIM118 (not a dict)
    return tensors


@pytest.mark.parametrize("metric", ["mlp-output", "fisher"])
def test_ctrl_c_saves_the_step_and_the_resume_skips_the_closed_form(tmp_path, monkeypatch, metric):
    pytest.importorskip("torch")
    import neuronmm_compiler.compression.heal as heal
    from neuronmm_compiler.compression.finetune import FinetuneSettings

    model_dir = make_llama(tmp_path / "m", seed=3)
    cal = token_file(tmp_path / "cal.npy", 512, 1)
    settings = FinetuneSettings(steps=5, learning_rate=3e-3, length=32, warmup=1, samples=96, checkpoint_seconds=1e9,
                                dtype="bfloat16")  # not "auto": runs compared bit for bit

    def request(out, **kw):
        return CompressRequest(model_dir=str(model_dir), out_dir=str(tmp_path / out), keep_ratio=0.3, align=16,
                               calibration=(str(cal),), calibration_samples=64, sequence_length=64,
                               heal="finetune", heal_metric=metric, finetune=settings, **kw)

    with threadpool_limits(limits=1, user_api="blas"):
        run_compress(request("whole"))

        def interrupt(stage, done, total):
            if stage == "healing (fine-tuning)" and done == 2:
                os.kill(os.getpid(), signal.SIGINT)  # arrives during step 2's callback: step 2 completes

        with pytest.raises(KeyboardInterrupt):
            run_compress(request("cut"), progress=interrupt)
        assert (tmp_path / "cut" / FINETUNE_CHECKPOINT).is_file()  # written at step 2, not after a minute
        calls = []
        real = heal.closed_form_heal
        monkeypatch.setattr(heal, "closed_form_heal", lambda *a, **k: calls.append(1) or real(*a, **k))
        run_compress(request("cut"))
    assert calls == []  # resumed from the checkpoint, without the whitened SVD and the closed form
    record = read_manifest(tmp_path / "cut").heal
    whole_seconds = read_manifest(tmp_path / "whole").heal["seconds"]
    stages = {"whitened_svd", "closed_form", "finetune"} | ({"fisher"} if metric == "fisher" else set())
    assert set(whole_seconds) == stages | {"finetune_sampling"} and all(v >= 0 for v in whole_seconds.values())
    assert set(record["seconds"]) == stages  # its samples came from the checkpoint: not sampled, not timed
    assert record["threads"] >= 1  # (the tiny model's stage seconds may round to 0.0: their keys are what is tested)
    assert record["finetune_run"]["resumed_at_step"] == 2
    whole_record = read_manifest(tmp_path / "whole").heal
    assert record["closed_form_error"] == whole_record["closed_form_error"]
    assert record.get("fisher") == whole_record.get("fisher") and ("fisher" in record) == (metric == "fisher")
    assert not (tmp_path / "cut" / FINETUNE_CHECKPOINT).exists()
    whole, cut = _factors(tmp_path / "whole"), _factors(tmp_path / "cut")
    assert whole.keys() == cut.keys() and all(np.array_equal(whole[k], cut[k]) for k in whole)

"""Fine-tuning's teacher targets from the calibration pass: the sequences that start where a calibration sequence
starts get the calibration's final hidden states, equal to the teacher's own forward pass, and the fine-tuning
computes that pass only for the others (the tiny random Llama of test_compress_calibrated; a few seconds)."""

from __future__ import annotations

import numpy as np
import pytest

from neuronmm_compiler.compression.calibration import calibrate, sequences
from neuronmm_compiler.compression.forward import CausalLM
from neuronmm_compiler.compression.heal_steps import whitened_factors
from test_compress_calibrated import LAYERS, VOCAB, make_llama

pytestmark = pytest.mark.usefixtures("one_blas_thread")


def test_calibration_states_are_the_teachers_and_spare_its_forward_pass(tmp_path, monkeypatch):
    torch = pytest.importorskip("torch")
    import neuronmm_compiler.compression.finetune as finetune
    from neuronmm_compiler.compression.torch_lm import TorchLM

    model = CausalLM(make_llama(tmp_path / "m", seed=6))
    ids = np.random.default_rng(7).integers(0, VOCAB, 448)  # 7 calibration sequences of 64, 14 of 32
    settings = finetune.FinetuneSettings(steps=6, learning_rate=3e-3, length=32, warmup=1, threads=1,
                                         dtype="float32", checkpoint_seconds=1e9)
    cal = calibrate(model, ids, source="t", length=64, keep_final=settings.length)
    assert cal.digest() == calibrate(model, ids, source="t", length=64).digest()  # the Grams do not change
    known = finetune.teacher_states(cal.final, 64, settings)
    assert sorted(known) == list(range(0, 14, 2))  # the fine-tuning sequences starting a calibration sequence
    lm = TorchLM(model, torch)
    chunks = sequences(ids, 32)
    for index, hidden in known.items():
        alone = lm.hidden(torch.from_numpy(chunks[index][None]))[0].numpy()
        np.testing.assert_allclose(hidden, alone, rtol=1e-4, atol=1e-5)
    assert finetune.teacher_states(cal.final, 64, settings.__class__(length=64)) == {}  # longer than was kept

    start = whitened_factors(model, cal, [{"gate": 16, "up": 16, "down": 16}] * LAYERS, 1e-4)
    passes: list[int] = []
    real = TorchLM.hidden
    monkeypatch.setattr(TorchLM, "hidden", lambda self, tokens, mlp=None: passes.append(mlp is None) or
                        real(self, tokens, mlp))
    given, _ = finetune.finetune_heal(model, ids, start, settings=settings, teacher_hidden=known)
    with_states = sum(passes)
    passes.clear()
    own, _ = finetune.finetune_heal(model, ids, start, settings=settings)
    order = np.random.default_rng(settings.seed).permutation(14)[:settings.steps]
    assert sum(passes) == settings.steps and with_states == sum(int(i) % 2 for i in order)  # then the odd ones only
    for layer in own:
        for p in own[layer]:
            for a, b in zip(given[layer][p], own[layer][p], strict=True):
                np.testing.assert_allclose(a, b, rtol=1e-3, atol=1e-5)

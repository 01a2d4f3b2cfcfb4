"""Calibration and the closed form take their token-wise products per block of consecutive sequences: the same
activations and Grams as one sequence at a time, and the same healed factors up to float32 rounding (the tiny
random Llama of test_compress_calibrated; about a second)."""

from __future__ import annotations

import numpy as np
import pytest

import neuronmm_compiler.compression.calibration as calibration
from neuronmm_compiler.compression.calibration import calibrate, sequence_groups, sequences
from neuronmm_compiler.compression.forward import CausalLM
from neuronmm_compiler.compression.heal import closed_form_heal
from neuronmm_compiler.compression.workflow import whitened_factors
from neuronmm_compiler.errors import InputError
from test_compress_calibrated import LAYERS, VOCAB, make_llama

pytestmark = pytest.mark.usefixtures("one_blas_thread")


def test_sequence_groups_are_consecutive_runs_of_at_least_the_block():
    assert sequence_groups([512] * 5, 2048) == [slice(0, 4), slice(4, 5)]
    assert sequence_groups([512] * 4, 2048) == [slice(0, 4)]
    assert sequence_groups([700, 700, 700, 90], 1024) == [slice(0, 2), slice(2, 4)]
    assert sequence_groups([64], 2048) == [slice(0, 1)]
    assert sequence_groups([], 2048) == []


def test_blocks_observe_what_single_sequences_do_and_heal_the_same(tmp_path, monkeypatch):
    model = CausalLM(make_llama(tmp_path / "m", seed=6))
    ids = np.random.default_rng(7).integers(0, VOCAB, 600)  # 9 sequences of 64 and a ragged 24
    chunks = sequences(ids, 64)
    one: list[tuple[int, np.ndarray, np.ndarray]] = []
    for chunk in chunks:
        model.forward(chunk, observe=lambda i, x, h: one.append((i, x, h)), logits=False)
    together: list[tuple[int, np.ndarray, np.ndarray]] = []
    model.observe_mlps(chunks, lambda i, x, h: together.append((i, x, h)))
    for layer in range(LAYERS):  # the same rows, in order: attention stayed within each sequence
        for k in (1, 2):
            single = np.concatenate([o[k] for o in one if o[0] == layer])
            assert np.allclose(single, next(t[k] for t in together if t[0] == layer), rtol=1e-5, atol=1e-5)
    with pytest.raises(InputError, match="token ids"):
        model.observe_mlps([chunks[0], np.array([VOCAB])], lambda *_: None)
    acc = calibration.GramAccumulator(4, 6, 1)
    bad = np.ones((3, 6), dtype=np.float32)
    bad[1, 2] = np.nan
    with pytest.raises(InputError, match="layer 0: the MLP's inner activations hold NaN or Inf"):
        acc.observe(0, np.ones((3, 4), dtype=np.float32), bad)

    results = {}
    for block in (64, 256, 2048):  # one sequence per block (as before), several, all of them
        monkeypatch.setattr(calibration, "BLOCK_TOKENS", block)
        cal = calibrate(model, ids, source="t", length=64)
        start = whitened_factors(model, cal, [{"gate": 16, "up": 16, "down": 16}] * LAYERS, 1e-4)
        healed, _ = closed_form_heal(model, ids, start, length=64, prior=cal.grams, prior_weight=1.0)
        stream, _ = closed_form_heal(model, ids, start, length=64, target="stream")
        results[block] = (cal, healed, stream)
    (cal0, healed0, stream0) = results[64]
    for cal, healed, stream in list(results.values())[1:]:
        assert cal.tokens == cal0.tokens == len(ids)
        for layer in range(LAYERS):
            for name in ("input", "inner"):
                ours, theirs = cal.grams[layer][name], cal0.grams[layer][name]  # float32 sums in other orders
                assert np.abs(ours - theirs).max() <= 1e-5 * np.abs(theirs).max()
            for ours, theirs in ((healed, healed0), (stream, stream0)):
                for p in ("gate", "up", "down"):
                    product = ours[layer][p][0].astype(np.float64) @ ours[layer][p][1]
                    reference = theirs[layer][p][0].astype(np.float64) @ theirs[layer][p][1]
                    assert np.linalg.norm(product - reference) <= 1e-3 * np.linalg.norm(reference)

"""`compress --tp N --heal finetune`: the factor-shard blocks are fine-tuned like the unsharded factors, through the
deployment's own sum over ranks, and a run interrupted while fine-tuning them resumes to the same blocks
(tiny random Llamas of test_compress_calibrated; a few seconds)."""

from __future__ import annotations

import os
import signal

import numpy as np
import pytest
from safetensors import safe_open
from safetensors.numpy import load_file, save_file

from neuronmm_compiler.compression import read_manifest
from neuronmm_compiler.compression.forward import CausalLM
from neuronmm_compiler.compression.heal_shards import sharded_mlp
from neuronmm_compiler.compression.heal_steps import CHECKPOINTS, SHARD_FINETUNE_CHECKPOINT, SHARD_START_CHECKPOINT
from neuronmm_compiler.compression.workflow import CompressRequest, run_compress
from neuronmm_compiler.errors import InputError
from test_compress_calibrated import make_llama, token_file

pytestmark = pytest.mark.usefixtures("one_blas_thread")  # tiny matrices (conftest.py)


def test_the_students_mlp_is_the_deployments_sum_over_ranks(tmp_path):
    torch = pytest.importorskip("torch")
    from neuronmm_compiler.compression.finetune import student_mlp
    from neuronmm_compiler.compression.torch_lm import TorchLM

    model = CausalLM(make_llama(tmp_path / "m", seed=1))
    hidden, inter = model.arch.hidden_size, model.arch.intermediate_size
    spans = [(0, 100), (100, inter)]  # unequal, as when the columns do not divide evenly
    rng = np.random.default_rng(0)

    def block(rows, cols, rank=16):
        return (rng.standard_normal((rows, rank)).astype(np.float32) / 4,
                rng.standard_normal((rank, cols)).astype(np.float32) / 4)

    x = rng.standard_normal((7, hidden)).astype(np.float32)
    lm = TorchLM(model, torch)
    for factored in (("gate", "up", "down"), ("up",)):  # every projection, or up alone (the others' blocks dense)
        layer = {p: [block(hidden, b - a) if p != "down" else block(b - a, hidden) for a, b in spans]
                 if p in factored else None for p in ("gate", "up", "down")}
        want = sharded_mlp(model, {0: layer}, spans)(0, x)
        params = {(0, p): [tuple(torch.from_numpy(t) for t in pair) for pair in blocks]
                  for p, blocks in layer.items() if blocks is not None}
        got = student_mlp(torch, lm, params, spans, 0, torch.from_numpy(x)).numpy()
        assert np.allclose(got, want, rtol=1e-4, atol=1e-5)
    # without spans: the one MLP of the unsharded factors
    pairs = {p: block(hidden, inter) if p != "down" else block(inter, hidden) for p in ("gate", "up", "down")}
    want = sharded_mlp(model, {0: {p: [f] for p, f in pairs.items()}}, [(0, inter)])(0, x)
    params = {(0, p): [tuple(torch.from_numpy(t) for t in f)] for p, f in pairs.items()}
    assert np.allclose(student_mlp(torch, lm, params, None, 0, torch.from_numpy(x)).numpy(), want, rtol=1e-4,
                       atol=1e-5)


def test_fine_tuning_the_blocks_heals_the_sharded_model(tmp_path):
    pytest.importorskip("torch")
    from neuronmm_compiler.compression.finetune import FinetuneSettings, finetune_heal
    from neuronmm_compiler.compression.quality import evaluate

    model = CausalLM(make_llama(tmp_path / "m", seed=3))
    hidden, inter = model.arch.hidden_size, model.arch.intermediate_size
    spans = [(0, inter // 2), (inter // 2, inter)]

    def truncated(w: np.ndarray, rank: int = 12) -> tuple[np.ndarray, np.ndarray]:
        u, s, vt = np.linalg.svd(w, full_matrices=False)
        return (u[:, :rank] * s[:rank]).astype(np.float32), vt[:rank].astype(np.float32)

    start = {layer: {p: [truncated(model.mlp_weight(layer, p)[a:b] if p == "down" else
                                   model.mlp_weight(layer, p)[:, a:b]) for a, b in spans]
                     for p in ("gate", "up", "down")} for layer in range(model.arch.num_hidden_layers)}
    ids = np.random.default_rng(4).integers(0, model.arch.vocab_size, 512)
    settings = FinetuneSettings(steps=6, learning_rate=3e-3, batch=2, length=32, warmup=1, threads=1)
    tuned, record = finetune_heal(model, ids, start, settings=settings, shards=spans)
    assert record["kl_last_10"] < record["kl_first"]
    assert all(len(tuned[layer][p]) == 2 and tuned[layer][p][1][0].shape == (hidden if p != "down" else inter // 2, 12)
               for layer in tuned for p in ("gate", "up", "down"))
    before, after = (evaluate(model, ids, sharded_mlp(model, f, spans), length=64, per_layer=False)
                     for f in (start, tuned))
    assert after.ppl_compressed < before.ppl_compressed
    with pytest.raises(InputError, match="2 factor blocks for 3 ranks"):
        finetune_heal(model, ids, start, settings=settings, shards=[(0, 64), (64, 128), (128, inter)])


def _blocks(out) -> dict[str, np.ndarray]:
    tensors = {}
    for rank in range(2):
        with safe_open(str(out / "tp2" / f"layer_000.rank{rank}.safetensors"), framework="np") as f:
            tensors.update({f"{rank}.{k}": f.get_tensor(k) for k in f.keys()})  # noqa: SIM118 (not a dict)
    return tensors


def test_tp_blocks_are_fine_tuned_measured_and_resumed(tmp_path, monkeypatch):
    pytest.importorskip("torch")
    import neuronmm_compiler.compression.heal as heal
    import test_compress_calibrated as tiny_models
    from neuronmm_compiler.compression.finetune import FinetuneSettings

    for name, value in (("HIDDEN", 256), ("INTER", 768), ("LAYERS", 1)):  # blocks wide enough for rank 128
        monkeypatch.setattr(tiny_models, name, value)
    model_dir = make_llama(tmp_path / "m", seed=5)
    weights = load_file(str(model_dir / "model.safetensors"))  # tied logits of a sane size at this width
    weights["model.embed_tokens.weight"] *= 0.1
    save_file(weights, str(model_dir / "model.safetensors"))
    cal, ev = token_file(tmp_path / "cal.npy", 1024, 1), token_file(tmp_path / "ev.npy", 256, 2)
    settings = FinetuneSettings(steps=5, learning_rate=1e-4, length=128, warmup=1, samples=0, checkpoint_seconds=1e9,
                                dtype="bfloat16")  # not "auto": runs compared bit for bit

    def request(out, heal="finetune"):
        return CompressRequest(model_dir=str(model_dir), out_dir=str(tmp_path / out), keep_ratio=0.8,
                               calibration=(str(cal),), eval=(str(ev),), sequence_length=128, heal=heal,
                               finetune=settings, tp=2, max_ppl_increase=1000.0)

    closed = run_compress(request("closed", heal="closed-form")).manifest
    whole = run_compress(request("whole")).manifest
    assert whole.heal["finetune_tp_run"]["resumed_at_step"] == 0
    assert read_manifest(tmp_path / "whole").heal["finetune_tp_run"] == whole.heal["finetune_tp_run"]  # as written
    sharded, before = whole.quality["tensor_parallel"], closed.quality["tensor_parallel"]
    assert "fine-tuned" in sharded["method"] and "fine-tuned" not in before["method"]
    tuned, start = _blocks(tmp_path / "whole"), _blocks(tmp_path / "closed")
    assert tuned.keys() == start.keys() and not any(np.array_equal(tuned[k], start[k]) for k in tuned)
    assert sharded["perplexity_compressed"] != before["perplexity_compressed"]  # measured on the tuned blocks
    assert not (tmp_path / "whole" / SHARD_FINETUNE_CHECKPOINT).exists()

    assert not (tmp_path / "whole" / SHARD_START_CHECKPOINT).exists()
    real, calls = heal.closed_form_heal, []
    # interrupted while fine-tuning the unsharded factors, then while fine-tuning the blocks: each resume skips the
    # closed form (the blocks' start is in SHARD_START_CHECKPOINT) and ends with the uninterrupted run's blocks
    for out, stage in (("cut-factors", "healing (fine-tuning)"), ("cut", "healing (fine-tuning the --tp 2 blocks)")):
        def interrupt(s, done, total, stage=stage):
            if s == stage and done == 2:
                os.kill(os.getpid(), signal.SIGINT)  # arrives during step 2's callback: step 2 completes

        monkeypatch.setattr(heal, "closed_form_heal", real)
        with pytest.raises(KeyboardInterrupt):
            run_compress(request(out), progress=interrupt)
        assert (tmp_path / out / SHARD_START_CHECKPOINT).is_file()
        calls.clear()
        monkeypatch.setattr(heal, "closed_form_heal", lambda *a, **k: calls.append(1) or real(*a, **k))
        cut = run_compress(request(out)).manifest
        assert calls == [], out
        resumed = (2, 0) if out == "cut-factors" else (settings.steps, 2)  # the blocks start after the factors
        assert (cut.heal["finetune_run"]["resumed_at_step"], cut.heal["finetune_tp_run"]["resumed_at_step"]) == resumed
        assert cut.heal["closed_form_error"] == whole.heal["closed_form_error"]
        for checkpoint in CHECKPOINTS:
            assert not (tmp_path / out / checkpoint).exists()
        a, b = _blocks(tmp_path / "whole"), _blocks(tmp_path / out)
        assert a.keys() == b.keys() and all(np.array_equal(a[k], b[k]) for k in a)
        assert read_manifest(tmp_path / out).quality["tensor_parallel"] == read_manifest(
            tmp_path / "whole").quality["tensor_parallel"]

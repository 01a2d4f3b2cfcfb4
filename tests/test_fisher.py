"""The residual-stream Fisher of ``--heal-metric fisher`` (compression/fisher.py), on the tiny random Llama of
test_compress_calibrated (a few seconds)."""

from __future__ import annotations

import numpy as np
import pytest

from neuronmm_compiler.compression.calibration import calibrate
from neuronmm_compiler.compression.fisher import residual_fisher, residual_metric
from neuronmm_compiler.compression.forward import CausalLM
from neuronmm_compiler.compression.heal import closed_form_heal
from neuronmm_compiler.compression.workflow import whitened_factors
from neuronmm_compiler.errors import InputError
from test_compress_calibrated import HIDDEN, LAYERS, VOCAB, make_llama

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.usefixtures("one_blas_thread")  # tiny matrices (conftest.py)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return CausalLM(make_llama(tmp_path_factory.mktemp("fisher") / "m", seed=5))


def _kl_hessian_diagonal_blocks(model, tokens: np.ndarray, layer: int) -> np.ndarray:
    """``sum_t H_tt``: the diagonal blocks of the Hessian of ``sum_s KL(p_s || q_s(d))`` in a change ``d``
    [tokens, hidden] of the residual stream after ``layer``'s MLP, at ``d = 0``: ``J^T (diag p - p p^T) J``
    summed over positions ``s`` (the KL's gradient vanishes there), with ``J`` the logits' Jacobian by autograd."""
    from neuronmm_compiler.compression.torch_lm import TorchLM

    lm = TorchLM(model, torch)
    ids = torch.from_numpy(tokens[None].astype(np.int64))

    def logits(d):
        def mlp(index, x):
            y = lm.dense_mlp(index, x)
            return y + d[None] if index == layer else y
        return lm.logits(ids, mlp)[0].double()

    n = len(tokens)
    p = torch.softmax(logits(torch.zeros(n, HIDDEN)), dim=-1).detach().numpy()
    jac = torch.autograd.functional.jacobian(logits, torch.zeros(n, HIDDEN)).numpy()  # [s, vocab, t, hidden]
    total = np.zeros((HIDDEN, HIDDEN))
    for s in range(n):
        curvature = np.diag(p[s]) - np.outer(p[s], p[s])
        for t in range(n):
            total += jac[s, :, t, :].T @ curvature @ jac[s, :, t, :]
    return total


def test_the_sampled_fisher_is_the_kl_hessian_of_the_residual_stream(tiny):
    tokens = np.random.default_rng(0).integers(0, VOCAB, 6)
    repeats = 4000
    sums, used = residual_fisher(tiny, np.tile(tokens, repeats), length=6, tokens=6 * repeats)
    assert len(sums) == LAYERS and used == 6 * repeats
    rng = np.random.default_rng(1)
    directions = rng.standard_normal((HIDDEN, 8))
    for layer in range(LAYERS):
        exact = _kl_hessian_diagonal_blocks(tiny, tokens, layer)
        estimate = sums[layer] / repeats
        # the quadratic forms d^T F d of random directions: Monte Carlo over 4000 x 6 sampled labels (heavy-
        # tailed: at 800 x 6 the ratios spread over 0.8-1.7)
        want = np.einsum("ik,ij,jk->k", directions, exact, directions)
        got = np.einsum("ik,ij,jk->k", directions, estimate, directions)
        assert np.allclose(got, want, rtol=0.2), (layer, got / want)
        assert np.linalg.norm(estimate - exact) < 0.1 * np.linalg.norm(exact)
    # the two layers' Fishers differ, and each estimate matches its own layer's Hessian better
    assert np.linalg.norm(sums[0] / repeats - _kl_hessian_diagonal_blocks(tiny, tokens, 0)) < \
        np.linalg.norm(sums[0] / repeats - _kl_hessian_diagonal_blocks(tiny, tokens, 1))


def test_the_residual_metric_mixes_the_normalised_fisher_with_the_identity():
    f = np.diag([4.0, 2.0, 0.0])
    m = residual_metric(f, 0.25)
    assert np.allclose(m, 0.75 * np.diag([2.0, 1.0, 0.0]) + 0.25 * np.eye(3))
    assert np.allclose(residual_metric(np.zeros((2, 2)), 0.5), 0.5 * np.eye(2))


def test_the_fisher_metric_with_an_identity_stream_is_the_mlp_output_metric(tiny):
    ids = np.random.default_rng(2).integers(0, VOCAB, 256)
    cal = calibrate(tiny, ids, source="test", length=64)
    plan = [{"gate": 32, "up": 32, "down": 32}] * LAYERS
    white = whitened_factors(tiny, cal, plan, 1e-4)
    reference, _ = closed_form_heal(tiny, ids, white, length=64, metric="mlp-output")
    same, _ = closed_form_heal(tiny, ids, white, length=64, metric="fisher",
                               stream_metrics=[np.eye(HIDDEN)] * LAYERS)
    for layer in range(LAYERS):
        for proj in ("gate", "up", "down"):
            want = reference[layer][proj][0] @ reference[layer][proj][1]
            got = same[layer][proj][0] @ same[layer][proj][1]
            assert np.abs(got - want).max() < 1e-3 * np.abs(want).max()  # float32 rounding, amplified by layer 1
    # a stream metric that weighs a few directions heavily changes down's fit
    heavy = np.eye(HIDDEN) + 50.0 * np.diag((np.arange(HIDDEN) < 4).astype(float))
    other, _ = closed_form_heal(tiny, ids, white, length=64, metric="fisher", stream_metrics=[heavy] * LAYERS)
    want = reference[0]["down"][0] @ reference[0]["down"][1]
    assert np.abs(other[0]["down"][0] @ other[0]["down"][1] - want).max() > 1e-2 * np.abs(want).max()
    with pytest.raises(InputError, match="fisher"):
        closed_form_heal(tiny, ids, white, length=64, metric="fisher")


def test_cli_fisher_metric_records_its_estimate_and_without_torch_says_how_to_install(tmp_path, tiny, monkeypatch):
    from click.testing import CliRunner

    from neuronmm_compiler.cli import main
    from neuronmm_compiler.compression import read_manifest
    from test_compress_calibrated import token_file

    model_dir = make_llama(tmp_path / "m", seed=5)
    cal = [token_file(tmp_path / f"c{i}.npy", 384, i) for i in (1, 2)]
    args = ["compress", str(model_dir), "--keep-ratio", "0.3", "--align", "16", "--calibration", str(cal[0]),
            "--calibration", str(cal[1]), "--sequence-length", "64", "--heal", "closed-form", "--heal-metric", "fisher"]
    result = CliRunner().invoke(main, [*args, "-o", str(tmp_path / "out")])
    assert result.exit_code == 0, result.output
    heal = read_manifest(tmp_path / "out").heal
    assert heal["metric"] == "fisher" and heal["fisher"] == {"tokens": 768, "mix": 0.5}
    assert set(heal["seconds"]) == {"whitened_svd", "fisher", "closed_form"}
    assert "  healing took " in result.output and ": whitened SVD " in result.output  # the stages' wall time
    monkeypatch.setitem(__import__("sys").modules, "torch", None)  # import torch raises ImportError
    missing = CliRunner().invoke(main, [*args, "-o", str(tmp_path / "none")])
    assert missing.exit_code == 2 and missing.stderr.strip().count("\n") == 0
    assert "--heal-metric fisher needs PyTorch" in missing.stderr

"""Whitened (activation-aware) truncation and the joint rank choice, against NumPy references."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from neuronmm_compiler.compression.rank_choice import (
    candidate_ranks,
    layer_losses,
    pareto_front,
    uniform_point,
    variants,
)
from neuronmm_compiler.compression.svd import truncated_svd
from neuronmm_compiler.compression.whitening import spectrum, truncation_loss, whiten, whitened_svd
from neuronmm_compiler.errors import InputError


def activations(rng: np.random.Generator, tokens: int, features: int) -> np.ndarray:
    """Anisotropic inputs, like a real model's: a few outlier features and correlated directions."""
    mix = rng.standard_normal((features, features)) * (np.arange(1, features + 1) ** -0.7)
    x = rng.standard_normal((tokens, features)) @ mix.T
    x[:, :3] *= 30.0
    return x


def reference_whitened(w: np.ndarray, x: np.ndarray, rank: int, lam: float) -> np.ndarray:
    """The rank-r W' minimizing ||X (W - W')||_F (+ damping), computed independently: through the
    symmetric square root of A = X^T X + lam I instead of a Cholesky factor, and LAPACK's SVD."""
    a = x.T @ x + lam * np.eye(x.shape[1])
    evals, evecs = np.linalg.eigh(a)
    root = (evecs * np.sqrt(evals)) @ evecs.T
    inv_root = (evecs / np.sqrt(evals)) @ evecs.T
    p, s, qt = np.linalg.svd(root @ w, full_matrices=False)
    return inv_root @ (p[:, :rank] * s[:rank]) @ qt[:rank]


@pytest.mark.parametrize("shape", [(48, 96), (96, 40)])
def test_whitened_svd_matches_an_independent_reference(shape):
    rng = np.random.default_rng(1)
    k, n = shape
    w = rng.standard_normal((k, n)) / np.sqrt(k)
    x = activations(rng, 400, k)
    gram = x.T @ x
    rank = 16
    f = whitened_svd(w, gram, rank, damping=1e-6)
    lam = 1e-6 * np.mean(np.diag(gram))
    ref = reference_whitened(w, x, rank, lam)
    assert f.u.shape == (k, rank) and f.v.shape == (rank, n)
    np.testing.assert_allclose(f.u @ f.v, ref, rtol=0, atol=1e-8 * np.abs(ref).max())
    # the reported output error is exactly the damped output error, sqrt(||X E||^2 + lam ||E||^2) / (same for W)
    e = w - f.u @ f.v
    damped = np.sqrt((np.linalg.norm(x @ e) ** 2 + lam * np.linalg.norm(e) ** 2)
                     / (np.linalg.norm(x @ w) ** 2 + lam * np.linalg.norm(w) ** 2))
    assert f.output_error == pytest.approx(damped, rel=1e-9)
    assert f.output_error == pytest.approx(np.linalg.norm(x @ e) / np.linalg.norm(x @ w), rel=1e-2)


def test_whitening_beats_plain_svd_on_the_output_and_loses_on_the_weight():
    rng = np.random.default_rng(2)
    w = rng.standard_normal((64, 128)) / 8
    x = activations(rng, 500, 64)
    white = whitened_svd(w, x.T @ x, 16)
    plain = truncated_svd(w, 16)
    out = lambda u, v: np.linalg.norm(x @ (w - u @ v)) / np.linalg.norm(x @ w)  # noqa: E731
    weight = lambda u, v: np.linalg.norm(w - u @ v) / np.linalg.norm(w)  # noqa: E731
    assert out(white.u, white.v) < 0.7 * out(plain.u, plain.v)
    assert weight(white.u, white.v) > weight(plain.u, plain.v)  # Eckart-Young: plain is optimal for the weight


def test_truncation_loss_from_the_spectrum_is_the_output_error_at_every_rank():
    rng = np.random.default_rng(3)
    w = rng.standard_normal((32, 80))
    x = activations(rng, 300, 32)
    gram = x.T @ x
    lower, _ = whiten(gram, 1e-8)
    squared = spectrum(w, lower)
    assert np.all(np.diff(squared) <= 1e-9 * squared[0])
    for rank in (1, 8, 31):
        f = whitened_svd(w, gram, rank, damping=1e-8)
        real = np.linalg.norm(x @ (w - f.u @ f.v)) / np.linalg.norm(x @ w)
        # exact up to the damping, which matters only where almost nothing is left
        assert truncation_loss(squared, rank) == pytest.approx(real, rel=1e-5 if rank < 31 else 1e-2)
    assert truncation_loss(squared, 32) == pytest.approx(0.0, abs=1e-6)


def test_singular_activations_are_damped_and_bad_input_is_an_error():
    rng = np.random.default_rng(4)
    x = rng.standard_normal((10, 40))  # rank 10 < 40 features: X^T X is singular
    gram = x.T @ x
    f = whitened_svd(rng.standard_normal((40, 60)), gram, 8)
    assert np.isfinite(f.u).all() and np.isfinite(f.v).all()
    lower, lam = whiten(gram, 1e-4)
    np.testing.assert_allclose(lower @ lower.T, gram + lam * np.eye(40), atol=1e-9 * np.abs(gram).max())
    bad = gram.copy()
    bad[0, 0] = np.nan
    with pytest.raises(InputError, match="NaN or Inf"):
        whitened_svd(rng.standard_normal((40, 60)), bad, 8)
    w = rng.standard_normal((40, 60))
    w[3, 3] = np.inf
    with pytest.raises(InputError, match="NaN or Inf"):
        whitened_svd(w, gram, 8)
    with pytest.raises(InputError, match="all zero"):
        whiten(np.zeros((4, 4)))
    with pytest.raises(InputError, match="rank"):
        whitened_svd(rng.standard_normal((40, 60)), gram, 41)


def test_candidate_ranks_store_fewer_parameters_than_dense():
    assert candidate_ranks(576, 1536) == [128, 256, 384]  # 419 is the break-even rank
    assert candidate_ranks(128, 4096) == []  # even one tile stores more than the dense matrix
    assert variants(576, 1536)[0] is None and len(variants(576, 1536)) == 1 + 9


def brute_force(losses, latencies):
    """Every assignment of variants to layers: (latency, loss) pairs."""
    return [(sum(latencies[i] for i in pick), sum(losses[layer][i] for layer, i in enumerate(pick)))
            for pick in itertools.product(range(len(latencies)), repeat=len(losses))]


def test_pareto_front_is_exact_against_brute_force():
    rng = np.random.default_rng(5)
    options = [None, (128, 128), (128, 256), (256, 128)]
    latencies = np.array([10.0, 6.0, 7.5, 8.0])
    losses = [np.concatenate([[0.0], rng.uniform(0.01, 0.5, 3)]) for _ in range(4)]
    front = pareto_front(losses, latencies, options)
    everything = brute_force(losses, latencies)
    for p in front.points:  # every front point is achievable and nothing dominates it
        assert any(abs(p.latency - lat) < 1e-9 and abs(p.loss - loss) < 1e-12 for lat, loss in everything)
        assert not any(lat <= p.latency - 1e-9 and loss <= p.loss - 1e-12 for lat, loss in everything)
        recomputed = sum(latencies[options.index(c)] for c in p.choice)
        assert recomputed == pytest.approx(p.latency)
    for lat, loss in everything:  # every assignment is matched or beaten by a front point
        assert any(p.latency <= lat + 1e-9 and p.loss <= loss + 1e-12 for p in front.points)
    assert front.points[-1].loss == 0.0 and all(c is None for c in front.points[-1].choice)


def test_joint_choice_keeps_rank_in_sensitive_layers_and_dominates_uniform():
    options = [None, (128, 128), (256, 256)]
    latencies = np.array([10.0, 5.0, 7.0])
    robust = np.array([0.0, 0.01, 0.002])
    sensitive = np.array([0.0, 0.30, 0.05])
    losses = [robust, sensitive, robust, robust]
    front = pareto_front(losses, latencies, options)
    uniform = uniform_point(losses, latencies, options, (256, 256))
    chosen = front.fastest_within(uniform.loss)
    assert chosen.loss <= uniform.loss and chosen.latency < uniform.latency
    assert chosen.choice[1] != (128, 128)  # the sensitive layer keeps more rank than the others
    assert chosen.choice[0] == (128, 128)
    accurate = front.most_accurate_within(uniform.latency)
    assert accurate.latency <= uniform.latency and accurate.loss < uniform.loss
    with pytest.raises(InputError, match="cost-model prediction"):
        front.most_accurate_within(1.0)


def test_layer_losses_sum_the_squared_projection_losses():
    spectra = {"gate": np.array([4.0, 1.0, 0.0]), "up": np.array([1.0, 1.0, 2.0]), "down": np.array([9.0, 0.0, 0.0])}
    losses = layer_losses(spectra, [None, (1, 1), (2, 1)])
    assert losses[0] == 0.0
    assert losses[1] == pytest.approx(1 / 5 + 3 / 4 + 0.0)
    assert losses[2] == pytest.approx(0.0 + 2 / 4 + 0.0)

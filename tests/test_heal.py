"""Healing after truncation, calibration checks, several eval files, the measured rank choice, sampling --
on the tiny random Llama of test_compress_calibrated (a few seconds in all)."""

from __future__ import annotations

import importlib.util

import numpy as np
import pytest
from click.testing import CliRunner
from safetensors import safe_open

from neuronmm_compiler.cli import main
from neuronmm_compiler.compression import read_manifest
from neuronmm_compiler.compression.calibration import calibrate
from neuronmm_compiler.compression.forward import CausalLM
from neuronmm_compiler.compression.heal import closed_form_heal
from neuronmm_compiler.compression.heal_metric import original_mlp
from neuronmm_compiler.compression.heal_solve import METRIC_DAMPING, rank_constrained_lstsq
from neuronmm_compiler.compression.measured_choice import measured_choice, plot_front
from neuronmm_compiler.compression.quality import evaluate, factored_mlp
from neuronmm_compiler.compression.sampling import sample_tokens
from neuronmm_compiler.compression.whitening import whitened_svd
from neuronmm_compiler.compression.workflow import CompressRequest, run_compress, whitened_factors
from neuronmm_compiler.errors import InputError
from test_compress_calibrated import INTER, LAYERS, VOCAB, make_llama, token_file

pytestmark = pytest.mark.usefixtures("one_blas_thread")  # tiny matrices (conftest.py)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    root = tmp_path_factory.mktemp("heal")
    model_dir = make_llama(root / "m", seed=3)
    return root, model_dir, CausalLM(model_dir)


def test_rank_constrained_lstsq_is_whitened_svd_for_the_layers_own_targets_and_beats_it_otherwise():
    rng = np.random.default_rng(0)
    x = rng.standard_normal((400, 24)) @ rng.standard_normal((24, 24))
    w = rng.standard_normal((24, 40))
    gram = x.T @ x
    u, v = rank_constrained_lstsq(gram, gram @ w, 8, damping=1e-12)  # equal up to the damping's terms
    white = whitened_svd(w, gram, 8, damping=1e-12)
    assert np.allclose(u @ v, white.u @ white.v, atol=1e-7)
    # another input (a drifted x~) and the original output: the refit is the rank-8 least-squares optimum
    drifted = x + 0.3 * rng.standard_normal(x.shape)
    target = x @ w
    g2, c2 = drifted.T @ drifted, drifted.T @ target
    u2, v2 = rank_constrained_lstsq(g2, c2, 8, damping=1e-9)
    fitted = np.linalg.norm(drifted @ u2 @ v2 - target)
    assert fitted < np.linalg.norm(drifted @ white.u @ white.v - target)
    for _ in range(5):  # no random rank-8 perturbation of the optimum does better
        du, dv = u2 + 1e-3 * rng.standard_normal(u2.shape), v2 + 1e-3 * rng.standard_normal(v2.shape)
        assert np.linalg.norm(drifted @ du @ dv - target) >= fitted - 1e-9
    with pytest.raises(InputError, match="rank must be"):
        rank_constrained_lstsq(gram, gram @ w, 30)


def test_rank_constrained_lstsq_with_an_output_metric_is_the_weighted_optimum():
    rng = np.random.default_rng(4)
    x = rng.standard_normal((300, 20)) @ rng.standard_normal((20, 20))
    w = rng.standard_normal((20, 30))
    gram, cross = x.T @ x, x.T @ (x @ w)
    c = rng.standard_normal((30, 30))
    metric = c @ c.T
    u, v = rank_constrained_lstsq(gram, cross, 6, damping=1e-9, metric=metric)
    right = np.linalg.cholesky(metric + METRIC_DAMPING * np.mean(np.diag(metric)) * np.eye(30))

    def weighted(uu, vv):
        return np.linalg.norm((x @ uu @ vv - x @ w) @ right)

    best = weighted(u, v)
    plain = rank_constrained_lstsq(gram, cross, 6, damping=1e-9)
    assert best < weighted(*plain)  # the unweighted optimum is worse in the weighted norm
    for _ in range(5):
        du, dv = u + 1e-3 * rng.standard_normal(u.shape), v + 1e-3 * rng.standard_normal(v.shape)
        assert weighted(du, dv) >= best - 1e-9
    # a multiple of the identity weighs every output alike: the unweighted solution
    same = rank_constrained_lstsq(gram, cross, 6, damping=1e-9, metric=3.0 * np.eye(30))
    assert np.allclose(same[0] @ same[1], plain[0] @ plain[1], atol=1e-8)


def test_output_metric_is_how_gate_and_up_errors_reach_the_mlp_output(tiny):
    _, _, model = tiny
    rng = np.random.default_rng(5)
    xs = [rng.standard_normal((40, model.arch.hidden_size)).astype(np.float32) for _ in range(2)]
    wants, metrics = original_mlp(model, 0, xs, ("gate", "up"), outputs=True)
    w = {p: model.mlp_weight(0, p).astype(np.float64) for p in ("gate", "up", "down")}
    for x, want in zip(xs, wants, strict=True):
        assert np.allclose(want, model.mlp(0, x)[0], rtol=1e-5, atol=1e-6)
    e = rng.standard_normal(w["down"].shape[0]) * 1e-4  # one error vector for every token: no approximation left
    x = np.concatenate(xs).astype(np.float64)
    g, u = x @ w["gate"], x @ w["up"]

    def out(gg, uu):
        return (gg / (1 + np.exp(-gg)) * uu) @ w["down"]

    for p, moved in (("up", out(g, u + e)), ("gate", out(g + e, u))):
        change = float(np.sum((moved - out(g, u)) ** 2))
        assert change == pytest.approx(float(e @ metrics[p] @ e), rel=1e-3)  # first order in e
        # a residual-stream metric S weighs the output's change: (change) S (change)^T
        s = np.diag(rng.uniform(0.5, 2.0, w["down"].shape[1]))
        _, weighed = original_mlp(model, 0, xs, (p,), outputs=False, stream=s)
        delta = moved - out(g, u)
        assert float(np.einsum("ti,ij,tj->", delta, s, delta)) == pytest.approx(float(e @ weighed[p] @ e), rel=1e-3)
    assert original_mlp(model, 0, xs, (), outputs=False) == ([], {})
    # every=2: the metric's sums over the even inputs alone, the outputs over all
    wants2, halves = original_mlp(model, 0, xs, ("gate", "up"), outputs=True, every=2)
    _, first = original_mlp(model, 0, xs[:1], ("gate", "up"), outputs=False)
    assert len(wants2) == 2 and all(np.array_equal(halves[p], first[p]) for p in ("gate", "up"))


def test_closed_form_heal_keeps_ranks_and_lowers_the_calibration_loss(tiny):
    _, _, model = tiny
    ids = np.random.default_rng(1).integers(0, VOCAB, 512)
    cal = calibrate(model, ids, source="t", length=64)
    plans = [{"gate": 16, "up": 16, "down": 16}, {"gate": None, "up": None, "down": 16}]
    start = whitened_factors(model, cal, plans, 1e-4)
    healed, report = closed_form_heal(model, ids, start, length=64, damping=1e-3, metric="projection")
    assert healed[1]["gate"] is start[1]["gate"]  # dense stays dense
    for layer, ranks in enumerate(plans):
        for proj, rank in ranks.items():
            if rank is not None:
                assert healed[layer][proj][0].shape[1] == rank == healed[layer][proj][1].shape[0]
                assert report.after[layer][proj] <= report.before[layer][proj] * (1 + 1e-3)  # ridge: not exactly
    before = evaluate(model, ids, factored_mlp(start), length=64, per_layer=False).ppl_compressed
    after = evaluate(model, ids, factored_mlp(healed), length=64, per_layer=False).ppl_compressed
    assert after < before
    stream, _ = closed_form_heal(model, ids, start, length=64, damping=1e-3, target="stream")
    assert evaluate(model, ids, factored_mlp(stream), length=64, per_layer=False).ppl_compressed < before
    weighed, _ = closed_form_heal(model, ids, start, length=64, damping=1e-3, metric="mlp-output")
    assert evaluate(model, ids, factored_mlp(weighed), length=64, per_layer=False).ppl_compressed < before
    assert not np.allclose(weighed[0]["gate"][0] @ weighed[0]["gate"][1], healed[0]["gate"][0] @ healed[0]["gate"][1])
    with pytest.raises(InputError, match="unknown heal metric"):
        closed_form_heal(model, ids, start, length=64, metric="output")


def test_cli_heal_min_calibration_single_source_and_several_eval_files(tiny):
    root, model_dir, _ = tiny
    cal, other = token_file(root / "cal.npy", 512, 5), token_file(root / "other.npy", 512, 8)
    ev1, ev2 = token_file(root / "ev1.npy", 128, 6), token_file(root / "ev2.npy", 128, 7)
    runner = CliRunner()
    out = root / "healed"
    result = runner.invoke(main, ["compress", str(model_dir), "--keep-ratio", "0.3", "--align", "16",
                                  "--calibration", str(cal), "--calibration", str(other), "--heal", "closed-form",
                                  "--eval", str(ev1), "--eval", str(ev2), "--sequence-length", "64",
                                  "--max-ppl-increase", "1000", "-o", str(out)])
    assert result.exit_code == 0, result.output
    assert "single source" not in result.stderr
    assert "healed (closed-form)" in result.output
    assert "ev1.npy: 126 tokens" in result.output and "ev2.npy: 126 tokens" in result.output
    manifest = read_manifest(out)
    assert manifest.heal["method"] == "closed-form" and manifest.quality["tokens"] == 252
    assert manifest.heal["metric"] == "mlp-output"  # the default (--heal-metric)
    assert [q["source"] for q in manifest.quality["per_file"]] == ["ev1.npy", "ev2.npy"]
    rank = manifest.ranks["gate"]
    with safe_open(str(out / "layer_000.safetensors"), framework="np") as f:  # the same file format
        assert sorted(f.keys()) == sorted(f"model.layers.0.mlp.{p}_proj.{t}" for p in ("gate", "up", "down")
                                          for t in ("u", "v"))
        assert f.get_tensor("model.layers.0.mlp.gate_proj.u").shape == (64, rank)
    one = runner.invoke(main, ["compress", str(model_dir), "--keep-ratio", "0.3", "--align", "16",
                               "--calibration", str(cal), "--sequence-length", "64", "-o", str(root / "one")])
    assert one.exit_code == 0 and "single source (cal.npy)" in one.stderr
    short = runner.invoke(main, ["compress", str(model_dir), "--keep-ratio", "0.3", "--align", "16",
                                 "--calibration", str(token_file(root / "short.npy", 4, 0)), "-o", str(root / "s")])
    lines = short.stderr.strip().splitlines()
    assert short.exit_code == 2 and len(lines) == 1
    assert "has 4 tokens; at least 256 are needed" in lines[0]
    assert max(256, INTER) == 256


def test_cli_fine_tuning_options_reach_the_settings(tiny):
    pytest.importorskip("torch")
    root, model_dir, _ = tiny
    cal = token_file(root / "cal-ft.npy", 512, 5)
    out = root / "tuned-f32"
    result = CliRunner().invoke(main, ["compress", str(model_dir), "--keep-ratio", "0.3", "--align", "16",
                                       "--calibration", str(cal), "--sequence-length", "64", "--heal", "finetune",
                                       "--finetune-steps", "1", "--finetune-samples", "0", "--finetune-lr", "2e-5",
                                       "--finetune-dtype", "float32", "--finetune-label-weight", "0.5",
                                       "--threads", "1", "-o", str(out)])
    assert result.exit_code == 0, result.output
    settings = read_manifest(out).heal["finetune"]
    assert (settings["steps"], settings["samples"], settings["learning_rate"], settings["dtype"],
            settings["label_weight"]) == (1, 0, 2e-5, "float32", 0.5)
    assert settings["batch"] == 1 and settings["top_k"] == 64  # the rest stays FinetuneSettings'


def test_measured_choice_respects_its_budget_and_keeps_dense_as_a_choice(tiny):
    root, _, model = tiny
    ids = np.random.default_rng(2).integers(0, VOCAB, 256)
    cal = calibrate(model, ids, source="t", length=64)

    def factor(layer, proj, rank):
        f = whitened_svd(model.mlp_weight(layer, proj), cal.gram(layer, proj), rank)
        return f.u, f.v

    none = measured_choice(model, ids, 0.0, factor, length=64, align=16)
    assert none.choice == [None] * LAYERS or all(s["ppl_increase"] <= 0 for s in none.steps if s["accepted"])
    loose = measured_choice(model, ids, 1000.0, factor, length=64, align=16)
    assert all(r is not None for r in loose.choice) and min(loose.choice) == 16
    mid = measured_choice(model, ids, 0.02, factor, length=64, align=16)
    assert all(s["ppl_increase"] <= 0.02 for s in mid.steps if s["accepted"])
    assert len(mid.sensitivity) == LAYERS
    assert plot_front(mid, root / "front.png").stat().st_size > 1000


def test_cli_choose_ranks_from_measured_perplexity(tiny):
    root, model_dir, _ = tiny
    cal, ev = token_file(root / "cal2.npy", 512, 9), token_file(root / "ev3.npy", 128, 10)
    result = CliRunner().invoke(main, ["compress", str(model_dir), "--keep-ratio", "0.5", "--align", "32",
                                       "--calibration", str(cal), "--calibration-samples", "64",
                                       "--choose-ranks", "--max-ppl-increase", "5", "--eval", str(ev),
                                       "--sequence-length", "64", "-o", str(root / "chosen")])
    assert result.exit_code == 0, result.output
    assert "measured rank choice within +2.5% perplexity on calibration tokens" in result.output
    assert (root / "chosen" / "choice_front.png").is_file()
    manifest = read_manifest(root / "chosen")
    record = manifest.rank_choice
    assert record["budget_ppl_increase"] == 0.05 and record["selection_budget"] == 0.025
    # the budget is held on the eval file: the model written is the last one checked, and it measured within
    check = record["eval_check"]
    assert check["checked"][-1]["accepted_steps"] == check["kept_steps"] and check["checked"][-1]["within"]
    assert manifest.quality["perplexity_increase"] <= 0.05 and "checked on the --eval files" in result.output
    assert [r["gate"] for r in manifest.layer_ranks()] == record["choice"]


def test_choice_over_budget_on_the_eval_file_is_backed_off_and_rebuilt_healed(tiny, monkeypatch):
    root, model_dir, _ = tiny
    cal, ev = token_file(root / "cal4.npy", 512, 11), token_file(root / "ev4.npy", 128, 12)
    # a selection budget far above the eval budget: the greedy accepts steps the eval file must refuse
    monkeypatch.setattr("neuronmm_compiler.compression.workflow.SELECTION_SHARE", 40.0)
    request = CompressRequest(str(model_dir), str(root / "backed"), 0.5, align=32, calibration=str(cal),
                              eval=str(ev), sequence_length=64, choose_ranks=True, max_ppl_increase=0.05,
                              heal="closed-form")
    result = run_compress(request)
    check = result.measured_choice.eval_check
    assert check["accepted_steps"] > 0 and check["kept_steps"] < check["accepted_steps"]
    assert not check["checked"][0]["within"] and check["checked"][-1]["within"]
    manifest = read_manifest(root / "backed")
    assert manifest.quality["perplexity_increase"] <= 0.05 and manifest.heal["method"] == "closed-form"
    assert [r["gate"] for r in manifest.layer_ranks()] == result.measured_choice.choice
    unchecked = run_compress(CompressRequest(**{**request.__dict__, "out_dir": str(root / "unchecked"),
                                                "eval_check": False}))
    assert unchecked.measured_choice.eval_check is None and unchecked.manifest.quality["perplexity_increase"] > 0.05


def test_sampling_is_deterministic_and_in_vocabulary(tiny):
    _, _, model = tiny
    a = sample_tokens(model, 70, length=20, batch=3, seed=4)
    b = sample_tokens(model, 70, length=20, batch=2, seed=4)
    assert a.shape == (70,) and a.min() >= 0 and a.max() < VOCAB and a[0] == 0
    assert b.shape == (70,) and np.array_equal(a, sample_tokens(model, 70, length=20, batch=3, seed=4))
    # the tiny random model's logits are so peaked that it always samples token 0: flattened, it draws
    hot = sample_tokens(model, 70, length=20, batch=3, seed=4, temperature=1e3)
    assert len(set(hot.tolist())) > 10 and hot.max() < VOCAB
    assert np.array_equal(hot, sample_tokens(model, 70, length=20, batch=3, seed=4, temperature=1e3))
    assert not np.array_equal(hot, sample_tokens(model, 70, length=20, batch=3, seed=5, temperature=1e3))
    # the cached step reproduces the full forward pass's last-position logits
    from neuronmm_compiler.compression.sampling import _step

    tokens = np.array([[0, 5, 9, 2]])
    cache = [{"k": np.zeros((1, model.arch.num_key_value_heads, 4, model.arch.head_dim), np.float32),
              "v": np.zeros((1, model.arch.num_key_value_heads, 4, model.arch.head_dim), np.float32)}
             for _ in model.layers]
    for pos in range(4):
        logits = _step(model, tokens[:, pos], pos, cache)
    assert np.allclose(logits[0], model.forward(tokens[0])[-1], atol=1e-4)


def test_heal_errors_are_one_line(tiny):
    root, model_dir, _ = tiny
    with pytest.raises(InputError, match="--heal needs --calibration"):
        run_compress(CompressRequest(model_dir=str(model_dir), out_dir=str(root / "e"), keep_ratio=0.3, align=16,
                                     heal="closed-form"))
    with pytest.raises(InputError, match="unknown --heal"):
        run_compress(CompressRequest(model_dir=str(model_dir), out_dir=str(root / "e"), keep_ratio=0.3, align=16,
                                     heal="magic"))


def test_finetune_mirrors_the_numpy_model_lowers_the_kl_and_resumes_after_a_kill(tiny):
    torch = pytest.importorskip("torch")
    from dataclasses import replace

    from neuronmm_compiler.compression.finetune import FinetuneSettings, finetune_heal
    from neuronmm_compiler.compression.torch_lm import TorchLM

    root, _, model = tiny
    tokens = np.random.default_rng(3).integers(0, VOCAB, 48)
    lm = TorchLM(model, torch)
    with torch.no_grad():
        logits = lm.logits(torch.from_numpy(tokens[None]))[0].numpy()
    assert np.allclose(logits, model.forward(tokens), atol=2e-4 * np.abs(logits).max())
    ids = np.random.default_rng(4).integers(0, VOCAB, 512)
    cal = calibrate(model, ids, source="t", length=64)
    start = whitened_factors(model, cal, [{"gate": 16, "up": 16, "down": 16}] * LAYERS, 1e-4)
    settings = FinetuneSettings(steps=6, learning_rate=3e-3, batch=2, length=32, warmup=1, threads=1,
                                checkpoint_seconds=0.0, dtype="float32")
    whole, record = finetune_heal(model, ids, start, settings=settings)
    assert record["kl_last_10"] < record["kl_first"]
    assert all(whole[layer][p][0].shape == start[layer][p][0].shape for layer in whole for p in whole[layer])

    class Killed(Exception):
        pass

    def kill(step, steps, loss):
        if step == 3:
            raise Killed

    checkpoint = root / "ft.ckpt"
    with pytest.raises(Killed):
        finetune_heal(model, ids, start, settings=settings, checkpoint=checkpoint, on_step=kill)
    resumed, again = finetune_heal(model, ids, start, settings=settings, checkpoint=checkpoint)
    assert again["resumed_at_step"] == 2  # saved after step 2; step 3 was lost with the kill
    for layer in whole:
        for p in whole[layer]:
            assert np.allclose(resumed[layer][p][0], whole[layer][p][0], atol=1e-6)
    _, fresh = finetune_heal(model, ids, start, settings=replace(settings, learning_rate=1e-3),
                                 checkpoint=checkpoint)
    assert fresh["resumed_at_step"] == 0  # another run's checkpoint is not resumed
    # the per-layer MLP-output loss and bfloat16 autocast run and still lower the KL
    _, mixed = finetune_heal(model, ids, start, settings=replace(settings, layer_weight=1.0, dtype="bfloat16"))
    assert mixed["kl_last_10"] < mixed["kl_first"]


def test_the_label_term_is_the_next_token_cross_entropy_and_fits_the_data(tiny):
    torch = pytest.importorskip("torch")
    from neuronmm_compiler.compression.finetune import FinetuneSettings, _label_nll, finetune_heal
    from neuronmm_compiler.compression.quality import evaluate, factored_mlp

    gen = torch.Generator().manual_seed(1)
    logits, tokens = torch.randn(2, 7, 30, generator=gen), torch.randint(0, 30, (2, 7), generator=gen)
    expected = torch.nn.functional.cross_entropy(logits[:, :-1].reshape(-1, 30), tokens[:, 1:].reshape(-1))
    assert torch.allclose(_label_nll(torch.log_softmax(logits, -1), tokens), expected)
    _, _, model = tiny
    ids = np.random.default_rng(4).integers(0, VOCAB, 512)
    start = whitened_factors(model, calibrate(model, ids, source="t", length=64),
                             [{"gate": 16, "up": 16, "down": 16}] * LAYERS, 1e-4)
    quality = {}
    for weight in (0.0, 1.0):
        settings = FinetuneSettings(steps=6, learning_rate=1e-3, batch=2, length=32, warmup=1, threads=1,
                                    dtype="float32", label_weight=weight)
        tuned, _ = finetune_heal(model, ids, start, settings=settings)
        quality[weight] = evaluate(model, ids, factored_mlp(tuned), length=64, per_layer=False)
    # the label term fits the data's own tokens; distillation alone keeps closer to the original's predictions
    assert quality[1.0].ppl_compressed < quality[0.0].ppl_compressed
    assert quality[1.0].top1_agreement < quality[0.0].top1_agreement


def test_sparse_kl_is_a_divergence():
    torch = pytest.importorskip("torch")
    from neuronmm_compiler.compression.finetune import _sparse_kl

    gen = torch.Generator().manual_seed(0)
    t, s = (torch.log_softmax(torch.randn(5, 40, generator=gen) * 3, -1) for _ in range(2))
    full = (t.exp() * (t - s)).sum(-1).mean()
    assert torch.allclose(_sparse_kl(torch, t, s), full, atol=1e-5)  # k = vocabulary: the full KL
    top_t, idx = t.topk(8, dim=-1)
    assert float(_sparse_kl(torch, top_t, s.gather(-1, idx))) > 0
    assert abs(float(_sparse_kl(torch, top_t, t.gather(-1, idx)))) < 1e-5


def test_tp_shards_get_the_same_whitening_and_healing_and_are_measured(tmp_path, monkeypatch):
    import test_compress_calibrated as tiny_models

    for name, value in (("HIDDEN", 256), ("INTER", 768), ("LAYERS", 1)):  # blocks wide enough for rank 128
        monkeypatch.setattr(tiny_models, name, value)
    model_dir = make_llama(tmp_path / "m", seed=5)
    cal, ev = token_file(tmp_path / "cal.npy", 1024, 1), token_file(tmp_path / "ev.npy", 256, 2)
    ppl = {}
    runs = [("plain", []), ("whitened", ["--calibration", str(cal)]),
            ("healed", ["--calibration", str(cal), "--heal", "closed-form"])]
    if importlib.util.find_spec("torch") is not None:  # the Fisher metric weighs each rank's down block too
        runs.append(("fisher", ["--calibration", str(cal), "--heal", "closed-form", "--heal-metric", "fisher"]))
    for label, extra in runs:
        out = tmp_path / label
        result = CliRunner().invoke(main, ["compress", str(model_dir), "--keep-ratio", "0.8", "--tp", "2", *extra,
                                           "--eval", str(ev), "--sequence-length", "128", "--max-ppl-increase",
                                           "1000", "-o", str(out)])
        assert result.exit_code == 0, result.output
        sharded = read_manifest(out).quality["tensor_parallel"]
        assert sharded["tp"] == 2 and "--tp 2 factor-shard blocks (kept 0.833 of the MLP parameters" in result.output
        assert sharded["kept_fraction"] == pytest.approx(128 * (256 + 384) / (256 * 384))  # rank-128 blocks
        assert "the factor-shard blocks keep 0.833 of the MLP parameters, the unsharded factors 0." in result.output
        ppl[label] = sharded["perplexity_compressed"]
        with safe_open(str(out / "tp2" / "layer_000.rank1.safetensors"), framework="np") as f:
            assert f.get_tensor("model.layers.0.mlp.down_proj.u").shape == (384, 128)
    assert ppl["whitened"] < ppl["plain"] and ppl["healed"] < ppl["plain"] and ppl.get("fisher", 0) < ppl["plain"]

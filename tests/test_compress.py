"""Block-aligned SVD compression of a model's MLP: ranks, accuracy, file format, resuming."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest
from click.testing import CliRunner
from safetensors import safe_open
from safetensors.numpy import save_file

from neuronmm_compiler.checkpoints.config import read_config
from neuronmm_compiler.checkpoints.weights import WeightReader, bf16_to_f32, read_raw_tensor
from neuronmm_compiler.cli import main
from neuronmm_compiler.compression import compress_model, read_manifest
from neuronmm_compiler.compression import svd as svd_module
from neuronmm_compiler.compression.svd import relative_error, truncated_svd
from neuronmm_compiler.errors import InputError, UnknownNameError
from neuronmm_compiler.frontends.shapes import block_aligned_rank

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "configs"
HIDDEN, INTERMEDIATE, LAYERS = 256, 768, 3
PROJ = ("gate", "up", "down")


pytestmark = pytest.mark.usefixtures("one_blas_thread")  # tiny matrices (conftest.py)


def make_model(root: Path, dtype: str = "float32", sharded: bool = False, seed: int = 0) -> tuple[Path, dict]:
    """A tiny Llama-style model on disk, MLP weights stored as HF does ([out, in]).

    Returns the directory and ``{(layer, proj): W}`` with W = weight.T [in, out] in float32 (after
    bf16 rounding for a bf16 model), i.e. exactly what compression must factor.
    """
    root.mkdir(parents=True, exist_ok=True)
    shutil.copy(FIXTURES / "tiny-llama.json", root / "config.json")
    rng = np.random.default_rng(seed)
    np_dtype = ml_dtypes.bfloat16 if dtype == "bfloat16" else np.float32
    tensors, weights = {}, {}
    # a decaying spectrum on top of noise, like trained weights (not a flat random matrix)
    decay = (1.0 + np.arange(HIDDEN)) ** -1.0
    for layer in range(LAYERS):
        for proj in PROJ:
            out_f, in_f = (INTERMEDIATE, HIDDEN) if proj != "down" else (HIDDEN, INTERMEDIATE)
            a = np.linalg.qr(rng.standard_normal((out_f, HIDDEN)))[0] * decay
            b = np.linalg.qr(rng.standard_normal((in_f, HIDDEN)))[0]
            weight = (a @ b.T + 1e-4 * rng.standard_normal((out_f, in_f))).astype(np_dtype)
            tensors[f"model.layers.{layer}.mlp.{proj}_proj.weight"] = weight
            weights[layer, proj] = weight.astype(np.float32).T
        tensors[f"model.layers.{layer}.self_attn.q_proj.weight"] = np.ones((HIDDEN, HIDDEN), np_dtype)
    tensors["model.embed_tokens.weight"] = np.ones((32, HIDDEN), np_dtype)
    if not sharded:
        save_file(tensors, root / "model.safetensors", metadata={"format": "pt"})
    else:
        names = sorted(tensors)
        shards = [names[: len(names) // 2], names[len(names) // 2:]]
        weight_map = {}
        for index, shard in enumerate(shards):
            filename = f"model-{index + 1:05d}-of-00002.safetensors"
            save_file({name: tensors[name] for name in shard}, root / filename)
            weight_map.update(dict.fromkeys(shard, filename))
        (root / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    return root, weights


def optimal_error(w: np.ndarray, rank: int) -> float:
    u, s, vt = np.linalg.svd(w.astype(np.float64), full_matrices=False)
    return relative_error(w, u[:, :rank] * s[:rank], vt[:rank])


def files_bytes(directory: Path) -> dict[str, bytes]:
    return {path.name: path.read_bytes() for path in sorted(directory.iterdir())}


@pytest.fixture(scope="module")
def fp32_model(tmp_path_factory):
    return make_model(tmp_path_factory.mktemp("fp32") / "tiny-llama")


@pytest.fixture(scope="module")
def reference_run(tmp_path_factory, fp32_model):
    """An uninterrupted compression at keep_ratio 0.8, align 32, to compare resumed runs against."""
    out = tmp_path_factory.mktemp("reference") / "out"
    manifest = compress_model(fp32_model[0], out, 0.8, align=32)
    return out, manifest


@pytest.mark.parametrize(("dtype", "sharded"), [("float32", False), ("bfloat16", False), ("bfloat16", True)])
def test_compress_matches_truncated_svd_and_reports_counts(tmp_path, dtype, sharded):
    model, weights = make_model(tmp_path / "model", dtype, sharded)
    calls = []
    manifest = compress_model(model, tmp_path / "out", 0.8, align=32, progress=lambda d, t: calls.append((d, t)))
    assert calls == [(i, 9) for i in range(1, 10)]
    rank = block_aligned_rank(HIDDEN, INTERMEDIATE, 0.8, 32)
    assert rank == 160 and manifest.ranks == {"gate": 160, "up": 160, "down": 160}
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == [
        "layer_000.safetensors", "layer_001.safetensors", "layer_002.safetensors", "manifest.json"]
    for layer in range(LAYERS):
        with safe_open(tmp_path / "out" / f"layer_{layer:03d}.safetensors", framework="np") as handle:
            assert sorted(handle.keys()) == sorted(
                f"model.layers.{layer}.mlp.{proj}_proj.{f}" for proj in PROJ for f in ("u", "v"))
            for proj in PROJ:
                w = weights[layer, proj]
                u = handle.get_tensor(f"model.layers.{layer}.mlp.{proj}_proj.u")
                v = handle.get_tensor(f"model.layers.{layer}.mlp.{proj}_proj.v")
                assert u.dtype == v.dtype == np.float32
                assert u.shape == (w.shape[0], rank) and v.shape == (rank, w.shape[1])
                entry = manifest.layers[layer].projections[proj]
                best = optimal_error(w, rank)
                assert relative_error(w, u, v) == pytest.approx(entry.relative_error, rel=1e-12)
                assert entry.relative_error == pytest.approx(best, rel=1e-5)
                assert entry.relative_error < 0.1  # U @ V ~= W for this decaying spectrum
                # singular values split evenly: u^T u == v v^T == diag(S)
                np.testing.assert_allclose(u.T @ u, v @ v.T, rtol=1e-3, atol=1e-4)
                assert (entry.shape, entry.params_before, entry.params_after) == (
                    w.shape, w.size, rank * sum(w.shape))
    before = LAYERS * 3 * HIDDEN * INTERMEDIATE
    after = LAYERS * 3 * rank * (HIDDEN + INTERMEDIATE)
    assert (manifest.params_before, manifest.params_after) == (before, after)
    assert manifest.compression_ratio == pytest.approx(before / after)
    assert manifest.kept_fraction == pytest.approx(0.8333, abs=1e-3)
    assert read_manifest(tmp_path / "out") == manifest


def test_manifest_schema(reference_run):
    out, manifest = reference_run
    raw = json.loads((out / "manifest.json").read_text())
    assert raw["format"] == "nmmc-svd-mlp" and raw["format_version"] == 2
    assert raw["model"] == {"name": "nmmc/tiny-llama", "architecture": "llama", "hidden_size": 256,
                            "intermediate_size": 768, "num_hidden_layers": 3, "torch_dtype": "bfloat16"}
    assert (raw["keep_ratio"], raw["align"], raw["dtype"]) == (0.8, 32, "float32")
    assert raw["naming"]["u"] == "model.layers.{layer}.mlp.{proj}_proj.u"
    assert raw["naming"]["file"] == "layer_{layer:03d}.safetensors"
    down = raw["layers"][2]["projections"]["down"]
    assert set(down) == {"rank", "shape", "params_before", "params_after", "relative_error", "svd_method"}
    assert down["shape"] == [768, 256] and down["svd_method"] == "lapack"
    totals = raw["totals"]
    assert totals["params_before"] == manifest.params_before and totals["params_after"] == manifest.params_after
    assert totals["compression_ratio"] == manifest.compression_ratio
    assert totals["max_relative_error"] == max(manifest.errors())


def test_default_align_and_rank_overrides(tmp_path, fp32_model):
    model, weights = fp32_model
    manifest = compress_model(model, tmp_path / "a", 0.8)
    assert manifest.ranks == dict.fromkeys(PROJ, block_aligned_rank(256, 768, 0.8)) == dict.fromkeys(PROJ, 128)
    manifest = compress_model(model, tmp_path / "b", 0.5, align=32, ranks={"down": 70, "up": 256})
    assert manifest.ranks == {"gate": block_aligned_rank(256, 768, 0.5, 32), "up": 256, "down": 70}
    entry = manifest.layers[0].projections["down"]
    assert entry.relative_error == pytest.approx(optimal_error(weights[0, "down"], 70), rel=1e-5)
    assert manifest.layers[0].projections["up"].relative_error < 1e-5  # full rank
    with safe_open(tmp_path / "b" / "layer_000.safetensors", framework="np") as handle:
        assert handle.get_slice("model.layers.0.mlp.down_proj.u").get_shape() == [768, 70]


@pytest.mark.parametrize(("ranks", "error"), [
    ({"o": 64}, UnknownNameError), ({"down": 0}, InputError), ({"gate": 257}, InputError), ({"up": True}, InputError),
])
def test_bad_rank_overrides(tmp_path, fp32_model, ranks, error):
    with pytest.raises(error):
        compress_model(fp32_model[0], tmp_path / "out", 0.8, ranks=ranks)
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("kwargs", [{"keep_ratio": 0.0}, {"keep_ratio": 1.5}, {"keep_ratio": 0.8, "align": 0},
                                    {"keep_ratio": 0.8, "dtype": "int8"}, {"keep_ratio": 0.8, "threads": 0}])
def test_bad_settings_are_input_errors(tmp_path, fp32_model, kwargs):
    with pytest.raises(InputError):
        compress_model(fp32_model[0], tmp_path / "out", **kwargs)


def test_gram_route_matches_lapack(tmp_path, fp32_model, reference_run, monkeypatch):
    """With every matrix forced through the Gram eigendecomposition the errors match LAPACK's."""
    monkeypatch.setattr(svd_module, "LAPACK_MAX_DIM", 0)
    manifest = compress_model(fp32_model[0], tmp_path / "out", 0.8, align=32)
    for gram_layer, lapack_layer in zip(manifest.layers, reference_run[1].layers, strict=True):
        for proj in PROJ:
            gram, lapack = gram_layer.projections[proj], lapack_layer.projections[proj]
            assert gram.method == "gram" and lapack.method == "lapack"
            assert gram.relative_error == pytest.approx(lapack.relative_error, rel=1e-5)


@pytest.mark.parametrize("shape", [(200, 600), (600, 200), (64, 64)])
def test_truncated_svd_methods_agree(shape):
    rng = np.random.default_rng(3)
    w = rng.standard_normal(shape).astype(np.float32)
    rank = 48
    best = optimal_error(w, rank)
    results = {method: truncated_svd(w, rank, method) for method in ("lapack", "gram")}
    for factors in results.values():
        assert factors.u.shape == (shape[0], rank) and factors.v.shape == (rank, shape[1])
        assert relative_error(w, factors.u, factors.v) == pytest.approx(best, rel=1e-6)
    np.testing.assert_allclose(results["gram"].u, results["lapack"].u, atol=1e-4)
    # exactly low-rank input: the Gram route drops the null components instead of dividing by ~0
    low = (rng.standard_normal((300, 4)) @ rng.standard_normal((4, 500))).astype(np.float32)
    factors = truncated_svd(low, 32, "gram")
    assert np.all(np.isfinite(factors.v)) and relative_error(low, factors.u, factors.v) < 1e-6
    with pytest.raises(InputError):
        truncated_svd(w, 0)
    with pytest.raises(InputError):
        truncated_svd(w, rank, "randomized")


def test_bf16_factors(tmp_path, fp32_model, reference_run):
    manifest = compress_model(fp32_model[0], tmp_path / "out", 0.8, align=32, dtype="model")  # model is bf16
    assert manifest.dtype == "bfloat16"
    with safe_open(tmp_path / "out" / "layer_001.safetensors", framework="np") as handle:
        assert handle.get_slice("model.layers.1.mlp.up_proj.v").get_dtype() == "BF16"
        u = read_raw_tensor(tmp_path / "out" / "layer_001.safetensors", "model.layers.1.mlp.up_proj.u")
        v = read_raw_tensor(tmp_path / "out" / "layer_001.safetensors", "model.layers.1.mlp.up_proj.v")
    w = fp32_model[1][1, "up"]
    entry = manifest.layers[1].projections["up"]
    assert relative_error(w, u, v) == pytest.approx(entry.relative_error, rel=1e-12)
    fp32_error = reference_run[1].layers[1].projections["up"].relative_error
    assert fp32_error <= entry.relative_error < fp32_error * 1.05


def test_bf16_weights_read_exactly(tmp_path):
    model, weights = make_model(tmp_path / "model", "bfloat16")
    reader = WeightReader(model)
    name = "model.layers.1.mlp.down_proj.weight"
    assert reader.info(name) == ("BF16", (HIDDEN, INTERMEDIATE))
    primary = reader.read(name)
    fallback = read_raw_tensor(model / "model.safetensors", name)  # the uint16-widening path
    assert primary.dtype == fallback.dtype == np.float32
    np.testing.assert_array_equal(primary, fallback)
    np.testing.assert_array_equal(primary, weights[1, "down"].T)
    bits = np.array([0x3F80, 0xC000, 0x7F80, 0x0001], dtype=np.uint16)
    np.testing.assert_array_equal(bf16_to_f32(bits), bits.view(ml_dtypes.bfloat16).astype(np.float32))


def test_only_mlp_weights_are_read_one_at_a_time(tmp_path, fp32_model, monkeypatch):
    read = []
    original = WeightReader.read

    def spy(self, name, shape=None):
        read.append(name)
        return original(self, name, shape)

    monkeypatch.setattr(WeightReader, "read", spy)
    compress_model(fp32_model[0], tmp_path / "out", 0.8)
    config = read_config(fp32_model[0])
    assert read == [f"model.layers.{i}.mlp.{p}_proj.weight" for i in range(config.num_hidden_layers) for p in PROJ]


class Crash(Exception):
    pass


def crash_after(k: int):
    def progress(done, total):
        if done >= k:
            raise Crash(done)
    return progress


def test_crash_then_resume_is_byte_identical_and_skips_finished_layers(tmp_path, fp32_model, reference_run):
    out = tmp_path / "out"
    with pytest.raises(Crash):
        compress_model(fp32_model[0], out, 0.8, align=32, progress=crash_after(5))  # dies inside layer 1
    assert sorted(p.name for p in out.iterdir()) == ["layer_000.safetensors"]  # no temp file, no manifest
    calls = []
    compress_model(fp32_model[0], out, 0.8, align=32, progress=lambda d, t: calls.append((d, t)))
    assert calls == [(i, 9) for i in range(4, 10)]  # layer 0 was resumed, layers 1 and 2 computed
    assert files_bytes(out) == files_bytes(reference_run[0])


def test_deleted_layer_and_manifest_are_rebuilt_identically(tmp_path, reference_run, fp32_model):
    out = tmp_path / "out"
    shutil.copytree(reference_run[0], out)
    (out / "layer_001.safetensors").unlink()
    (out / "manifest.json").unlink()
    calls = []
    compress_model(fp32_model[0], out, 0.8, align=32, progress=lambda d, t: calls.append(d))
    assert calls == [7, 8, 9]
    assert files_bytes(out) == files_bytes(reference_run[0])
    calls.clear()  # a complete directory: nothing recomputed, same manifest
    assert compress_model(fp32_model[0], out, 0.8, align=32, progress=lambda d, t: calls.append(d)) == reference_run[1]
    assert calls == [] and files_bytes(out) == files_bytes(reference_run[0])


def test_invalid_or_stale_layer_files_are_recomputed(tmp_path, reference_run, fp32_model):
    out = tmp_path / "out"
    shutil.copytree(reference_run[0], out)
    data = (out / "layer_002.safetensors").read_bytes()
    (out / "layer_002.safetensors").write_bytes(data[: len(data) // 2])  # truncated
    (out / "layer_000.safetensors").write_bytes(b"")  # empty
    (out / ".layer_001.safetensors.123.abcd.tmp").write_bytes(b"partial")  # left by a killed run
    calls = []
    compress_model(fp32_model[0], out, 0.8, align=32, progress=lambda d, t: calls.append(d))
    assert calls == [4, 5, 6, 7, 8, 9]
    assert files_bytes(out) == files_bytes(reference_run[0])
    calls.clear()  # other settings: every layer is recomputed
    manifest = compress_model(fp32_model[0], out, 0.6, align=32, progress=lambda d, t: calls.append(d))
    assert len(calls) == 9 and manifest.ranks["gate"] == block_aligned_rank(256, 768, 0.6, 32)


def _rewrite_tensor(model_dir: Path, name: str, change) -> None:
    """Rewrite model.safetensors with ``name`` replaced by ``change(old)``, every other tensor as it was."""
    with safe_open(str(model_dir / "model.safetensors"), framework="np") as handle:
        names = list(handle.keys())
        tensors = {key: handle.get_tensor(key) for key in names}
    tensors[name] = change(tensors[name])
    save_file(tensors, model_dir / "model.safetensors", metadata={"format": "pt"})


def test_weights_changed_before_a_resume_are_recompressed(tmp_path, reference_run):
    """A finished layer file records a digest of the weights it was made from: a resume after one layer's weight
    changed recomputes that layer only, and its factors are those of the new weight."""
    model, weights = make_model(tmp_path / "model")
    out = tmp_path / "out"
    compress_model(model, out, 0.8, align=32)
    assert files_bytes(out) == files_bytes(reference_run[0])
    name = "model.layers.1.mlp.up_proj.weight"
    _rewrite_tensor(model, name, lambda w: w * 2)
    calls = []
    manifest = compress_model(model, out, 0.8, align=32, progress=lambda d, t: calls.append(d))
    assert calls == [7, 8, 9]  # layers 0 and 2 reused, layer 1 recomputed
    with safe_open(str(out / "layer_001.safetensors"), framework="np") as handle:
        u, v = handle.get_tensor("model.layers.1.mlp.up_proj.u"), handle.get_tensor("model.layers.1.mlp.up_proj.v")
    w_new = 2 * weights[1, "up"]
    assert relative_error(w_new, u, v) == pytest.approx(optimal_error(w_new, manifest.ranks["up"]), rel=1e-5)
    calls.clear()  # a weight outside the MLPs does not touch the layer files
    _rewrite_tensor(model, "model.embed_tokens.weight", lambda w: w + 1)
    compress_model(model, out, 0.8, align=32, progress=lambda d, t: calls.append(d))
    assert calls == []


def test_the_weight_digest_covers_bytes_names_and_order(tmp_path, fp32_model):
    reader = WeightReader(fp32_model[0])
    names = ["model.layers.0.mlp.gate_proj.weight", "model.layers.0.mlp.up_proj.weight"]
    assert reader.digest(names) == WeightReader(fp32_model[0]).digest(names) != reader.digest(names[::-1])
    assert len(reader.digest()) == 16 and reader.digest() != reader.digest(names)
    copy = tmp_path / "copy"
    shutil.copytree(fp32_model[0], copy)

    def one_ulp(w):
        w = w.copy()
        w.flat[7] = np.nextafter(w.flat[7], np.inf)
        return w

    _rewrite_tensor(copy, names[1], one_ulp)
    assert WeightReader(copy).digest(names[:1]) == reader.digest(names[:1])
    assert WeightReader(copy).digest(names) != reader.digest(names)
    data = (copy / "model.safetensors").read_bytes()
    (copy / "model.safetensors").write_bytes(data[: len(data) - 100])
    with pytest.raises(InputError, match=r"not a readable safetensors file|cut short"):
        WeightReader(copy).digest()


def test_a_healing_checkpoint_is_keyed_by_every_weight_of_the_model(tmp_path):
    """Fine-tuning distils from the whole original model, whose LM head and final norm feed no calibration Gram: its
    checkpoints' identity holds a digest of every tensor, so a changed weight anywhere starts them afresh."""
    from types import SimpleNamespace

    from neuronmm_compiler.compression.heal_steps import _finetune_identity

    model, _ = make_model(tmp_path / "model")
    request = SimpleNamespace(model_dir=str(model), damping=0.01, heal_damping=1e-4, heal_target="healed",
                              heal_prior=1.0, heal_metric="mlp-output")
    calibration = SimpleNamespace(digest=lambda: "c0ffee")
    before = _finetune_identity(request, calibration)
    assert before == _finetune_identity(request, calibration)
    _rewrite_tensor(model, "model.embed_tokens.weight", lambda w: w + 1)
    after = _finetune_identity(request, calibration)
    assert after["source"] != before["source"] and {**after, "source": 0} == {**before, "source": 0}


def test_model_directory_errors(tmp_path, fp32_model):
    empty = tmp_path / "no-weights"
    empty.mkdir()
    shutil.copy(FIXTURES / "tiny-llama.json", empty / "config.json")
    with pytest.raises(InputError, match=r"no model\.safetensors or model\.safetensors\.index\.json"):
        compress_model(empty, tmp_path / "out", 0.8)
    wrong = tmp_path / "wrong-shape"
    shutil.copytree(fp32_model[0], wrong)
    raw = json.loads((wrong / "config.json").read_text())
    raw["intermediate_size"] = 512
    (wrong / "config.json").write_text(json.dumps(raw))
    with pytest.raises(InputError, match=r"gate_proj.weight' has shape \[768, 256\]; the config implies \[512, 256\]"):
        compress_model(wrong, tmp_path / "out", 0.8)
    raw["intermediate_size"], raw["num_hidden_layers"] = 768, 4
    (wrong / "config.json").write_text(json.dumps(raw))
    with pytest.raises(InputError, match=r"'model.layers.3.mlp.gate_proj.weight' not found"):
        compress_model(wrong, tmp_path / "out", 0.8)
    with pytest.raises(InputError, match="model directory not found"):
        compress_model(FIXTURES / "tiny-llama.json", tmp_path / "out", 0.8)
    shutil.copy(FIXTURES / "unknown-architecture.json", empty / "config.json")
    with pytest.raises(InputError, match="unsupported architecture"):
        compress_model(empty, tmp_path / "out", 0.8)


def test_read_manifest_errors(tmp_path, reference_run):
    with pytest.raises(InputError, match="manifest not found"):
        read_manifest(tmp_path)
    (tmp_path / "manifest.json").write_text("{oops")
    with pytest.raises(InputError, match="malformed JSON"):
        read_manifest(tmp_path / "manifest.json")
    (tmp_path / "manifest.json").write_text(json.dumps({"format": "other"}))
    with pytest.raises(InputError, match="malformed nmmc manifest"):
        read_manifest(tmp_path)
    raw = json.loads((reference_run[0] / "manifest.json").read_text())
    del raw["layers"][0]["projections"]["up"]
    (tmp_path / "manifest.json").write_text(json.dumps(raw))
    with pytest.raises(InputError, match="malformed nmmc manifest"):
        read_manifest(tmp_path)


def test_bf16_fallback_when_safetensors_cannot_give_numpy_bf16(tmp_path, monkeypatch):
    """Older safetensors cannot return bf16 to NumPy: the reader then widens the raw uint16 bits."""
    from neuronmm_compiler.checkpoints import weights as weights_module

    model, weights = make_model(tmp_path / "model", "bfloat16")
    real_open = weights_module.safe_open

    class NoBf16:
        def __init__(self, *args, **kwargs):
            self.handle = real_open(*args, **kwargs)

        def __enter__(self):
            self.inner = self.handle.__enter__()
            return self

        def __exit__(self, *exc):
            return self.handle.__exit__(*exc)

        def keys(self):
            return self.inner.keys()

        def get_slice(self, name):
            return self.inner.get_slice(name)

        def get_tensor(self, name):
            if self.inner.get_slice(name).get_dtype() == "BF16":
                raise TypeError("data type 'bfloat16' not understood")
            return self.inner.get_tensor(name)

    monkeypatch.setattr(weights_module, "safe_open", NoBf16)
    reader = WeightReader(model)
    np.testing.assert_array_equal(reader.read("model.layers.0.mlp.gate_proj.weight"), weights[0, "gate"].T)


def test_svd_accuracy_script_runs_on_a_small_shape():
    from neuronmm_compiler.compression.svd_accuracy import measure

    (row,) = measure(shapes={"small": (256, 640)}, randomized=True)
    assert row.rank == block_aligned_rank(256, 640, 0.8) and set(row.results) == {"full", "gram", "randomized"}
    full, gram, randomized = (row.results[m][1] for m in ("full", "gram", "randomized"))
    assert gram == pytest.approx(full, rel=1e-6) and randomized >= full * (1 - 1e-6)
    assert "small" in row.format()


def test_output_files_get_the_usual_permissions(reference_run):
    out = reference_run[0]
    modes = {path.name: path.stat().st_mode & 0o777 for path in out.iterdir()}
    assert len(set(modes.values())) == 1, modes  # layer files like the manifest (safetensors alone would give 0600)


def test_a_foreign_manifest_is_not_overwritten(tmp_path, fp32_model):
    out = tmp_path / "out"
    out.mkdir()
    (out / "manifest.json").write_text('{"files": ["something else"]}')
    with pytest.raises(InputError, match="is not an nmmc manifest"):
        compress_model(fp32_model[0], out, 0.8)
    assert (out / "manifest.json").read_text() == '{"files": ["something else"]}'


def test_a_nan_weight_is_one_line_naming_the_tensor(tmp_path):
    """Once a LinAlgError traceback (issue 14, item 11)."""
    from safetensors.numpy import load_file

    model, _ = make_model(tmp_path / "m")
    tensors = load_file(model / "model.safetensors")
    tensors["model.layers.1.mlp.up_proj.weight"][3, 5] = np.nan
    save_file(tensors, model / "model.safetensors", metadata={"format": "pt"})
    result = CliRunner().invoke(main, ["compress", str(model), "--keep-ratio", "0.5", "-o", str(tmp_path / "out")])
    assert result.exit_code == 2, result.output
    assert "model.layers.1.mlp.up_proj.weight" in result.stderr and "NaN" in result.stderr
    *before, error = result.stderr.strip().splitlines()  # the error is one line; before it only the planned ranks
    assert error.startswith("nmmc: error: ") and "NaN" in error
    assert [line.split(":")[1] for line in before] == [" note"] and "0.667 of the MLP parameters kept" in before[0]
    # the note comes once the inputs are checked: it is no part of a user error's one line


@pytest.mark.parametrize(("field", "value"), [("num_hidden_layers", 1_000_000_000), ("hidden_size", 2**40)])
def test_absurd_config_sizes_are_refused_not_looped_over(tmp_path, field, value):
    model, _ = make_model(tmp_path / "m")
    config = json.loads((model / "config.json").read_text())
    config[field] = value
    (model / "config.json").write_text(json.dumps(config))
    result = CliRunner().invoke(main, ["compress", str(model), "--keep-ratio", "0.5", "-o", str(tmp_path / "out")])
    assert result.exit_code == 2 and f"field '{field}' is {value}; nmmc accepts at most" in result.stderr
    assert not (tmp_path / "out").exists()

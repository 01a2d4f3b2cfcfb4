"""nmmc export: the package it writes, verified kernel by kernel, and a small Llama-architecture torch model whose
MLPs it replaces matching the unpatched model's logits (dense and SVD, two buckets, tp 1 and tp 2 emulated)."""

from __future__ import annotations

import importlib
import json
import sys
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from neuronmm_compiler.cli import main
from neuronmm_compiler.export import ExportRequest, export_model
from neuronmm_compiler.export.manifest import schema
from neuronmm_compiler.export.verify import verify_dir
from neuronmm_compiler.targets import get_target, with_launch

torch = pytest.importorskip("torch", reason="the export runtime needs the 'torch' extra")

from neuronmm_compiler.export.runtime.llama import LlamaForCausalLM  # noqa: E402 - needs torch

pytestmark = pytest.mark.usefixtures("one_polish_start")  # what surrounds a search, not the search (conftest.py)

CONFIG = {"model_type": "llama", "architectures": ["LlamaForCausalLM"], "hidden_size": 256, "intermediate_size": 640,
          "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 128,
          "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "torch_dtype": "float32", "tie_word_embeddings": False,
          "_name_or_path": "tiny-llama"}
BUCKETS = (4, 16)
#: Logit tolerance: bf16 kernel arguments and outputs (relative rounding 2^-8) through two layers.
TOLERANCE = 2e-2


def _decaying(rows: int, cols: int, rng: np.random.Generator) -> torch.Tensor:
    """A weight whose singular values decay, as trained weights' do (so an SVD at keep ratio 0.8 is close), large
    enough that the MLPs move the logits far more than the kernels' rounding does."""
    rank = min(rows, cols)
    left, _ = np.linalg.qr(rng.standard_normal((rows, rank)))
    right, _ = np.linalg.qr(rng.standard_normal((cols, rank)))
    return torch.from_numpy(((left * np.exp(-np.arange(rank) / 24.0)) @ right.T * 96 / cols ** 0.5).astype(np.float32))


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory) -> Path:
    """A Hugging Face style checkpoint of a 2-layer Llama (deterministic weights)."""
    return write_checkpoint(tmp_path_factory.mktemp("model"))


def write_checkpoint(directory: Path) -> Path:
    """Write a 2-layer Llama checkpoint (config.json, model.safetensors; deterministic, decaying MLP spectra) into
    ``directory``."""
    from safetensors.torch import save_file

    torch.set_num_threads(1)  # tiny tensors: threads only contend with the interpreter (and other test workers)
    torch.manual_seed(0)
    model = LlamaForCausalLM(CONFIG)
    rng = np.random.default_rng(1)
    state = {k: v.detach().contiguous() for k, v in model.state_dict().items()}
    for layer in range(CONFIG["num_hidden_layers"]):
        for proj, (rows, cols) in {"gate": (640, 256), "up": (640, 256), "down": (256, 640)}.items():
            state[f"model.layers.{layer}.mlp.{proj}_proj.weight"] = _decaying(rows, cols, rng).contiguous()
    (directory / "config.json").write_text(json.dumps(CONFIG))
    save_file(state, str(directory / "model.safetensors"))
    return directory


@pytest.fixture(scope="module")
def factors(tiny_model, tmp_path_factory) -> Path:
    from neuronmm_compiler.compression import compress_model

    out = tmp_path_factory.mktemp("factors") / "f"
    compress_model(tiny_model, out, keep_ratio=0.8)
    return out


@pytest.fixture(scope="module")
def exports(tiny_model, factors, tmp_path_factory):
    """export(kind, tp) -> the package directory, each exported once per module (LNC=2, buckets 4 and 16)."""
    made: dict[tuple[str, int], Path] = {}
    root = tmp_path_factory.mktemp("exports")

    def get(kind: str, tp: int) -> Path:
        if (kind, tp) not in made:
            made[kind, tp] = root / f"nmmc_{kind}_tp{tp}"
            _export(tiny_model if kind == "dense" else factors, made[kind, tp], tp)
        return made[kind, tp]

    return get


def _export(source: Path, out: Path, tp: int, lnc: int = 2) -> dict:
    target = with_launch(get_target(f"trn2:lnc={lnc}"), "in-graph")
    return export_model(ExportRequest(model=str(source), buckets=BUCKETS, target=target, dialect="nki", tp=tp,
                                      trials=8), out)


def _import(package_dir: Path):
    sys.path.insert(0, str(package_dir.parent))
    try:
        importlib.invalidate_caches()
        return importlib.import_module(package_dir.name)
    finally:
        sys.path.pop(0)


def _svd_reference(model_dir: Path, factors_dir: Path) -> LlamaForCausalLM:
    """The unpatched model with each MLP weight replaced by its factors' product (what the SVD kernels compute)."""
    from safetensors.torch import load_file

    model = LlamaForCausalLM.from_pretrained(model_dir)
    for layer, block in enumerate(model.model.layers):
        stored = load_file(str(factors_dir / f"layer_{layer:03d}.safetensors"))
        for proj in ("gate", "up", "down"):
            prefix = f"model.layers.{layer}.mlp.{proj}_proj"
            w = stored[f"{prefix}.u"].double() @ stored[f"{prefix}.v"].double()
            getattr(block.mlp, f"{proj}_proj").weight.data = w.T.float().contiguous()
    return model


@pytest.mark.parametrize(("kind", "tp"), [("dense", 1), ("dense", 2), ("svd", 1), ("svd", 2)])
def test_patched_model_matches_the_unpatched_logits(tiny_model, factors, exports, kind, tp):
    """The patched model's logits match the unpatched model's (for SVD: the model whose MLP weights are the
    factors' products) within bf16 tolerance, for prompts that fall in both buckets (3 and 14 tokens) and one
    longer than the largest (2 x 11 = 22 tokens: chunks)."""
    weights = tiny_model if kind == "dense" else factors
    package = exports(kind, tp)
    manifest = json.loads((package / "manifest.json").read_text())
    assert manifest["mlp"] == kind and manifest["tp"]["degree"] == tp and manifest["lnc"] == 2
    pkg = _import(package)
    reference = LlamaForCausalLM.from_pretrained(tiny_model) if kind == "dense" else _svd_reference(tiny_model,
                                                                                                    factors)
    patched = LlamaForCausalLM.from_pretrained(tiny_model)
    assert pkg.patch(patched, weights, emulate_tp=tp > 1, backend="interpreter") == [0, 1]
    generator = torch.Generator().manual_seed(2)
    no_mlp = LlamaForCausalLM.from_pretrained(tiny_model)
    for block in no_mlp.model.layers:
        block.mlp.down_proj.weight.data.zero_()
    with torch.no_grad():
        for shape in ((1, 3), (2, 7), (2, 11)):
            ids = torch.randint(0, CONFIG["vocab_size"], shape, generator=generator)
            expected, got = reference(ids), patched(ids)
            scale = expected.abs().max().item()
            error = (got - expected).abs().max().item() / scale
            assert error < TOLERANCE, (kind, tp, shape, error)
            # the MLPs matter: without them the logits are off by far more than the kernels' error
            assert (no_mlp(ids) - expected).abs().max().item() / scale > max(10 * error, TOLERANCE)


def test_export_package_verifies_and_matches_its_schema(exports):
    """`nmmc verify DIR` passes for a dense export at tp 1 (kernel files) and an SVD one at tp 2 (plans); the
    manifest validates against its JSON Schema (also shipped in the package) and states each argument's shape,
    dtype and layout."""
    import jsonschema

    for out in (exports("dense", 1), exports("svd", 2)):
        manifest = json.loads((out / "manifest.json").read_text())
        jsonschema.validate(manifest, schema())
        assert json.loads((out / "manifest.schema.json").read_text()) == schema()
        result = CliRunner().invoke(main, ["verify", str(out)])
        assert result.exit_code == 0, result.output
        assert "OK: every kernel verifies" in result.output
    assert "plan.json" in result.output
    assert CliRunner().invoke(main, ["verify", str(out / "manifest.json"), "--json"]).exit_code == 0
    assert manifest["layers"] == ["svd-bf16-r128-128-128"] * 2 and manifest["activation_dtype"] == "bfloat16"
    bucket = manifest["groups"]["svd-bf16-r128-128-128"]["buckets"][0]
    function = next(iter(bucket["kernels"].values()))["functions"][0]
    assert function["arguments"][0] == {"name": "x", "shape": [4, 256], "dtype": "bfloat16", "layout": "row_major"}
    assert bucket["predicted"]["band_us"][0] < bucket["predicted"]["total_us"] < bucket["predicted"]["band_us"][1]
    assert bucket["predicted"]["launch"]["context"] == "in-graph" and bucket["predicted"]["comm_us"] > 0


def test_verify_reports_a_manifest_that_contradicts_its_kernels(tiny_model, tmp_path):
    out = tmp_path / "pkg"
    _export(tiny_model, out, tp=1, lnc=1)
    manifest = json.loads((out / "manifest.json").read_text())
    manifest["groups"]["dense-bf16"]["buckets"][0]["kernels"]["mlp"]["functions"][0]["arguments"][0]["shape"] = [5, 256]
    (out / "manifest.json").write_text(json.dumps(manifest))
    report = verify_dir(out)
    assert not report.ok and any("differ" in (item.error or "") for item in report.items)


def test_weights_of_the_wrong_kind_or_shape_are_refused(tiny_model, factors, tmp_path):
    out = tmp_path / "pkg_svd"
    _export(factors, out, tp=1, lnc=1)
    pkg = _import(out)
    with pytest.raises(FileNotFoundError, match="nmmc compress"):
        pkg.mlp(tiny_model, layer=0)  # an SVD package given the dense checkpoint
    module = pkg.mlp(factors, layer=1)
    assert module(torch.zeros(2, 3, 256)).shape == (2, 3, 256)


def test_device_launch_uses_the_manifests_lnc(tmp_path, monkeypatch):
    """On a Neuron device the kernel is launched as NxD Inference launches its own (``kernel[lnc](...)``); a
    NEURON_LOGICAL_NC_CONFIG naming another degree is refused before neuronx-cc would fail with NCC_EVRF066."""
    from neuronmm_compiler.export.runtime.backend import KernelRunner

    class Grid:
        def __init__(self):
            self.grids = []

        def __getitem__(self, grid):
            self.grids.append(grid)
            return self

    runner = KernelRunner(tmp_path, {"lnc": 2, "dialect": "nki", "target": "trn2:lnc=2"})
    kernel = Grid()
    monkeypatch.delenv("NEURON_LOGICAL_NC_CONFIG", raising=False)
    assert runner.launcher(kernel) is kernel and kernel.grids == [2]
    monkeypatch.setenv("NEURON_LOGICAL_NC_CONFIG", "1")
    with pytest.raises(RuntimeError, match="NCC_EVRF066"):
        runner.launcher(kernel)
    one = KernelRunner(tmp_path, {"lnc": 1, "dialect": "nki", "target": "trn1"})
    monkeypatch.setenv("NEURON_LOGICAL_NC_CONFIG", "1")
    assert one.launcher(kernel) is kernel and kernel.grids == [2]


def test_export_cli_from_a_shipped_name_and_its_help(tmp_path):
    """The issue's command at a reduced search: a shipped name, buckets 1 and 128, trn2 (LNC=2 by default)."""
    out = tmp_path / "pkg"
    result = CliRunner().invoke(main, ["export", "llama-3.2-1b", "--tokens", "1,128", "--target", "trn2",
                                       "--trials", "4", "--no-progress", "-o", str(out)])
    assert result.exit_code == 0, result.output + result.stderr
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["target"] == "trn2:lnc=2:launch=in-graph" and manifest["launch"]["call"] == "kernel[2](*args)"
    assert manifest["mlp"] == "dense" and [b["tokens"] for b in manifest["groups"]["dense-bf16"]["buckets"]] == [1, 128]
    # the predicted latencies say how far to trust them (the manifest's model_error, also where no band exists)
    note = manifest["groups"]["dense-bf16"]["buckets"][0]["predicted"]["model_error"]
    assert f"latencies are the cost model's, not measured: {note}" in result.output
    assert {p.name for p in out.iterdir()} >= {"__init__.py", "weights.py", "module.py", "patch.py", "backend.py",
                                               "manifest.json", "manifest.schema.json", "kernels"}
    help_text = CliRunner().invoke(main, ["export", "--help"]).output
    for option in ("--tokens", "--tp", "--lnc", "--target", "--dtype", "--keep-ratio", "--dense", "-o"):
        assert option in help_text
    bad = CliRunner().invoke(main, ["export", "no-such-model", "--tokens", "1", "-o", str(tmp_path / "x")])
    assert bad.exit_code == 2 and "model not found" in bad.stderr and not (tmp_path / "x").exists()

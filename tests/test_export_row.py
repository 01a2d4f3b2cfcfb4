"""FP8 kernels with per-token activation scales (``--act-scale row``) through ``nmmc export`` and ``nmmc tune --model``:
a dense FP8 row export of a checkpoint (weights quantized on the fly, nothing calibrated: the kernels compute each
token's scale) and an export of an ``nmmc compress --dtype fp8 --act-scale row`` output, patched into a tiny Llama,
match nmmc's FP8 row emulation (compression/formats.py, what ``compress --eval`` measures) eagerly and under
``torch.compile(fullgraph=True)``; ``tune --model`` of that output tunes row-scaled kernels; ``--tp`` is refused.

Kernels are compiled at their default schedule (no search) to keep the file cheap."""

from __future__ import annotations

import functools

import numpy as np
import pytest
from click.testing import CliRunner

from neuronmm_compiler.cli import main
from neuronmm_compiler.compression import read_manifest
from neuronmm_compiler.compression.formats import Fp8Layer, emulated_mlp
from neuronmm_compiler.compression.fp8_files import read_fp8_layer
from neuronmm_compiler.driver import compile_workload
from neuronmm_compiler.export import ExportRequest, export_model
from neuronmm_compiler.export.manifest import schema
from neuronmm_compiler.export.verify import verify_export
from neuronmm_compiler.ir.quantized import quantize_weight
from neuronmm_compiler.targets import get_target, with_launch

torch = pytest.importorskip("torch", reason="the export runtime needs the 'torch' extra")

from neuronmm_compiler.export.runtime.llama import LlamaForCausalLM  # noqa: E402 - needs torch
from test_export import CONFIG, _import, write_checkpoint  # noqa: E402
from test_export_fp8 import EMULATION_TOLERANCE, FP8_TOLERANCE, _emulated_model, _errors  # noqa: E402

TARGET = with_launch(get_target("trn2:lnc=2"), "in-graph")
PROJ = ("gate", "up", "down")

pytestmark = pytest.mark.usefixtures("one_blas_thread", "one_polish_start")  # tiny matrices (conftest.py)


def _kernel(workload):
    return compile_workload(workload, target=TARGET, dialect="nki")


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    return write_checkpoint(tmp_path_factory.mktemp("rowmodel"))


def test_row_export_of_a_checkpoint_needs_no_calibration_and_matches_the_emulation(checkpoint, tmp_path):
    """--dtype fp8 --act-scale row of a dense checkpoint: kernels with no activation-scale arguments (the manifest
    says the scales are per token), weights quantized by the runtime into nmmc's bytes; patched without any
    calibration, the model matches nmmc's FP8 row emulation and the unquantized model within FP8's error, and
    torch.compile(fullgraph=True) gives the eager logits."""
    import jsonschema

    out = tmp_path / "nmmc_row"
    manifest = export_model(ExportRequest(model=str(checkpoint), buckets=(16,), target=TARGET, dialect="nki",
                                          dtype="float8_e4m3", act_scale="row"), out, kernel_fn=_kernel)
    jsonschema.validate(manifest, schema())
    group = manifest["groups"]["dense-fp8"]
    assert manifest["weights"]["activation_scales"] == "row" and group["activation_scales"] == "row"
    assert set(group["tensors"]) == {"w_gate", "w_up", "w_down", "w_gate_scale", "w_up_scale", "w_down_scale"}
    pkg = _import(out)
    reference = LlamaForCausalLM.from_pretrained(checkpoint)
    loaded = pkg.weights.layer_arguments(manifest, checkpoint, 0)
    weights = {layer: {p: quantize_weight(getattr(reference.model.layers[layer].mlp, f"{p}_proj").weight.detach()
                                          .t().numpy(), "float8_e4m3") for p in PROJ} for layer in (0, 1)}
    assert np.array_equal(loaded["w_down"].view(torch.uint8).numpy(), weights[0]["down"][0].view(np.uint8))
    assert np.array_equal(loaded["w_down_scale"].numpy(), weights[0]["down"][1])
    patched = LlamaForCausalLM.from_pretrained(checkpoint)
    assert pkg.patch(patched, checkpoint, backend="interpreter") == [0, 1]  # no calibration= needed
    fp8 = {layer: Fp8Layer("float8_e4m3", w, {}, "row") for layer, w in weights.items()}
    emulated = _emulated_model(checkpoint, emulated_mlp({}, fp8=fp8))
    to_emulation, to_reference = _errors(patched, emulated, reference)
    assert to_emulation < EMULATION_TOLERANCE and to_emulation * 5 < to_reference < FP8_TOLERANCE, \
        (to_emulation, to_reference)
    ids = torch.randint(0, CONFIG["vocab_size"], (1, 20), generator=torch.Generator().manual_seed(4))  # 16 + 16
    graphs: list = []

    def backend(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    torch._dynamo.reset()
    try:
        with torch.no_grad():
            assert torch.equal(torch.compile(patched, backend=backend, fullgraph=True, dynamic=False)(ids),
                               patched(ids))
    finally:
        torch._dynamo.reset()
    assert sum(getattr(n.target, "namespace", None) == "nmmc" for gm in graphs for n in gm.graph.nodes) == 4


@pytest.fixture(scope="module")
def row_output(checkpoint, tmp_path_factory):
    """An `nmmc compress --keep-ratio 0.8 --dtype fp8 --act-scale row` output of the checkpoint (no calibration)."""
    out = tmp_path_factory.mktemp("rowf") / "f"
    run = CliRunner().invoke(main, ["compress", str(checkpoint), "--keep-ratio", "0.8", "--dtype", "fp8",
                                    "--act-scale", "row", "--sequence-length", "16", "-o", str(out)])
    assert run.exit_code == 0, run.output
    return out


def test_row_export_of_a_compress_output_follows_its_manifest(checkpoint, row_output, tmp_path):
    """The compress output's FP8 SVD layers (fp8.act_scale row, files without activation scales) export row-scaled
    kernels without any flag; patched, the model matches the emulation of those files; `nmmc verify` passes; a
    contradicting --act-scale and --tp 2 are refused in one line."""
    out = tmp_path / "nmmc_row_svd"
    manifest = export_model(ExportRequest(model=str(row_output), buckets=(16,), target=TARGET, dialect="nki"), out,
                            kernel_fn=_kernel)
    (name,) = manifest["groups"]
    assert name.startswith("svd-fp8-r") and manifest["groups"][name]["activation_scales"] == "row"
    assert not any(t.endswith(("x_scale", "h_scale", "x_ug_scale")) for t in manifest["groups"][name]["tensors"])
    pkg = _import(out)
    patched = LlamaForCausalLM.from_pretrained(checkpoint)
    assert pkg.patch(patched, row_output, backend="interpreter") == [0, 1]
    ranks = read_manifest(row_output).layer_ranks()
    layers = {n: read_fp8_layer(row_output / f"layer_{n:03d}.safetensors", n, ranks[n], "float8_e4m3", "row")
              for n in (0, 1)}
    emulated = _emulated_model(checkpoint, emulated_mlp({}, fp8={n: layer for n, (layer, _) in layers.items()}))
    unquantized = _emulated_model(checkpoint, emulated_mlp({n: d for n, (_, d) in layers.items()},
                                                           kernel_dtype="float32"))
    to_emulation, to_reference = _errors(patched, emulated, unquantized)
    assert to_emulation < EMULATION_TOLERANCE and to_emulation * 5 < to_reference < FP8_TOLERANCE, \
        (to_emulation, to_reference)
    report = verify_export(out)
    assert report.ok, report.lines(str(out))
    for extra, says in ((["--act-scale", "static"], "FP8 layers with row activation scales"),
                        (["--tp", "2"], "per-token activation scales (--act-scale row) are not sharded")):
        refused = CliRunner().invoke(main, ["export", str(row_output), "--tokens", "4", *extra, "-o",
                                            str(tmp_path / "p")])
        assert refused.exit_code == 2 and says in refused.output, refused.output
        assert len(refused.output.strip().splitlines()) == 1 and not (tmp_path / "p").exists()


def test_tune_model_tunes_row_scaled_kernels_for_a_row_output(row_output, tmp_path):
    """`tune --model` of the row-scaled compress output no longer refuses it: its recorded format is tuned with
    per-token scales (format svd-fp8-row; the kernel takes no activation scale and reduces each token's absmax)."""
    from neuronmm_compiler.model_tuning.pipeline import resolve_model, tune_model
    from test_model_formats import _compile_default

    source = resolve_model(row_output, None)
    assert source.act_scale == "row"
    index = tune_model(source, [4], tmp_path / "k", target=TARGET, dialect="nki",
                       tune_bucket=functools.partial(_compile_default, target=TARGET))
    (bucket,) = index["buckets"]
    assert bucket["chosen_format"] == "svd-fp8-row" and index["formats_allowed"] == ["svd-fp8-row", "dense-fp8-row"]
    kernel = (tmp_path / "k" / bucket["file"]).read_text()
    assert "row activation scales" in kernel and '"x_scale"' not in kernel

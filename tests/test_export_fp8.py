"""nmmc export with FP8 kernels: a dense FP8 export of a Hugging Face checkpoint (weights quantized on the fly,
activation scales calibrated on the unpatched model) and an export of an ``nmmc compress`` output whose layers
differ in format and ranks (an FP8 dense layer, a bf16 SVD layer: two kernel groups), each patched into a tiny
Llama-architecture torch model and compared with nmmc's FP8 emulation of the same model (compression/formats.py, the
forward ``nmmc compress --eval`` measures) and with the unquantized model.

Kernels are compiled at their default schedule (no search) to keep the file cheap."""

from __future__ import annotations

import json

import ml_dtypes
import numpy as np
import pytest
from click.testing import CliRunner

from neuronmm_compiler.cli import main
from neuronmm_compiler.compression import read_manifest
from neuronmm_compiler.compression.formats import Fp8Layer, emulated_mlp, reduce_rank_mlp
from neuronmm_compiler.compression.fp8_files import read_fp8_layer
from neuronmm_compiler.driver import compile_workload
from neuronmm_compiler.export import ExportRequest, export_model
from neuronmm_compiler.export.manifest import schema
from neuronmm_compiler.export.verify import group_problems
from neuronmm_compiler.ir.quantized import activation_scale, quantize_weight
from neuronmm_compiler.targets import get_target, with_launch

torch = pytest.importorskip("torch", reason="the export runtime needs the 'torch' extra")

from neuronmm_compiler.export.runtime import fp8 as runtime_fp8  # noqa: E402 - needs torch
from neuronmm_compiler.export.runtime.llama import LlamaForCausalLM  # noqa: E402
from test_export import CONFIG, _import, write_checkpoint  # noqa: E402

TARGET = with_launch(get_target("trn2:lnc=2"), "in-graph")
#: Patched vs nmmc's FP8 emulation of the same kernels: they quantize the same bf16 activations with the same
#: scales, so they differ by fp32 accumulation order (which can move a value of h across an FP8 rounding boundary:
#: one e4m3 step is 2^-3 of its binade) and bf16 output rounding; measured ~2e-3 of the largest logit.
EMULATION_TOLERANCE = 1e-2
#: Patched FP8 vs the unquantized model: e4m3 keeps 3 mantissa bits (rounding error up to 2^-4 relative per
#: element, on x, h and every weight); nmmc verify measures 6-9% relative error of one FP8 MLP's output against the
#: unquantized one on Gaussian data (docs/quantization.md "Verification"). Through two layers and the residual stream
#: the
#: logits moved 3.4% of the largest logit here; the bound leaves 3x.
FP8_TOLERANCE = 0.1


def _kernel(workload):
    return compile_workload(workload, target=TARGET, dialect="nki")


pytestmark = pytest.mark.usefixtures("one_blas_thread")  # tiny matrices (conftest.py)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """A 2-layer Llama checkpoint (test_export's) and calibration token ids."""
    directory = write_checkpoint(tmp_path_factory.mktemp("fp8model"))
    calibration = torch.randint(0, CONFIG["vocab_size"], (2, 24), generator=torch.Generator().manual_seed(5))
    return directory, calibration


def _ranges(model, calibration) -> dict[int, dict[str, float]]:
    """max|x| and max|h| per layer over the calibration tokens in the unquantized model (independently of
    the runtime's calibrate)."""
    ranges: dict[int, dict[str, float]] = {}
    handles = []
    for layer, block in enumerate(model.model.layers):
        def note(point, value, layer=layer):
            seen = ranges.setdefault(layer, {})
            seen[point] = max(seen.get(point, 0.0), float(value.abs().max()))
        handles.append(block.mlp.register_forward_pre_hook(lambda _m, a, note=note: note("x", a[0])))
        handles.append(block.mlp.down_proj.register_forward_pre_hook(lambda _m, a, note=note: note("h", a[0])))
    with torch.no_grad():
        model(calibration)
    for handle in handles:
        handle.remove()
    return ranges


class _Emulated(torch.nn.Module):
    """One layer's MLP as nmmc's NumPy emulation of its kernel computes it, on the bf16 activations the exported
    module hands its kernel."""

    def __init__(self, mlp, layer: int):
        super().__init__()
        self.mlp, self.layer = mlp, layer

    def forward(self, x):
        rows = x.reshape(-1, x.shape[-1]).to(torch.bfloat16).float().numpy()
        return torch.from_numpy(np.asarray(self.mlp(self.layer, rows), np.float32)).reshape(x.shape)


def _emulated_model(directory, mlp) -> LlamaForCausalLM:
    model = LlamaForCausalLM.from_pretrained(directory)
    for layer, block in enumerate(model.model.layers):
        block.mlp = _Emulated(mlp, layer)
    return model


def _errors(patched, emulated, reference, shapes=((1, 3), (2, 11))) -> tuple[float, float]:
    """Largest logit error (of the largest logit) of the patched model against the emulation and the reference,
    over prompts ``shapes`` (by default in both buckets and one chunked past the largest)."""
    generator = torch.Generator().manual_seed(2)
    worst = [0.0, 0.0]
    with torch.no_grad():
        for shape in shapes:
            ids = torch.randint(0, CONFIG["vocab_size"], shape, generator=generator)
            got, expected = patched(ids), reference(ids)
            scale = expected.abs().max().item()
            worst[0] = max(worst[0], (got - emulated(ids)).abs().max().item() / scale)
            worst[1] = max(worst[1], (got - expected).abs().max().item() / scale)
    return worst[0], worst[1]


def test_runtime_quantization_is_nmmcs():
    """The package's torch quantization (no nmmc on a Neuron host) gives nmmc's bytes and scales, ties included."""
    rng = np.random.default_rng(3)
    weight = torch.from_numpy(rng.standard_normal((48, 40)).astype(np.float32)).to(torch.bfloat16).float()
    weight[0, :4] = torch.tensor([240.0, 0.0, -1e-3, 3.5])  # a channel whose values land on ties of the grid
    q, scale = runtime_fp8.quantize_weight(weight, "float8_e4m3")
    expected_q, expected_scale = quantize_weight(weight.t().numpy(), "float8_e4m3")
    assert np.array_equal(q.view(torch.uint8).numpy(), expected_q.view(np.uint8))
    assert np.array_equal(scale.numpy(), expected_scale)
    assert runtime_fp8.activation_scale(7.25, "float8_e4m3") == float(activation_scale(7.25, "float8_e4m3")[0, 0])


def _checkpoint_fp8(directory, calibration) -> tuple[dict[int, Fp8Layer], LlamaForCausalLM]:
    """(each layer's FP8 weights and calibrated static scales as nmmc computes them, the unquantized model)."""
    reference = LlamaForCausalLM.from_pretrained(directory)
    fp8 = {}
    for layer, points in _ranges(reference, calibration).items():
        weights = {p: quantize_weight(getattr(reference.model.layers[layer].mlp, f"{p}_proj").weight.detach()
                                      .t().numpy(), "float8_e4m3") for p in ("gate", "up", "down")}
        fp8[layer] = Fp8Layer("float8_e4m3", weights,
                              {p: float(activation_scale(v, "float8_e4m3")[0, 0]) for p, v in points.items()})
    return fp8, reference


def _megatron_emulation(fp8: dict[int, Fp8Layer], spans: list[tuple[int, int]]):
    """nmmc's FP8 emulation of Megatron ranks all-reduced: rank r computes the MLP of its intermediate columns
    (gate/up columns with their per-channel scales, down rows with down's whole scale, the shared static scales),
    its partial output rounded to bf16, the partials summed in float32 and rounded to bf16 (a bf16 all-reduce)."""
    def rank_layer(layer: Fp8Layer, a: int, b: int) -> Fp8Layer:
        (gq, gs), (uq, us), down = (layer.weights[p] for p in ("gate", "up", "down"))
        return Fp8Layer(layer.format, {"gate": (gq[:, a:b], gs.reshape(-1)[a:b]),
                                       "up": (uq[:, a:b], us.reshape(-1)[a:b]), "down": (down[0][a:b], down[1])},
                        layer.activation_scales)

    ranks = [emulated_mlp({}, fp8={n: rank_layer(layer, a, b) for n, layer in fp8.items()}) for a, b in spans]

    def mlp(layer: int, x: np.ndarray) -> np.ndarray:
        total = sum(np.asarray(rank(layer, x), np.float32) for rank in ranks)
        return np.asarray(total, np.float32).astype(ml_dtypes.bfloat16).astype(np.float32)

    return mlp


def test_fp8_export_of_a_checkpoint_matches_the_fp8_emulation(tiny, tmp_path):
    """--dtype fp8 of a dense checkpoint: FP8 kernels per bucket, the manifest stating each argument's dtype and the
    activations' separately; patched, the model matches nmmc's FP8 emulation closely and the unquantized model
    within FP8's error (a prompt per bucket and one chunked past the largest)."""
    import jsonschema

    directory, calibration = tiny
    out = tmp_path / "nmmc_fp8"
    manifest = export_model(ExportRequest(model=str(directory), buckets=(4, 16), target=TARGET, dialect="nki",
                                          dtype="float8_e4m3"), out, kernel_fn=_kernel)
    jsonschema.validate(manifest, schema())
    group = manifest["groups"]["dense-fp8"]
    assert manifest["layers"] == ["dense-fp8"] * 2 and manifest["activation_dtype"] == "bfloat16"
    assert group["tensors"]["w_gate"]["dtype"] == "float8_e4m3"
    assert group["tensors"]["w_gate"]["transform"] == "quantize"
    assert group["tensors"]["w_gate_scale"] == {**group["tensors"]["w_gate_scale"], "dtype": "float32",
                                                "shape": [640, 1], "transform": "channel_scale"}
    assert group["tensors"]["x_scale"]["from"] == "calibration"
    pkg = _import(out)
    patched = LlamaForCausalLM.from_pretrained(directory)
    with pytest.raises(ValueError, match="calibration"):
        pkg.patch(patched, directory, backend="interpreter")
    assert pkg.patch(patched, directory, calibration=calibration, backend="interpreter") == [0, 1]

    fp8, reference = _checkpoint_fp8(directory, calibration)
    emulated = _emulated_model(directory, emulated_mlp({}, fp8=fp8))
    to_emulation, to_reference = _errors(patched, emulated, reference)
    assert to_emulation < EMULATION_TOLERANCE, to_emulation
    assert to_emulation * 5 < to_reference < FP8_TOLERANCE, to_reference  # FP8 is on: far from the unquantized


def test_fp8_export_at_tp2_gives_each_rank_its_weight_and_scale_slices(tiny, tmp_path):
    """--dtype fp8 --tp 2 of a dense checkpoint: per-rank FP8 kernels (Megatron), each rank bound to its columns
    of gate/up with the matching rows of their per-channel scales, its rows of down with down's whole scale, and
    the activation scales shared; the runtime hands each rank those slices (the quantization of the whole weight,
    sliced), so the two rank modules all-reduced (emulated in one process) match nmmc's FP8 emulation of those
    ranks, and `nmmc verify` passes the plans."""
    import jsonschema

    directory, calibration = tiny
    out = tmp_path / "nmmc_fp8_tp2"
    manifest = export_model(ExportRequest(model=str(directory), buckets=(16,), target=TARGET, dialect="nki", tp=2,
                                          dtype="float8_e4m3"), out, kernel_fn=_kernel)
    jsonschema.validate(manifest, schema())
    group = manifest["groups"]["dense-fp8"]
    (bucket,) = group["buckets"]
    assert bucket["strategy"] == "megatron" and manifest["tp"]["degree"] == 2
    assert group["tensors"]["w_down_scale"]["shape"] == [256, 1]
    assert group["tensors"]["x_scale"]["from"] == group["tensors"]["h_scale"]["from"] == "calibration"
    for rank, span in enumerate(([0, 320], [320, 640])):
        (step, _) = bucket["ranks"][rank]["steps"]
        args = step["args"]
        assert args["w_gate"] == {"tensor": "w_gate", "cols": span} and args["w_down"] == {"tensor": "w_down",
                                                                                          "rows": span}
        assert args["w_gate_scale"] == {"tensor": "w_gate_scale", "rows": span} == {**args["w_up_scale"],
                                                                                   "tensor": "w_gate_scale"}
        assert args["w_down_scale"] == {"tensor": "w_down_scale"} and args["x_scale"] == {"tensor": "x_scale"}
        dtypes = {a["name"]: a["dtype"] for f in bucket["kernels"][step["kernel"]]["functions"]
                  for a in f["arguments"]}
        assert dtypes["w_gate"] == dtypes["w_down"] == "float8_e4m3" and dtypes["w_gate_scale"] == "float32"
    pkg = _import(out)
    scales = runtime_fp8.calibrate(LlamaForCausalLM.from_pretrained(directory), calibration)
    ranks = [pkg.weights.layer_arguments(manifest, directory, 0, rank, scales) for rank in (0, 1)]
    whole = runtime_fp8.quantize_weight(LlamaForCausalLM.from_pretrained(directory).model.layers[0].mlp.gate_proj
                                        .weight.detach(), "float8_e4m3")
    assert torch.equal(torch.cat([ranks[0]["w_gate_scale__rows_0_320"], ranks[1]["w_gate_scale__rows_320_640"]]),
                       whole[1])
    assert torch.equal(ranks[0]["w_down_scale"], ranks[1]["w_down_scale"])
    patched = LlamaForCausalLM.from_pretrained(directory)
    assert pkg.patch(patched, directory, calibration=calibration, emulate_tp=True, backend="interpreter") == [0, 1]
    fp8, reference = _checkpoint_fp8(directory, calibration)
    emulated = _emulated_model(directory, _megatron_emulation(fp8, [(0, 320), (320, 640)]))
    to_emulation, to_reference = _errors(patched, emulated, reference)
    assert to_emulation < EMULATION_TOLERANCE and to_emulation * 5 < to_reference < FP8_TOLERANCE, \
        (to_emulation, to_reference)
    result = CliRunner().invoke(main, ["verify", str(out)])
    assert result.exit_code == 0 and "OK: every kernel verifies" in result.output, result.output


def test_export_of_per_layer_formats_groups_the_layers(tiny, tmp_path):
    """An `nmmc compress` output whose layer 0 is dense FP8 and layer 1 SVD bf16 (as --choose-ranks --dtype fp8
    records them): one kernel group each, the layer files' FP8 bytes and scales read as they are, the patched
    model matching the emulation of those files, `nmmc verify` passing the package; a --dtype contradicting the
    recorded formats is refused."""
    from neuronmm_compiler.compression import compress_model
    from neuronmm_compiler.compression.compress_steps import load_factors

    directory, calibration = tiny
    ranges = _ranges(LlamaForCausalLM.from_pretrained(directory), calibration)
    factors = tmp_path / "f"
    compress_model(directory, factors, keep_ratio=0.8,
                   layer_ranks=[dict.fromkeys(("gate", "up", "down")), {"gate": 128, "up": 128, "down": 128}],
                   fp8={0: ("float8_e4m3", ranges[0])})
    assert read_manifest(factors).layer_formats() == ["float8_e4m3", "float32"]
    out = tmp_path / "nmmc_mixed"
    manifest = export_model(ExportRequest(model=str(factors), buckets=(16,), target=TARGET, dialect="nki"), out,
                            kernel_fn=_kernel)
    import jsonschema

    jsonschema.validate(manifest, schema())
    assert manifest["layers"] == ["dense-fp8", "svd-bf16-r128-128-128"] and manifest["mlp"] == "per layer"
    assert manifest["groups"]["svd-bf16-r128-128-128"]["tensors"]["u_gate"]["dtype"] == "bfloat16"
    assert manifest["groups"]["dense-fp8"]["tensors"]["x_scale"]["name"] == "model.layers.{layer}.mlp.x_scale"
    assert {p.name for p in (out / "kernels").iterdir()} == set(manifest["groups"])
    assert group_problems(manifest) == []
    swapped = {**manifest, "layers": manifest["layers"][::-1]}
    assert group_problems(swapped) == ["layers and groups disagree: every layer must be in exactly the group the "
                                       "layers list names"]
    wrong = json.loads(json.dumps(manifest))
    wrong["groups"]["dense-fp8"]["tensors"]["w_up"]["dtype"] = "bfloat16"
    assert [p.split(":")[0] for p in group_problems(wrong)] == ["group dense-fp8"]
    pkg = _import(out)
    patched = LlamaForCausalLM.from_pretrained(directory)
    assert pkg.patch(patched, factors, backend="interpreter") == [0, 1]

    layer0, _ = read_fp8_layer(factors / "layer_000.safetensors", 0, dict.fromkeys(("gate", "up", "down")),
                               "float8_e4m3")
    svd = {1: load_factors(factors, read_manifest(factors))[1]}
    emulated = _emulated_model(directory, emulated_mlp(svd, fp8={0: layer0}))
    reference = _emulated_model(directory, emulated_mlp({0: {p: np.asarray(
        layer0.weights[p][0].astype(np.float32) * layer0.weights[p][1].reshape(1, -1)) for p in layer0.weights},
        **svd}, kernel_dtype="float32"))
    to_emulation, to_reference = _errors(patched, emulated, reference)
    assert to_emulation < EMULATION_TOLERANCE and to_emulation * 5 < to_reference < FP8_TOLERANCE, \
        (to_emulation, to_reference)
    assert layer0.weights["gate"][0].dtype == ml_dtypes.float8_e4m3
    result = CliRunner().invoke(main, ["verify", str(out)])  # the FP8 kernel and the bf16 one
    assert result.exit_code == 0 and "OK: every kernel verifies" in result.output, result.output
    bad = CliRunner().invoke(main, ["export", str(factors), "--tokens", "4", "--dtype", "bf16", "-o",
                                    str(tmp_path / "x")])
    assert bad.exit_code == 2 and "drop --dtype" in bad.stderr


def test_fp8_svd_export_at_tp2_reduces_the_rank_and_matches_the_emulation(tiny, tmp_path):
    """An `nmmc compress --dtype fp8` output of SVD layers at --tp 2: replicate-u/reduce-rank, whose down_v
    quantizes the all-reduced h U_down with the layer file's own h_ud scale (reduce-output, whose per-rank partials
    need scales no source holds, is skipped saying so); the two rank modules all-reduced match nmmc's emulation of
    those ranks and the unquantized factors within FP8's error, and `nmmc verify` passes the package."""
    from neuronmm_compiler.compression.compress_steps import load_factors

    directory, _ = tiny
    ids = np.random.default_rng(5).integers(0, CONFIG["vocab_size"], (4, 200))  # whitening needs >= 640 tokens
    np.save(tmp_path / "cal.npy", ids)
    factors = tmp_path / "f"
    done = CliRunner().invoke(main, ["compress", str(directory), "--keep-ratio", "0.8", "--dtype", "fp8",
                                     "--calibration", str(tmp_path / "cal.npy"), "-o", str(factors)])
    assert done.exit_code == 0, done.output
    out = tmp_path / "nmmc_svd_fp8_tp2"
    manifest = export_model(ExportRequest(model=str(factors), buckets=(16,), target=TARGET, dialect="nki", tp=2),
                            out, kernel_fn=_kernel)
    (bucket,) = manifest["groups"]["svd-fp8-r128-128-128"]["buckets"]
    assert bucket["strategy"] == "replicate-u/reduce-rank"
    plan = json.loads((out / bucket["plan"]).read_text())
    skipped = {s["strategy"]: s.get("reason", "") for s in plan["strategies"] if not s["applies"]}
    assert "h_ud_scale.r0" in skipped["replicate-u/reduce-output"]
    down_v = bucket["ranks"][1]["steps"][2]
    assert down_v["args"]["h_ud"] == {"tensor": "z"} and down_v["args"]["h_ud_scale"] == {"tensor": "h_ud_scale"}
    tensors = manifest["groups"]["svd-fp8-r128-128-128"]["tensors"]
    assert tensors["h_ud_scale"]["name"] == "model.layers.{layer}.mlp.h_ud_scale"
    pkg = _import(out)
    # the all-reduce sits between the rank kernel and down_v: a router owning only a final all-reduce cannot run it
    assert not any(pkg.ops.routable("svd-fp8-r128-128-128", tokens, rank) for tokens in (3, 16) for rank in (0, 1))
    with pytest.raises(ValueError, match="routable"):
        pkg.ops.run_rank("svd-fp8-r128-128-128", 3, 0, torch.zeros(3, CONFIG["hidden_size"]), {})
    patched = LlamaForCausalLM.from_pretrained(directory)
    assert pkg.patch(patched, factors, emulate_tp=True, backend="interpreter") == [0, 1]
    ranks = {p: 128 for p in ("gate", "up", "down")}
    layers = {n: read_fp8_layer(factors / f"layer_{n:03d}.safetensors", n, ranks, "float8_e4m3")[0] for n in (0, 1)}
    emulated = _emulated_model(directory, reduce_rank_mlp(layers, [(0, 320), (320, 640)]))
    reference = _emulated_model(directory, emulated_mlp(load_factors(factors, read_manifest(factors)),
                                                        kernel_dtype="float32"))
    to_emulation, to_reference = _errors(patched, emulated, reference)
    assert to_emulation < EMULATION_TOLERANCE and to_emulation * 5 < to_reference < FP8_TOLERANCE, \
        (to_emulation, to_reference)
    result = CliRunner().invoke(main, ["verify", str(out)])
    assert result.exit_code == 0 and "OK: every kernel verifies" in result.output, result.output

"""nmmc export --serving vllm-neuron: the buckets vLLM Neuron compiles (its rules, cited in export/serving.py), the
package as a pip-installable vLLM plugin (the pyproject's entry point), and the router checked against the recorded
signature of vllm_neuron.functional.mlp with a stand-in vllm_neuron package (vLLM is not installable here: these are
signature checks, nothing runs vLLM). ``scripts/vllm_plugin_install.py`` does the actual pip install."""

from __future__ import annotations

import importlib
import json
import logging
import re
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from neuronmm_compiler.cli import main
from neuronmm_compiler.driver import compile_workload
from neuronmm_compiler.errors import InputError
from neuronmm_compiler.export import ExportRequest, export_model
from neuronmm_compiler.export.serving import (
    PIN,
    decode_buckets,
    plan_serving,
    prefill_buckets,
    serving_files,
)
from neuronmm_compiler.targets import get_target, with_launch

torch = pytest.importorskip("torch", reason="the export runtime needs the 'torch' extra")

HIDDEN, INTERMEDIATE, TP = 256, 512, 2
CONFIG = {"model_type": "llama", "architectures": ["LlamaForCausalLM"], "hidden_size": HIDDEN,
          "intermediate_size": INTERMEDIATE, "num_hidden_layers": 2, "torch_dtype": "bfloat16",
          "_name_or_path": "tiny-llama"}
#: decode buckets [1, 2] (--max-num-seqs 2), prefill [128] (--max-num-batched-tokens = --max-model-len = 128)
FLAGS = {"tp": TP, "max_num_seqs": 2, "max_num_batched_tokens": 128, "max_model_len": 128}
#: bf16 arguments, intermediate and output (relative rounding 2^-8 each) against a float64 reference.
TOLERANCE = 2e-2

# vllm_neuron.functional.mlp's parameters at the pinned commit (export/runtime/vllm_plugin.py SIGNATURE); the stand-in
# computes with them as vLLM Neuron's PyTorch fallback does (mlp.py _torch_mlp_impl, no norm/bias/quantization).
STANDIN_MLP = '''
import enum

import torch


class ActFnType(enum.Enum):
    SiLU = 0
    GELU = 1


class NormType(enum.Enum):
    NO_NORM = 0
    RMS_NORM = 1


class QuantizationType(enum.Enum):
    NONE = 0
    STATIC = 1


CALLS = []


def mlp(hidden, gate_w, up_w, down_w, eps=1e-6, ln_w=None, skip_gate=False, act_fn=ActFnType.SiLU, gate_b=None,
        up_b=None, down_b=None, norm_b=None, norm_type=NormType.NO_NORM, fused_add_tensor=None,
        store_fused_add_result=False, quantization_type=QuantizationType.NONE, gate_w_scale=None, up_w_scale=None,
        down_w_scale=None, gate_up_in_scale=None, down_in_scale=None, quant_clipping_bound=0.0, output_dtype=None,
        gate_clamp_upper_limit=None, gate_clamp_lower_limit=None, up_clamp_upper_limit=None,
        up_clamp_lower_limit=None, gate_up_w_layout=None{extra}):
    CALLS.append(tuple(hidden.shape))
    return (torch.nn.functional.silu(hidden @ gate_w) * (hidden @ up_w)) @ down_w
'''


@pytest.fixture(scope="module")
def package(tmp_path_factory):
    """An export of a 2-layer Llama-shaped model for the FLAGS server (default schedules, no search: the router is
    what is tested), imported as ``nmmc_vllm_tiny``."""
    root = tmp_path_factory.mktemp("serving")
    (root / "model").mkdir()
    (root / "model" / "config.json").write_text(json.dumps(CONFIG))
    plan = plan_serving("llama", HIDDEN, INTERMEDIATE, **FLAGS)
    target = with_launch(get_target("trn2:lnc=2"), "in-graph")
    out = root / "nmmc_vllm_tiny"
    export_model(ExportRequest(model=str(root / "model"), buckets=plan.tokens, target=target, dialect="nki", tp=TP),
                 out, kernel_fn=lambda workload: compile_workload(workload, target=target),
                 extra_files=serving_files(plan, out.name, out, "tiny-llama"))
    sys.path.insert(0, str(root))
    try:
        importlib.invalidate_caches()
        pkg = importlib.import_module(out.name)
        importlib.import_module(f"{out.name}.vllm_plugin")
        importlib.import_module(f"{out.name}.ops")
    finally:
        sys.path.remove(str(root))
    return pkg, out


def _write_standin(root: Path, extra: str = "") -> None:
    functional = root / "vllm_neuron" / "functional"
    functional.mkdir(parents=True)
    (root / "vllm_neuron" / "__init__.py").write_text("")
    (functional / "__init__.py").write_text("from .mlp import mlp\n")
    (functional / "mlp.py").write_text(STANDIN_MLP.replace("{extra}", extra))
    # a module that binds the function by name at import, as `from vllm_neuron.functional.mlp import mlp` does
    (root / "vllm_neuron" / "early.py").write_text("from vllm_neuron.functional.mlp import mlp\n")


@pytest.fixture
def standin(package, tmp_path, monkeypatch):
    """A stand-in vllm_neuron package on sys.path (not imported), the plugin's state reset, and a spy on the
    package's operators' run_rank (the nmmc entry point the router calls) recording each call."""
    pkg, _ = package
    plugin = pkg.vllm_plugin
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setitem(plugin._STATE, "warned", False)
    calls: list[tuple[str, int, int]] = []
    operators = pkg.ops.package_ops()
    real = operators.run_rank

    def spy(group, tokens, rank, x, weights):
        calls.append((group, tokens, rank))
        return real(group, tokens, rank, x, weights)

    monkeypatch.setattr(operators, "run_rank", spy)
    yield plugin, tmp_path, calls
    for name in [n for n in sys.modules if n == "vllm_neuron" or n.startswith("vllm_neuron.")]:
        del sys.modules[name]
    sys.meta_path[:] = [f for f in sys.meta_path if type(f).__name__ != "_PatchOnImport"]


def _call_arguments(tokens: int, width: int = INTERMEDIATE // TP, dtype=torch.bfloat16, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(tokens, HIDDEN, generator=g)
    gate = torch.randn(HIDDEN, width, generator=g) / HIDDEN ** 0.5
    up = torch.randn(HIDDEN, width, generator=g) / HIDDEN ** 0.5
    down = torch.randn(width, HIDDEN, generator=g) / width ** 0.5
    return [t.to(dtype) for t in (x, gate, up, down)]


def _reference(x, gate, up, down):
    x, gate, up, down = (t.double() for t in (x, gate, up, down))
    return (torch.nn.functional.silu(x @ gate) * (x @ up)) @ down


# -- buckets ------------------------------------------------------------------------------------------------------


def test_buckets_follow_vllm_neurons_rules():
    """The examples of vLLM Neuron's own docstrings (bucket_utils.py at the pinned commit) and its refusals."""
    assert decode_buckets(8) == [1, 2, 4, 8] and decode_buckets(32) == [1, 2, 4, 8, 16, 32]
    assert decode_buckets(6) == [1, 2, 4, 6] and decode_buckets(1) == [1]
    assert prefill_buckets(2048, 2048) == ([128, 256, 512, 1024, 2048], "single-shot")
    assert prefill_buckets(4096, 2048) == ([128, 256, 512, 1024, 2048], "single-shot")  # min(B, L)
    assert prefill_buckets(2000, 2000) == ([128, 256, 512, 1024, 2000], "single-shot")
    assert prefill_buckets(100, 100) == ([100], "single-shot")
    assert prefill_buckets(2048, 131072) == ([2048], "segmented")  # chunked prefill runs in segments of B
    with pytest.raises(InputError, match="segments of 512, 1024, 2048, 4096, 8192"):
        prefill_buckets(3000, 8192)
    with pytest.raises(InputError, match="16384"):
        prefill_buckets(32768, 32768)
    plan = plan_serving("llama", 4096, 14336, tp=8, max_num_seqs=32, max_num_batched_tokens=2048, max_model_len=2048)
    assert plan.decode == (1, 2, 4, 8, 16, 32) and plan.prefill == (128, 256, 512, 1024, 2048)
    assert plan.tokens == (1, 2, 4, 8, 16, 32, 128, 256, 512, 1024, 2048) and plan.intermediate_per_rank == 1792
    assert plan.as_dict()["source"] == PIN
    with pytest.raises(InputError, match="does not divide the intermediate size"):
        plan_serving("llama", 4096, 14336, tp=3, max_num_seqs=8, max_num_batched_tokens=2048, max_model_len=2048)
    with pytest.raises(InputError, match=r"prefill bucket.* 1000"):  # sequence parallel: bucket % TP
        plan_serving("llama", 4096, 14336, tp=16, max_num_seqs=8, max_num_batched_tokens=1000, max_model_len=1000)
    with pytest.raises(InputError, match="Qwen3ForCausalLM"):
        plan_serving("qwen2", 4096, 14336, tp=8, max_num_seqs=8, max_num_batched_tokens=2048, max_model_len=2048)


@pytest.mark.parametrize(("args", "message"), [
    (["--tokens", "1,128"], "drop --tokens"),
    (["--keep-ratio", "0.8"], "dense bf16 MLP only"),
    (["--dtype", "fp8"], "dense bf16 MLP only"),
    (["--lnc", "1"], "LNC=2"),
    (["--tp", "3"], "does not divide"),
    (["--max-num-batched-tokens", "3000"], "segments of"),
])
def test_serving_export_refuses_what_cannot_match_in_one_line(tmp_path, args, message):
    flags = {"--tp": "8", "--max-num-seqs": "32", "--max-num-batched-tokens": "2048", "--max-model-len": "8192"}
    for flag, value in zip(args[::2], args[1::2], strict=True):
        flags[flag] = value
    out = tmp_path / "pkg"
    result = CliRunner().invoke(main, ["export", "llama-3.1-8b", "--serving", "vllm-neuron",
                                       *[item for pair in flags.items() for item in pair], "-o", str(out)])
    assert result.exit_code == 2, result.output
    assert message in result.stderr and len(result.stderr.strip().splitlines()) == 1 and not out.exists()


def test_serving_flags_need_each_other(tmp_path):
    runner = CliRunner()
    missing = runner.invoke(main, ["export", "llama-3.1-8b", "--serving", "vllm-neuron", "--max-num-seqs", "8",
                                   "-o", str(tmp_path / "a")])
    assert missing.exit_code == 2 and "needs --max-num-batched-tokens:" in missing.stderr

    stray = runner.invoke(main, ["export", "llama-3.1-8b", "--tokens", "1", "--max-num-seqs", "8",
                                 "-o", str(tmp_path / "b")])
    assert stray.exit_code == 2 and "add --serving vllm-neuron" in stray.stderr
    named = runner.invoke(main, ["export", "llama-3.1-8b", "--serving", "vllm-neuron", "--max-num-seqs", "8",
                                 "--max-num-batched-tokens", "2048", "--max-model-len", "2048",
                                 "-o", str(tmp_path / "my-pkg")])
    assert named.exit_code == 2 and "must be a Python identifier" in named.stderr
    assert not any(tmp_path.iterdir())


# -- packaging ------------------------------------------------------------------------------------------------------


def _matches(pattern: str, relative: str) -> bool:
    """setuptools' package-data glob (``**`` any directories, ``*`` within one name)."""
    regex = re.escape(pattern).replace(r"\*\*/", "(?:.*/)?").replace(r"\*", "[^/]*")
    return re.fullmatch(regex, relative) is not None


def test_pyproject_declares_the_plugin_and_ships_every_file_the_runtime_reads(package):
    """The written pyproject.toml: the entry point vLLM looks up (group vllm.general_plugins, vllm/plugins/__init__.py
    at the commit cited in vllm_plugin.py), the package dir as the import package, and package data covering the
    manifest, the plan and every kernel file (what `pip install PKG_DIR` copies; the install itself runs in
    scripts/vllm_plugin_install.py)."""
    tomllib = pytest.importorskip("tomllib")
    _, out = package
    project = tomllib.loads((out / "pyproject.toml").read_text())
    assert project["build-system"]["build-backend"] == "setuptools.build_meta"
    assert project["project"]["name"] == "nmmc-export-nmmc-vllm-tiny" and project["project"]["dependencies"] == []
    plugins = project["project"]["entry-points"]["vllm.general_plugins"]
    assert plugins == {"nmmc_nmmc_vllm_tiny": "nmmc_vllm_tiny.vllm_plugin:register"}
    setuptools = project["tool"]["setuptools"]
    assert setuptools["packages"] == ["nmmc_vllm_tiny"] and setuptools["package-dir"] == {"nmmc_vllm_tiny": "."}
    patterns = project["tool"]["setuptools"]["package-data"]["nmmc_vllm_tiny"]
    files = [p.relative_to(out).as_posix() for p in out.rglob("*") if p.is_file() and "__pycache__" not in p.parts]
    modules = {f for f in files if "/" not in f and f.endswith(".py")}  # the package's modules
    data = [f for f in files if f not in modules and f != "pyproject.toml"]
    assert {"manifest.json", "serving.json", "SERVING.md", "vllm_plugin.py", "ops.py"} <= set(data) | modules
    assert any(f.startswith("kernels/") and f.endswith(".py") for f in data)
    assert [f for f in data if not any(_matches(p, f) for p in patterns)] == []
    serving = json.loads((out / "serving.json").read_text())
    assert serving["mlp_tokens"] == [1, 2, 128] and serving["intermediate_per_rank"] == INTERMEDIATE // TP


# -- router: signature checks against a stand-in vllm_neuron -----------------------------------------------------------


def test_signature_check_exported_shapes_run_nmmcs_kernels_others_the_original(standin):
    """Signature check, not a vLLM run: a stand-in vllm_neuron.functional whose mlp has the recorded signature is
    imported after register() (as vLLM loads plugins before the model); calls of an exported bucket and rank slice
    run the package's operator and equal the float64 MLP within bf16 rounding; every other call reaches the stand-in
    unchanged."""
    plugin, root, calls = standin
    _write_standin(root)
    plugin.register()
    plugin.register()  # idempotent: one hook
    assert sum(type(f).__name__ == "_PatchOnImport" for f in sys.meta_path) == 1
    import vllm_neuron.functional as NF

    standin_module = sys.modules["vllm_neuron.functional.mlp"]  # NF.mlp is the function, this its module
    assert NF.mlp.nmmc_router and standin_module.mlp is NF.mlp  # both names the models may look up
    original = NF.mlp.original
    assert original.__module__ == "vllm_neuron.functional.mlp" and plugin.signature_of(original) == plugin.SIGNATURE
    for tokens in (1, 2, 128):  # decode buckets and the prefill bucket, each rank's [H, I/TP] slice
        x, gate, up, down = _call_arguments(tokens, seed=tokens)
        out = NF.mlp(x, gate, up, down)
        ref = _reference(x, gate, up, down)
        assert out.dtype == torch.bfloat16 and out.shape == (tokens, HIDDEN)
        assert float((out.double() - ref).abs().max() / ref.abs().max()) < TOLERANCE
    assert [c[1] for c in calls] == [1, 2, 128] and standin_module.CALLS == []
    x, gate, up, down = _call_arguments(2)
    NF.mlp(hidden=x, gate_w=gate, up_w=up, down_w=down, eps=1e-5)  # keywords; eps is inert without a norm
    assert len(calls) == 4 and standin_module.CALLS == []

    fallbacks = [
        ((*_call_arguments(3),), {}),  # not a bucket
        ((*_call_arguments(2, width=INTERMEDIATE // 4),), {}),  # another tensor-parallel slice
        ((*_call_arguments(2, dtype=torch.float32),), {}),  # another dtype
        ((*_call_arguments(2),), {"norm_type": standin_module.NormType.RMS_NORM, "ln_w": torch.ones(1, HIDDEN)}),
        ((*_call_arguments(2),), {"act_fn": standin_module.ActFnType.GELU}),
        ((*_call_arguments(2),), {"fused_add_tensor": torch.zeros(2, HIDDEN, dtype=torch.bfloat16)}),
        ((*_call_arguments(2),), {"quantization_type": standin_module.QuantizationType.STATIC}),
        ((*_call_arguments(2), 1e-6, None, True), {}),  # skip_gate, positionally
        ((*_call_arguments(2),), {"output_dtype": torch.float32}),
    ]
    for args, kwargs in fallbacks:
        NF.mlp(*args, **kwargs)
    assert len(calls) == 4 and len(standin_module.CALLS) == len(fallbacks)


def test_router_traces_into_one_graph_under_torch_compile(standin):
    """vLLM Neuron compiles its models with torch.compile: the router's choice is made on shapes and dtypes while
    tracing, so a routed call is one graph with the package's operator in it (fullgraph, no break) and a call
    passed on traces through the original; both equal eager (aot_eager backend on the CPU; not the Neuron backend)."""
    plugin, root, _ = standin
    _write_standin(root)
    plugin.register()
    import vllm_neuron.functional as NF

    def layer(x, gate, up, down):
        return NF.mlp(x, gate, up, down) + 1

    compiled = torch.compile(layer, fullgraph=True, backend="aot_eager")
    for tokens in (2, 3):  # an exported bucket, then one that is not
        args = _call_arguments(tokens)
        assert torch.equal(compiled(*args), layer(*args))
    explained = torch._dynamo.explain(layer)(*_call_arguments(2))
    assert explained.graph_break_count == 0
    targets = [str(n.target) for g in explained.graphs for n in g.graph.nodes if n.op == "call_function"]
    assert any(t.startswith("nmmc.nmmc_vllm_tiny_") for t in targets), targets


def test_signature_check_rebinds_early_imports_and_is_idempotent(standin):
    """vllm_neuron.functional already imported, and a module that bound ``mlp`` by name at import: register()
    routes at once, rebinds that name too, and a second register() or install() leaves the same router in place."""
    plugin, root, calls = standin
    _write_standin(root)
    import vllm_neuron.early as early
    import vllm_neuron.functional as NF

    original = NF.mlp
    plugin.register()
    router = NF.mlp
    assert router.nmmc_router and router.original is original and early.mlp is router
    plugin.register()
    assert plugin.install(NF) and NF.mlp is router and early.mlp is router
    early.mlp(*_call_arguments(128))
    assert [c[1] for c in calls] == [128]


@pytest.mark.parametrize("extra", [", new_option=None", ""])
def test_signature_check_a_changed_signature_keeps_the_original_with_one_warning(standin, caplog, extra):
    """A vllm_neuron.functional.mlp whose parameters differ from the recorded ones (a parameter added; or the
    recorded one with a default changed) is left in place, with exactly one warning however often the plugin
    loads."""
    plugin, root, calls = standin
    _write_standin(root, extra)
    if not extra:
        source = root / "vllm_neuron" / "functional" / "mlp.py"
        source.write_text(source.read_text().replace("eps=1e-6", "eps=1e-5"))
    plugin.register()
    with caplog.at_level(logging.WARNING, logger=plugin.logger.name):
        import vllm_neuron.functional as NF

        plugin.register()
        plugin.install(NF)
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING and r.name == plugin.logger.name]
    assert len(warnings) == 1
    assert ("new: new_option" if extra else "kind or default changed: eps") in warnings[0].getMessage()
    assert not getattr(NF.mlp, "nmmc_router", False)
    NF.mlp(*_call_arguments(2))
    assert calls == []


def test_disabled_by_environment(standin, monkeypatch):
    plugin, root, _ = standin
    _write_standin(root)
    monkeypatch.setenv("NMMC_VLLM_NEURON", "off")
    plugin.register()
    import vllm_neuron.functional as NF

    assert not getattr(NF.mlp, "nmmc_router", False)


def test_routes_are_the_exported_shapes_only(package):
    pkg, _ = package
    routes = pkg.vllm_plugin.routes_of(pkg.manifest())
    assert routes == {(t, HIDDEN, INTERMEDIATE // TP): ("dense-bf16", t, 0) for t in (1, 2, 128)}


def test_plugin_module_reads_nothing_from_nmmc():
    """The plugin runs in every vLLM process: it imports the standard library and torch only (vllm_neuron is patched
    when it is imported, not imported by the plugin)."""
    source = (Path(__file__).parents[1] / "src/neuronmm_compiler/export/runtime/vllm_plugin.py").read_text()
    imported = set(re.findall(r"^\s*(?:from|import) ([\w.]+)", source, flags=re.M))
    assert imported <= {"__future__", "enum", "importlib", "importlib.abc", "inspect", "json", "logging", "os", "sys",
                        "threading", "collections.abc", "pathlib", "typing", "torch"}


def test_max_model_len_defaults_to_the_model_config_as_vllm_does(tmp_path):
    """Without --max-model-len vLLM takes the model config's max_position_embeddings (131072 for Llama-3.1-8B): above
    --max-num-batched-tokens 2048 its prefill is segmented, one bucket of 2048. A config without the field needs the
    flag."""
    from neuronmm_compiler.cli.export import _max_position_embeddings

    assert _max_position_embeddings("llama-3.1-8b", "--serving vllm-neuron") == 131072
    from neuronmm_compiler.export.serving import plan_serving

    plan = plan_serving("llama", 4096, 14336, tp=8, max_num_seqs=32, max_num_batched_tokens=2048,
                        max_model_len=131072)
    assert plan.tokens == (1, 2, 4, 8, 16, 32, 2048)
    bare = tmp_path / "bare"
    bare.mkdir()
    (bare / "config.json").write_text('{"model_type": "llama", "hidden_size": 256, "intermediate_size": 512, '
                                      '"num_hidden_layers": 1, "torch_dtype": "bfloat16"}')
    result = CliRunner().invoke(main, ["export", str(bare), "--serving", "vllm-neuron", "--tp", "2", "--max-num-seqs",
                                       "8", "--max-num-batched-tokens", "512", "-o", str(tmp_path / "pkg")])
    assert result.exit_code == 2 and "needs --max-model-len" in result.stderr and not (tmp_path / "pkg").exists()

"""An nmmc export in real Hugging Face transformers models (tiny random Llama and Qwen3 checkpoints written with
``save_pretrained``), eager and under ``torch.compile``: every kernel is a custom operator, one graph node per call;
the patched model has no more graph breaks than the unpatched one, compiles with ``fullgraph=True`` and gives the
eager logits, at token counts on and off the buckets; greedy generation equals the unpatched model's (bf16); the
operators' fake implementations pass ``torch.library.opcheck``; the router API (``ops.run_rank``) of a tp 2 export
sums to the module's output."""

from __future__ import annotations

import importlib
import json
import shutil
import sys
import types
from pathlib import Path

import pytest
from click.testing import CliRunner

from neuronmm_compiler.cli import main

pytestmark = pytest.mark.usefixtures("one_polish_start")  # what surrounds a search, not the search (conftest.py)

torch = pytest.importorskip("torch", reason="the export runtime needs the 'torch' extra")
transformers = pytest.importorskip("transformers", reason="needs the 'test' extra (transformers)")

#: Tiny configs (hidden 256, 2 layers, 4 heads of 64, 2 KV heads). initializer_range 0.1 instead of 0.02: with
#: 0.02 the MLPs barely move the logits and greedy decoding falls into repeating one token.
COMMON = {"hidden_size": 256, "intermediate_size": 640, "num_hidden_layers": 2, "num_attention_heads": 4,
          "num_key_value_heads": 2, "head_dim": 64, "vocab_size": 128, "max_position_embeddings": 256,
          "initializer_range": 0.1}
MODELS = {"llama": ("LlamaConfig", "LlamaForCausalLM", "LlamaMLP"),
          "qwen3": ("Qwen3Config", "Qwen3ForCausalLM", "Qwen3MLP")}
BUCKETS = "4,16"
#: Row counts (batch, sequence): below a bucket (3 -> 4), on one (2 x 8 = 16), above the largest (20 -> 16 + 4);
#: Qwen3 (the same runtime path) below a bucket and above the largest only, to keep the file cheap.
SHAPES = {"llama": ((1, 3), (2, 8), (1, 20)), "qwen3": ((1, 3), (1, 20))}


def _checkpoint(kind: str, directory: Path, dtype: torch.dtype) -> Path:
    config_cls, model_cls, _ = MODELS[kind]
    torch.manual_seed(0)
    model = getattr(transformers, model_cls)(getattr(transformers, config_cls)(**COMMON))
    model.to(dtype).save_pretrained(directory)
    return directory


def _load(kind: str, directory: Path, dtype: torch.dtype):
    return getattr(transformers, MODELS[kind][1]).from_pretrained(directory, dtype=dtype).eval()


def _import(package_dir: Path):
    sys.path.insert(0, str(package_dir.parent))
    try:
        importlib.invalidate_caches()
        return importlib.import_module(package_dir.name)
    finally:
        sys.path.pop(0)


def _export(checkpoint: Path, out: Path, *extra: str) -> None:
    result = CliRunner().invoke(main, ["export", str(checkpoint), "--tokens", BUCKETS, "--target", "trn2",
                                       "--trials", "4", "--no-progress", "-o", str(out), *extra])
    assert result.exit_code == 0, result.output + result.stderr


@pytest.fixture(scope="module")
def packages(tmp_path_factory):
    """kind -> (bf16 checkpoint, its package: dense, tp 1, buckets 4 and 16, exported by the CLI)."""
    torch.set_num_threads(1)
    made = {}
    for kind in MODELS:
        root = tmp_path_factory.mktemp(kind)
        checkpoint = _checkpoint(kind, root / "ckpt", torch.bfloat16)
        _export(checkpoint, root / f"nmmc_hf_{kind}")
        made[kind] = (checkpoint, root / f"nmmc_hf_{kind}")
    return made


def _patched(kind: str, packages, dtype: torch.dtype = torch.bfloat16):
    checkpoint, package = packages[kind]
    pkg = _import(package)
    model = _load(kind, checkpoint, dtype)
    assert pkg.patch(model, checkpoint) == [0, 1]
    assert all(type(layer.mlp).__name__ == "NmmcMLP" for layer in model.model.layers)
    return pkg, model


def _nmmc_nodes(graphs: list) -> list[str]:
    return [str(node.target) for gm in graphs for node in gm.graph.nodes
            if getattr(node.target, "namespace", None) == "nmmc"]


@pytest.mark.parametrize("kind", list(MODELS))
def test_hf_checkpoint_exports_verifies_and_compiles_like_eager(packages, kind):
    """The CLI export of a save_pretrained checkpoint verifies; the patched model has no more graph breaks than the
    unpatched one and compiles with fullgraph=True, each MLP call one node per bucket chunk, its logits equal to the
    eager patched model's at every row count (under, on and above the buckets) and close to the unpatched model's."""
    checkpoint, package = packages[kind]
    manifest = json.loads((package / "manifest.json").read_text())
    assert manifest["model"]["architecture"] == kind and manifest["mlp"] == "dense"
    verified = CliRunner().invoke(main, ["verify", str(package)])
    assert verified.exit_code == 0 and "OK: every kernel verifies" in verified.output, verified.output
    pkg, patched = _patched(kind, packages)
    reference = _load(kind, checkpoint, torch.bfloat16)
    generator = torch.Generator().manual_seed(1)
    with torch.no_grad():
        ids = torch.randint(0, COMMON["vocab_size"], (1, 5), generator=generator)
        torch._dynamo.reset()
        unpatched_breaks = torch._dynamo.explain(reference)(ids, use_cache=False).graph_break_count
        torch._dynamo.reset()
        assert torch._dynamo.explain(patched)(ids, use_cache=False).graph_break_count <= unpatched_breaks
        for shape in SHAPES[kind]:
            ids = torch.randint(0, COMMON["vocab_size"], shape, generator=generator)
            graphs: list = []

            def backend(gm, example_inputs, graphs=graphs):
                graphs.append(gm)
                return gm.forward

            torch._dynamo.reset()
            compiled = torch.compile(patched, backend=backend, fullgraph=True, dynamic=False)
            got = compiled(ids, use_cache=False).logits
            eager = patched(ids, use_cache=False).logits
            assert torch.equal(got, eager), shape
            chunks = pkg.ops.bucket_tokens(manifest["layers"][0], shape[0] * shape[1])
            assert chunks == {3: [4], 16: [16], 20: [16, 4]}[shape[0] * shape[1]]
            nodes = _nmmc_nodes(graphs)
            assert len(nodes) == COMMON["num_hidden_layers"] * len(chunks), nodes
            assert all(f"_t{bucket}_mlp" in node for node, bucket in zip(nodes, chunks * 2, strict=True))
            expected = reference(ids, use_cache=False).logits.float()
            error = (eager.float() - expected).abs().max() / expected.abs().max()
            assert error < 0.03, (shape, error.item())  # bf16 rounding of the MLP's operands and intermediate
    torch._dynamo.reset()


def test_aot_eager_compile_and_greedy_generation_match(packages):
    """aot_eager (AOTAutograd: functionalization and the operators' fake implementations) gives the eager logits;
    greedy generation of 10 tokens (bf16, KV cache: a prefill and nine one-row decode steps, padded to bucket 4)
    with the patched Llama and Qwen3 equals the unpatched models', and differs without the MLPs (so the MLPs
    decide tokens)."""
    torch._dynamo.reset()
    _, patched = _patched("llama", packages)
    ids = torch.randint(0, COMMON["vocab_size"], (2, 7), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        compiled = torch.compile(patched, backend="aot_eager", fullgraph=True, dynamic=False)
        assert torch.equal(compiled(ids, use_cache=False).logits, patched(ids, use_cache=False).logits)
    torch._dynamo.reset()
    prompt = torch.randint(0, COMMON["vocab_size"], (1, 6), generator=torch.Generator().manual_seed(4))
    settings = {"max_new_tokens": 10, "min_new_tokens": 10, "do_sample": False}
    for kind in MODELS:
        checkpoint, _ = packages[kind]
        reference = _load(kind, checkpoint, torch.bfloat16)
        _, patched = _patched(kind, packages)
        with torch.no_grad():
            expected = reference.generate(prompt, **settings)
            assert torch.equal(patched.generate(prompt, **settings), expected), kind
            for layer in reference.model.layers:
                layer.mlp.down_proj.weight.data.zero_()
            assert not torch.equal(reference.generate(prompt, **settings), expected), kind


def test_operators_fake_implementation_and_names(packages):
    """Each kernel is one operator torch.ops.nmmc.<package>_<digest>_<group>_t<bucket>_<role>; two packages in one
    process have disjoint names; the fake implementation gives the kernel's result shape and dtype without running
    it, and torch.library.opcheck's four default checks pass on the CPU operator."""
    llama, qwen = (_import(packages[kind][1]) for kind in MODELS)
    ops = llama.ops.package_ops()
    names = {kernel.qualname for kernel in ops.kernels.values()}
    assert names == {f"nmmc::nmmc_hf_llama_{ops.digest}_dense_bf16_t{t}_mlp" for t in (4, 16)}
    assert not names & {kernel.qualname for kernel in qwen.ops.package_ops().kernels.values()}
    assert llama.ops.ops_for(llama.runner()) is ops  # registered once per process
    kernel = ops.kernels["dense-bf16", 4, "mlp"]
    assert kernel.inputs == ("x", "w_gate", "w_up", "w_down")
    args = tuple(torch.randn(spec["shape"]).to(torch.bfloat16) for spec in kernel.specs.values())
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode() as mode:
        out = kernel.op(*(mode.from_tensor(a) for a in args))
    assert tuple(out.shape) == (4, 256) and out.dtype == torch.bfloat16
    with pytest.raises(ValueError, match="argument x is"), FakeTensorMode() as mode:
        kernel.op(mode.from_tensor(torch.zeros(5, 256, dtype=torch.bfloat16)), *(mode.from_tensor(a)
                                                                                  for a in args[1:]))
    torch.library.opcheck(kernel.op, args)  # schema, autograd registration, fake tensor, AOT dispatch (dynamic)


def test_run_rank_partials_sum_to_the_module_output(packages, tmp_path):
    """The router API of a tp 2 export: each rank's partial (weights by kernel argument name, or by the operand key
    weights.layer_arguments returns) at 5 rows (bucket 16) and 20 rows (16 + 4), summed as an all-reduce does,
    equals the tp 2 module's output emulated in one process; routable is True for Megatron's plans; a wrong weight
    shape is refused naming both shapes."""
    checkpoint, _ = packages["llama"]
    package = tmp_path / "nmmc_hf_llama_tp2"
    _export(checkpoint, package, "--tp", "2")
    pkg = _import(package)
    group = pkg.manifest()["layers"][0]
    model = _load("llama", checkpoint, torch.bfloat16)
    pkg.patch(model, checkpoint, emulate_tp=True)
    module = model.model.layers[1].mlp
    for tokens in (5, 20):
        x = torch.randn(tokens, 256, generator=torch.Generator().manual_seed(tokens)).to(torch.bfloat16)
        parts = []
        for rank in range(2):
            assert pkg.ops.routable(group, tokens, rank)
            operands = pkg.weights.layer_arguments(pkg.manifest(), checkpoint, 1, rank)
            by_name = {key.split("__")[0]: value for key, value in operands.items()}
            assert set(by_name) == {"w_gate", "w_up", "w_down"} and by_name["w_gate"].shape == (256, 320)
            parts.append(pkg.ops.run_rank(group, tokens, rank, x, by_name))
            assert torch.equal(pkg.ops.run_rank(group, tokens, rank, x, operands), parts[-1])
        assert parts[0].shape == (tokens, 256) and parts[0].dtype == torch.bfloat16
        total = (parts[0].float() + parts[1].float()).to(torch.bfloat16)
        assert torch.equal(total, module(x))
    with pytest.raises(ValueError, match=r"w_down is \(256, 320\)"):
        pkg.ops.run_rank(group, 5, 0, x[:5], {**by_name, "w_down": by_name["w_gate"]})


def test_nki_op_registration_with_a_stand_in(packages, tmp_path, monkeypatch):
    """Where torch_neuronx imports, each kernel is registered with its nki_op (here a stand-in holding to the
    documented contract: it wraps torch.library.custom_op and its body is the fake implementation; torch-neuronx is
    not installable here, so the real one is not run): the nki_op operator is the one the model calls, and CPU
    tensors reach the interpreter through the ..._cpu operator, giving the logits of the package registered
    without torch_neuronx."""
    registered = []

    def nki_op(name, fn=None, mutates_args=()):
        def register(fn):
            registered.append(name)
            defined = torch.library.custom_op(name, fn, mutates_args=mutates_args)
            defined.register_fake(fn)
            return defined
        return register if fn is None else register(fn)

    checkpoint, package = packages["llama"]
    _, plain = _patched("llama", packages)  # its operators registered before torch_neuronx "imports"
    copy = tmp_path / "nmmc_hf_llama_nki"
    shutil.copytree(package, copy)
    monkeypatch.setitem(sys.modules, "torch_neuronx", types.SimpleNamespace(nki_op=nki_op))
    pkg = _import(copy)
    monkeypatch.setattr(pkg.backend.KernelRunner, "preload", lambda self, kernel: None)  # would import nki
    ops = pkg.ops.package_ops()
    assert sorted(registered) == sorted(kernel.qualname for kernel in ops.kernels.values())
    assert all(kernel.op.name().endswith("_mlp") for kernel in ops.kernels.values())
    assert all(hasattr(torch.ops.nmmc, kernel.qualname.split("::")[1] + "_cpu") for kernel in ops.kernels.values())
    model = _load("llama", checkpoint, torch.bfloat16)
    pkg.patch(model, checkpoint)
    ids = torch.randint(0, COMMON["vocab_size"], (1, 3), generator=torch.Generator().manual_seed(5))
    with torch.no_grad():
        assert torch.equal(model(ids, use_cache=False).logits, plain(ids, use_cache=False).logits)

"""The MLP's norm prologue: residual add (its sum stored), RMSNorm / LayerNorm, gamma applied or folded."""

from __future__ import annotations

import numpy as np
import pytest

from helpers import compile_graph
from neuronmm_compiler.cli import main
from neuronmm_compiler.errors import InputError, ScheduleError
from neuronmm_compiler.frontends.graph_file import spec_from_document
from neuronmm_compiler.frontends.prologue import NormPrologue, fold_gamma
from neuronmm_compiler.frontends.workloads import MlpWorkload, mlp_workload, workload_from_dict
from neuronmm_compiler.ir import Graph
from neuronmm_compiler.ir.evaluate import evaluate
from neuronmm_compiler.ir.text import parse_text
from neuronmm_compiler.passes.legality import kernel_conflicts
from neuronmm_compiler.targets import get_target, with_lnc
from neuronmm_compiler.verification import verify_source

TRN2 = get_target("trn2")


def _norm_graph(op: str, params: int) -> Graph:
    g = Graph("norms")
    x = g.add_input("x", (4, 6), "fp32")
    r = g.add_input("res", (4, 6), "fp32")
    extra = [g.add_input(name, (6,), "fp32") for name in ("gamma", "beta")[:params]]
    s = g.add_elementwise("add", x, r)
    g.add_output("y", g.add_matmul(g.add_norm(op, s, *extra, eps=1e-5), g.add_input("w", (6, 3), "fp32")))
    g.add_output("s", s)
    return g


@pytest.mark.parametrize(("op", "params"), [("rmsnorm", 0), ("rmsnorm", 1), ("layernorm", 1), ("layernorm", 2)])
def test_norm_text_round_trip_and_evaluation(op, params):
    g = _norm_graph(op, params)
    assert parse_text(str(g)) == g
    rng = np.random.default_rng(0)
    args = {"x": rng.normal(size=(4, 6)), "res": rng.normal(size=(4, 6)), "gamma": rng.normal(size=6),
            "beta": rng.normal(size=6), "w": rng.normal(size=(6, 3))}
    args = {n.name: args[n.name] for n in g.inputs()}
    s = args["x"] + args["res"]
    c = s - s.mean(axis=1, keepdims=True) if op == "layernorm" else s
    n = c / np.sqrt((c * c).mean(axis=1, keepdims=True) + 1e-5)
    n = n * args.get("gamma", 1.0) + args.get("beta", 0.0)
    out = evaluate(g, args)
    np.testing.assert_allclose(out["y"], n @ args["w"], rtol=1e-12)
    np.testing.assert_allclose(out["s"], s)


def test_norm_ir_errors():
    g = Graph("bad")
    x = g.add_input("x", (4, 6), "fp32")
    with pytest.raises(InputError, match="eps"):
        g.add_norm("rmsnorm", x, eps=0.0)
    with pytest.raises(Exception, match="1-D"):
        g.add_norm("rmsnorm", x, g.add_input("g", (4, 6), "fp32"))
    with pytest.raises(Exception, match="operand"):
        parse_text('graph t {\n %x = input "x" [2, 4] fp32\n %g = input "g" [4] fp32\n'
                   ' %n = norm rmsnorm %x, %g, %g eps=1e-06 : [2, 4] float32\n %y = output "y" %n\n}\n')


def _verify(workload, target=TRN2, **params):
    compiled = compile_graph(workload, target=target, dialect="nki", params=params)
    report = verify_source(compiled.kernel.source, filename=workload.describe())
    assert report.ok, f"{workload.describe()} {params}: {report.error}"
    return compiled, report


@pytest.mark.parametrize(("norm", "keep", "split"), [
    ("rmsnorm", None, "none"), ("layernorm", 0.8, "none"), ("rmsnorm", None, "features"),
    ("layernorm", None, "hidden"), ("rmsnorm", 0.8, "intermediate"), ("layernorm", None, "tokens"),
])
def test_prologue_kernels_verify_and_the_model_counts_what_runs(norm, keep, split):
    """Residual add, stored sum, norm, on one core and under every kind of LNC=2 split (the interpreter runs both
    programs against one HBM and refuses overlapping writes), the cost model's HBM bytes and DMAs equal the
    interpreter's."""
    tokens = 256 if split == "tokens" else 8
    workload = mlp_workload(tokens, 1280 if norm == "layernorm" else 512, 768, keep_ratio=keep, dense=keep is None,
                            prologue=NormPrologue(norm, residual=True))
    target = with_lnc(TRN2, 2 if split != "none" else 1)
    params = {"lnc_split": split} if split != "none" else {}
    if split == "tokens":
        params["tokens_per_block"] = 128
    compiled, report = _verify(workload, target, **params)
    counters = report.counters
    assert counters["hbm_bytes_written"]["residual_sum"] == tokens * workload.hidden * 2
    cost = compiled.cost
    for name, value in counters["hbm_bytes_read"].items():
        assert cost.hbm_bytes_read_by_tensor.get(name, 0) == value, name
    for name, value in counters["hbm_bytes_written"].items():
        assert cost.hbm_bytes_written_by_tensor.get(name, 0) == value, name
    assert cost.dma_transfers == counters["dma_transfers"]
    assert cost.transposes == counters["transposes"]


def test_the_prologue_costs_engine_time_and_traffic():
    plain = compile_graph(mlp_workload(8, 512, 768, dense=True), target=TRN2, dialect="nki").cost
    fused = compile_graph(mlp_workload(8, 512, 768, dense=True, prologue=NormPrologue("rmsnorm", residual=True)),
                          target=TRN2, dialect="nki").cost
    assert fused.hbm_bytes_read_by_tensor["residual"] > 0 and fused.hbm_bytes_written_by_tensor["residual_sum"] > 0
    assert fused.latency_us > plain.latency_us


def test_gamma_folded_into_the_weights_is_the_same_mlp():
    rng = np.random.default_rng(1)
    for keep, names in ((None, ("w_gate", "w_up")), (0.8, ("u_gate", "u_up"))):
        base = dict(tokens=4, hidden=256, intermediate=384, keep_ratio=keep, dense=keep is None)
        applied = mlp_workload(**base, prologue=NormPrologue("rmsnorm", residual=True)).graph()
        folded = mlp_workload(**base, prologue=NormPrologue("rmsnorm", residual=True, fold_gamma=True)).graph()
        args = {n.name: rng.normal(size=n.storage_shape) for n in applied.inputs()}
        weights = fold_gamma(args["gamma"], {name: args[name] for name in names})
        other = {**{k: v for k, v in args.items() if k != "gamma"}, **weights}
        for name, value in evaluate(applied, args).items():
            np.testing.assert_allclose(evaluate(folded, other)[name], value, rtol=1e-9)


def test_graph_files_take_norms_with_eps_and_beta():
    doc = {"nmmc_graph": 1, "name": "ln", "inputs": {"x": {"shape": [8, 256]}, "g": {"shape": [256]},
                                                        "b": {"shape": [256]}, "w": {"shape": [256, 384]}},
           "ops": {"n": {"op": "layernorm", "args": ["x", "g", "b"], "eps": 1.0e-5},
                   "y": {"op": "matmul", "args": ["n", "w"]}},
           "outputs": {"out": "y"}}
    graph = spec_from_document(doc, "ln.yaml").graph()
    assert graph.node("n").attrs["eps"] == "1e-05"
    from neuronmm_compiler.frontends.workloads import graph_workload

    _verify(graph_workload(graph, "ln.yaml"), with_lnc(TRN2, 1))
    bad = {**doc, "ops": {**doc["ops"], "y": {"op": "matmul", "args": ["n", "w"], "eps": 1e-5}}}
    with pytest.raises(InputError, match="eps is a parameter"):
        spec_from_document(bad, "bad.yaml")


def test_legality_keeps_the_prologue_in_the_kernel_and_refuses_what_it_cannot_hold():
    from neuronmm_compiler.passes import DEFAULT_FUSION_PIPELINE, parse_pipeline, run_pipeline, split_kernels

    graph = mlp_workload(8, 256, 384, dense=True, prologue=NormPrologue("layernorm", residual=True)).graph()
    kernels = split_kernels(run_pipeline(graph, parse_pipeline(DEFAULT_FUSION_PIPELINE)).graph)
    assert len(kernels) == 1 and not kernel_conflicts(kernels[0])
    fused = run_pipeline(graph, parse_pipeline(DEFAULT_FUSION_PIPELINE)).graph
    assert fused.node("x_sum").annotations["group"] == "xn"


def test_workload_json_round_trip_and_cli_errors(capsys):
    workload = mlp_workload(8, 256, 384, dense=True, prologue=NormPrologue("rmsnorm", residual=True, eps=1e-5))
    assert workload_from_dict(workload.to_dict()) == workload
    assert "prologue" not in mlp_workload(8, 256, 384, dense=True).to_dict()
    assert isinstance(workload, MlpWorkload)
    for args, message in ((["--residual"], "go(es) with --fuse-norm"),
                          (["--fuse-norm", "rmsnorm", "--target", "trn1"], "nki dialect")):
        with pytest.raises(SystemExit) as exit_info:
            main(["cost", "--mlp", "--tokens", "8", "--hidden", "256", "--intermediate", "384", "--dense", *args],
                 standalone_mode=True)
        assert exit_info.value.code == 2
        assert message in capsys.readouterr().err


def test_nki_dialect_only():
    with pytest.raises(ScheduleError, match="nki dialect"):
        compile_graph(mlp_workload(8, 256, 384, dense=True, prologue=NormPrologue("rmsnorm")),
                      target=get_target("trn1"), dialect="neuronxcc")

"""User-described graphs through the whole pipeline: the shipped examples, and the lowering rules
they exercise (a LoRA branch sharing X with its base matmul and summed in one PSUM accumulator,
intermediates on chip, kernels split where a value must cross HBM, transposes as HBM views)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from helpers import compile_graph
from neuronmm_compiler.cli import main
from neuronmm_compiler.frontends.graph_file import load_graph_spec, spec_from_document
from neuronmm_compiler.frontends.workloads import graph_workload
from neuronmm_compiler.targets import get_target
from neuronmm_compiler.verification import verify_source

pytestmark = pytest.mark.usefixtures("one_polish_start")  # what surrounds a search, not the search (conftest.py)

EXAMPLES = Path(__file__).resolve().parents[1] / "examples" / "graphs"


def run(*args: str):
    return CliRunner().invoke(main, list(args), catch_exceptions=False)


def compile_doc(doc: dict, dims: dict | None = None, target: str = "trn1", **params):
    spec = spec_from_document(doc, "test.yaml")
    return compile_graph(graph_workload(spec.graph(dims), "test.yaml"), target=get_target(target), params=params)


def verified(compiled) -> dict:
    report = verify_source(compiled.kernel.source, seed=3)
    assert report.ok, report.error or report.rel_error
    assert report.counters["total_hbm_bytes_read"] == compiled.cost.hbm_bytes_read
    assert report.counters["total_hbm_bytes_written"] == compiled.cost.hbm_bytes_written
    return report.counters


def graph(inputs: dict, ops: dict, outputs: dict, dtype: str = "fp32") -> dict:
    return {"nmmc_graph": 1, "name": "g", "dtype": dtype, "inputs": {k: {"shape": v} for k, v in inputs.items()},
            "ops": {k: {"op": v[0], "args": list(v[1:])} for k, v in ops.items()}, "outputs": outputs}


@pytest.mark.parametrize("example", ["lora", "three_factor_chain", "svd_mlp"])
@pytest.mark.parametrize("dialect", ["nki", "neuronxcc"])
def test_examples_tune_emit_and_verify(tmp_path, example, dialect):
    path = str(EXAMPLES / f"{example}.yaml")
    dims = ["--dim", "tokens=96", "--target", "trn2" if dialect == "nki" else "trn1"]  # where each is documented
    tuned = tmp_path / "tuned.py"
    result = run("tune", "--graph", path, *dims, "--dialect", dialect, "--trials", "30", "--json", "-o", str(tuned))
    assert result.exit_code == 0, result.output
    data = json.loads(result.output)
    assert data["speedups"]["unfused"] > 1.0
    emitted = tmp_path / "emitted.py"
    result = run("emit", "--graph", path, *dims, "--dialect", dialect, "-o", str(emitted))
    assert result.exit_code == 0, result.output
    for kernel in (tuned, emitted):
        text = kernel.read_text()
        assert ("import neuronxcc.nki as nki" in text) == (dialect == "neuronxcc")
        check = run("verify", str(kernel), "--json")
        assert check.exit_code == 0, check.output
        assert json.loads(check.output)["ok"] is True
    assert run("cost", "--graph", path, *dims).exit_code == 0
    assert "== kernel" in run("explain", "--graph", path, *dims).output


def test_lora_shares_the_x_load_and_sums_both_products_in_one_psum():
    spec = load_graph_spec(EXAMPLES / "lora.yaml")
    compiled = compile_graph(graph_workload(spec.graph({"tokens": 128}), "lora"), target=get_target("trn1"),
                             params={"tokens_per_block": 128})
    counters = verified(compiled)
    tokens, hidden = 128, 2048
    assert counters["hbm_bytes_read"]["x"] == tokens * hidden * 2  # x crosses HBM once, for both branches
    assert counters["tensor_tensor_ops"] == 0  # the add is the PSUM accumulation itself
    assert len(compiled.programs) == 1
    source = compiled.kernel.source
    assert "summed in one PSUM accumulator" in source


def test_three_factor_chain_keeps_both_intermediates_on_chip():
    spec = load_graph_spec(EXAMPLES / "three_factor_chain.yaml")
    compiled = compile_graph(graph_workload(spec.graph({"tokens": 64}), "chain"), target=get_target("trn2"))
    counters = verified(compiled)
    assert {k for k, v in counters["hbm_bytes_read"].items() if v} == {"x", "p", "q", "r"}
    assert {k for k, v in counters["hbm_bytes_written"].items() if v} == {"y"}
    assert counters["transposes"] == 0 or compiled.schedule.x_transpose == "pe"


def test_a_computed_weight_splits_the_kernel_through_hbm():
    doc = graph({"x": [40, 64], "a": [64, 64], "b": [64, 48]},
                {"ab": ("matmul", "a", "b"), "y0": ("matmul", "x", "ab")}, {"y": "y0"})
    compiled = compile_doc(doc)
    assert len(compiled.programs) == 2
    counters = verified(compiled)
    assert "ab" in counters["hbm_bytes_written"]  # the product of the weights is handed over in HBM


def test_transpose_of_a_computed_value_is_a_view_of_its_hbm_array():
    doc = graph({"x": [40, 64], "w": [64, 40], "v": [40, 24]},
                {"xw": ("matmul", "x", "w"), "t": ("transpose", "xw"), "y0": ("matmul", "t", "v")},
                {"y": "y0", "z": "xw"})
    compiled = compile_doc(doc)
    assert len(compiled.programs) == 2
    verified(compiled)
    lines = "\n".join(run_explain(doc))
    assert "is a view of the HBM array" in lines


def run_explain(doc: dict) -> list[str]:
    from neuronmm_compiler.tuning.report import explain_lines

    return explain_lines(compile_doc(doc))


def test_input_read_directly_and_transposed_in_one_kernel():
    doc = graph({"x": [32, 32], "w": [32, 16]},
                {"t": ("transpose", "x"), "s": ("add", "x", "t"), "y0": ("matmul", "s", "w")}, {"y": "y0"})
    compiled = compile_doc(doc)
    verified(compiled)
    assert compiled.kernel.source.count("def g_k") == 1  # the view of x is read in the same kernel


@pytest.mark.parametrize("layout", ["row_major", "transposed"])
def test_output_of_a_transposed_input_is_a_copy(layout):
    doc = graph({"x": [70, 300], "w": [300, 20]},
                {"t": ("transpose", "x"), "y0": ("matmul", "x", "w")},
                {"y": "y0", "xt": {"value": "t", "layout": layout}})
    verified(compile_doc(doc))


def test_transposed_weight_and_transposed_output_of_a_row_major_value():
    doc = graph({"x": [50, 200], "w": [200, 300]}, {"y0": ("matmul", "x", "w"), "s": ("silu", "y0")},
                {"y": "y0", "ys": {"value": "s", "layout": "transposed"}})
    doc["inputs"]["w"]["layout"] = "transposed"
    for out_tile in (128, 512):
        counters = verified(compile_doc(doc, out_tile=out_tile))
        assert counters["dma_transposes"] > 0


def test_different_row_counts_split_into_kernels():
    doc = graph({"x": [30, 64], "w": [64, 30], "z": [64, 16]},
                {"xw": ("matmul", "x", "w"), "t": ("transpose", "xw"), "y0": ("silu", "t")}, {"y": "y0"})
    verified(compile_doc(doc))


def test_elementwise_on_inputs_and_strips():
    doc = graph({"x": [100, 130], "w": [130, 130], "b": [100, 130]},
                {"xw": ("matmul", "x", "w"), "m": ("multiply", "xw", "b"), "s": ("silu", "m"),
                 "y0": ("matmul", "s", "w"), "e": ("add", "x", "b")},
                {"y": "y0", "e_out": "e"}, dtype="bf16")
    verified(compile_doc(doc))


def test_a_tuned_graph_is_locked_and_regressed(tmp_path):
    lock = tmp_path / "nmmc.lock.json"
    path = str(EXAMPLES / "lora.yaml")
    result = run("tune", "--graph", path, "--dim", "tokens=32", "--trials", "10", "--lock", str(lock),
                 "-o", str(tmp_path / "k.py"))
    assert result.exit_code == 0, result.output
    check = run("regress", str(lock))
    assert check.exit_code == 0, check.output
    assert "graph lora bf16" in check.output and " ok " in check.output
    # a hand-edited lock is refused (its entry key no longer matches) ...
    data = json.loads(lock.read_text())
    lock.write_text(json.dumps(data).replace("lora_a", "lora_z"))
    bad = CliRunner().invoke(main, ["regress", str(lock)])
    assert bad.exit_code == 2 and "edited by hand" in bad.output
    # ... and a recorded graph's names are checked as a graph file's are
    from neuronmm_compiler.errors import InputError
    from neuronmm_compiler.frontends.workloads import workload_from_dict

    workload = data["entries"][0]["workload"] if "entries" in data else data[0]["workload"]
    workload["graph"] = workload["graph"].replace('"x"', '"nl"').replace("%x ", "%nl ").replace("%x,", "%nl,")
    with pytest.raises(InputError, match="reserved"):
        workload_from_dict(workload)


def test_values_handed_between_kernels_count_against_hbm():
    from neuronmm_compiler.errors import ScheduleError

    # a @ b is a computed weight, so it crosses HBM: 131072 x 65536 bf16 = 16 GiB, a trn1 core's HBM
    doc = graph({"x": [1, 131072], "a": [131072, 128], "b": [128, 65536]},
                {"ab": ("matmul", "a", "b"), "y0": ("matmul", "x", "ab")}, {"y": "y0"}, dtype="bf16")
    with pytest.raises(ScheduleError, match=r"values handed between kernels\) need 16\.\d GiB; a trn1 NeuronCore"):
        compile_doc(doc)


@pytest.mark.parametrize(("ops", "outputs", "kernels"), [
    # xw is a row-major output and also a matmul's left operand: the second matmul reads it from HBM
    ({"xw": ("matmul", "x", "w"), "y0": ("matmul", "xw", "v")}, {"y": "y0", "z": "xw"}, 2),
    # silu(xw) feeds a matmul (held transposed) but xw is held row-major for its output
    ({"xw": ("matmul", "x", "w"), "s": ("silu", "xw"), "y0": ("matmul", "s", "v")}, {"y": "y0", "z": "xw"}, 2),
    # a row-major value read twice: by its output and by a row-major epilogue
    ({"xw": ("matmul", "x", "w"), "s": ("silu", "xw")}, {"y": "s", "z": "xw"}, 2),
    # no conflict: one kernel
    ({"xw": ("matmul", "x", "w"), "s": ("silu", "xw"), "y0": ("matmul", "s", "v")}, {"y": "y0"}, 1),
])
def test_kernel_split_rules(ops, outputs, kernels):
    doc = graph({"x": [48, 96], "w": [96, 80], "v": [80, 40]}, ops, outputs)
    compiled = compile_doc(doc)
    assert len(compiled.programs) == kernels
    verified(compiled)


def test_a_kernel_of_copies_only():
    # found by scripts/fuzz.py (seed 7, case 1268): both outputs return x0, one through a transpose
    # that cannot fold (x0 is also returned directly), so the only kernel computes nothing
    doc = {"nmmc_graph": 1, "name": "g", "dtype": "bf16",
           "inputs": {"x0": {"layout": "transposed", "shape": [384, 4]}},
           "ops": {"op0": {"op": "transpose", "args": ["x0"]}, "op1": {"op": "transpose", "args": ["op0"]},
                   "op2": {"op": "transpose", "args": ["x0"]}},
           "outputs": {"y0": {"layout": "transposed", "value": "op1"}, "y1": "op2"}}
    compiled = compile_doc(doc, target="trn2")
    assert "m_blk" not in compiled.kernel.source
    counters = verified(compiled)
    assert counters["dma_transposes"] == 0 and counters["transposes"] == 0  # copied as stored

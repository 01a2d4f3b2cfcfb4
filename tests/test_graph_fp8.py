"""FP8 weights in graph files (docs/graph-format.md, "FP8 weights"): the graph a file declares is the one the MLP
frontend builds, misuse is refused with the reason, and the kernel verifies against the quantized graph."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import jsonschema
import pytest
from click.testing import CliRunner

from neuronmm_compiler.cli import main
from neuronmm_compiler.errors import InputError
from neuronmm_compiler.frontends import graph_file as gf
from neuronmm_compiler.frontends.shapes import Fp8Weights, mlp_graph
from neuronmm_compiler.ir import to_text
from neuronmm_compiler.ir.quantized import unquantized
from neuronmm_compiler.passes.quantize_fp8 import quantize_fp8

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples" / "graphs"

MLP: dict[str, Any] = {
    "nmmc_graph": 1, "name": "dense_mlp", "dims": {"tokens": 4, "hidden": 256, "inter": 256},
    "inputs": {"x": {"shape": ["tokens", "hidden"]},
               "w_gate": {"shape": ["hidden", "inter"], "dtype": "fp8_e5m2", "scale": "tensor"},
               "w_up": {"shape": ["hidden", "inter"], "dtype": "fp8_e5m2", "scale": "tensor"},
               "w_down": {"shape": ["inter", "hidden"], "dtype": "fp8_e5m2", "scale": "tensor"}},
    "ops": {"gate": {"op": "matmul", "args": ["x", "w_gate"]}, "up": {"op": "matmul", "args": ["x", "w_up"]},
            "act": {"op": "silu", "args": ["gate"]}, "h": {"op": "multiply", "args": ["act", "up"]},
            "down": {"op": "matmul", "args": ["h", "w_down"]}},
    "outputs": {"out": "down"},
}


def _doc(**changes: Any) -> dict[str, Any]:
    """MLP with ``a__b=value`` set at doc[a][b] (None deletes)."""
    doc = copy.deepcopy(MLP)
    for path, value in changes.items():
        *parents, last = path.split("__")
        node = doc
        for key in parents:
            node = node[key]
        if value is None:
            del node[last]
        else:
            node[last] = value
    return doc


def test_a_file_builds_the_mlp_frontends_fp8_graph():
    graph = gf.spec_from_document(MLP, "mlp.yaml").graph()
    assert to_text(graph) == to_text(mlp_graph(4, 256, 256, None, fp8=Fp8Weights("float8_e5m2", "tensor")))


def test_the_example_quantizes_the_base_weight_only():
    graph = quantize_fp8(gf.load_graph_spec(EXAMPLES / "lora_fp8.yaml").graph({"hidden": 256, "out": 384}))
    assert [(n.name, n.dtype, n.shape) for n in graph.inputs()][-3:] == [
        ("lora_b", "bfloat16", (16, 384)), ("x_scale", "float32", (1, 1)), ("w_scale", "float32", (384, 1))]
    plain = gf.load_graph_spec(EXAMPLES / "lora.yaml").graph({"hidden": 256, "out": 384})
    assert to_text(unquantized(graph)) == to_text(plain).replace("graph lora", "graph lora_fp8", 1)


@pytest.mark.parametrize(("doc", "message"), [
    (_doc(ops__gate__args=["w_gate", "x"]), "reads the FP8 weight w_gate as other than a matmul's right operand"),
    (_doc(ops__h__args=["act", "w_up"], ops__up=None), "reads the FP8 weight w_up as other"),
    (_doc(inputs__w_up__layout="transposed"), "an FP8 weight is stored row_major"),
    (_doc(inputs__x__scale="row"), "scale goes with an FP8 dtype"),
    (_doc(inputs__w_up__scale="channel"), "scale 'channel': accepted row, tensor"),
    (_doc(inputs__x__dtype="fp32"), "FP8 weights go with bfloat16 activations"),
    (_doc(dtype="fp8"), "FP8 goes on weight inputs"),
    (_doc(inputs__x_scale={"shape": [1, 1]}), "'x_scale' is a name of the file"),
    (_doc(ops__w_down_scale_row={"op": "silu", "args": ["h"]}, outputs__extra="w_down_scale_row"),
     "'w_down_scale_row' is a name of the file"),
])
def test_fp8_misuse_is_refused_with_the_reason(doc, message):
    with pytest.raises(InputError, match=message.replace("(", r"\(").replace(")", r"\)")):
        gf.spec_from_document(doc, "mlp.yaml")


def test_the_schema_takes_fp8_weights_and_scales_only_on_them():
    validator = jsonschema.Draft202012Validator(json.loads(gf.schema_path().read_text()))
    assert list(validator.iter_errors(MLP)) == []
    assert list(validator.iter_errors(_doc(inputs__x__scale="row")))  # a scale on a bf16 input


def test_an_fp8_graph_file_verifies(tmp_path):
    path = tmp_path / "mlp.json"
    path.write_text(json.dumps(MLP))
    out = tmp_path / "mlp.py"
    result = CliRunner().invoke(main, ["emit", "--graph", str(path), "--target", "trn2", "-o", str(out)])
    assert result.exit_code == 0, result.output
    source = out.read_text()
    assert "nl.float8_e5m2" in source and "double_row" in source
    verified = CliRunner().invoke(main, ["verify", "--json", str(out)])
    report = json.loads(verified.output)
    assert report["ok"] and report["rel_error"] < 1e-2 and report["unquantized_rel_error"] > report["rel_error"]
    refused = CliRunner().invoke(main, ["cost", "--graph", str(path), "--dtype", "fp8"])
    assert refused.exit_code == 2 and "declares its FP8 weights itself" in refused.output

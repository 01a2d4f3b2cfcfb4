"""Graph files (``--graph FILE``): the reader, the JSON Schema, and files written by an attacker.

The reader treats every file as untrusted: names become identifiers in emitted Python, so each
hostile document here must either be rejected with one ``nmmc: error:`` line (exit 2, nothing
written) or be neutralised, and a neutralised one must emit kernels whose syntax tree holds only
what nmmc emits (docstrings and comments, the numpy and NKI imports, the kernel functions and
``reference``, calls of NKI/NumPy functions) and that still verify.
"""

from __future__ import annotations

import ast
import copy
import json
import re
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml
from click.testing import CliRunner

from neuronmm_compiler.cli import main
from neuronmm_compiler.codegen import read_metadata
from neuronmm_compiler.errors import InputError, NmmcError
from neuronmm_compiler.frontends import graph_file as gf
from neuronmm_compiler.frontends import untrusted
from neuronmm_compiler.frontends.graph_fp8 import fp8_matmul_names, is_fp8_derived
from neuronmm_compiler.ir import parse_text, to_text

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = sorted((ROOT / "examples" / "graphs").glob("*.yaml"))
#: Small bindings of each example's dimensions, so that the interpreter runs them in a second or so.
SMALL = {
    "lora": ["--dim", "tokens=96", "--dim", "hidden=256", "--dim", "out=384", "--dim", "rank=16"],
    "three_factor_chain": ["--dim", "tokens=64", "--dim", "hidden=256", "--dim", "rank1=128", "--dim", "rank2=64",
                           "--dim", "out=256"],
    "svd_mlp": ["--dim", "tokens=32", "--dim", "hidden=256", "--dim", "intermediate=384", "--dim", "rank=128"],
    "norm_mlp": ["--dim", "tokens=8", "--dim", "hidden=256", "--dim", "intermediate=384"],
    "lora_fp8": ["--dim", "tokens=96", "--dim", "hidden=256", "--dim", "out=384", "--dim", "rank=16"],
}

#: The target each dialect is documented for with every construct it emits (support.py): nki on trn2.
TARGET_OF = {"nki": ["--target", "trn2"], "neuronxcc": ["--target", "trn1"]}


def run(*args: str, cwd: Path | None = None):
    runner = CliRunner()
    if cwd is None:
        return runner.invoke(main, list(args))
    with runner.isolated_filesystem(temp_dir=cwd):
        return runner.invoke(main, list(args))


def base_doc() -> dict[str, Any]:
    """A small valid graph: y = silu(x w) + x v, with a named dimension."""
    return {
        "nmmc_graph": 1,
        "name": "g",
        "description": "a small test graph",
        "dtype": "bf16",
        "dims": {"tokens": 64, "hidden": 256},
        "inputs": {"x": {"shape": ["tokens", "hidden"]}, "w": {"shape": ["hidden", 128]},
                   "v": {"shape": ["hidden", 128]}},
        "ops": {"xw": {"op": "matmul", "args": ["x", "w"]}, "act": {"op": "silu", "args": ["xw"]},
                "xv": {"op": "matmul", "args": ["x", "v"]}, "total": {"op": "add", "args": ["act", "xv"]}},
        "outputs": {"y": "total"},
    }


def write(tmp_path: Path, doc: Any, name: str = "graph.yaml") -> Path:
    path = tmp_path / name
    if isinstance(doc, str):
        path.write_text(doc)
    elif isinstance(doc, bytes):
        path.write_bytes(doc)
    elif name.lower().endswith(".json"):
        path.write_text(json.dumps(doc))
    else:
        path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


def load(tmp_path: Path, doc: Any, name: str = "graph.yaml") -> gf.GraphSpec:
    return gf.load_graph_spec(write(tmp_path, doc, name))


def rejected(tmp_path: Path, doc: Any, name: str = "graph.yaml") -> str:
    """The one-line message with which the reader rejects ``doc``."""
    path = write(tmp_path, doc, name)
    with pytest.raises(NmmcError) as info:
        gf.load_graph_spec(path).graph()
    message = str(info.value)
    assert "\n" not in message and "\r" not in message, message
    return message


# ----------------------------------------------------------------------------- valid files


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.stem)
def test_examples_read(path):
    spec = gf.load_graph_spec(path)
    assert spec.name == path.stem and spec.source == str(path)
    graph = spec.graph()
    assert [n.name for n in graph.outputs()] and [n.name for n in graph.inputs()]
    # every op appears after the ops it reads
    seen: set[str] = {i.name for i in spec.inputs}
    for op in spec.ops:
        assert set(op.args) <= seen, op
        seen.add(op.name)


def test_lora_reads_as_written():
    spec = gf.load_graph_spec(ROOT / "examples" / "graphs" / "lora.yaml")
    assert dict(spec.dims) == {"tokens": 128, "hidden": 2048, "out": 2048, "rank": 16}
    assert [(i.name, i.shape, i.dtype, i.layout) for i in spec.inputs] == [
        ("x", ("tokens", "hidden"), "bfloat16", "row_major"), ("w", ("hidden", "out"), "bfloat16", "row_major"),
        ("lora_a", ("hidden", "rank"), "bfloat16", "row_major"), ("lora_b", ("rank", "out"), "bfloat16", "row_major")]
    assert [(o.name, o.op, o.args) for o in spec.ops] == [
        ("base", "matmul", ("x", "w")), ("xa", "matmul", ("x", "lora_a")), ("delta", "matmul", ("xa", "lora_b")),
        ("merged", "add", ("base", "delta"))]
    assert [(o.name, o.value, o.layout) for o in spec.outputs] == [("y", "merged", "row_major")]
    assert spec.description == "LoRA adapter fused with its base projection"


def test_json_reads_like_yaml(tmp_path):
    doc = base_doc()
    from_yaml = load(tmp_path, doc, "g.yaml")
    from_json = load(tmp_path, doc, "g.json")
    assert to_text(from_json.graph()) == to_text(from_yaml.graph())
    assert (from_json.dims, from_json.inputs, from_json.ops, from_json.outputs) == (
        from_yaml.dims, from_yaml.inputs, from_yaml.ops, from_yaml.outputs)
    # JSON is chosen by the suffix, whatever its case; YAML otherwise (JSON is YAML, mostly)
    assert load(tmp_path, doc, "G.JSON").ops == from_yaml.ops


def test_dims_defaults_and_bindings(tmp_path):
    doc = base_doc()
    doc["dims"]["tokens"] = None
    spec = load(tmp_path, doc)
    with pytest.raises(InputError, match=r"dimension 'tokens' has no value; pass --dim tokens=N"):
        spec.graph()
    bound = spec.graph(gf.parse_dim_bindings(["tokens=300", " hidden = 384 "]))
    x = next(n for n in bound.inputs() if n.name == "x")
    w = next(n for n in bound.inputs() if n.name == "w")
    assert x.shape == (300, 384) and w.shape == (384, 128)
    assert next(iter(bound.outputs())).shape == (300, 128)
    assert spec.bind({"tokens": 7}) == {"tokens": 7, "hidden": 256}
    with pytest.raises(InputError, match=r"--dim 'depth': the graph has no such dimension \(its dimensions: "
                                         r"tokens, hidden\)"):
        spec.graph({"depth": 3})


def test_ops_are_put_in_dependency_order(tmp_path):
    doc = base_doc()
    doc["ops"] = dict(reversed(list(doc["ops"].items())))
    spec = load(tmp_path, doc)
    # depth first from the ops in file order, arguments in order: the graph (and so the kernel) is stable
    assert [o.name for o in spec.ops] == ["xw", "act", "xv", "total"]


def test_layouts_dtypes_and_output_forms(tmp_path):
    doc = base_doc()
    doc["inputs"]["w"] = {"shape": ["hidden", 128], "layout": "transposed", "dtype": "bfloat16"}
    doc["outputs"] = {"y": {"value": "total", "layout": "transposed"}}
    spec = load(tmp_path, doc)
    graph = spec.graph()
    w = next(n for n in graph.inputs() if n.name == "w")
    assert w.shape == (256, 128) and w.storage_shape == (128, 256)
    out = next(iter(graph.outputs()))
    assert out.attrs["layout"] == "transposed" and out.storage_shape == (128, 64)
    doc = base_doc()
    doc["dtype"] = "fp32"
    assert {i.dtype for i in load(tmp_path, doc).inputs} == {"float32"}


def test_description_becomes_one_printable_line(tmp_path):
    doc = base_doc()
    doc["description"] = 'two\nlines """ with\tquotes # and a hash\u2028'
    assert load(tmp_path, doc).description == 'two lines """ with quotes # and a hash'


def test_an_input_no_op_reads_is_an_argument(tmp_path):
    doc = base_doc()
    doc["inputs"]["unused"] = {"shape": [4, 4]}
    assert "unused" in [n.name for n in load(tmp_path, doc).graph().inputs()]


# ----------------------------------------------------------------------------- rejections


def _with(**changes: Any) -> dict[str, Any]:
    """base_doc() with dotted-path changes; a value of ``...`` deletes the key."""
    doc = base_doc()
    for dotted, value in changes.items():
        *parents, last = dotted.split("__")
        node = doc
        for key in parents:
            node = node[key]
        if value is ...:
            del node[last]
        else:
            node[last] = value
    return doc


VALID_YAML = yaml.safe_dump(base_doc(), sort_keys=False)

#: (document: text or dict, file name, fragment of the message)
REJECTED = [
    ("", "graph.yaml", "the graph file is empty"),
    ("   \n# only a comment\n", "graph.yaml", "the graph file is empty"),
    ("- a\n- b\n", "graph.yaml", "a graph file is a mapping of nmmc_graph, name"),
    ("just text", "graph.yaml", "got a string"),
    ("{", "graph.yaml", "invalid YAML at line 1, column 2: expected the node content, but found '<stream end>'"),
    ("a: b: c\n", "graph.yaml", "invalid YAML at line 1, column 5: mapping values are not allowed here"),
    ("{}", "graph.json", "'nmmc_graph: 1' (the format version) is required"),
    ('{"nmmc_graph": 1,}', "graph.json",
     "invalid JSON at line 1, column 18: Expecting property name enclosed in double quotes"),
    (VALID_YAML + "name: h\n", "graph.yaml",
     f"invalid YAML at line {VALID_YAML.count(chr(10)) + 1}, column 1: duplicate key 'name'"),
    (VALID_YAML.replace("  x:\n    shape:", "  x:\n    dtype: bf16\n    dtype: fp32\n    shape:", 1), "graph.yaml",
     "duplicate key 'dtype'"),
    ('{"nmmc_graph": 1, "name": "g", "name": "h"}', "graph.json", "invalid JSON: duplicate key 'name'"),
    ("nmmc_graph: 1\nname: &n g\ndescription: *n\n", "graph.yaml", "YAML aliases (*name) are not accepted"),
    ("nmmc_graph: 1\nname: !!python/object/apply:os.system ['true']\n", "graph.yaml",
     "YAML tags ('!!python/object/apply:os.system') are not accepted"),
    ("nmmc_graph: 1\nname: !!str g\n", "graph.yaml", "YAML tags ('!!str') are not accepted"),
    ("nmmc_graph: 1\nname: !custom g\n", "graph.yaml", "YAML tags ('!custom') are not accepted"),
    ("nmmc_graph: 1\ninputs: !!set {a, b}\n", "graph.yaml", "YAML tags ('!!set') are not accepted"),
    ("nmmc_graph: 1\nname: g\ninputs:\n  x: {<<: {shape: [1]}}\n", "graph.yaml", "YAML merge keys (<<)"),
    ("nmmc_graph: 1\nname: 2024-01-01\n", "graph.yaml", "a YAML timestamp ('2024-01-01') is not accepted"),
    ("nmmc_graph: 1\nname: 2024-13-45\n", "graph.yaml", "invalid YAML"),
    ("nmmc_graph: 0x1\n", "graph.yaml", "integer '0x1': write integers in plain decimal"),
    ("nmmc_graph: 1\ndims: {t: 010}\n", "graph.yaml", "integer '010': write integers in plain decimal"),
    ("nmmc_graph: 1\ndims: {t: 1_000}\n", "graph.yaml", "integer '1_000'"),
    ("nmmc_graph: 1\ndims: {t: 1:20}\n", "graph.yaml", "integer '1:20'"),
    ("nmmc_graph: 1\ndims: {t: 1" + "0" * 5000 + "}\n", "graph.yaml", "integer of 5001 digits: the limit is 18"),
    ('{"nmmc_graph": 1, "dims": {"t": 1' + "0" * 5000 + "}}", "graph.json", "integer of 5001 digits"),
    ('{"nmmc_graph": 1, "dims": {"t": NaN}}', "graph.json", "NaN is not a JSON number"),
    ('{"nmmc_graph": 1, "dims": {"t": -Infinity}}', "graph.json", "-Infinity is not a JSON number"),
    ("a: " + "[" * 40 + "]" * 40 + "\n", "graph.yaml", "nested more than 16 levels deep"),
    ("a: " + "{b: " * 5000 + "1" + "}" * 5000 + "\n", "graph.yaml", "nested more than 16 levels deep"),
    ("[" * 100_000 + "]" * 100_000, "graph.json", "invalid JSON: nested too deeply"),
    ("nmmc_graph: 1\nname: g\x07\n", "graph.yaml", "invalid YAML"),
    ("nmmc_graph: 1\n---\nnmmc_graph: 1\n", "graph.yaml", "but found another document"),
    (b"\xff\xfe\x00garbage\x00\x80", "graph.yaml", "graph files must be UTF-8 text"),
    ("#" * (untrusted.MAX_FILE_BYTES + 1), "graph.yaml", "graph files are at most 256 KiB"),
    # the document
    (_with(extra=1), "graph.yaml", "top level: unknown key 'extra'; accepted: nmmc_graph, name"),
    (_with(nmmc_graph=2), "graph.yaml", "'nmmc_graph: 1' (the format version) is required; got 2"),
    (_with(nmmc_graph=True), "graph.yaml", "required; got true"),
    (_with(nmmc_graph=1.0), "graph.yaml", "required; got 1.0"),
    (_with(nmmc_graph="1"), "graph.yaml", "required; got '1'"),
    (_with(nmmc_graph=...), "graph.yaml", "required; got null"),
    (_with(name=...), "graph.yaml", "'name' is required"),
    (_with(inputs=...), "graph.yaml", "'inputs' is required"),
    (_with(outputs=...), "graph.yaml", "'outputs' is required"),
    (_with(inputs={}), "graph.yaml", "a graph needs at least one input"),
    (_with(outputs={}), "graph.yaml", "a graph needs at least one output"),
    (_with(inputs=[1, 2]), "graph.yaml", "inputs must be a mapping (name: ...); got a list [1, 2]"),
    (_with(ops="matmul"), "graph.yaml", "ops must be a mapping (name: ...); got a string 'matmul'"),
    (_with(dims=[]), "graph.yaml", "dims must be a mapping"),
    (_with(description=5), "graph.yaml", "description must be a string; got an integer"),
    (_with(description="x" * 1001), "graph.yaml", "description is longer than 1000 characters"),
    (_with(description="right-to-left \u202e override"), "graph.yaml",
     "description contains the invisible or control character U+202E"),
    (_with(description="zero\u200bwidth"), "graph.yaml", "U+200B"),
    (_with(dtype="int8"), "graph.yaml", "unknown dtype 'int8'; accepted: bf16, bfloat16, fp32, float32"),
    (_with(dtype="BF16"), "graph.yaml", "unknown dtype 'BF16'"),
    (_with(dtype=None), "graph.yaml", "unknown dtype null"),
    (_with(dtype=["bf16"]), "graph.yaml", "unknown dtype ['bf16']"),
    # dimensions
    (_with(dims__tokens=0), "graph.yaml", "dims.tokens must be a positive integer; got 0"),
    (_with(dims__tokens=-3), "graph.yaml", "dims.tokens must be a positive integer; got -3"),
    (_with(dims__tokens=1.5), "graph.yaml", "dims.tokens must be a positive integer; got 1.5"),
    (_with(dims__tokens=True), "graph.yaml", "dims.tokens must be a positive integer; got true"),
    (_with(dims__tokens="64"), "graph.yaml", "dims.tokens must be a positive integer; got '64'"),
    (_with(dims__tokens=float("inf")), "graph.yaml", "got inf"),
    (_with(dims__tokens=2**31 + 1), "graph.yaml", "dims.tokens is 2147483649; dimensions are at most 2147483648"),
    (_with(dims__tokens=2**40), "graph.yaml", "dimensions are at most"),
    (_with(inputs__w__shape=["hidden", 2**31 + 1]), "graph.yaml", "input w: shape[1] is 2147483649"),
    (_with(inputs__w__shape=["hidden", 0]), "graph.yaml", "input w: shape[1] must be a positive integer; got 0"),
    (_with(inputs__w__shape=["hidden", None]), "graph.yaml", "shape[1] must be a positive integer; got null"),
    (_with(inputs__w__shape=["depth", 128]), "graph.yaml",
     "input w: shape uses dimension 'depth', which is not declared under dims"),
    (_with(inputs__w__shape=[]), "graph.yaml", "input w: shape must be a list of one or two dimensions"),
    (_with(inputs__w__shape=[1, 2, 3]), "graph.yaml", "input w: shape must be a list of one or two dimensions"),
    (_with(inputs__w__shape="[256, 128]"), "graph.yaml", "shape must be a list"),
    (_with(inputs__w=...), "graph.yaml", "op xw: argument 'w' is not an input or op of the graph"),
    (_with(inputs__w__layout="column_major"), "graph.yaml",
     "input w: unknown layout 'column_major'; accepted: row_major, transposed"),
    (_with(inputs__w__dtype="fp16"), "graph.yaml", "input w: unknown dtype 'fp16'"),
    (_with(inputs__w__strides=[1, 1]), "graph.yaml", "input w: unknown key 'strides'; accepted: shape, dtype, layout"),
    (_with(inputs__w=[256, 128]), "graph.yaml", "input w must be a mapping"),
    (_with(inputs__w=None), "graph.yaml", "input w must be a mapping (name: ...); got an empty value"),
    # ops
    (_with(ops__act__op="gelu"), "graph.yaml", "op act: unsupported op 'gelu'; supported: matmul, transpose, add"),
    (_with(ops__act__op=["silu"]), "graph.yaml", "op act: unsupported op ['silu']"),
    (_with(ops__act__op=...), "graph.yaml", "op act: unsupported op null"),
    (_with(ops__act__args=["xw", "xv"]), "graph.yaml", "op act: silu takes a list of 1 argument name(s)"),
    (_with(ops__xw__args="x, w"), "graph.yaml", "op xw: matmul takes a list of 2 argument name(s) as args; got 'x, w'"),
    (_with(ops__xw__args=["x", "ghost"]), "graph.yaml", "op xw: argument 'ghost' is not an input or op"),
    (_with(ops__xw__args=["x", "y"]), "graph.yaml", "op xw: argument 'y' is an output; ops read inputs and ops"),
    (_with(ops__xw__args=["x", 3]), "graph.yaml", "op xw: argument 3 is not an input or op"),
    (_with(ops__xw__kernel="k0"), "graph.yaml", "op xw: unknown key 'kernel'; accepted: op, args"),
    (_with(ops__act__args=["total"]), "graph.yaml", "the ops form a cycle: act -> total -> act"),
    (_with(ops__act__args=["act"]), "graph.yaml", "the ops form a cycle: act -> act"),
    (_with(ops__xw__args=["x", "total"]), "graph.yaml", "the ops form a cycle: xw -> total -> act -> xw"),
    (_with(ops__dead={"op": "silu", "args": ["x"]}), "graph.yaml",
     "op dead is computed but no output uses it; return it as an output or remove it"),
    # shapes (checked on the bound graph)
    (_with(inputs__w__shape=[100, 128]), "graph.yaml",
     "matmul %xw: contraction sizes differ: lhs %x [M, K] = [64, 256], rhs %w [K, N] = [100, 128]"),
    (_with(inputs__v__shape=["hidden", 64]), "graph.yaml",
     "elementwise add %total: operand shapes differ: %act [64, 128] bfloat16, %xv [64, 64] bfloat16"),
    (_with(inputs__x__shape=[256]), "graph.yaml", "matmul %xw needs 2-D operands"),
    (_with(inputs__x__shape=[256], inputs__x__layout="transposed"), "graph.yaml",
     "layout 'transposed' needs a 2-D shape"),
    (_with(inputs__v__dtype="fp32"), "graph.yaml", "operand dtypes differ"),
    # outputs
    (_with(outputs__y="x"), "graph.yaml", "output y: value 'x' is an input: outputs must be computed"),
    (_with(outputs__y="ghost"), "graph.yaml", "output y: value 'ghost' is not an op of the graph"),
    (_with(outputs__y={"value": "total", "layout": "diagonal"}), "graph.yaml", "output y: unknown layout 'diagonal'"),
    (_with(outputs__y={"layout": "transposed"}), "graph.yaml", "output y: value null is not an op of the graph"),
    (_with(outputs__y={"value": ["total"]}), "graph.yaml", "output y: value ['total'] is not an op of the graph"),
    (_with(outputs__y={"value": "total", "dtype": "fp32"}), "graph.yaml", "output y: unknown key 'dtype'"),
    (_with(outputs__z="total"), "graph.yaml", "outputs y and z both return op total; return each value once"),
    (_with(outputs__y=["total"]), "graph.yaml", "output y must be a mapping"),
    # names shared between kinds of entries
    (_with(outputs={"x": "total"}), "graph.yaml", "output 'x' is already used by an input"),
    (_with(outputs={"act": "total"}), "graph.yaml", "output 'act' is already used by an op"),
    (_with(inputs__tokens={"shape": [1, 1]}), "graph.yaml", "input 'tokens' is already used by a dimension"),
    # size limits
    (_with(ops={f"op{i}": {"op": "silu", "args": ["x"]} for i in range(gf.MAX_NODES)}), "graph.yaml",
     "more than 256 inputs and ops"),
]


@pytest.mark.parametrize(("doc", "name", "fragment"), REJECTED,
                         ids=[f"{i}-{str(f)[:40]}" for i, (_, _, f) in enumerate(REJECTED)])
def test_bad_files_are_rejected_in_one_line(tmp_path, doc, name, fragment):
    message = rejected(tmp_path, doc, name)
    assert fragment in message, message
    assert message.startswith(str(tmp_path / name) + ": "), message
    assert len(message) < 500, message


#: A few of REJECTED, each through every command that takes --graph.
THROUGH_THE_CLI = [
    ("", "graph.yaml", "the graph file is empty"),
    ("nmmc_graph: 1\nname: !!python/object/apply:os.system ['true']\n", "graph.yaml", "YAML tags"),
    ('{"nmmc_graph": 1, "dims": {"t": 1' + "0" * 5000 + "}}", "graph.json", "integer of 5001 digits"),
    (_with(inputs__w__shape=["hidden", 2**31 + 1]), "graph.yaml", "dimensions are at most"),
    (_with(ops__act__args=["total"]), "graph.yaml", "the ops form a cycle"),
    (_with(inputs__w__shape=[100, 128]), "graph.yaml", "contraction sizes differ"),
    (_with(outputs__y="x"), "graph.yaml", "outputs must be computed"),
]


@pytest.mark.parametrize(("doc", "name", "fragment"), THROUGH_THE_CLI, ids=[f for _, _, f in THROUGH_THE_CLI])
def test_bad_files_through_the_cli(tmp_path, doc, name, fragment):
    path = write(tmp_path, doc, name)
    out = tmp_path / "out"
    out.mkdir()
    for command in (["emit", "-o", str(out / "k.py")], ["cost"], ["explain"], ["schedules"],
                    ["tune", "--trials", "2", "-o", str(out / "k.py")]):
        result = run(*command, "--graph", str(path))
        assert result.exit_code == 2, (command, result.output)
        err = result.stderr.strip()
        assert err.startswith("nmmc: error: ") and "\n" not in err and fragment in err, err
        assert "Traceback" not in result.output
        assert list(out.iterdir()) == []


@pytest.mark.parametrize(
    ("values", "fragment"),
    [
        (["tokens"], "--dim takes NAME=N (e.g. tokens=128); got 'tokens'"),
        (["tokens="], "--dim takes NAME=N"),
        (["=5"], "--dim takes NAME=N"),
        (["tokens=abc"], "--dim tokens: 'abc' is not a positive decimal integer"),
        (["tokens=1e3"], "'1e3' is not a positive decimal integer"),
        (["tokens=0x10"], "'0x10' is not a positive decimal integer"),
        (["tokens=1_000"], "'1_000' is not a positive decimal integer"),
        (["tokens=+5"], "'+5' is not a positive decimal integer"),
        (["tokens=-5"], "'-5' is not a positive decimal integer"),
        (["tokens=\u0663"], "is not a positive decimal integer"),  # ARABIC-INDIC DIGIT THREE: int() takes it
        (["tokens=" + "9" * 5000], "is too large; dimensions are at most 2147483648"),
        (["tokens=2147483649"], "'2147483649' is too large"),
        (["tokens=0"], "--dim tokens: dimensions must be positive; got 0"),
        (["tokens=5", "tokens=6"], "--dim tokens is given twice"),
        (["tok\nens=5"], "--dim 'tok\\nens': not a dimension name"),
        (["__class__=5"], "--dim '__class__': not a dimension name"),
    ],
)
def test_bad_dim_bindings(values, fragment):
    with pytest.raises(InputError) as info:
        gf.parse_dim_bindings(values)
    message = str(info.value)
    assert fragment in message and "\n" not in message and len(message) < 200, message


def test_beyond_the_targets_hbm_is_rejected(tmp_path):
    path = write(tmp_path, base_doc())
    result = run("emit", "--graph", str(path), "--dim", "tokens=2147483648", "-o", str(tmp_path / "k.py"))
    assert result.exit_code == 2
    assert result.stderr.strip() == (f"nmmc: error: {path}: the graph's inputs and outputs need 1536.00 GiB of HBM; "
                                     "a trn2 LNC=2 logical core has 24.00 GiB")
    assert not (tmp_path / "k.py").exists()


# ----------------------------------------------------------------------------- names


@pytest.mark.parametrize("name", ["x", "X1", "lora_a", "x_ug", "hidden_states", "q" * 64, "os", "sys", "system",
                                  "builtins", "subprocess", "strip", "psum", "k0", "v", "v_1", "vx3", "x_k", "block_x"])
def test_plain_names_are_accepted(name):
    assert untrusted.check_user_name(name, "input") == name


@pytest.mark.parametrize(
    ("name", "fragment"),
    [
        ("", "is not a valid name"),
        ("1x", "is not a valid name"),
        ("_x", "is not a valid name"),
        ("__class__", "is not a valid name"),
        ("__import__", "is not a valid name"),
        ("x-y", "is not a valid name"),
        ("x y", "is not a valid name"),
        ('x"); import os #', "is not a valid name"),
        ("x\nimport os", "'x\\nimport os' is not a valid name"),
        ('x"""', "is not a valid name"),
        ("x#", "is not a valid name"),
        ("x\\", "is not a valid name"),
        ("\u0445", "is not a valid name"),  # CYRILLIC SMALL LETTER HA, looks like x
        ("\uff58", "is not a valid name"),  # FULLWIDTH x: Python would NFKC-normalise it to x
        ("x\u200b", "'x\\u200b' is not a valid name"),
        ("x\u202e", "'x\\u202e' is not a valid name"),
        ("caf\u00e9", "is not a valid name"),
        ("q" * 65, "is longer than 64 characters"),
        ("lambda", "is not a valid name"),
        ("None", "is not a valid name"),
        ("match", "is not a valid name"),
        ("exec", "is reserved (a Python builtin"),
        ("eval", "is reserved"),
        ("open", "is reserved"),
        ("range", "is reserved"),
        ("tuple", "is reserved"),
        ("print", "is reserved"),
        ("exit", "is reserved"),
        ("np", "is reserved"),
        ("nl", "is reserved"),
        ("nisa", "is reserved"),
        ("nki", "is reserved"),
        ("neuronxcc", "is reserved"),
        ("reference", "is reserved"),
        ("kt", "is reserved"),
        ("m_blk", "is reserved"),
        ("ct", "is reserved"),
        ("x_strip", "is reserved: nmmc derives names of that form"),
        ("mm_psum", "derives names"),
        ("x_tpsum", "derives names"),
        ("w_block", "derives names"),
        ("w_resident", "derives names"),
        ("y_rows", "derives names"),
        ("x_rowtile", "derives names"),
        ("x_in_tile", "derives names"),
        ("act_f32", "derives names"),
        ("x_f64", "derives names"),
        ("act_spill", "derives names"),
        ("g_k0", "derives names"),
        ("g_k12", "derives names"),
        ("g_kernel", "derives names"),
        ("v3", "derives names"),
        ("a__b", "derives names"),
        (True, "input true: names must be strings (YAML reads unquoted true/false/yes/no/on/off as booleans"),
        (None, "input null: names must be strings"),
        (12, "input 12: names must be strings"),
        (["x"], "input ['x']: names must be strings"),
    ],
)
def test_unsafe_names_are_rejected(name, fragment):
    with pytest.raises(InputError) as info:
        untrusted.check_user_name(name, "input")
    message = str(info.value)
    assert fragment in message and "\n" not in message, message


def test_dimension_names_only_need_to_be_plain(tmp_path):
    """Dimensions never reach emitted code: m, n, k are fine names for them."""
    doc = _with(dims={"m": 64, "k": 256, "n": 128},
                inputs={"x": {"shape": ["m", "k"]}, "w": {"shape": ["k", "n"]}},
                ops={"xw": {"op": "matmul", "args": ["x", "w"]}}, outputs={"y": "xw"})
    assert dict(load(tmp_path, doc).dims) == {"m": 64, "k": 256, "n": 128}
    assert "is not a valid name" in rejected(tmp_path, _with(dims={"t\u0430": 1}))
    assert "is not a valid name" in rejected(tmp_path, _with(dims={"_t": 1}))


@pytest.mark.parametrize("where", ["graph", "input", "op", "output", "shape-dim", "arg", "output-value"])
def test_injection_through_every_name_is_rejected(tmp_path, where):
    evil = 'x"):\n    import os; os.system("id")  #'
    doc = base_doc()
    if where == "graph":
        doc["name"] = evil
    elif where == "input":
        doc["inputs"][evil] = doc["inputs"].pop("v")
    elif where == "op":
        doc["ops"] = {evil: {"op": "silu", "args": ["x"]}, **doc["ops"]}
    elif where == "output":
        doc["outputs"] = {evil: "total"}
    elif where == "shape-dim":
        doc["inputs"]["w"]["shape"] = [evil, 128]
    elif where == "arg":
        doc["ops"]["act"]["args"] = [evil]
    else:
        doc["outputs"] = {"y": evil}
    message = rejected(tmp_path, doc)
    assert "'x\"):\\n    import os;" in message, message


# ----------------------------------------------------------------------------- the schema


def _schema() -> dict[str, Any]:
    return json.loads(gf.schema_path().read_text())


def _validator() -> jsonschema.Draft202012Validator:
    schema = _schema()
    jsonschema.Draft202012Validator.check_schema(schema)
    return jsonschema.Draft202012Validator(schema)


def test_the_schema_ships_with_the_package():
    path = gf.schema_path()
    assert path.is_file() and path.parent.name == "schemas"
    assert path.parent.parent == Path(gf.__file__).parent
    pyproject = (ROOT / "pyproject.toml").read_text()
    package_data = pyproject.split("[tool.setuptools.package-data]")[1]
    assert '\n"neuronmm_compiler.frontends" = ["schemas/*.json"]\n' in package_data
    assert _schema()["$schema"] == "https://json-schema.org/draft/2020-12/schema"


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.stem)
def test_examples_validate_against_the_schema(path):
    doc = untrusted.read_document(path)[0]
    errors = [e.message for e in _validator().iter_errors(doc)]
    assert errors == []


def test_the_test_graph_validates_against_the_schema():
    assert [e.message for e in _validator().iter_errors(base_doc())] == []
    doc = base_doc()
    doc["outputs"] = {"y": {"value": "total", "layout": "transposed"}}
    doc["dims"]["tokens"] = None
    assert [e.message for e in _validator().iter_errors(doc)] == []


def test_every_document_the_reader_accepts_here_validates(tmp_path):
    """The schema is never stricter than nmmc: documents nmmc compiles validate."""
    docs = [base_doc(), _with(dims__tokens=None), _with(description="x" * gf.MAX_DESCRIPTION_LENGTH),
            *(doc for doc in NEUTRALISED.values() if isinstance(doc, dict)),
            *(untrusted.read_document(path)[0] for path in EXAMPLES)]
    for index, doc in enumerate(docs):
        gf.spec_from_document(doc, f"doc {index}")
        assert [e.message for e in _validator().iter_errors(doc)] == [], index


MALFORMED = [
    _with(nmmc_graph=2),
    _with(nmmc_graph=True),
    _with(name="x_strip"),
    _with(name="nl"),
    _with(inputs={}),
    _with(extra=1),
    _with(inputs__w__shape=[1, 2, 3]),
    _with(inputs__w__shape=["hidden", 0]),
    _with(inputs__w__shape=["hidden", 2**31 + 1]),
    _with(inputs__w__layout="diagonal"),
    _with(inputs__w__dtype="int8"),
    _with(inputs={"x\nimport os": {"shape": [1, 1]}}),
    _with(inputs={"__class__": {"shape": [1, 1]}}),
    _with(ops__act__op="gelu"),
    _with(ops__act__args=["xw", "xv"]),
    _with(ops__xw__args=["x"]),
    _with(ops__xw__kernel="k0"),
    _with(outputs={}),
    _with(outputs__y={"layout": "transposed"}),
    _with(outputs__y=["total"]),
    _with(dims__tokens=1.5),
    _with(description=7),
    _with(name=...),
]


@pytest.mark.parametrize("doc", MALFORMED, ids=range(len(MALFORMED)))
def test_malformed_documents_fail_schema_and_reader(tmp_path, doc):
    assert list(_validator().iter_errors(doc)), "the schema accepted it"
    rejected(tmp_path, doc, "graph.json")


def test_schema_and_reader_share_their_constants():
    schema = _schema()
    defs = schema["$defs"]
    not_enum, not_pattern = (part["not"] for part in defs["value_name"]["allOf"][1:])
    assert set(not_enum["enum"]) == untrusted.RESERVED_NAMES
    assert not_pattern["pattern"] == untrusted.DERIVED_PATTERN
    assert defs["plain_name"]["pattern"] == f"^[A-Za-z][A-Za-z0-9_]{{0,{untrusted.MAX_NAME_LENGTH - 1}}}$"
    assert defs["op"]["properties"]["op"]["enum"] == list(gf.OPS)
    rules = [rule for rule in defs["op"]["allOf"] if "properties" in rule["if"]]
    arity = {tuple(rule["if"]["properties"]["op"]["enum"]): rule["then"]["properties"]["args"]["maxItems"]
             for rule in rules}
    assert {op: n for ops, n in arity.items() for op in ops} == dict(gf.OPS)
    fewest = {op: rule["then"]["properties"]["args"]["minItems"] for rule in rules
              for op in rule["if"]["properties"]["op"]["enum"]}
    assert fewest == {op: 1 if op in ("rmsnorm", "layernorm") else n for op, n in gf.OPS.items()}
    assert defs["dtype"]["enum"] == list(gf.DTYPE_ALIASES)
    assert defs["layout"]["enum"] == list(gf.LAYOUTS)
    assert defs["size"] == {"type": "integer", "minimum": 1, "maximum": gf.MAX_DIMENSION}
    assert schema["properties"]["description"]["maxLength"] == gf.MAX_DESCRIPTION_LENGTH
    assert set(schema["properties"]) == set(gf.TOP_KEYS)
    assert set(defs["input"]["properties"]) == set(gf.INPUT_KEYS)
    assert set(defs["op"]["properties"]) == set(gf.OP_KEYS)


@pytest.mark.parametrize("name", ["x", "lora_a", "x_strip", "mm_psum", "g_k0", "v3", "a__b", "nl", "kt", "_x", "1x",
                                  "x\u200b", "q" * 64, "q" * 65, "x-y", "v", "x_ug"])
def test_schema_and_reader_agree_on_names(name):
    """Keywords and builtins are the reader's alone; on every other name the two agree."""
    schema_ok = not list(_validator().iter_errors(_with(name=name)))
    try:
        untrusted.check_user_name(name, "graph name")
        reader_ok = True
    except InputError:
        reader_ok = False
    assert schema_ok == reader_ok


# ----------------------------------------------------------------------------- emitted kernels


#: (module, alias) of every import of an emitted file, by dialect.
IMPORTS = {
    "nki": {("numpy", "np"), ("nki", None), ("nki.isa", "nisa"), ("nki.language", "nl")},
    "neuronxcc": {("numpy", "np"), ("neuronxcc.nki", "nki"), ("neuronxcc.nki.isa", "nisa"),
                  ("neuronxcc.nki.language", "nl")},
}
MODULE_ALIASES = {"np", "nki", "nisa", "nl"}
CALLABLE_BUILTINS = {"range", "tuple", "min", "max", "len"}
#: Every syntax node kind a function of an emitted kernel file may contain (no import, lambda, class, ...).
ALLOWED_NODES = (
    ast.Expr, ast.Constant, ast.FunctionDef, ast.arguments, ast.arg,
    ast.Assert, ast.Compare, ast.Eq, ast.Call, ast.keyword, ast.Name, ast.Load, ast.Store, ast.Attribute,
    ast.Tuple, ast.JoinedStr, ast.FormattedValue, ast.Assign, ast.AugAssign, ast.For, ast.Return,
    ast.Subscript, ast.Slice, ast.BinOp, ast.UnaryOp, ast.Add, ast.Sub, ast.Mult, ast.Div, ast.MatMult,
    ast.USub, ast.LtE, ast.List, ast.FloorDiv,
)


def _attribute_root(node: ast.AST) -> ast.AST:
    while isinstance(node, ast.Attribute):
        node = node.value
    return node


def check_kernel_ast(source: str, dialect: str) -> set[str]:
    """Assert that ``source`` holds only what nmmc emits; return the names it binds."""
    lines = source.splitlines()
    doc_line = next(i for i, line in enumerate(lines) if line.startswith('"""'))
    assert all(line.startswith("#") for line in lines[:doc_line]), "a header line that is not a comment"
    metadata = read_metadata(source)
    assert metadata is not None and metadata.dialect == dialect
    parse_text(metadata.graph)  # the metadata's graph is plain IR text
    kernels = [k.name for k in metadata.kernels]

    tree = ast.parse(source)
    body = tree.body
    assert isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant)
    imports = [s for s in body[1:] if isinstance(s, ast.Import)]
    functions = [s for s in body[1:] if isinstance(s, ast.FunctionDef)]
    assert len(imports) + len(functions) == len(body) - 1, "a top-level statement nmmc does not emit"
    imported = [(a.name, a.asname) for s in imports for a in s.names]
    assert sorted(imported, key=str) == sorted(IMPORTS[dialect], key=str)
    assert [f.name for f in functions] == [*kernels, "reference"]

    bound: set[str] = set()
    for function in functions:
        decorators = [ast.unparse(d) for d in function.decorator_list]
        assert decorators == ([] if function.name == "reference" else ["nki.jit"])
        params = {a.arg for a in function.args.args}
        assert not (function.args.vararg or function.args.kwarg or function.args.kwonlyargs or function.args.defaults)
        local = set(params)
        for node in ast.walk(function):
            if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
                local.add(node.id)
        bound |= local | {function.name}
        docstring = function.body[0]
        assert isinstance(docstring, ast.Expr) and isinstance(docstring.value, ast.Constant)
        for node in ast.walk(function):
            assert isinstance(node, ALLOWED_NODES), f"{type(node).__name__} in {function.name}"
            if isinstance(node, ast.Attribute):
                assert not node.attr.startswith("_"), node.attr
            if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load):
                assert node.id in local | MODULE_ALIASES | CALLABLE_BUILTINS, f"{node.id} is read but never bound"
            if isinstance(node, ast.Call):
                if isinstance(node.func, ast.Name):
                    assert node.func.id in CALLABLE_BUILTINS, node.func.id
                else:
                    root = _attribute_root(node.func)
                    # an FP8 kernel reads a scale argument through an access pattern, ``s.ap(...)``
                    # (docs/quantization.md)
                    access_pattern = node.func.attr == "ap" and isinstance(node.func.value, ast.Name)
                    assert isinstance(root, ast.Name) and (root.id in {"np", "nl", "nisa"} or (
                        access_pattern and root.id in params)), ast.unparse(node.func)
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and node is not docstring.value:
                # the only other strings are the shape- and launch-assertion messages' literal parts
                assert (re.fullmatch(r"[A-Za-z0-9_]+: expected shape \([0-9A-Z_, ]+\), got ", node.value)
                        or re.fullmatch(r"[A-Z]+ = ", node.value)  # a size read from the arguments: T = {T}: ...
                        or re.fullmatch(r": this kernel takes 1 to [0-9]+", node.value)
                        or re.fullmatch(r"an LNC=[0-9] kernel launched with ", node.value)
                        # the token split's check (lowerings/fused_tokens.py): two programs' equal trips
                        or node.value.startswith(": the two programs' shares of T take different numbers of token")
                        or re.fullmatch(r" program\(s\): launch it on a logical core of [0-9] physical cores \(see the "
                                        r"file header\)", node.value)), node.value
            if isinstance(node, ast.JoinedStr):
                assert all(isinstance(v, (ast.Constant, ast.FormattedValue)) for v in node.values)
        for node in ast.walk(function):
            if isinstance(node, ast.Assert):
                assert isinstance(node.msg, ast.JoinedStr)
    return bound


@pytest.mark.parametrize(
    ("old", "new"),
    [
        ("import numpy as np\n", "import numpy as np\nimport os\n"),
        ("import numpy as np\n", "import numpy as np\nprint('hi')\n"),
        ("\ndef reference(", "\n@staticmethod\ndef reference("),
        ("    x_f64 = np.asarray(", "    import os\n    x_f64 = np.asarray("),
        ("    x_f64 = np.asarray(", "    eval('1')\n    x_f64 = np.asarray("),
        ("    x_f64 = np.asarray(", "    y = x.__class__\n    x_f64 = np.asarray("),
        ("    x_f64 = np.asarray(", "    y = os\n    x_f64 = np.asarray("),
        ("    x_f64 = np.asarray(", "    y = 'rm -rf'\n    x_f64 = np.asarray("),
        ("    x_f64 = np.asarray(", "    y = lambda: 0\n    x_f64 = np.asarray("),
        ("    x_f64 = np.asarray(", "    y = x.shape.__len__()\n    x_f64 = np.asarray("),
        ("# workload", "# workload\nimport os\n#"),
    ],
)
def test_the_kernel_checker_catches_tampering(tmp_path, old, new):
    """The checker the injection tests rely on is not vacuous: each edit of a clean kernel fails it."""
    out = tmp_path / "kernel.py"
    assert run("emit", "--graph", str(write(tmp_path, base_doc())), "--dialect", "nki", "--target", "trn2", "-o",
               str(out)).exit_code == 0
    source = out.read_text()
    check_kernel_ast(source, "nki")
    assert old in source
    with pytest.raises(AssertionError):
        check_kernel_ast(source.replace(old, new, 1), "nki")


def _user_names(spec: gf.GraphSpec) -> set[str]:
    return ({spec.name} | {i.name for i in spec.inputs} | {o.name for o in spec.ops}
            | {o.name for o in spec.outputs})


def _fp8_names(spec: gf.GraphSpec, names: set[str]) -> set[str]:
    """Those of ``names`` the FP8 matmuls of the file add or derive (``<weight>_scale``, ``w_scale_row``, ...): the
    reader refuses a file that uses one of them (graph_fp8.check_fp8_reads)."""
    added = fp8_matmul_names(spec.ops, {i.name: i.scale for i in spec.inputs if i.scale is not None})
    return {name for name in names if is_fp8_derived(name, added)}


#: Documents with hostile-looking content the reader accepts: it never reaches the code as code.
NEUTRALISED = {
    "description": _with(description='"""\nimport os\nos.system("id")\n""" # \' \\ {x} %s'),
    "description-block": 'nmmc_graph: 1\nname: g\ndescription: |\n  """\n  import os\n  #\n' + "\n".join(
        VALID_YAML.splitlines()[3:]) + "\n",
    "module-names": _with(inputs={"os": {"shape": ["tokens", "hidden"]}, "sys": {"shape": ["hidden", 128]},
                                  "subprocess": {"shape": ["hidden", 128]}},
                          ops={"system": {"op": "matmul", "args": ["os", "sys"]},
                               "popen": {"op": "silu", "args": ["system"]},
                               "builtins": {"op": "matmul", "args": ["os", "subprocess"]},
                               "getattr_": {"op": "multiply", "args": ["popen", "builtins"]}},
                          outputs={"shutil": "getattr_"}),
    "near-derived": _with(inputs={"x_k": {"shape": ["tokens", "hidden"]}, "block_x": {"shape": ["hidden", 128]},
                                  "strip": {"shape": ["hidden", 128]}},
                          ops={"psum": {"op": "matmul", "args": ["x_k", "block_x"]},
                               "vx": {"op": "silu", "args": ["psum"]},
                               "rows": {"op": "matmul", "args": ["x_k", "strip"]},
                               "k0": {"op": "add", "args": ["vx", "rows"]}},
                          outputs={"v": {"value": "k0", "layout": "transposed"}}),
}


@pytest.mark.parametrize("dialect", ["nki", "neuronxcc"])
@pytest.mark.parametrize("case", sorted(NEUTRALISED))
def test_neutralised_documents_emit_clean_verified_kernels(tmp_path, case, dialect):
    path = write(tmp_path, NEUTRALISED[case])
    spec = gf.load_graph_spec(path)
    out = tmp_path / "kernel.py"
    result = run("emit", "--graph", str(path), "--dialect", dialect, *TARGET_OF[dialect], "-o", str(out))
    assert result.exit_code == 0, result.output
    source = out.read_text()
    assert "import os" not in source and "system(" not in source
    bound = check_kernel_ast(source, dialect)
    assert {i.name for i in spec.inputs} <= bound
    verified = run("verify", str(out), "--json")
    assert verified.exit_code == 0, verified.output
    assert json.loads(verified.output)["ok"] is True


def test_a_path_with_newlines_cannot_inject_code(tmp_path):
    """The file's path is echoed in the kernel's header comment and in messages: escaped."""
    directory = tmp_path / 'evil\nimport os\nos.system("touch PWNED")\n#'
    directory.mkdir()
    path = write(directory, base_doc(), "g\u202e.yaml")
    out = tmp_path / "kernel.py"
    result = run("emit", "--graph", str(path), "-o", str(out))
    assert result.exit_code == 0, result.output
    source = out.read_text()
    check_kernel_ast(source, "nki")  # --dialect auto on trn2, the default target
    assert repr(str(path)) in source
    assert run("verify", str(out)).exit_code == 0
    assert not list(tmp_path.rglob("PWNED"))
    missing = run("emit", "--graph", str(path) + "\n", "-o", str(out))
    assert missing.exit_code == 2
    assert missing.stderr.count("\n") == 1 and "\\n" in missing.stderr and "does not exist" in missing.stderr
    bad = write(directory, "nmmc_graph: 2\n", "bad.yaml")
    result = run("emit", "--graph", str(bad), "-o", str(out))
    assert result.exit_code == 2 and result.stderr.count("\n") == 1
    assert result.stderr.startswith(f"nmmc: error: {str(bad)!r}: 'nmmc_graph: 1'")


def _graphs_for_codegen(tmp_path: Path) -> list[tuple[Path, list[str]]]:
    """(graph file, extra emit options) covering the lowering's variants: the examples, several token
    blocks, weights kept resident, X^T made by TensorE, a split MLP, an elementwise epilogue reading
    an input, a transposed input and output, and a graph cut into two kernels through HBM."""
    split = _with(dims={"tokens": 200, "hidden": 256},
                  inputs={"x": {"shape": ["tokens", "hidden"]}, "w1": {"shape": ["hidden", 384]},
                          "w2": {"shape": [384, "hidden"]},
                          "xt": {"shape": ["tokens", "hidden"], "layout": "transposed"}},
                  ops={"h": {"op": "matmul", "args": ["x", "w1"]}, "a": {"op": "silu", "args": ["h"]},
                       "g": {"op": "matmul", "args": ["a", "w2"]}, "r": {"op": "add", "args": ["g", "x"]},
                       "s": {"op": "multiply", "args": ["r", "xt"]}},
                  outputs={"y": "s", "hh": "h"})
    base = write(tmp_path, base_doc(), "base.yaml")
    examples = {p.stem: p for p in EXAMPLES}
    params = ["--param", "x_transpose=pe", "--param", "cache_weights=all", "--param", "tokens_per_block=64"]
    return [
        *((p, SMALL[p.stem]) for p in EXAMPLES),
        (examples["lora"], [*SMALL["lora"], *params]),
        (examples["svd_mlp"], [*SMALL["svd_mlp"], "--param", "mlp=split", "--param", "k_tiles_per_block=1"]),
        (base, []),
        (base, ["--dim", "tokens=300", *params]),
        (write(tmp_path, split, "split.yaml"), []),
        (write(tmp_path, NEUTRALISED["near-derived"], "near.yaml"), ["--param", "x_transpose=pe"]),
    ]


@pytest.mark.parametrize("dialect", ["nki", "neuronxcc"])
def test_every_name_nmmc_binds_is_refused_as_a_user_name(tmp_path, dialect):
    """A user name can never collide with a buffer, loop variable, kernel or local the lowering makes
    up: everything an emitted kernel binds that the file did not name is refused by the reader. (When
    the lowering invents a new kind of name, this test says which, and RESERVED_NAMES or
    DERIVED_PATTERN in graph_file.py must learn it.)"""
    kernels = 0
    # the norm prologue and FP8 are emitted in the nki dialect only (docs/fusion.md, docs/quantization.md)
    graphs = [g for g in _graphs_for_codegen(tmp_path) if dialect == "nki" or g[0].stem not in ("norm_mlp", "lora_fp8")]
    for index, (path, options) in enumerate(graphs):
        out = tmp_path / f"{path.stem}-{index}-{dialect}.py"
        result = run("emit", "--graph", str(path), "--dialect", dialect, *TARGET_OF[dialect], *options, "-o", str(out))
        assert result.exit_code == 0, (path.name, result.output)
        source = out.read_text()
        kernels += len(read_metadata(source).kernels)
        spec = gf.load_graph_spec(path)
        own = check_kernel_ast(source, dialect) - _user_names(spec)
        own -= _fp8_names(spec, own)
        assert own, path
        accepted = []
        for name in sorted(own):
            try:
                untrusted.check_user_name(name, "input")
                accepted.append(name)
            except InputError:
                pass
        assert accepted == [], f"{path.name}: names nmmc binds that a graph file could also use: {accepted}"
        verified = run("verify", str(out), "--json")
        assert verified.exit_code == 0 and json.loads(verified.output)["ok"] is True, (path.name, verified.output)
    assert kernels >= len(graphs) + 2  # the split MLP and the split graph have two each


def test_hostile_documents_through_the_cli_write_nothing(tmp_path):
    """Each hostile document through every graph command: exit 2, one line, no file."""
    hostile = [
        _with(name='g"""; import os'),
        _with(inputs={"\u0445": {"shape": [1, 1]}}),
        _with(ops__act__op="__import__('os').system('id')"),
        _with(inputs__w__layout="row_major\nimport os"),
        _with(dtype="bf16\nimport os"),
        _with(description="\u202e evil"),
        "nmmc_graph: 1\nname: !!python/object/apply:os.system ['touch PWNED']\n",
        "nmmc_graph: 1\nname: !!python/name:os.system\n",
    ]
    out = tmp_path / "out"
    out.mkdir()
    for index, doc in enumerate(hostile):
        path = write(tmp_path, doc, f"h{index}.yaml")
        for command in (["emit", "-o", str(out / "k.py")], ["cost", "--json"], ["explain"], ["schedules"]):
            result = run(*command, "--graph", str(path))
            assert result.exit_code == 2, (index, command, result.output)
            assert result.stderr.count("\n") == 1 and result.stderr.startswith("nmmc: error: "), result.stderr
            assert result.stdout == ""
    assert list(out.iterdir()) == [] and not list(tmp_path.rglob("PWNED"))


def test_the_reader_does_not_mutate_or_keep_the_document(tmp_path):
    doc = base_doc()
    before = copy.deepcopy(doc)
    spec = gf.spec_from_document(doc, "doc")
    assert doc == before
    doc["inputs"]["x"]["shape"][0] = 1
    assert spec.inputs[0].shape == ("tokens", "hidden")

"""IR support for fusion: the annotation API, transposed outputs, their verification, and
split_kernels (a fused graph cut into one graph per kernel), checked by evaluating the kernels in turn.

The text form of annotations is tested in test_ir_text.py, evaluation of transposed outputs in
test_ir_evaluate.py, the passes that set annotations in test_fusion_passes.py."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from neuronmm_compiler.errors import InputError, IRError, UnknownNameError
from neuronmm_compiler.frontends.shapes import mlp_graph
from neuronmm_compiler.ir import COMPUTE_KINDS, Graph, evaluate, parse_text, to_text, verify
from neuronmm_compiler.lowerings.fused_groups import read_groups
from neuronmm_compiler.passes import kernel_order, run_pipeline, split_kernels
from test_fusion_passes import BRANCHY_FUSED, SVD_CHAIN, SVD_MLP_SPLIT, SVD_MLP_WHOLE, split_pipeline
from test_ir_text import ANNOTATED, random_graphs


def small_graph() -> Graph:
    graph = Graph("g")
    a = graph.add_input("a", (4, 8), "fp32")
    b = graph.add_input("b", (8, 3), "fp32")
    mm = graph.add_matmul(a, b)
    graph.add_output("c", graph.add_elementwise("silu", mm))
    return graph


# ----------------------------------------------------------------------------- annotations API


def test_annotate_sets_reads_and_reports_changes():
    graph = small_graph()
    assert graph.annotations("mm0") == {} and dict(graph.node("mm0").annotations) == {}
    assert graph.annotate("mm0", orient="transposed", kernel="k0") is True
    assert graph.annotate("mm0", orient="transposed") is False  # same value again
    assert graph.annotate("mm0", place="sbuf", orient="normal") is True  # overwrite + add
    assert graph.annotations("mm0") == {"orient": "normal", "kernel": "k0", "place": "sbuf"}
    assert dict(graph.node("mm0").annotations) == graph.annotations("mm0")
    assert graph.annotations("a") == {} and graph.annotations("c") == {}


def test_annotations_are_copies_and_node_view_is_frozen():
    graph = small_graph()
    graph.annotate("silu0", kernel="k0")
    copied = graph.annotations("silu0")
    copied["kernel"] = "k9"
    assert graph.annotations("silu0") == {"kernel": "k0"}
    with pytest.raises(TypeError):
        graph.node("silu0").annotations["kernel"] = "k1"  # type: ignore[index]


def test_clear_annotations():
    graph = small_graph()
    graph.annotate("mm0", orient="normal", kernel="k0", place="hbm")
    assert graph.clear_annotations("mm0", "place", "orient") is True
    assert graph.annotations("mm0") == {"kernel": "k0"}
    assert graph.clear_annotations("mm0", "place") is False
    assert graph.clear_annotations("mm0") is True
    assert graph.annotations("mm0") == {}


@pytest.mark.parametrize(
    ("values", "error", "message"),
    [
        ({"colour": "red"}, UnknownNameError, r"%mm0: unknown annotation key 'colour'; known: kernel, orient, place"),
        ({"orient": "sideways"}, InputError, r"orient='sideways' is not valid; accepted: normal, transposed"),
        ({"place": "psum"}, InputError, r"place='psum' is not valid; accepted: sbuf, hbm"),
        ({"kernel": "0k"}, InputError, r"kernel='0k': the value must be an identifier"),
        ({"kernel": "class"}, InputError, r"must be an identifier"),
        ({"orient": "normal", "place": "dram"}, InputError, r"place='dram'"),
    ],
)
def test_annotate_rejects_bad_keys_and_values_atomically(values, error, message):
    graph = small_graph()
    with pytest.raises(error, match=message):
        graph.annotate("mm0", **values)
    assert graph.annotations("mm0") == {}  # nothing half-set


def test_annotate_only_compute_nodes():
    graph = small_graph()
    with pytest.raises(IRError, match=r"cannot annotate %a: it is an input; only compute nodes"):
        graph.annotate("a", orient="normal")
    with pytest.raises(IRError, match=r"it is an output"):
        graph.annotate("c", kernel="k0")
    with pytest.raises(IRError, match=r"no node %ghost"):
        graph.annotate("ghost", kernel="k0")
    with pytest.raises(IRError, match=r"no node %ghost"):
        graph.annotations("ghost")


def test_equality_signature_and_copy_include_annotations():
    first, second = small_graph(), small_graph()
    first.annotate("mm0", orient="transposed")
    assert first != second and first.signature() != second.signature()
    second.annotate("mm0", orient="transposed")
    assert first == second and first.signature() == second.signature()
    duplicate = first.copy()
    duplicate.annotate("mm0", orient="normal")
    assert first.annotations("mm0") == {"orient": "transposed"}
    renamed = first.copy(name="other")
    assert renamed.name == "other" and renamed != first and renamed.copy(name="g") == first
    with pytest.raises(InputError, match="graph name"):
        first.copy(name="not ok")


# ----------------------------------------------------------------------------- transposed outputs


def test_transposed_output_storage_shape_and_layout():
    graph = Graph("g")
    a = graph.add_input("a", (4, 8), "bf16")
    graph.add_output("plain", a)
    graph.add_output("flipped", a, layout="transposed")
    assert graph.node("plain").layout == "row_major" and graph.node("plain").storage_shape == (4, 8)
    assert graph.node("flipped").layout == "transposed"
    assert graph.node("flipped").shape == (4, 8) and graph.node("flipped").storage_shape == (8, 4)
    assert graph.node("a").layout == "row_major"


def test_output_layout_checks():
    graph = Graph("g")
    graph.add_input("a", (4, 8), "bf16")
    graph.add_input("v", (8,), "bf16")
    with pytest.raises(InputError, match=r"output 'o': unknown layout 'diagonal'; accepted: row_major, transposed"):
        graph.add_output("o", "a", layout="diagonal")
    with pytest.raises(InputError, match=r"output 'o': layout 'transposed' needs a 2-D shape; got \[8\]"):
        graph.add_output("o", "v", layout="transposed")
    assert "o" not in graph


# ----------------------------------------------------------------------------- verifier


def _verify_error(graph: Graph) -> str:
    with pytest.raises(IRError) as caught:
        verify(graph)
    return str(caught.value)


def _marked(message: str) -> str:
    [line] = [line for line in message.splitlines() if line.startswith("  >>")]
    return line


@pytest.mark.parametrize(
    ("node", "annotations", "message"),
    [
        ("mm0", {"colour": "red"}, "%mm0: unknown annotation key 'colour'; known: kernel, orient, place"),
        ("mm0", {"orient": "sideways"}, "%mm0: annotation orient='sideways' is not valid"),
        ("mm0", {"place": "psum"}, "%mm0: annotation place='psum' is not valid; accepted: sbuf, hbm"),
        ("mm0", {"kernel": "k 0"}, "%mm0: annotation kernel='k 0': the value must be an identifier"),
        ("mm0", {"kernel": 3}, "%mm0: annotation kernel=3"),
        ("mm0", ["orient"], "%mm0: annotations must be a dict"),
        ("x", {"orient": "normal"}, "%x: input carries annotations (orient); only compute nodes"),
        ("h_t", {"kernel": "k0"}, "%h_t: output carries annotations (kernel)"),
    ],
)
def test_verify_rejects_bad_annotations(node, annotations, message):
    graph = parse_text(ANNOTATED)
    graph.nx_graph.nodes[node]["annotations"] = annotations
    error = _verify_error(graph)
    assert message in error
    assert f"%{node} =" in _marked(error)


def test_verify_kernel_annotation_on_all_or_none():
    graph = parse_text(ANNOTATED)
    verify(graph)
    graph.clear_annotations("s", "kernel")
    error = _verify_error(graph)
    assert "%s: has no kernel annotation but %mm0 has one" in error
    assert "(missing on %s)" in error
    assert "%s = elementwise silu %v3" in _marked(error)
    for node in ("mm0", "v3"):
        graph.clear_annotations(node, "kernel")
    verify(graph)  # none has a kernel: fine


def test_verify_output_layout():
    graph = parse_text(ANNOTATED)
    graph.nx_graph.nodes["h_t"]["attrs"]["layout"] = "diagonal"
    error = _verify_error(graph)
    assert "%h_t: layout 'diagonal' is not one of row_major, transposed" in error
    assert '%h_t = output "h_t" %v3 layout=diagonal' in _marked(error)
    del graph.nx_graph.nodes["h_t"]["attrs"]["layout"]
    assert "%h_t: output lacks attribute(s) layout" in _verify_error(graph)


def test_verify_shows_annotations_in_context():
    graph = parse_text(ANNOTATED)
    graph.nx_graph.nodes["v3"]["shape"] = (1, 1)
    marked = _marked(_verify_error(graph))
    assert "%v3 = matmul %mm0, %vg : [1, 1] bfloat16 {kernel=k0, orient=transposed, place=hbm}" in marked


def run_kernels(kernels: list[Graph], inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Evaluate kernels one after another, each reading graph inputs and earlier kernels' outputs by name."""
    available = dict(inputs)
    produced: dict[str, np.ndarray] = {}
    for kernel in kernels:
        # a view input (a transpose read across kernels) reads another array with the other layout
        arrays = {node.name: available[kernel.hbm_aliases.get(node.id, node.name)] for node in kernel.inputs()}
        result = evaluate(kernel, arrays)
        assert not set(result) & set(produced), "a name is produced twice"
        available.update(result)
        produced.update(result)
    return produced


def random_inputs(graph: Graph, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {node.name: rng.standard_normal(node.storage_shape) for node in graph.inputs()}


SVD_MLP_K0 = """\
graph svd_mlp_k0 {
  %x = input "x" [4, 8] float32 layout=row_major
  %u_gate = input "u_gate" [8, 2] float32 layout=row_major
  %v_gate = input "v_gate" [2, 16] float32 layout=row_major
  %u_up = input "u_up" [8, 3] float32 layout=row_major
  %v_up = input "v_up" [3, 16] float32 layout=row_major
  %x_ug = matmul %x, %u_gate : [4, 2] float32 {kernel=k0, orient=transposed, place=sbuf}
  %gate = matmul %x_ug, %v_gate : [4, 16] float32 {kernel=k0, orient=transposed, place=sbuf}
  %x_uu = matmul %x, %u_up : [4, 3] float32 {kernel=k0, orient=transposed, place=sbuf}
  %up = matmul %x_uu, %v_up : [4, 16] float32 {kernel=k0, orient=transposed, place=sbuf}
  %act = elementwise silu %gate : [4, 16] float32 {kernel=k0, orient=transposed, place=sbuf}
  %h = elementwise multiply %act, %up : [4, 16] float32 {kernel=k0, orient=transposed, place=hbm}
  %h_0 = output "h" %h layout=transposed
}
"""
SVD_MLP_K1 = """\
graph svd_mlp_k1 {
  %u_down = input "u_down" [16, 4] float32 layout=row_major
  %v_down = input "v_down" [4, 8] float32 layout=row_major
  %h = input "h" [4, 16] float32 layout=transposed
  %h_ud = matmul %h, %u_down : [4, 4] float32 {kernel=k1, orient=transposed, place=sbuf}
  %down = matmul %h_ud, %v_down : [4, 8] float32 {kernel=k1, orient=normal, place=hbm}
  %out = output "out" %down
}
"""


# ----------------------------------------------------------------------------- split_kernels


def test_split_kernels_of_a_single_kernel_graph_is_the_graph_renamed():
    graph = parse_text(SVD_MLP_WHOLE)
    [kernel] = split_kernels(graph)
    assert kernel.name == "svd_mlp_k0"
    assert kernel == graph.copy(name="svd_mlp_k0")
    assert to_text(kernel) == SVD_MLP_WHOLE.replace("graph svd_mlp {", "graph svd_mlp_k0 {")


def test_split_kernels_of_the_split_mlp_hands_h_over_transposed():
    graph = parse_text(SVD_MLP_SPLIT)
    kernels = split_kernels(graph)
    assert [to_text(kernel) for kernel in kernels] == [SVD_MLP_K0, SVD_MLP_K1]
    assert [kernel.name for kernel in kernels] == ["svd_mlp_k0", "svd_mlp_k1"]
    boundary_out = kernels[0].outputs()[-1]
    boundary_in = kernels[1].inputs()[-1]
    assert (boundary_out.name, boundary_out.layout, boundary_out.storage_shape) == ("h", "transposed", (16, 4))
    assert (boundary_in.name, boundary_in.layout, boundary_in.storage_shape) == ("h", "transposed", (16, 4))


@pytest.mark.parametrize("mode", ["whole", "split"])
def test_split_kernels_evaluate_like_the_whole_graph(mode):
    source = mlp_graph(5, 8, 16, (2, 3, 4), dtype="fp32")
    fused = run_pipeline(source, split_pipeline(mode)).graph
    inputs = random_inputs(source, seed=3)
    expected = evaluate(source, inputs)
    kernels = split_kernels(fused)
    assert len(kernels) == (1 if mode == "whole" else 2)
    produced = run_kernels(kernels, inputs)
    np.testing.assert_allclose(produced["out"], expected["out"], rtol=1e-12)
    if mode == "split":  # the hand-over is h, stored transposed
        x = inputs["x"]
        h = (x @ inputs["u_gate"] @ inputs["v_gate"]) / (1 + np.exp(-(x @ inputs["u_gate"] @ inputs["v_gate"])))
        h = h * (x @ inputs["u_up"] @ inputs["v_up"])
        np.testing.assert_allclose(produced["h"], h.T, rtol=1e-12)


def test_split_kernels_boundaries_names_and_order():
    graph = parse_text(BRANCHY_FUSED)
    kernels = split_kernels(graph)
    assert kernel_order(graph) == ["k0", "k1", "k2"]
    signatures = [
        (
            kernel.name,
            [(node.id, node.name) for node in kernel.inputs()],
            [node.id for node in kernel.compute_nodes()],
            [(node.name, node.operands[0]) for node in kernel.outputs()],
        )
        for kernel in kernels
    ]
    assert signatures == [
        ("g_k0", [("x", "x"), ("w", "w")], ["e", "m2", "e2"], [("e", "e"), ("m2_0", "m2"), ("e2", "e2")]),
        ("g_k1", [("w", "w"), ("e", "e"), ("m2", "m2_0")], ["m1", "m4"], [("z", "m4"), ("m4", "m4")]),
        ("g_k2", [("w", "w"), ("m4", "m4"), ("e2", "e2")], ["m5", "m6"], [("m2", "m6")]),
    ]
    for kernel in kernels:
        assert all(node.layout == "row_major" for node in [*kernel.inputs(), *kernel.outputs()])  # no orients
        for node in kernel.compute_nodes():
            assert kernel.annotations(node.id) == graph.annotations(node.id)
    inputs = random_inputs(graph, seed=5)
    produced, expected = run_kernels(kernels, inputs), evaluate(graph, inputs)
    for name in ("m2", "z"):
        np.testing.assert_allclose(produced[name], expected[name], rtol=1e-12)


def test_split_kernels_unused_inputs_and_passed_through_inputs_go_to_the_first_kernel():
    out_line = '  %out = output "out" %down\n'
    graph = parse_text(SVD_MLP_SPLIT.replace(out_line, out_line + '  %xo = output "x_again" %x\n'))
    graph.add_input("spare", (2, 2), "fp32")
    first, second = split_kernels(graph)
    assert "spare" in [node.name for node in first.inputs()]
    assert "x_again" in [node.name for node in first.outputs()]
    assert "spare" not in [node.name for node in second.inputs()]


def test_split_kernels_errors():
    with pytest.raises(IRError, match=r"no kernel annotations \(run the fuse pass first\)"):
        split_kernels(parse_text(SVD_CHAIN))
    passthrough = Graph("p")
    passthrough.add_output("o", passthrough.add_input("a", (2, 2), "fp32"))
    with pytest.raises(IRError, match=r"has no compute nodes"):
        split_kernels(passthrough)
    backwards = parse_text(SVD_CHAIN)
    backwards.annotate("xu", kernel="k1")
    backwards.annotate("xuv", kernel="k0")
    backwards.add_output("extra", backwards.add_transpose("xu", id="t_late"))
    backwards.annotate("t_late", kernel="k0")
    # first appearance: xu (k1), xuv (k0) -> order k1, k0; xuv (k0) reads xu (k1): fine
    assert [kernel.name for kernel in split_kernels(backwards)] == ["svd_chain_k1", "svd_chain_k0"]
    backwards.annotate("xu", kernel="k0")
    backwards.annotate("xuv", kernel="k1")
    backwards.add_output("late", backwards.add_elementwise("silu", "xuv", id="s_late"))
    backwards.annotate("s_late", kernel="k0")
    with pytest.raises(IRError, match=r"%s_late \(kernel k0\) reads %xuv of the later kernel k1"):
        split_kernels(backwards)


# ----------------------------------------------------------------------------- properties


@settings(max_examples=120, deadline=None)
@given(
    st.one_of(random_graphs(), random_graphs(max_ops=12, chains=True)),
    st.sampled_from(["whole", "split"]),
    st.integers(0, 2**32 - 1),
)
def test_fusion_pipeline_and_split_preserve_values(graph, mode, seed):
    result = run_pipeline(graph, split_pipeline(mode)).graph
    compute = result.compute_nodes()
    assume(compute)
    order = kernel_order(result)
    assert order == [f"k{index}" for index in range(len(order))]
    for node in compute:
        annotations = result.annotations(node.id)
        grouped = set() if node.kind == "transpose" else {"group"} | ({"acc"} if node.kind == "matmul" else set())
        assert {"orient", "kernel", "place"} | grouped <= set(annotations)
        assert set(annotations) <= {"orient", "kernel", "place", "group", "acc"}
        if "group" in annotations:  # a group never spans kernels
            assert result.annotations(annotations["group"])["kernel"] == annotations["kernel"]
        users = [result.node(user) for user in result.users(node.id)]
        # transposes are HBM views of their operand, so both are in HBM
        leaves = node.kind == "transpose" or any(
            user.kind not in COMPUTE_KINDS or user.kind == "transpose"
            or user.annotations["kernel"] != annotations["kernel"] for user in users
        )
        assert annotations["place"] == ("hbm" if leaves else "sbuf")
        if users and all(user.kind == "matmul" and user.operands[1] != node.id for user in users):
            assert annotations["orient"] == "transposed"  # read only as a matmul lhs
        for operand in node.operands:
            if operand in {n.id for n in compute}:
                assert order.index(result.annotations(operand)["kernel"]) <= order.index(annotations["kernel"])
    for kernel in split_kernels(result):  # the fused lowering can read every kernel's groups
        read_groups(kernel, kernel.name)
    inputs = random_inputs(graph, seed)
    expected = evaluate(graph, inputs)
    produced = run_kernels(split_kernels(result), inputs)
    for name, value in expected.items():
        np.testing.assert_allclose(produced[name], value, rtol=1e-9, atol=1e-12)

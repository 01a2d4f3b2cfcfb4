"""Random graph files through the whole pipeline: nmmc's fuzzer.

:func:`random_case` draws a graph file (as the parsed document a user would write: inputs, ops,
outputs, named dimensions, layouts, dtypes) with shapes that are ragged, tiny or large-but-cheap,
plus a target, a dialect and a few schedule parameters. :func:`run_case` runs it as ``nmmc emit
--graph`` does (validation, passes, kernel split, lowering, codegen) and then as ``nmmc verify``
does, and classifies the outcome:

- ``ok``: the kernels were emitted, verify in the interpreter against the float64 reference, and
  the cost model's HBM bytes per tensor equal the interpreter's;
- ``rejected``: a user-facing :class:`~neuronmm_compiler.errors.NmmcError` (a graph nmmc does not
  compile, a schedule that does not fit), the message being what the user would see;
- ``internal``: any other exception (a bug), ``unverified``: the kernel computes the wrong values,
  ``bytes``: the cost model and the interpreter disagree about traffic.

The tests draw the randomness from hypothesis (which then shrinks a failing case);
``scripts/fuzz.py`` runs thousands of seeded cases.
"""

from __future__ import annotations

import random
import traceback
from dataclasses import dataclass, field
from typing import Any

from ..errors import NmmcError
from ..support import support_for
from ..targets import TARGETS, with_lnc
from ..vocab import Dialect, ElementwiseOp, Layout, NodeKind

#: Outcomes that are not bugs.
GOOD = ("ok", "rejected")


@dataclass
class FuzzCase:
    """One generated case: a graph document and how to compile it."""

    document: dict[str, Any]
    dims: dict[str, int]
    target: str
    dialect: str
    params: dict[str, Any] = field(default_factory=dict)

    def describe(self) -> str:
        import json

        return json.dumps({"graph": self.document, "dims": self.dims, "target": self.target,
                           "dialect": self.dialect, "params": self.params}, sort_keys=True)


@dataclass
class Outcome:
    status: str  # ok | rejected | internal | unverified | bytes
    detail: str = ""
    kernels: int = 0


def _size(rng: random.Random) -> int:
    """A dimension: mostly small and ragged, sometimes exactly tiled, rarely large (one axis only)."""
    roll = rng.random()
    if roll < 0.15:
        return rng.randint(1, 8)
    if roll < 0.55:
        return rng.randint(9, 300)
    if roll < 0.85:
        return rng.choice((128, 256, 384, 512))
    return rng.choice((640, 1000, 1024, 1536))


def random_case(rng: random.Random, max_ops: int = 7) -> FuzzCase:
    """Draw a random graph file and compile settings (see the module docstring)."""
    dtype = rng.choice(("bf16", "bf16", "fp32"))
    tokens = _size(rng) if rng.random() < 0.8 else rng.randint(1, 64)
    doc: dict[str, Any] = {"nmmc_graph": 1, "name": "fuzz", "dtype": dtype}
    dims: dict[str, Any] = {}
    bound: dict[str, int] = {}
    if rng.random() < 0.4:
        dims["tokens"] = rng.choice((None, tokens))
        if dims["tokens"] is None or rng.random() < 0.3:
            bound["tokens"] = tokens
    inputs: dict[str, dict[str, Any]] = {}
    shapes: dict[str, tuple[int, int]] = {}
    ops: dict[str, dict[str, Any]] = {}
    counter = {"in": 0, "op": 0}

    def new_input(shape: tuple[int, int], weight: bool) -> str:
        name = f"{'w' if weight else 'x'}{counter['in']}"
        counter["in"] += 1
        entry: dict[str, Any] = {"shape": [("tokens" if "tokens" in dims and d == tokens and i == 0 else d)
                                           for i, d in enumerate(shape)]}
        if rng.random() < (0.1 if weight else 0.25):
            entry["layout"] = Layout.TRANSPOSED.value
        inputs[name] = entry
        shapes[name] = shape
        return name

    def new_op(kind: str, args: list[str], shape: tuple[int, int]) -> str:
        name = f"op{counter['op']}"
        counter["op"] += 1
        ops[name] = {"op": kind, "args": args}
        shapes[name] = shape
        return name

    values = [new_input((tokens, _size(rng)), weight=False)]
    for _ in range(rng.randint(1, max_ops)):
        a = rng.choice(values)
        rows, cols = shapes[a]
        roll = rng.random()
        if roll < 0.45:
            if rng.random() < 0.1:
                same = [v for v in values if shapes[v][0] == cols]
                rhs = rng.choice(same) if same else new_input((cols, _size(rng)), weight=True)
            else:
                # large-but-cheap: a wide weight when there are few tokens
                wide = rows <= 8 and rng.random() < 0.3
                rhs = new_input((cols, rng.choice((4096, 8192)) if wide else _size(rng)), weight=True)
            values.append(new_op(NodeKind.MATMUL.value, [a, rhs], (rows, shapes[rhs][1])))
        elif roll < 0.75:
            same = [v for v in values if shapes[v] == (rows, cols)]
            b = rng.choice(same) if same and rng.random() < 0.7 else new_input((rows, cols), weight=False)
            binary = rng.choice((ElementwiseOp.ADD, ElementwiseOp.MULTIPLY))
            values.append(new_op(binary.value, [a, b], (rows, cols)))
        elif roll < 0.92:
            values.append(new_op(ElementwiseOp.SILU.value, [a], (rows, cols)))
        else:
            values.append(new_op(NodeKind.TRANSPOSE.value, [a], (cols, rows)))
    if not ops:
        values.append(new_op(ElementwiseOp.SILU.value, [values[0]], shapes[values[0]]))
    computed = [v for v in values if v in ops]
    used = {arg for op in ops.values() for arg in op["args"]}
    sinks = [v for v in computed if v not in used]
    chosen = list(dict.fromkeys(sinks + [v for v in computed if rng.random() < 0.15]))
    outputs: dict[str, Any] = {}
    for index, value in enumerate(chosen):
        layout = Layout.TRANSPOSED if rng.random() < 0.2 else Layout.ROW_MAJOR
        outputs[f"y{index}"] = value if layout == Layout.ROW_MAJOR else {"value": value, "layout": layout.value}
    if dims:
        doc["dims"] = dims
    doc.update(inputs=inputs, ops=ops, outputs=outputs)
    params: dict[str, Any] = {}
    for key, choices in (("tokens_per_block", (32, 64, 128, 256, 512)), ("weight_block_kib", (4, 16, 64)),
                         ("k_tiles_per_block", (0, 2, 8)), ("out_tile", (128, 512)),
                         ("weight_dma", ("row", "tile", "block")), ("cache_weights", ("none", "stage1", "all")),
                         ("x_transpose", ("dma", "pe")),
                         ("token_tile", (64, 128)), ("mlp", ("whole", "split")), ("stationary", ("weights", "tokens"))):
        if rng.random() < (0.1 if key == "mlp" else 0.3):
            params[key] = rng.choice(choices)
    target = rng.choice(tuple(TARGETS))
    dialect = rng.choice([d for d in Dialect if support_for(d, target) is not None])  # documented pairings only
    if params.get("weight_dma") == "block" and dialect != Dialect.NKI:  # an access pattern: nki dialect only
        params["weight_dma"] = "row"
    if TARGETS[target].max_lnc > 1 and rng.random() < 0.5:  # the logical core (LNC=2), and sometimes its split
        target = with_lnc(TARGETS[target], 2).spec
        if rng.random() < 0.5:
            exchanging = ("gather", "hidden", "intermediate") if dialect == Dialect.NKI else ()
            params["lnc_split"] = rng.choice(("tokens", "features", *exchanging))
    if rng.random() < 0.3:  # drawn last, so the cases drawn before it keep their other settings
        params["row_k_tiles"] = rng.choice((2, 8))
    # a block of contraction tiles is at most the longest contraction (nmmc refuses more): drawn values are clamped
    contraction = max((shapes[op["args"][0]][1] for op in ops.values() if op["op"] == NodeKind.MATMUL.value),
                      default=0)
    for key in ("k_tiles_per_block", "row_k_tiles"):
        if key in params:
            params[key] = min(params[key], -(-contraction // 128))
    return FuzzCase(doc, bound, target, dialect, params)


def run_case(case: FuzzCase, *, verify: bool = True) -> Outcome:
    """Compile (and verify) one case; never raises."""
    from ..driver import compile_workload
    from ..frontends.graph_file import check_fits_hbm, spec_from_document
    from ..frontends.workloads import graph_workload
    from ..targets import get_target
    from . import verify_source

    try:
        target = get_target(case.target)
        spec = spec_from_document(case.document, "fuzz.yaml")
        graph = spec.graph(case.dims)
        check_fits_hbm(graph, target, spec.source)
        workload = graph_workload(graph, spec.source)
        compiled = compile_workload(workload, target=target, dialect=case.dialect, params=case.params)
    except NmmcError as exc:
        return Outcome("rejected", str(exc))
    except Exception:  # classifying every failure is the point
        return Outcome("internal", traceback.format_exc(limit=6))
    kernels = len(compiled.programs)
    if not verify:
        return Outcome("ok", kernels=kernels)
    try:
        report = verify_source(compiled.kernel.source, filename="fuzz_kernel.py", seed=7, rules=True)
    except Exception:
        return Outcome("internal", "verification raised:\n" + traceback.format_exc(limit=6), kernels)
    if not report.ok:
        return Outcome("unverified", f"{report.error or ''} rel_error={report.rel_error}", kernels)
    measured = (report.counters.get("total_hbm_bytes_read"), report.counters.get("total_hbm_bytes_written"))
    predicted = (compiled.cost.hbm_bytes_read, compiled.cost.hbm_bytes_written)
    if measured != predicted:
        return Outcome("bytes", f"cost model {predicted} bytes read/written, interpreter {measured}", kernels)
    return Outcome("ok", kernels=kernels)

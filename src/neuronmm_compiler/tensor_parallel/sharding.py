"""Sharding as a graph transformation: a gated MLP (dense or SVD) becomes the graphs each rank of a
tensor-parallel group runs, the slices of the weights each rank reads, and the collectives between.

Megatron-style: gate and up are column-parallel over the intermediate dimension, down is row-parallel
and its partial outputs are summed across ranks. For SVD factors there are several legal ways to
shard (docs/tensor-parallel.md, "Strategies"):

gate/up
  ``replicate-u``: U replicated, V split by columns (every rank computes the whole x U strip);
  ``factor-shard``: every rank's column block of W factorised on its own (the rank split across ranks).
down
  ``reduce-output``: U split by rows, V replicated, the [tokens, hidden] partial outputs all-reduced;
  ``reduce-rank``: U split by rows, V replicated, the [tokens, r] partial products h_i U_i all-reduced
  *before* the multiplication by V (r / hidden of the bytes of ``reduce-output``);
  ``factor-shard``: every rank's row block of W factorised on its own, the partial outputs all-reduced.

FP8 weights (``--dtype fp8``, docs/quantization.md) shard with their scales: a per-output-channel scale follows its
weight's columns (gate/up, V of a column shard), a row-parallel weight keeps its whole per-channel scale (its
output channels are not split), a factor of a shard's own carries its own. An activation's static per-tensor scale
is one tensor, the same on every rank, when every rank quantizes the same value or a column shard of one value (x,
the replicated x U, the intermediate h); it is the rank's own (``<value>_scale.r<rank>``) when each rank quantizes a
value of its own (x U_i of a shard's own factors, the partial product h_i U_down_i that reduce-output and factor-shard
quantize). ``reduce-rank`` quantizes no partial product: a rank hands on ``h_i U_down_i`` dequantized (bf16), and the
second kernel quantizes the all-reduced sum, the unsharded ``h U_down``, with the unsharded MLP's ``h_ud_scale``.

Shards are as even as possible (the first ``I mod N`` ranks get one column more), so a ragged
intermediate (not a multiple of ``N * 128``) gives ranks whose last tile is ragged, which the
lowerings handle; ranks with equal shapes form one *role* and share a kernel.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

from ..errors import InputError
from ..frontends.shapes import Fp8Weights, block_aligned_rank, mlp_graph
from ..frontends.workloads import MlpWorkload, Workload, gemm_workload, graph_workload
from ..ir import Graph
from ..ir.fp8 import is_fp8
from ..passes.quantize_fp8 import quantize_fp8
from ..vocab import ElementwiseOp

GATE_UP_STRATEGIES = ("replicate-u", "factor-shard")
DOWN_STRATEGIES = ("reduce-output", "reduce-rank", "factor-shard")
DENSE = "dense"
#: Tile alignment of a rank (the TensorEngine's partition count): per-shard ranks are multiples of it.
ALIGN = 128


@dataclass(frozen=True)
class Strategy:
    """How gate/up and down are sharded (``dense``/``dense`` for an uncompressed MLP)."""

    gate_up: str
    down: str

    @property
    def name(self) -> str:
        return "megatron" if self.gate_up == DENSE else f"{self.gate_up}/{self.down}"


def strategies(workload: MlpWorkload) -> list[Strategy]:
    """Every strategy that applies to the workload (one for a dense MLP, six for an SVD MLP)."""
    if workload.ranks is None:
        return [Strategy(DENSE, DENSE)]
    return [Strategy(g, d) for g in GATE_UP_STRATEGIES for d in DOWN_STRATEGIES]


def parse_strategy(text: str, workload: MlpWorkload) -> Strategy:
    """A ``GATE_UP/DOWN`` (or ``megatron``) name as a Strategy of the workload; InputError listing them."""
    known = {s.name: s for s in strategies(workload)}
    if text not in known:
        raise InputError(f"unknown tensor-parallel strategy {text!r} for this MLP; known: {', '.join(known)}")
    return known[text]


def check_tp(tp: object, intermediate: int) -> int:
    """``tp`` as a validated group size: a positive integer, at most ``intermediate`` (each rank needs at
    least one column of the intermediate dimension)."""
    if isinstance(tp, bool) or not isinstance(tp, int) or tp < 1:
        raise InputError(f"--tp is the number of tensor-parallel ranks and must be a positive integer; got {tp!r}")
    if tp > intermediate:
        raise InputError(f"--tp {tp} exceeds the intermediate size {intermediate}: each rank needs at least one "
                         "column of the intermediate dimension")
    return tp


def shard_sizes(intermediate: int, tp: int) -> list[int]:
    """The intermediate columns of each rank: as even as possible, the first ``intermediate mod tp`` ranks
    one more (Megatron splits evenly; an uneven split keeps every rank within one column of the others)."""
    base, extra = divmod(intermediate, check_tp(tp, intermediate))
    return [base + (1 if i < extra else 0) for i in range(tp)]


def kept_fraction(rows: int, cols: int, rank: int) -> float:
    """The fraction of a [rows, cols] weight's parameters its rank-``rank`` factors hold."""
    return rank * (rows + cols) / (rows * cols)


def shard_rank(rows: int, cols: int, fraction: float) -> int | None:
    """The rank of a [rows, cols] shard factorised on its own, keeping ``fraction`` of its parameters like
    the unsharded factors do, as a whole number of 128-wide tiles (the fused kernel then never pads a
    rank tile). None when no aligned rank compresses the shard (the rank would not be below
    ``rows * cols / (rows + cols)``): factorising that shard is pointless and the strategy does not apply."""
    rank = block_aligned_rank(rows, cols, min(fraction, 1.0), ALIGN)
    if rank % ALIGN or rank * (rows + cols) >= rows * cols:
        return None
    return rank


@dataclass(frozen=True)
class Operand:
    """Where a kernel argument comes from: a named tensor of the plan (a global input, a per-rank
    factor, or a collective's result), optionally a [start, stop) slice of its rows or columns."""

    tensor: str
    rows: tuple[int, int] | None = None
    cols: tuple[int, int] | None = None

    def as_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"tensor": self.tensor}
        if self.rows is not None:
            out["rows"] = list(self.rows)
        if self.cols is not None:
            out["cols"] = list(self.cols)
        return out


@dataclass(frozen=True)
class KernelStep:
    """Run one kernel (a per-rank workload): its graph's inputs bound to operands, its outputs named."""

    key: str  # names the kernel file shared by every rank running the same workload
    workload: Workload
    args: dict[str, Operand]
    outputs: dict[str, str]  # graph output name -> tensor name in the plan


@dataclass(frozen=True)
class CollectiveStep:
    """A collective over the group: ``op`` of ``tensor`` (``shape``, ``dtype``), result named ``result``."""

    op: str
    tensor: str
    result: str
    shape: tuple[int, ...]
    dtype: str
    group: tuple[int, ...]


@dataclass
class RankProgram:
    """What one rank runs, in order; ``role`` numbers the distinct shapes."""

    rank: int
    role: int
    steps: list[KernelStep | CollectiveStep] = field(default_factory=list)


@dataclass(frozen=True)
class Factor:
    """A weight tensor the plan names: its shape and what it holds (a per-rank factor of a shard says which); an FP8
    plan's tensors also say their dtype (FP8 weights, float32 scales)."""

    name: str
    shape: tuple[int, int]
    holds: str
    dtype: str | None = None


@dataclass
class ShardedMlp:
    """The per-rank graphs and collectives of one strategy."""

    workload: MlpWorkload
    tp: int
    strategy: Strategy
    sizes: list[int]
    factors: dict[str, Factor]
    ranks: list[RankProgram]

    @property
    def kept(self) -> float:
        """The fraction of the dense MLP's parameters the plan's weights hold (its scales not counted): the unsharded
        factors' for the slice-based strategies; ``factor-shard`` factorises each shard on its own at its own aligned
        rank, which can keep fewer (SmolLM2-135M at rank 384, tp 2: 0.778 against 0.917) or more."""
        held = sum(f.shape[0] * f.shape[1] for f in self.factors.values() if "_scale" not in f.name)
        return held / (3 * self.workload.hidden * self.workload.intermediate)

    @property
    def offsets(self) -> list[int]:
        out, at = [], 0
        for size in self.sizes:
            out.append(at)
            at += size
        return out


def _partial_graph(tokens: int, hidden: int, cols: int, ranks: tuple[int, int, int], dtype: str,
                   fp8: Fp8Weights | None) -> Graph:
    """The rank's graph of ``reduce-rank``: the SVD MLP up to ``z = h U_down`` (no V_down), output ``z``; with
    ``fp8`` every factor is an FP8 input and every matmul marked as :func:`mlp_graph` marks them (``z`` is the
    dequantized product, in ``dtype``: nothing of a rank's own is quantized)."""
    graph = Graph("svd_mlp_partial")
    x = graph.add_input("x", (tokens, hidden), dtype)
    weights = dtype if fp8 is None else fp8.format
    marks = {} if fp8 is None else {"act_scale": fp8.act_scale, "w_scale": fp8.scales}
    parts = {"gate": (hidden, cols, ranks[0]), "up": (hidden, cols, ranks[1])}
    outs = {}
    for part, (rows, width, rank) in parts.items():
        u = graph.add_input(f"u_{part}", (rows, rank), weights)
        v = graph.add_input(f"v_{part}", (rank, width), weights)
        tag = "ug" if part == "gate" else "uu"
        outs[part] = graph.add_matmul(graph.add_matmul(x, u, id=f"x_{tag}", **marks), v, id=part, **marks)
    act = graph.add_elementwise(ElementwiseOp.SILU, outs["gate"], id="act")
    h = graph.add_elementwise(ElementwiseOp.MULTIPLY, act, outs["up"], id="h")
    u_down = graph.add_input("u_down", (cols, ranks[2]), weights)
    graph.add_output("z", graph.add_matmul(h, u_down, id="h_ud", **marks))
    return graph


def _second_factor(tokens: int, hidden: int, rank: int, dtype: str, fp8: Fp8Weights | None) -> Workload:
    """``reduce-rank``'s kernel after the all-reduce, ``out = z V_down``: a GEMM in ``dtype``; with ``fp8`` the
    graph of one FP8-weight matmul (the MLP's ``down``) reading the all-reduced ``z`` under the unsharded graph's
    name ``h_ud``, so ``quantize-fp8`` quantizes it with the unsharded MLP's static scale ``h_ud_scale`` (the sum
    of the ranks' partial products is the unsharded ``h U_down``), as every FP8 matmul is lowered."""
    if fp8 is None:
        return gemm_workload(tokens, hidden, rank, dtype=dtype)
    graph = Graph("svd_mlp_down_v")
    z = graph.add_input("h_ud", (tokens, rank), dtype)
    v = graph.add_input("v_down", (rank, hidden), fp8.format)
    graph.add_output("out", graph.add_matmul(z, v, id="down", act_scale=fp8.act_scale, w_scale=fp8.scales))
    return graph_workload(graph, "tp reduce-rank: z V_down")


def shard_mlp(workload: MlpWorkload, tp: int, strategy: Strategy) -> ShardedMlp:
    """The per-rank programs of ``workload`` over ``tp`` ranks under ``strategy``. InputError when the
    strategy does not apply (a factor-shard strategy whose shards no aligned rank compresses)."""
    t, h, inter, dtype, fp8 = workload.tokens, workload.hidden, workload.intermediate, workload.dtype, workload.fp8
    sizes = shard_sizes(inter, tp)
    group = tuple(range(tp))
    factors: dict[str, Factor] = {}
    programs: list[RankProgram] = []
    roles: dict[int, int] = {}
    at = 0
    for rank, cols in enumerate(sizes):
        span = (at, at + cols)
        at += cols
        role = roles.setdefault(cols, len(roles))
        program = RankProgram(rank, role)
        args: dict[str, Operand] = {"x": Operand("x")}
        if workload.ranks is None:
            _dense_args(args, factors, h, inter, span)
            kernel: Workload = MlpWorkload(t, h, cols, None, dtype, fp8=fp8)
            _scale_args(args, factors, kernel, fp8, rank, set())
            program.steps.append(KernelStep(f"mlp_{cols}", kernel, args, {"out": f"out.r{rank}"}))
            program.steps.append(CollectiveStep("all_reduce", f"out.r{rank}", "out", (t, h), dtype, group))
            programs.append(program)
            continue
        ranks = _rank_args(args, factors, workload, strategy, rank, span)
        if strategy.down == "reduce-rank":
            graph = _partial_graph(t, h, cols, ranks, dtype, fp8)
            kernel = graph_workload(graph, f"tp shard: {cols} intermediate columns")
            own = {"x_ug", "x_uu"} if strategy.gate_up == "factor-shard" else set()
            _scale_args(args, factors, kernel, fp8, rank, own)
            program.steps.append(KernelStep(f"partial_{cols}_{ranks[0]}_{ranks[1]}", kernel, args,
                                            {"z": f"z.r{rank}"}))
            program.steps.append(CollectiveStep("all_reduce", f"z.r{rank}", "z", (t, ranks[2]), dtype, group))
            second = _second_factor(t, h, ranks[2], dtype, fp8)
            down_args = {"a": Operand("z"), "b": Operand("v_down")} if fp8 is None else \
                {"h_ud": Operand("z"), "v_down": Operand("v_down")}
            _scale_args(down_args, factors, second, fp8, rank, set())
            program.steps.append(KernelStep("down_v", second, down_args, {"c" if fp8 is None else "out": "out"}))
        else:
            kernel = MlpWorkload(t, h, cols, ranks, dtype, fp8=fp8)
            own = ({"x_ug", "x_uu"} if strategy.gate_up == "factor-shard" else set()) | {"h_ud"}
            _scale_args(args, factors, kernel, fp8, rank, own)
            program.steps.append(KernelStep(f"mlp_{cols}_{'_'.join(map(str, ranks))}", kernel, args,
                                            {"out": f"out.r{rank}"}))
            program.steps.append(CollectiveStep("all_reduce", f"out.r{rank}", "out", (t, h), dtype, group))
        programs.append(program)
    return ShardedMlp(workload, tp, strategy, sizes, factors, programs)


def _scale_args(args: dict[str, Operand], factors: dict[str, Factor], kernel: Workload, fp8: Fp8Weights | None,
                rank: int, own: set[str]) -> None:
    """Bind the scale inputs of an FP8 rank kernel (nothing for bf16; see the module docstring): a weight's scale
    ``<w>_scale`` follows the weight's operand (its column slice as rows of a per-channel scale; whole for a
    row-parallel or whole weight; ``<w>_scale.r<rank>`` for a factor of the rank's own), an activation's
    ``<value>_scale`` is shared by every rank unless ``value`` is in ``own``."""
    if fp8 is None:
        return
    inputs = quantize_fp8(kernel.graph()).inputs()  # the kernel's arguments: with the scales the pass adds
    weights = {node.name for node in inputs if is_fp8(node.dtype)}
    for name in weights:
        tensor = args[name].tensor
        factors[tensor] = replace(factors[tensor], dtype=fp8.format)
    for node in inputs:
        name = node.name
        if name in args or not name.endswith("_scale"):
            continue
        base = name[: -len("_scale")]
        weight = args[base] if base in weights else None
        if weight is None:  # an activation's static per-tensor scale
            shared = base not in own
            tensor = name if shared else f"{name}.r{rank}"
            holds = (f"the static scale of {base} (per tensor, the same on every rank)" if shared else
                     f"the static scale of rank {rank}'s own {base} (per tensor)")
            factors[tensor] = Factor(tensor, (1, 1), holds, "float32")
            args[name] = Operand(tensor)
            continue
        stem, dot, suffix = weight.tensor.partition(".")
        tensor = f"{stem}_scale{dot}{suffix}"
        full = factors[weight.tensor].shape[1] if fp8.scales == "row" else 1
        what = "per output channel" if fp8.scales == "row" else "per tensor"
        factors[tensor] = Factor(tensor, (full, 1), f"the {fp8.scales} scales of {weight.tensor} ({what})", "float32")
        per_column = fp8.scales == "row" and weight.cols is not None
        args[name] = Operand(tensor, rows=weight.cols if per_column else None)


def _dense_args(args: dict[str, Operand], factors: dict[str, Factor], h: int, inter: int,
                span: tuple[int, int]) -> None:
    for name, shape in (("w_gate", (h, inter)), ("w_up", (h, inter)), ("w_down", (inter, h))):
        factors[name] = Factor(name, shape, f"the unsharded {name}")
    args["w_gate"] = Operand("w_gate", cols=span)
    args["w_up"] = Operand("w_up", cols=span)
    args["w_down"] = Operand("w_down", rows=span)


def _rank_args(args: dict[str, Operand], factors: dict[str, Factor], workload: MlpWorkload, strategy: Strategy,
               rank: int, span: tuple[int, int]) -> tuple[int, int, int]:
    """Bind the rank's factor arguments; return its (gate, up, down) ranks."""
    assert workload.ranks is not None
    h, inter = workload.hidden, workload.intermediate
    cols = span[1] - span[0]
    out = []
    for part, full in zip(("gate", "up"), workload.ranks[:2], strict=True):
        if strategy.gate_up == "replicate-u":
            factors[f"u_{part}"] = Factor(f"u_{part}", (h, full), f"the unsharded U of {part}")
            factors[f"v_{part}"] = Factor(f"v_{part}", (full, inter), f"the unsharded V of {part}")
            args[f"u_{part}"] = Operand(f"u_{part}")
            args[f"v_{part}"] = Operand(f"v_{part}", cols=span)
            out.append(full)
            continue
        out.append(_own_factors(args, factors, part, (h, cols), kept_fraction(h, inter, full), rank,
                                f"columns {span[0]}:{span[1]}"))
    full = workload.ranks[2]
    if strategy.down == "factor-shard":
        own = _own_factors(args, factors, "down", (cols, h), kept_fraction(inter, h, full), rank,
                           f"rows {span[0]}:{span[1]}")
        return out[0], out[1], own
    factors["u_down"] = Factor("u_down", (inter, full), "the unsharded U of down")
    factors["v_down"] = Factor("v_down", (full, h), "the unsharded V of down")
    args["u_down"] = Operand("u_down", rows=span)
    if strategy.down == "reduce-output":
        args["v_down"] = Operand("v_down")
    return out[0], out[1], full


def _own_factors(args: dict[str, Operand], factors: dict[str, Factor], part: str, shape: tuple[int, int],
                 fraction: float, rank: int, which: str) -> int:
    """Bind a projection's shard ``shape`` factorised on its own (factor-shard); return its rank."""
    rows, cols = shape
    own = shard_rank(rows, cols, fraction)
    if own is None:
        raise InputError(f"factor-shard does not apply to {part}: a [{rows}, {cols}] shard has no 128-aligned "
                         "rank below its full rank")
    for name, dims in ((f"u_{part}.r{rank}", (rows, own)), (f"v_{part}.r{rank}", (own, cols))):
        factors[name] = Factor(name, dims, f"{name[0].upper()} of {part}'s {which} factorised on their own, "
                                           f"rank {own}")
    args[f"u_{part}"] = Operand(f"u_{part}.r{rank}")
    args[f"v_{part}"] = Operand(f"v_{part}.r{rank}")
    return own


def unsharded_graph(workload: MlpWorkload) -> Graph:
    """The graph the shards together compute when every factor is a slice of one unsharded set (for FP8 weights, the
    quantized graph: each scale a plan tensor of the same name)."""
    return quantize_fp8(mlp_graph(workload.tokens, workload.hidden, workload.intermediate, workload.ranks,
                                  workload.dtype, fp8=workload.fp8))

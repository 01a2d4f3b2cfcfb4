"""The ``fused`` lowering: chains, gated MLPs and user graphs as fused kernels under a
:class:`FusedSchedule` (see docs/fusion.md).

The fusion pipeline orients every computed value (implicit transposition), assigns kernels (the
MLP whole or split) and marks what stays on chip; :func:`split_kernels` cuts the annotated graph
into one subgraph per kernel, each lowered by :func:`lower_fused_kernel`. A tuned kernel is compared
with two baselines at the same shape, as the NeuronMM paper measures them: the dense computation
with AWS's kernel per projection, and the SVD factors as separate AWS-kernel GEMMs with every
intermediate through HBM (for a user's graph: every op as its own kernel, left operands given
pre-transposed or row-major).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import replace
from typing import TYPE_CHECKING, Any, ClassVar

from ..cost_model import COST_MODEL_VERSION, CostReport, combine_reports, estimate
from ..cost_model.footprint import FUSED_ADVICE
from ..errors import InputError, ScheduleError
from ..frontends.workloads import ChainWorkload, GemmWorkload, GraphWorkload, MlpWorkload, Workload
from ..ir import Graph
from ..ir.fp8 import check_on_target
from ..ir.mx import check_mx_on_target
from ..ir.quantized import is_quantized, unquantized
from ..kernel_ir.program import Program
from ..passes import DEFAULT_FUSION_PIPELINE, DEFAULT_PIPELINE, Fuse, Pass, parse_pipeline, run_pipeline, split_kernels
from ..schedule import GemmProblem
from ..schedule.fused import NORMALIZED_PARAMS, ROW_K_TILES, FusedSchedule, normalize_on
from ..schedule.params import check_column_tiles, check_schedule, column_tile_candidates
from ..search import Evaluator, SearchSpace, SpaceSpec
from ..targets import Target, with_lnc
from ..vocab import ALayout, Dialect, Layout, NodeKind
from .base import Baseline, Lowering, aws_baseline, resolve_split, split_restriction, transpose_choice
from .gemm import aws_gemm_cost
from .lower_elementwise import lower_elementwise
from .lower_fused import KernelCache, divided_fused_kernel, finish_fused_kernel, lower_fused_kernel
from .mx import check_mx_schedule
from .nkilib_mlp import nkilib_baseline

if TYPE_CHECKING:
    from ..cost_model.footprint import Footprint


def row_scaled(workload: Workload) -> bool:
    """True for an FP8 MLP whose activations are scaled per token in the kernel (``--act-scale row``)."""
    fp8 = getattr(workload, "fp8", None)
    return fp8 is not None and fp8.act_scale == "row"


def splittable(workload: Workload) -> bool:
    """True when ``mlp=split`` changes anything: a matmul reads an elementwise result (the MLP's h); not with per-token
    activation scales, computed in the kernel that quantizes with them (passes/legality.py, rule 'row scale'), nor with
    MX weights (an MX MLP quantizes h on chip: lowerings/mx.py)."""
    if getattr(workload, "mx", None) is not None:
        return False
    if not isinstance(workload, GraphWorkload):
        return isinstance(workload, MlpWorkload) and not row_scaled(workload)
    graph = workload.graph()
    return any(n.kind == NodeKind.MATMUL and graph.node(n.operands[0]).kind == NodeKind.ELEMENTWISE
               for n in graph.nodes())


def has_prologue(workload: Workload) -> bool:
    """True when the workload normalizes a matmul's input (a norm prologue, frontends/prologue.py)."""
    if isinstance(workload, MlpWorkload):
        return workload.prologue is not None
    return isinstance(workload, GraphWorkload) and any(n.kind == NodeKind.NORM for n in workload.graph().nodes())


def row_major_activations(workload: Workload) -> bool:
    """True when some activation is row-major in HBM, so how X^T is made (x_transpose) matters. A normalized
    input's strip is always made by TensorE transposes (lowerings/fused_prologue.py): x_transpose does not
    apply to it."""
    if isinstance(workload, (ChainWorkload, GemmWorkload)):
        return workload.a_layout == ALayout.MK
    if not isinstance(workload, GraphWorkload):
        return workload.prologue is None  # an MLP's x is row-major [tokens, hidden]
    graph = workload.graph()
    lhs = {n.operands[0] for n in graph.nodes() if n.kind == NodeKind.MATMUL}
    return any(n.layout == Layout.ROW_MAJOR for n in graph.inputs() if n.id in lhs)


#: The splits whose programs exchange values with nisa.sendrecv (the nki dialect only).
EXCHANGING = ("gather", "hidden", "intermediate")


def fused_space(row_major_x: bool, splittable: bool, dma_transpose: bool = True, lnc: int = 1,
                exchange: bool = True, column_tiles: tuple[int, ...] = (1,), normalized: bool = False) -> SearchSpace:
    """The fused search space: X^T made only by DMA unless some activation is row-major
    (``row_major_x``), and then only on the TensorEngine where a transposing DMA load is not documented
    (``dma_transpose`` False); one kernel per gated MLP unless ``splittable``; the token or feature split on an
    LNC=2 target (``lnc``), with the exchanging splits only where the dialect documents nisa.sendrecv
    (``exchange``)."""
    restrict: dict[str, tuple] = split_restriction(FusedSchedule, lnc)
    if not exchange:
        restrict["lnc_split"] = tuple(v for v in restrict["lnc_split"] if v not in EXCHANGING)
    if not row_major_x:
        restrict["x_transpose"] = ("pe",) if normalized else ("dma",)  # a norm's strip: TensorE transposes
    elif not dma_transpose:
        restrict["x_transpose"] = ("pe",)
    if not splittable:
        restrict["mlp"] = ("whole",)
    restrict["column_tiles"] = column_tiles
    return SearchSpace.for_schedule(FusedSchedule, restrict)


def fusion_pipeline(mlp: str) -> list[Pass]:
    """The fusion pipeline with the fuse pass's MLP mode set."""
    return [replace(p, mlp=mlp) if isinstance(p, Fuse) else p for p in parse_pipeline(DEFAULT_FUSION_PIPELINE)]


def unfused_cost(graph: Graph, target: Target, *, lhs_layout: str = ALayout.MK, dma_transpose: bool = True
                 ) -> CostReport:
    """Every matmul as its own AWS-kernel GEMM, every elementwise op as its own HBM-to-HBM kernel,
    on a canonical graph (transposes of inputs folded into their layouts).

    ``lhs_layout="mk"``: activations are row-major in HBM, so each GEMM transposes its left operand
    on load (the unfused SVD baseline: "whatever transposes the layouts need"). ``"km"``: every left
    operand is assumed already transposed, as AWS's kernel takes it (the dense baseline, given the
    benefit of the doubt). An input stored transposed is read as such in both. Every kernel runs on one physical
    core (AWS's tutorial kernels are LNC=1 kernels)."""
    target = with_lnc(target, 1)
    reports = []
    for node in graph.nodes():
        if node.kind == NodeKind.MATMUL:
            lhs = graph.node(node.operands[0])
            m, k = lhs.shape
            layout = ALayout.KM if lhs.kind == NodeKind.INPUT and lhs.layout == Layout.TRANSPOSED else lhs_layout
            problem = GemmProblem(m, node.shape[1], k, dtype=node.dtype, a_layout=layout)
            reports.append(aws_gemm_cost(problem, target, dma_transpose))
        elif node.kind == NodeKind.ELEMENTWISE:
            reports.append(estimate(lower_elementwise(node.attrs["op"], node.shape, node.dtype, target), target))
        elif node.kind == NodeKind.NORM:  # a norm kernel of its own: one HBM-to-HBM pass over the rows, as a unary op
            reports.append(estimate(lower_elementwise("silu", node.shape, node.dtype, target), target))
        elif node.kind == NodeKind.TRANSPOSE:
            raise ScheduleError("baselines of graphs with transposes of computed values are not modelled")
    return combine_reports(reports)


def _canonical(graph: Graph) -> Graph:
    return run_pipeline(graph, DEFAULT_PIPELINE).graph


def late_forms(schedule: FusedSchedule) -> list[FusedSchedule]:
    """The forms of a one-token-tile schedule the search's last descent costs beside it: the activations stationary
    (``stationary=tokens``), the row-major matmul in K blocks of each of :data:`ROW_K_TILES`, and both."""
    forms = [schedule] + ([replace(schedule, stationary="tokens")] if schedule.stationary == "weights" else [])
    if schedule.row_k_tiles == 0:
        forms += [replace(form, row_k_tiles=k) for form in forms for k in ROW_K_TILES]
    return forms[1:]


def hoisted_forms(schedule: FusedSchedule) -> list[FusedSchedule]:
    """The MX schedule with its weights' scales hoisted before their K blocks (``mx_scales=hoisted``, lowerings/mx.py)
    where it blocks a contraction (``k_tiles_per_block`` or ``row_k_tiles``: elsewhere nothing is hoisted)."""
    if schedule.mx_scales != "block" or not (schedule.k_tiles_per_block or schedule.row_k_tiles):
        return []
    return [replace(schedule, mx_scales="hoisted")]


Forms = Callable[[FusedSchedule], list[FusedSchedule]]


def _with_hoisted(forms: Forms | None, hoist: Forms | None, keep: bool = True) -> Forms | None:
    """``forms`` (other forms of a schedule) followed by the ``hoist`` forms of the schedule (``keep``) and of each of
    them; ``forms`` itself without ``hoist``."""
    if hoist is None:
        return forms

    def both(schedule: FusedSchedule) -> list[FusedSchedule]:
        others = forms(schedule) if forms is not None else []
        return [*others, *(h for f in ((schedule, *others) if keep else others) for h in hoist(f))]
    return both


#: The schedule parameters that count contraction tiles per weight block (0: all of them).
_CONTRACTION_BLOCK_PARAMS = ("k_tiles_per_block", "row_k_tiles")


def _check_contraction_blocks(workload: Workload, params: Mapping[str, str | int], target: Target) -> None:
    """ScheduleError when a ``--param`` block of contraction tiles is larger than the workload's longest contraction:
    the lowering would take the whole contraction, so the value the user wrote is not the one the kernel uses.
    Only values the user gave are checked (the search samples within the workload's own lists)."""
    if not any(params.get(name) is not None for name in _CONTRACTION_BLOCK_PARAMS):
        return
    graph = workload.graph()
    longest = max((graph.node(n.operands[0]).shape[-1] for n in graph.nodes() if n.kind == NodeKind.MATMUL),
                  default=0)
    tiles = -(-longest // target.pmax)
    for name in _CONTRACTION_BLOCK_PARAMS:
        value = params.get(name)
        if value is not None and int(value) > tiles:
            raise ScheduleError(f"{name}={value} exceeds this workload's longest contraction, {tiles} tiles of "
                                f"{target.pmax} rows ({longest}); give 1..{tiles}, or 0 for all of them")


#: Divided programs the search keeps for the block forms of the row schedules it costed last
#: (:meth:`FusedLowering.search_setup`): a row schedule and its 5 late forms (:func:`late_forms`), each kernel's
#: (two for mlp=split), whose block forms the evaluator costs after them
_DIVIDED_KEPT = 16


class FusedLowering(Lowering):
    kind: ClassVar[str] = "fused"
    schedule_class: ClassVar[type] = FusedSchedule
    default_schedule_name: ClassVar[str] = "default"
    exhaustive_threshold: ClassVar[int] = 200  # fused schedules take longer to cost
    fit_advice: ClassVar[tuple[str, str]] = FUSED_ADVICE

    def accepts(self, workload: Workload) -> bool:
        return True

    def resolve(self, workload: Workload, schedule: Any | None, preset_name: str | None,
                params: Mapping[str, str | int], target: Target, dialect: Dialect) -> FusedSchedule:
        if preset_name is not None:
            raise InputError("--schedule presets are GEMM schedules; fused graphs take --param only "
                             "(see 'nmmc schedules --mlp ...')")
        fp8 = getattr(workload, "fp8", None)
        if fp8 is not None:  # a format the target's nc_matmul takes (rule NKI-MATMUL-E4M3FN)
            check_on_target(fp8.format, target)
        mx = getattr(workload, "mx", None)
        if mx is not None:  # nc_matmul_mx on the target, in the nki dialect (rule NKI-MX-TARGET; docs/mx.md)
            check_mx_on_target(mx.spec, target, dialect)
            check_mx_schedule(params)
        base = schedule or FusedSchedule()
        if row_major_activations(workload):
            base = base.with_params(transpose_choice("x_transpose", schedule, params, workload, target, dialect))
        chosen = base.with_params(dict(params))
        check_schedule(chosen, target)
        if chosen.mx_scales != "block" and mx is None:
            raise ScheduleError(f"mx_scales={chosen.mx_scales}: only MX weights (--dtype mxfp8_e4m3, mxfp8_e5m2, "
                                "mxfp4) have block scales to hoist (docs/mx.md); drop the mx_scales parameter")
        _check_contraction_blocks(workload, params, target)
        if has_prologue(workload) and dialect != Dialect.NKI:
            raise ScheduleError("the norm prologue (--fuse-norm, a graph's rmsnorm/layernorm) uses nisa.activation_"
                                "reduce, bn_stats, bn_aggr and tensor_scalar as the nki dialect (NKI 0.3+) spells "
                                "them; use --dialect nki (trn2, trn3)")
        check_column_tiles(chosen.column_tiles, target)
        if chosen.lnc_split in EXCHANGING and dialect != Dialect.NKI:
            raise ScheduleError(f"lnc_split={chosen.lnc_split} exchanges values with nisa.sendrecv, documented for the "
                                "nki dialect only; use --dialect nki, or lnc_split=tokens/features")
        if chosen.weight_dma == "block" and dialect != Dialect.NKI:
            raise ScheduleError("weight_dma=block loads a weight block in one DMA through an access pattern (.ap), "
                                "documented for the nki dialect (NKI 0.2+) only; use --dialect nki, or weight_dma=row")
        if chosen.mlp == "split" and row_scaled(workload):
            raise ScheduleError("mlp=split hands h to a second kernel through HBM; per-token activation scales "
                                "(--act-scale row) are computed in the kernel that quantizes and dequantizes with "
                                "them: use mlp=whole (docs/quantization.md)")
        if chosen.mlp == "split" and not splittable(workload):
            raise ScheduleError("mlp=split applies to graphs where a matmul reads an elementwise result "
                                "(the gated MLP's h)")
        normalized = normalize_on(chosen, workload.token_count, target)
        if target.lnc == 1 and normalized.lnc_split == "none":
            return normalized
        graph = workload.graph()

        def programs(schedule: FusedSchedule) -> list[Program]:
            kernels = self.kernels(run_pipeline(graph, self.pipeline(schedule)).graph)
            return [self.lower(k, schedule, target) for k in kernels]

        return resolve_split(normalized, params, target, programs, () if dialect == Dialect.NKI else EXCHANGING)

    def pipeline(self, schedule: Any) -> list[Pass]:
        return fusion_pipeline(schedule.mlp)

    def kernels(self, graph: Graph) -> list[Graph]:
        if not graph.compute_nodes():
            raise ScheduleError(f"graph {graph.name} computes nothing: every output returns an input (transposes "
                                "of inputs become input layouts); nmmc compiles computations")
        return split_kernels(graph)

    def lower(self, kernel: Graph, schedule: Any, target: Target) -> Program:
        return lower_fused_kernel(kernel, schedule, target, kernel.name)

    def summary(self, workload: Workload, schedule_name: str, schedule: Any, programs: list[Program],
                footprints: list[Footprint], cost: CostReport, target: Target) -> list[tuple[str, str]]:
        return [
            ("workload", workload.describe()),
            ("schedule", schedule_name),
            ("parameters", schedule.describe()),
            ("footprint", "; ".join(f"{p.name}: {fp.describe()}" for p, fp in zip(programs, footprints, strict=True))),
            ("predicted", f"{cost.latency_us:.1f} us on {target.label} (cost model v{COST_MODEL_VERSION}, "
                          f"{len(programs)} kernel{'s' if len(programs) > 1 else ''}; {target.launch_summary})"),
        ]

    def space(self, workload: Workload, dma_transpose: bool = True, lnc: int = 1, exchange: bool = True) -> SearchSpace:
        columns = (1,) if getattr(workload, "mx", None) is not None else column_tile_candidates(workload.token_count)
        return fused_space(row_major_activations(workload), splittable(workload), dma_transpose, lnc, exchange,
                           columns, has_prologue(workload))

    def search_setup(self, workload: Workload, target: Target, exhaustive_threshold: int,
                     dma_transpose: bool = True, exchange: bool = True) -> tuple[SpaceSpec, Evaluator]:
        mx = getattr(workload, "mx", None)
        if mx is not None:  # before any schedule is costed (rule NKI-MX-TARGET)
            check_mx_on_target(mx.spec, target, "nki" if exchange else "neuronxcc")
        tokens = workload.token_count
        graph = workload.graph()
        kernels_by_mode: dict[str, list[Graph]] = {}
        divided: dict[tuple[int, FusedSchedule], Program] = {}  # (kernel graph, row schedule): its divided program
        read: KernelCache = {}  # what the lowering reads of each kernel whatever the schedule (lower_fused.py)

        def lower(kernel: Graph, schedule: FusedSchedule) -> Program:
            # the block form of a row schedule (the variant below, costed right after it, and its late forms right
            # after the row form's) is the row form's divided program with its slab loads coalesced
            # (lower_fused.divided_fused_kernel): lowered once for both, the last few kept
            key = (id(kernel), replace(schedule, weight_dma="row") if schedule.weight_dma == "block" else schedule)
            program = divided.pop(key, None) or divided_fused_kernel(kernel, key[1], target, kernel.name, read)
            divided[key] = program  # the most recent last
            if len(divided) > _DIVIDED_KEPT:
                del divided[next(iter(divided))]
            return finish_fused_kernel(program, schedule)

        def cost(schedule: FusedSchedule) -> CostReport:
            if schedule.mlp not in kernels_by_mode:
                kernels_by_mode[schedule.mlp] = self.kernels(run_pipeline(graph, self.pipeline(schedule)).graph)
            return combine_reports([estimate(lower(k, schedule), target) for k in kernels_by_mode[schedule.mlp]])

        columns = (1,) if mx is not None else column_tile_candidates(tokens, target.max_column_tiles)  # MX: row tiles
        space = fused_space(row_major_activations(workload), splittable(workload), dma_transpose, target.lnc,
                            exchange, columns)

        def normalized(schedule: FusedSchedule) -> FusedSchedule:
            return normalize_on(schedule, tokens, target)

        def distinct() -> list[FusedSchedule]:  # walked only by an exhaustive search
            return list(space.distinct(normalized, NORMALIZED_PARAMS))

        base = FusedSchedule()
        transposes = space.candidates["x_transpose"]
        x_transpose = "pe" if "pe" in transposes and (tokens < 128 or "dma" not in transposes) else "dma"
        shapes = [replace(base, x_transpose=x_transpose), replace(base, cache_weights="stage1", tokens_per_block=512)]
        if "split" in space.candidates["mlp"]:
            shapes.append(replace(base, mlp="split"))
        if tokens <= 64:  # decode: wide weight rows over few K tiles, accumulators packed in a bank (as nki-library)
            shapes.append(replace(base, x_transpose=x_transpose, k_tiles_per_block=8, weight_block_kib=128))
        # every guess under every split of the logical core (a decode step has no tokens to divide, a prefill step
        # may have no on-chip value worth exchanging): the first trials include one that divides
        guesses = [replace(g, lnc_split=split) for g in shapes for split in space.candidates["lnc_split"]]
        spec = SpaceSpec(space=space, guesses=guesses, size=space.distinct_size(normalized, NORMALIZED_PARAMS),
                         distinct=distinct)
        # a weight block in one DMA (an access pattern: the nki dialect) is costed beside every sampled schedule of one
        # DMA per slab, not sampled itself: it trades fixed costs for a longer prologue, and as a third value it left
        # the search in other basins at 512 tokens (docs/fusion.md, "The search")
        blocks = (lambda s: [replace(s, weight_dma="block")] if s.weight_dma == "row" else []) if exchange else None
        # an MX weight's scales hoisted before its K blocks (lowerings/mx.py: fewer DMAs, more SBUF) is costed beside
        # every MX schedule that blocks a contraction and beside its other forms, not sampled: only MX schedules have it
        hoist = hoisted_forms if mx is not None else None
        variants = _with_hoisted(blocks, hoist)
        # the activations stationary (lowerings/fused_stationary.py) and the row-major matmul's own K blocks
        # (row_k_tiles) where the tokens are one token tile, as in nki-library's decode MLP: costed in the search's last
        # descent only (search/tuner.py, _late); the first, costed on every trial, made the test suite about a quarter
        # slower (pytest 7:20 -> 9:24 on a 2-core host)
        late = _with_hoisted(late_forms, hoist, keep=False) if tokens <= target.gemm_stationary_fmax else None
        return spec, Evaluator(cost, normalized, variants, late)

    def baselines(self, workload: Workload, target: Target, dma_transpose: bool = True) -> dict[str, Baseline]:
        if isinstance(workload, GraphWorkload):
            graph = workload.graph()
            fp8 = is_quantized(graph)  # AWS's GEMMs have no FP8: the bf16 graph it quantizes, labelled so
            graph = _canonical(unquantized(graph, workload.dtype) if fp8 else graph)
            tag = f", {workload.dtype}, no FP8" if fp8 else ""
            try:
                dense, unfused = (unfused_cost(graph, target, lhs_layout=ALayout.KM, dma_transpose=dma_transpose),
                                  unfused_cost(graph, target, lhs_layout=ALayout.MK, dma_transpose=dma_transpose))
            except ScheduleError:
                dense = unfused = None
            return {"dense": aws_baseline(f"per-op kernels, lhs pre-transposed{tag}", "pre-transposed per-op kernels",
                                          dense, target),
                    "unfused": aws_baseline(f"per-op kernels (AWS GEMMs{tag})", "per-op kernels", unfused, target)}
        # AWS's tutorial matmul has no FP8: for an FP8 MLP its baselines are the bf16 computations a user without
        # nmmc's FP8 kernel would run (ir/quantized.unquantized), named so (docs/quantization.md, "Baselines")
        fp8 = isinstance(workload, MlpWorkload) and workload.fp8 is not None
        plain, tag = ((lambda g: unquantized(g, workload.dtype)), f" {workload.dtype}") if fp8 else ((lambda g: g), "")
        aws = "AWS kernels, no FP8" if fp8 else "AWS kernels"
        dense = unfused_cost(_canonical(plain(workload.dense_graph())), target, lhs_layout=ALayout.KM,
                             dma_transpose=dma_transpose)
        baselines = {"dense": aws_baseline(f"dense{tag} ({aws})", f"dense{tag}", dense, target)}
        if isinstance(workload, MlpWorkload):  # what NxD Inference runs for an MLP (lowerings/nkilib_mlp.py)
            baselines = {"nkilib-mlp": nkilib_baseline(workload, target), **baselines}
        if workload.svd:  # a dense MLP has no SVD factors to leave unfused
            unfused = unfused_cost(_canonical(plain(workload.graph())), target, lhs_layout=ALayout.MK,
                                   dma_transpose=dma_transpose)
            baselines["unfused"] = aws_baseline(f"SVD factors unfused{tag} ({aws})", f"unfused SVD{tag}", unfused,
                                                target)
        return baselines


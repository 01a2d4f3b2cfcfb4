"""What the user asks nmmc to compile, as a tagged union: a GEMM, an SVD-compressed chain X·U·V, a
gated MLP (SVD-compressed or dense), or a graph the user described in a graph file. Each kind knows
the graph it compiles, the dense graph it is measured against, a one-line description, and its
plain-JSON form (:meth:`Workload.to_dict` / :func:`workload_from_dict`, used by lockfiles and study
attributes). Which lowering compiles a workload is the lowering registry's business
(:mod:`.lowerings`), not the workload's.
"""

from __future__ import annotations

import re
from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

from ..errors import InputError
from ..ir import DTYPES, Graph, canonical_dtype, parse_text, to_text
from ..schedule import GemmProblem
from ..vocab import ALayout, NodeKind
from .mx import MxWeights, mx_from_dict
from .prologue import NormPrologue, prologue_from_dict
from .shapes import Fp8Weights, block_aligned_rank, gemm_graph, mlp_graph, svd_chain_graph


class Workload(ABC):
    """One compilation request (frozen, hashable). ``kind`` names the variant in its JSON form."""

    kind: ClassVar[str]
    dtype: str

    @abstractmethod
    def graph(self) -> Graph:
        """The graph nmmc compiles (the SVD-compressed one for chain and SVD MLP workloads)."""

    @abstractmethod
    def dense_graph(self) -> Graph:
        """The uncompressed computation, the paper's baseline (a user's graph is its own)."""

    @abstractmethod
    def describe(self) -> str:
        """One line for headers and reports."""

    @property
    @abstractmethod
    def token_count(self) -> int:
        """Rows of the activations (M of a GEMM or chain, tokens of an MLP)."""

    @abstractmethod
    def fields_dict(self) -> dict[str, Any]:
        """The kind's own fields as plain JSON values (see :meth:`to_dict`)."""

    @property
    def svd(self) -> bool:
        """True when :meth:`graph` is a low-rank (SVD) approximation of :meth:`dense_graph`: it
        computes something else than the dense computation it is compared with."""
        return False

    def to_dict(self) -> dict[str, Any]:
        """The fields that rebuild this workload, as plain JSON values (``kind`` and ``dtype`` first)."""
        return {"kind": self.kind, "dtype": self.dtype, **self.fields_dict()}


def _typed_a_layout(workload: GemmWorkload | ChainWorkload) -> None:
    """Hold a valid ``a_layout`` given as a string as its :class:`ALayout` (equal, and hashing
    equal, to the string); an invalid one is kept for the graph's frontend to reject."""
    object.__setattr__(workload, "a_layout", ALayout.lookup(workload.a_layout) or workload.a_layout)


@dataclass(frozen=True)
class GemmWorkload(Workload):
    """``C[M,N] = A[M,K] @ B[K,N]``; ``a_layout="km"``: A is stored transposed, as [K, M]."""

    kind: ClassVar[str] = "gemm"
    m: int
    n: int
    k: int
    dtype: str = "bfloat16"
    a_layout: ALayout = ALayout.MK
    #: B in an OCP MX format and A quantized on chip (``--dtype mxfp4`` ..., docs/mx.md; a fused kernel), or None
    mx: MxWeights | None = None

    def __post_init__(self) -> None:
        _typed_a_layout(self)

    def problem(self) -> GemmProblem:
        return GemmProblem(self.m, self.n, self.k, dtype=self.dtype, a_layout=self.a_layout)

    def graph(self) -> Graph:
        return gemm_graph(self.m, self.n, self.k, dtype=self.dtype, a_layout=self.a_layout, mx=self.mx)

    def dense_graph(self) -> Graph:
        return self.graph()

    def describe(self) -> str:
        return self.problem().describe() + ("" if self.mx is None else f", B {self.mx.describe()}")

    @property
    def token_count(self) -> int:
        return self.m

    def fields_dict(self) -> dict[str, Any]:
        fields = {"m": self.m, "n": self.n, "k": self.k, "a_layout": self.a_layout}
        if self.mx is not None:  # absent otherwise: the JSON form (cache keys, lockfiles) of other GEMMs is kept
            fields["mx"] = self.mx.to_dict()
        return fields


@dataclass(frozen=True)
class ChainWorkload(Workload):
    """``Y[M,N] = X[M,K] @ U[K,R] @ V[R,N]``: an SVD-compressed weight ``W ≈ U V`` applied to X."""

    kind: ClassVar[str] = "chain"
    m: int
    n: int
    k: int
    rank: int
    dtype: str = "bfloat16"
    a_layout: ALayout = ALayout.MK

    def __post_init__(self) -> None:
        _typed_a_layout(self)

    def graph(self) -> Graph:
        return svd_chain_graph(self.m, self.n, self.k, self.rank, dtype=self.dtype, x_layout=self.a_layout)

    def dense_graph(self) -> Graph:
        return gemm_graph(self.m, self.n, self.k, dtype=self.dtype, a_layout=self.a_layout)

    def describe(self) -> str:
        return (f"Y[M,N] = X[M,K] @ U[K,R] @ V[R,N], M={self.m} N={self.n} K={self.k} R={self.rank}, "
                f"{self.dtype}, X {'[M,K]' if self.a_layout == ALayout.MK else 'stored as X_t[K,M]'}")

    @property
    def token_count(self) -> int:
        return self.m

    def fields_dict(self) -> dict[str, Any]:
        return {"m": self.m, "n": self.n, "k": self.k, "a_layout": self.a_layout, "rank": self.rank}

    @property
    def svd(self) -> bool:
        return True


@dataclass(frozen=True)
class MlpWorkload(Workload):
    """The gated MLP ``silu(x Wg) * (x Wu) Wd``; ``ranks`` (gate, up, down) or None for dense; ``prologue``: the
    residual add and norm fused before it (:mod:`.prologue`), or None."""

    kind: ClassVar[str] = "mlp"
    tokens: int
    hidden: int
    intermediate: int
    ranks: tuple[int, int, int] | None = None
    dtype: str = "bfloat16"
    prologue: NormPrologue | None = None
    #: FP8 weights and quantized activations (``--dtype fp8``, docs/quantization.md), or None (weights in ``dtype``)
    fp8: Fp8Weights | None = None
    #: OCP MX weights and activations quantized on chip (``--dtype mxfp4`` ..., docs/mx.md), or None
    mx: MxWeights | None = None

    def graph(self) -> Graph:
        return mlp_graph(self.tokens, self.hidden, self.intermediate, self.ranks, dtype=self.dtype,
                         prologue=self.prologue, fp8=self.fp8, mx=self.mx)

    def dense_graph(self) -> Graph:
        return mlp_graph(self.tokens, self.hidden, self.intermediate, None, dtype=self.dtype, prologue=self.prologue,
                         fp8=self.fp8, mx=self.mx)

    def describe(self) -> str:
        ranks = "dense" if self.ranks is None else "ranks gate/up/down " + "/".join(map(str, self.ranks))
        prologue = "" if self.prologue is None else f", prologue {self.prologue.describe()}"
        fp8 = "" if self.fp8 is None else f", {self.fp8.format} weights ({self.fp8.scales} scales)"
        if self.fp8 is not None and self.fp8.act_scale != "static":
            fp8 += f", {self.fp8.act_scale} activation scales"
        fp8 += "" if self.mx is None else f", {self.mx.describe()}"
        return (f"gated MLP silu(x Wg) * (x Wu) Wd, tokens={self.tokens} hidden={self.hidden} "
                f"intermediate={self.intermediate}, {ranks}, {self.dtype}{prologue}{fp8}")

    @property
    def token_count(self) -> int:
        return self.tokens

    def fields_dict(self) -> dict[str, Any]:
        fields = {"tokens": self.tokens, "hidden": self.hidden, "intermediate": self.intermediate,
                  "ranks": None if self.ranks is None else list(self.ranks)}
        if self.prologue is not None:  # absent otherwise: the JSON form (cache keys, lockfiles) of other MLPs is kept
            fields["prologue"] = self.prologue.to_dict()
        if self.fp8 is not None:  # likewise
            fields["fp8"] = {"format": self.fp8.format, "scales": self.fp8.scales}
            if self.fp8.act_scale != "static":  # absent when static: earlier FP8 cache keys and lockfiles are kept
                fields["fp8"]["act_scale"] = self.fp8.act_scale
        if self.mx is not None:  # likewise
            fields["mx"] = self.mx.to_dict()
        return fields

    @property
    def svd(self) -> bool:
        return self.ranks is not None


@dataclass(frozen=True)
class GraphWorkload(Workload):
    """A user's graph (see :mod:`.graph_file`), held as the IR text of the graph with its dimensions
    bound (so the workload stays hashable), and where it came from (for messages)."""

    kind: ClassVar[str] = "graph"
    graph_text: str
    source: str
    dtype: str = "bfloat16"

    def graph(self) -> Graph:
        return parse_text(self.graph_text)

    def dense_graph(self) -> Graph:
        return self.graph()

    def describe(self) -> str:
        graph = self.graph()
        ins = ", ".join(f"{n.name}{list(n.shape)}" for n in graph.inputs())
        outs = ", ".join(f"{n.name}{list(n.shape)}" for n in graph.outputs())
        return f"graph {graph.name} ({self.source}): {ins} -> {outs}, {self.dtype}"

    @property
    def token_count(self) -> int:
        return graph_token_count(self.graph())

    def fields_dict(self) -> dict[str, Any]:
        return {"graph": self.graph_text, "source": self.source}


#: The variants by their ``kind``.
WORKLOAD_KINDS: Mapping[str, type[Workload]] = {
    cls.kind: cls for cls in (GemmWorkload, ChainWorkload, MlpWorkload, GraphWorkload)}


def graph_token_count(graph: Graph) -> int:
    """Rows of the largest left operand of a matmul (the token dimension a fused kernel blocks),
    or of the largest computed value when the graph has no matmul."""
    rows = [graph.node(n.operands[0]).shape[0] for n in graph.nodes() if n.kind == NodeKind.MATMUL]
    rows = rows or [n.shape[0] for n in graph.compute_nodes()]
    return max(rows, default=1)


def graph_workload(graph: Graph, source: str) -> GraphWorkload:
    """A workload compiling a user's graph (see :mod:`.graph_file`); the dtype of its activations (an FP8 graph's
    weights and float32 scales besides, docs/quantization.md)."""
    from ..ir.fp8 import is_fp8
    from ..ir.quantized import scale_inputs

    scales = scale_inputs(graph)
    dtypes = {n.dtype for n in graph.inputs() if not is_fp8(n.dtype) and n.id not in scales}
    if len(dtypes) != 1:
        raise InputError(f"{source}: inputs mix dtypes ({', '.join(sorted(dtypes)) or 'FP8 only'}); a graph has "
                         "one dtype (and FP8 weights with their float32 scales)")
    return GraphWorkload(graph_text=to_text(graph), source=source, dtype=dtypes.pop())


def _positive(value: object, what: str) -> int:
    if value is None or isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise InputError(f"{what} must be a positive integer; got {value!r}")
    return value


def gemm_workload(m: int, n: int, k: int, *, dtype: str = "bfloat16", a_layout: str = ALayout.MK,
                  mx: MxWeights | None = None) -> GemmWorkload:
    """``C[M,N] = A[M,K] @ B[K,N]`` (``dtype`` may be spelled bf16/fp32; dimensions and dtype are
    checked by :class:`GemmProblem`); ``mx``: B in an OCP MX format (docs/mx.md)."""
    workload = GemmWorkload(m, n, k, dtype=canonical_dtype(dtype), a_layout=a_layout, mx=mx)
    workload.problem()
    if mx is not None:
        workload.graph()  # K a whole number of MX tiles, else InputError now
    return workload


def chain_workload(m: int, n: int, k: int, *, rank: int | None = None, keep_ratio: float | None = None,
                   dtype: str = "bfloat16", a_layout: str = ALayout.MK, align: int = 128) -> ChainWorkload:
    """X[M,K] @ U[K,R] @ V[R,N]; the rank given, or block-aligned from the dense [K, N] weight."""
    if (rank is None) == (keep_ratio is None):
        raise InputError("give exactly one of --rank and --keep-ratio for an SVD chain")
    r = _positive(rank, "--rank") if keep_ratio is None else block_aligned_rank(k, n, keep_ratio, align)
    return ChainWorkload(m, n, k, r, dtype=dtype, a_layout=a_layout)


def mlp_workload(tokens: int, hidden: int, intermediate: int, *, rank: int | None = None,
                 ranks: tuple[int, ...] | None = None, keep_ratio: float | None = None,
                 dense: bool = False, dtype: str = "bfloat16", align: int = 128,
                 prologue: NormPrologue | None = None, fp8: Fp8Weights | None = None,
                 mx: MxWeights | None = None) -> MlpWorkload:
    """The gated MLP; ranks per projection (gate, up, down), one rank for all, or block-aligned from
    keep_ratio (gate/up from [hidden, intermediate], down from [intermediate, hidden]); ``prologue``: the
    residual add and norm fused before it."""
    for value, what in ((tokens, "--tokens"), (hidden, "--hidden"), (intermediate, "--intermediate")):
        _positive(value, what)
    given = sum(x is not None for x in (rank, ranks, keep_ratio))
    if dense:
        if given:
            raise InputError("a dense MLP takes no --rank, --ranks or --keep-ratio")
        return MlpWorkload(tokens, hidden, intermediate, dtype=dtype, prologue=prologue, fp8=fp8, mx=mx)
    if given != 1:
        raise InputError("give exactly one of --rank, --ranks and --keep-ratio for an SVD MLP (or --dense)")
    if keep_ratio is not None:
        gate_up = block_aligned_rank(hidden, intermediate, keep_ratio, align)
        down = block_aligned_rank(intermediate, hidden, keep_ratio, align)
        chosen = (gate_up, gate_up, down)
    elif ranks is not None:
        if len(ranks) != 3:
            raise InputError(f"--ranks takes three ranks gate,up,down; got {len(ranks)}")
        chosen = tuple(_positive(r, "--ranks entry") for r in ranks)  # type: ignore[assignment]
    else:
        chosen = (_positive(rank, "--rank"),) * 3
    return MlpWorkload(tokens, hidden, intermediate, ranks=chosen, dtype=dtype, prologue=prologue, fp8=fp8, mx=mx)


# ----------------------------------------------------------------------------- JSON form


def _field(data: Mapping[str, Any], name: str) -> int:
    return _positive(data.get(name), f"workload field {name!r}")


def _graph_from_dict(data: Mapping[str, Any]) -> GraphWorkload:
    """A user graph recorded as its IR text: parsed and its names checked as a graph file's are
    (a lockfile is edited by hand, and its names become identifiers in emitted code)."""
    from .untrusted import check_user_name

    text, source = data.get("graph"), data.get("source", "lockfile")
    if not isinstance(text, str) or not isinstance(source, str):
        raise InputError("a graph workload needs 'graph' (the graph's text form) and 'source' strings")
    graph = parse_text(text)
    check_user_name(graph.name, "graph name")
    for node in graph.nodes():
        check_user_name(node.name if node.kind in (NodeKind.INPUT, NodeKind.OUTPUT) else node.id, node.kind)
    return graph_workload(graph, source)


def workload_from_dict(data: Mapping[str, Any]) -> Workload:
    """Rebuild a workload from :meth:`Workload.to_dict`'s output; InputError when malformed."""
    if not isinstance(data, Mapping):
        raise InputError(f"a workload must be a JSON object; got {data!r}")
    kind, dtype = data.get("kind"), data.get("dtype", "bfloat16")
    if kind not in WORKLOAD_KINDS:
        raise InputError(f"unknown workload kind {kind!r}; kinds: {', '.join(WORKLOAD_KINDS)}")
    if dtype not in DTYPES:
        raise InputError(f"unknown dtype {dtype!r}; accepted: {', '.join(DTYPES)}")
    if kind in ("gemm", "chain"):
        layout = ALayout.lookup(data.get("a_layout", ALayout.MK))
        if layout is None:
            raise InputError(f"unknown A layout {data.get('a_layout')!r}; accepted: {', '.join(ALayout)}")
        m, n, k = (_field(data, name) for name in ("m", "n", "k"))
        if kind == "chain":
            return ChainWorkload(m, n, k, _field(data, "rank"), dtype=dtype, a_layout=layout)
        return GemmWorkload(m, n, k, dtype=dtype, a_layout=layout, mx=mx_from_dict(data.get("mx")))
    if kind == "graph":
        return _graph_from_dict(data)
    ranks = data.get("ranks")
    if ranks is not None:
        if not isinstance(ranks, list) or len(ranks) != 3:
            raise InputError(f"workload field 'ranks' must be null or three ranks gate, up, down; got {ranks!r}")
        ranks = tuple(_positive(r, "workload field 'rank'") for r in ranks)
    fp8 = data.get("fp8")
    if fp8 is not None:
        if not isinstance(fp8, Mapping):
            raise InputError(f"workload field 'fp8' must be null or {{format, scales}}; got {fp8!r}")
        fp8 = Fp8Weights(str(fp8.get("format")), str(fp8.get("scales")), str(fp8.get("act_scale", "static")))
    return MlpWorkload(_field(data, "tokens"), _field(data, "hidden"), _field(data, "intermediate"),
                       ranks=ranks, dtype=dtype, prologue=prologue_from_dict(data.get("prologue")), fp8=fp8,
                       mx=mx_from_dict(data.get("mx")))


def workload_label(data: Mapping[str, Any]) -> str:
    """A short label of a workload dict for tables: ``gemm 128x512x256 bf16``, ``chain ... r128``."""
    dtype = {"bfloat16": "bf16", "float32": "fp32"}.get(str(data.get("dtype")), str(data.get("dtype")))
    kind = data.get("kind")
    if kind in ("gemm", "chain"):
        text = f"{kind} {data.get('m')}x{data.get('n')}x{data.get('k')}"
        text += f" r{data.get('rank')}" if kind == "chain" else ""
        text += " A^T" if data.get("a_layout") == ALayout.KM else ""
        mx = data.get("mx")
        return f"{text} {dtype}" + (f" {mx.get('format')}" if isinstance(mx, Mapping) else "")
    if kind == "graph":
        match = re.search(r"graph\s+(\w+)", str(data.get("graph", "")))
        return f"graph {match.group(1) if match else '?'} {dtype}"
    ranks = data.get("ranks")
    rank_text = "dense" if ranks is None else "r" + "/".join(map(str, ranks))
    prologue = data.get("prologue")
    norm = f" +{prologue.get('norm')}" if isinstance(prologue, Mapping) else ""
    fp8, mx = data.get("fp8"), data.get("mx")
    weights = f" {str(fp8.get('format')).replace('float8_', 'fp8_')}" if isinstance(fp8, Mapping) else ""
    weights += f" {mx.get('format')}" if isinstance(mx, Mapping) else ""
    return (f"mlp t{data.get('tokens')} h{data.get('hidden')} i{data.get('intermediate')} {rank_text}{norm} "
            f"{dtype}{weights}")

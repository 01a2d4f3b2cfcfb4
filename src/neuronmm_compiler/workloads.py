"""What the user asks nmmc to compile: a GEMM, an SVD-compressed chain X·U·V, a gated MLP
(SVD-compressed or dense), or a graph the user described in a graph file, with the graph each is
measured against."""

from __future__ import annotations

from dataclasses import dataclass

from .errors import InputError
from .ir import Graph, block_aligned_rank, gemm_graph, mlp_graph, parse_text, svd_chain_graph, to_text
from .schedule import GemmProblem


@dataclass(frozen=True)
class Workload:
    """One compilation request. ``kind`` is "gemm", "chain", "mlp" or "graph" (a user's graph file,
    held as the IR text of the graph with its dimensions bound, so the workload stays hashable)."""

    kind: str
    dtype: str = "bfloat16"
    # gemm / chain: Y[M, N] = X[M, K] @ W[K, N] (W = U V for a chain)
    m: int = 0
    n: int = 0
    k: int = 0
    rank: int = 0
    a_layout: str = "mk"
    # mlp
    tokens: int = 0
    hidden: int = 0
    intermediate: int = 0
    ranks: tuple[int, int, int] | None = None
    # graph: the IR text form of the bound graph, and where it came from (for messages)
    graph_text: str = ""
    source: str = ""

    @property
    def token_count(self) -> int:
        """Rows of the activations (M of a GEMM or chain, tokens of an MLP)."""
        if self.kind == "graph":
            return graph_token_count(self.graph())
        return self.tokens if self.kind == "mlp" else self.m

    @property
    def fused(self) -> bool:
        return self.kind != "gemm"

    def problem(self) -> GemmProblem:
        if self.kind != "gemm":
            raise InputError(f"a {self.kind} workload is not a single GEMM")
        return GemmProblem(self.m, self.n, self.k, dtype=self.dtype, a_layout=self.a_layout)

    def graph(self) -> Graph:
        """The graph nmmc compiles (the SVD-compressed one for chain and SVD MLP workloads)."""
        if self.kind == "gemm":
            return gemm_graph(self.m, self.n, self.k, dtype=self.dtype, a_layout=self.a_layout)
        if self.kind == "chain":
            return svd_chain_graph(self.m, self.n, self.k, self.rank, dtype=self.dtype, x_layout=self.a_layout)
        if self.kind == "graph":
            return parse_text(self.graph_text)
        return mlp_graph(self.tokens, self.hidden, self.intermediate, self.ranks, dtype=self.dtype)

    def dense_graph(self) -> Graph:
        """The uncompressed computation: the paper's baseline (a user's graph is its own)."""
        if self.kind == "graph":
            return self.graph()
        if self.kind in ("gemm", "chain"):
            return gemm_graph(self.m, self.n, self.k, dtype=self.dtype, a_layout=self.a_layout)
        return mlp_graph(self.tokens, self.hidden, self.intermediate, None, dtype=self.dtype)

    def describe(self) -> str:
        if self.kind == "graph":
            graph = self.graph()
            ins = ", ".join(f"{n.name}{list(n.shape)}" for n in graph.inputs())
            outs = ", ".join(f"{n.name}{list(n.shape)}" for n in graph.outputs())
            return f"graph {graph.name} ({self.source}): {ins} -> {outs}, {self.dtype}"
        if self.kind == "gemm":
            return self.problem().describe()
        if self.kind == "chain":
            return (f"Y[M,N] = X[M,K] @ U[K,R] @ V[R,N], M={self.m} N={self.n} K={self.k} R={self.rank}, "
                    f"{self.dtype}, X {'[M,K]' if self.a_layout == 'mk' else 'stored as X_t[K,M]'}")
        ranks = "dense" if self.ranks is None else "ranks gate/up/down " + "/".join(map(str, self.ranks))
        return (f"gated MLP silu(x Wg) * (x Wu) Wd, tokens={self.tokens} hidden={self.hidden} "
                f"intermediate={self.intermediate}, {ranks}, {self.dtype}")


def graph_token_count(graph: Graph) -> int:
    """Rows of the largest left operand of a matmul (the token dimension a fused kernel blocks),
    or of the largest computed value when the graph has no matmul."""
    rows = [graph.node(n.operands[0]).shape[0] for n in graph.nodes() if n.kind == "matmul"]
    rows = rows or [n.shape[0] for n in graph.compute_nodes()]
    return max(rows, default=1)


def graph_workload(graph: Graph, source: str) -> Workload:
    """A workload compiling a user's graph (see :mod:`.graph_file`)."""
    dtypes = {n.dtype for n in graph.inputs()}
    if len(dtypes) > 1:
        raise InputError(f"{source}: inputs mix dtypes ({', '.join(sorted(dtypes))}); a graph has one dtype")
    return Workload("graph", dtype=dtypes.pop(), graph_text=to_text(graph), source=source)


def _positive(value: int | None, what: str) -> int:
    if value is None or isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise InputError(f"{what} must be a positive integer; got {value!r}")
    return value


def chain_workload(m: int, n: int, k: int, *, rank: int | None = None, keep_ratio: float | None = None,
                   dtype: str = "bfloat16", a_layout: str = "mk", align: int = 128) -> Workload:
    """X[M,K] @ U[K,R] @ V[R,N]; the rank given, or block-aligned from the dense [K, N] weight."""
    if (rank is None) == (keep_ratio is None):
        raise InputError("give exactly one of --rank and --keep-ratio for an SVD chain")
    r = _positive(rank, "--rank") if rank is not None else block_aligned_rank(k, n, keep_ratio, align)  # type: ignore[arg-type]
    return Workload("chain", dtype=dtype, m=m, n=n, k=k, rank=r, a_layout=a_layout)


def mlp_workload(tokens: int, hidden: int, intermediate: int, *, rank: int | None = None,
                 ranks: tuple[int, int, int] | None = None, keep_ratio: float | None = None,
                 dense: bool = False, dtype: str = "bfloat16", align: int = 128) -> Workload:
    """The gated MLP; ranks per projection (gate, up, down), one rank for all, or block-aligned from
    keep_ratio (gate/up from [hidden, intermediate], down from [intermediate, hidden])."""
    for value, what in ((tokens, "--tokens"), (hidden, "--hidden"), (intermediate, "--intermediate")):
        _positive(value, what)
    given = sum(x is not None for x in (rank, ranks, keep_ratio))
    if dense:
        if given:
            raise InputError("a dense MLP takes no --rank, --ranks or --keep-ratio")
        return Workload("mlp", dtype=dtype, tokens=tokens, hidden=hidden, intermediate=intermediate)
    if given != 1:
        raise InputError("give exactly one of --rank, --ranks and --keep-ratio for an SVD MLP (or --dense)")
    if keep_ratio is not None:
        gate_up = block_aligned_rank(hidden, intermediate, keep_ratio, align)
        down = block_aligned_rank(intermediate, hidden, keep_ratio, align)
        chosen = (gate_up, gate_up, down)
    elif ranks is not None:
        chosen = tuple(_positive(r, "--ranks entry") for r in ranks)  # type: ignore[assignment]
        if len(chosen) != 3:
            raise InputError(f"--ranks takes three ranks gate,up,down; got {len(chosen)}")
    else:
        chosen = (_positive(rank, "--rank"),) * 3
    return Workload("mlp", dtype=dtype, tokens=tokens, hidden=hidden, intermediate=intermediate,
                    ranks=chosen)  # type: ignore[arg-type]

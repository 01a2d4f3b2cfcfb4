"""nki-library's prefill MLP kernel (``mlp_cte``, bf16, gated SiLU, no bias) as a program of nmmc's kernel IR.

Read from aws-neuron/nki-library at :data:`~.nkilib_source.NKILIB_CTE_COMMIT` (092a49dc: the ``mlp_cte/basic/``
variant the Neuron 2.32 release notes describe), paths under ``src/nkilib_src/nkilib/core/mlp/mlp_cte/`` (cited as
``<file>, <function>``; the structure is d2ad3a57's, whose line numbers are kept where the code is unchanged). Per
physical core:

* **Split** (LNC=2, ``mlp_cte_sharding.py, calculate_sharding``): the intermediate dim (each core all tokens, half of
  I, the partial outputs reduce-scattered over H with bf16 ``sendrecv``,
  ``basic/mlp_cte_basic_projection.py, _sync_down_proj_results_across_int_dim``) when ``tokens <= 256`` or
  ``I > 2048 and I % 256 == 0``, never when ``H < 7168 or I < 1024``, always when ``I > 4096``; else the tokens (each
  core half of them, no exchange; they must divide evenly, ``_calculate_bxs_sharding`` asserts).
* **Token tiles** by what PSUM holds (``basic/mlp_cte_basic_tile_info.py, calc_batch_seqlen_dim_tile_size``): 128 x
  ``8 // ceil(I_c/512)`` tokens (384 for 768 tokens at H = 8192), at most 512, in subtiles of 128; every weight is
  streamed once per token tile.
* Per tile: x loaded per 128-token subtile; TensorE transposes, four per PSUM bank, one VectorE copy each; gate, then
  up: slabs of 1024 rows of H x I_c through a ring both use of as many SBUF buffers as fit, at most 4
  (``basic/mlp_cte_basic_allocation.py, allocate_src_projection_weights``: ``min(get_free_space() // slab, 4)``;
  ``mlp_cte_constants.py, build_mlp_cte_constants``: ``src_proj_weights_max_buffer_count = 4``; d2ad3a57 always
  allocated 4), activations stationary (128 tokens), weights moving (512 columns); silu on ScalarE and the multiply on
  VectorE straight from PSUM into bf16; the product transposed back the same way; down: 128 rows of I x 1024 columns
  of H per DMA through a ring of 8 (``down_proj_weights_buffer_count = 8``); one store per subtile.

Modelling differences (docs/nkilib-mlp.md): a 1024-row slab is one DMA in the kernel (8 runs per partition) and eight
here (nmmc's buffers put 128 consecutive rows on the partitions); the kernel's in-place reuse of SBUF tiles and its
double-buffered stack sections are left to nmmc's allocation (what the footprint check sees is each buffer once);
the ring's buffer count is the first token tile's (a later tile of an interleaved stack section may get fewer).
"""

from __future__ import annotations

from ..kernel_ir.coalesce import coalesce_slab_loads
from ..kernel_ir.dims import Dim, iv, loop
from ..kernel_ir.expr import Expr, Lin, add, modulo, scale, sub, var
from ..kernel_ir.lnc import PROGRAM_ID
from ..kernel_ir.program import (
    Activation,
    Alloc,
    Buffer,
    Comment,
    Copy,
    DmaCopy,
    Matmul,
    PeTranspose,
    Point,
    Program,
    Ref,
    SendRecv,
    Stmt,
    TensorTensor,
    span,
)
from ..targets import Target
from ..vocab import ElementwiseOp
from .nkilib_source import DoesNotRun

P = 128
MOVING = 512
#: PSUM fp32 elements per partition: 8 banks x 2 KiB / 4 (mlp_cte_tile_info.py:82-134).
PSUM_ELEMENTS = 4096
#: Rows of H per gate/up slab (basic/mlp_cte_basic_tile_info.py: ``_src_proj_hidden_dim_tile_size = 1024``) and the
#: most buffers in their ring (mlp_cte_constants.py, build_mlp_cte_constants: ``src_proj_weights_max_buffer_count``).
SLAB_ROWS, SLAB_BUFFERS = 1024, 4
#: Columns of H per down-projection DMA (128 rows of I each) and buffers in its ring
#: (mlp_cte_tile_info.py:37-38, 210-215; mlp_cte_constants.py:184).
DOWN_COLS, DOWN_BUFFERS = 1024, 8
#: SBUF bytes per partition the prefill kernel allocates from: 224 KiB less 16 KiB, 8 and 256 bytes
#: (mlp_cte_constants.py, ``MAX_AVAILABLE_SBUF_SIZE``).
SBUF_WINDOW = 224 * 1024 - 16384 - 8 - 256
#: Transposes packed per PSUM bank before one eviction (mlp_cte_transpose.py:258-271).
PACKED_TRANSPOSES = 4


def split_on_intermediate(tokens: int, hidden: int, inter: int) -> bool:
    """nki-library's choice at LNC=2 (mlp_cte_sharding.py, calculate_sharding; no projection bias)."""
    if inter > 4096:
        return True
    if hidden < 7168 or inter < 1024:
        return False
    return tokens <= 256 or (inter > 2048 and inter % 256 == 0)


def token_tile(tokens: int, hidden: int, inter_core: int) -> int:
    """Tokens per tile: as many 128-token subtiles as leave gate's PSUM tiles within 8 banks, at most 512
    (basic/mlp_cte_basic_tile_info.py, calc_batch_seqlen_dim_tile_size)."""
    subtiles = PSUM_ELEMENTS // (-(-inter_core // MOVING) * MOVING)
    if subtiles == 0:
        raise DoesNotRun(f"nki-library's prefill kernel cannot tile {inter_core} intermediate columns per core "
                         "(more than 4096: basic/mlp_cte_basic_tile_info.py, calc_batch_seqlen_dim_tile_size gives 0 "
                         "tokens per tile, a division by zero at trace time)")
    tile = P * subtiles
    tile = min(tile, 384) if tokens == 768 and hidden == 8192 else min(tile, -(-tokens // P) * P)
    return min(tile, 512)


#: SBUF bytes per partition held before the gate/up ring is allocated, besides the token tile's hidden rows and
#: products: the zero-bias (fp32) and epsilon (bf16) [128, 1] vectors on the heap, each rounded to 4 bytes
#: (mlp_cte_constants.py, build_mlp_cte_constants; utils/allocator.py, alloc_heap aligns the heap to 4).
CONSTANT_BYTES = 8


def slab_buffers(hidden: int, inter_c: int, nsub: int) -> int:
    """Gate/up weight slabs in the ring: as many as the SBUF window has room for after the token tile's hidden rows
    (heap, ``nsub`` x [128, H] bf16) and its products (stack, ``nsub`` x [128, I_c rounded to 512] bf16), at most
    :data:`SLAB_BUFFERS` (basic/mlp_cte_basic_allocation.py, allocate_src_projection_weights; the free space is
    ``heap_curr_addr - stack_curr_addr``, utils/allocator.py, get_free_space). None fits: the ring is empty and the
    kernel's ``% len(weights_sbuf_list)`` divides by zero at trace time."""
    held = CONSTANT_BYTES + nsub * hidden * 2 + nsub * -(-inter_c // MOVING) * MOVING * 2
    slab = (SLAB_ROWS // P) * inter_c * 2
    count = min((SBUF_WINDOW - held) // slab, SLAB_BUFFERS)
    if count < 1:
        raise DoesNotRun(f"nki-library's prefill kernel does not fit: not one gate/up slab of {SLAB_ROWS} x {inter_c} "
                         f"({slab} bytes per partition) fits the {SBUF_WINDOW - held} bytes its {SBUF_WINDOW}-byte "
                         "SBUF window has left (basic/mlp_cte_basic_allocation.py, allocate_src_projection_weights "
                         "allocates none; the projection's ring index then divides by zero)")
    return count


def cte_program(tokens: int, hidden: int, inter: int, target: Target, dtype: str = "bfloat16") -> Program:
    """nki-library's ``mlp_cte`` for x[tokens, hidden] on ``target`` (its logical-core degree), as a program."""
    lnc = target.lnc
    pid: Expr = var(PROGRAM_ID) if lnc > 1 else Lin(0)
    on_inter = lnc > 1 and split_on_intermediate(tokens, hidden, inter)
    if on_inter:
        if inter % lnc or hidden % (2 * lnc):
            raise DoesNotRun(f"intermediate={inter} or hidden={hidden} does not halve evenly")
        inter_c, core_tokens, token0 = inter // lnc, tokens, Lin(0)
    else:
        if tokens % lnc:
            raise DoesNotRun(f"{tokens} tokens do not divide between {lnc} cores (mlp_cte_sharding.py, "
                             "_calculate_bxs_sharding asserts)")
        inter_c, core_tokens = inter, tokens // lnc
        token0 = scale(pid, core_tokens)
    inter0: Expr = scale(pid, inter_c) if on_inter else Lin(0)
    tt = token_tile(core_tokens, hidden, inter_c)
    nsub = tt // P
    nbuf = slab_buffers(hidden, inter_c, nsub)
    x = Buffer("x", (tokens, hidden), dtype, "hbm")
    w = {p: Buffer(f"w_{p}", (hidden, inter), dtype, "hbm") for p in ("gate", "up")}
    w_down = Buffer("w_down", (inter, hidden), dtype, "hbm")
    out = Buffer("out", (tokens, hidden), dtype, "hbm")
    k_tiles, i_tiles = -(-hidden // P), -(-inter_c // P)
    bufs = {
        "x_rows": Buffer("x_rows", (P, nsub, hidden), dtype, "sbuf"),
        "x_strip": Buffer("x_strip", (P, k_tiles, tt), dtype, "sbuf"),
        "h_rows": Buffer("h_rows", (P, nsub, inter_c), dtype, "sbuf"),
        "h_strip": Buffer("h_strip", (P, i_tiles, tt), dtype, "sbuf"),
        "out_rows": Buffer("out_rows", (P, nsub, hidden), dtype, "sbuf"),
        "ring": Buffer("w_ring", (P, nbuf, SLAB_ROWS // P, inter_c), dtype, "sbuf"),
        "down_ring": Buffer("w_down_ring", (P, DOWN_BUFFERS, DOWN_COLS), dtype, "sbuf"),
    }
    if on_inter:
        bufs["recv"] = Buffer("out_recv", (P, hidden // 2), dtype, "sbuf")
    ctx = _Cte(tokens, hidden, inter_c, tt, nsub, nbuf, dtype, pid, inter0, on_inter, x, w, w_down, out, bufs)
    body: list[Stmt] = [Comment(f"nki-library mlp_cte (prefill), {'intermediate' if on_inter else 'token'} split, "
                                f"{tt}-token tiles; see neuronmm_compiler.lowerings.nkilib_cte for the source lines")]
    full, tail = divmod(core_tokens, tt)
    if full:
        t_i = iv("tile", full)
        body += loop("tile", Lin(full), full, ctx.tile(add(token0, scale(t_i, tt)), tt), comment="token tiles")
    if tail:
        body += ctx.tile(add(token0, full * tt), tail)
    doc = (f"nki-library prefill MLP (mlp_cte) over {tokens} tokens, hidden {hidden}, intermediate {inter} ({dtype}), "
           f"as nmmc models it.\nArguments: x{list(x.shape)}, w_gate{list(w['gate'].shape)}, "
           f"w_up{list(w['up'].shape)}, w_down{list(w_down.shape)}. Returns out{list(out.shape)}.")
    split = ("intermediate" if on_inter else "tokens") if lnc > 1 else ""
    # one DMA per gate/up slab of 128-row tiles, the access pattern [[I, 128], [128 I, n], [1, I]] of
    # project_standard_source_tensor_tile (mlp_cte_projection.py:1041-1059)
    return coalesce_slab_loads(Program("nkilib_mlp_cte", [x, w["gate"], w["up"], w_down], [out], body, doc=doc,
                                       programs=lnc, split=split))


class _Cte:
    """The body of one token tile (``tok`` tokens from ``t0``)."""

    def __init__(self, tokens: int, hidden: int, inter_c: int, tt: int, nsub: int, nbuf: int, dtype: str, pid: Expr,
                 inter0: Expr, on_inter: bool, x: Buffer, w: dict[str, Buffer], w_down: Buffer, out: Buffer,
                 bufs: dict[str, Buffer]):
        self.tokens, self.hidden, self.inter_c, self.tt, self.nsub = tokens, hidden, inter_c, tt, nsub
        self.nbuf = nbuf
        self.dtype, self.pid, self.inter0, self.on_inter = dtype, pid, inter0, on_inter
        self.x, self.w, self.w_down, self.out, self.b = x, w, w_down, out, bufs

    def _subs(self, tok: int) -> list[tuple[int, int]]:
        return [(s, min(P, tok - s * P)) for s in range(-(-tok // P))]

    def _transposes(self, src: Buffer, dst: Buffer, s: int, rows: int, cols: int, name: str) -> list[Stmt]:
        """``src[0:rows, s, 0:cols]`` into ``dst[:, tile, s*128 : s*128 + rows]``: four TensorE transposes per PSUM
        bank, one VectorE copy per bank."""
        out: list[Stmt] = []
        tiles = -(-cols // P)
        for first in range(0, tiles, PACKED_TRANSPOSES):
            n = min(PACKED_TRANSPOSES, tiles - first)
            widths = [min(P, cols - (first + j) * P) for j in range(n)]
            ps = Buffer(f"{name}_tpsum", (P, PACKED_TRANSPOSES, P), self.dtype, "psum")
            out.append(Alloc(ps))
            for j, width in enumerate(widths):
                out.append(PeTranspose(Ref(ps, (span(0, width), Point(Lin(j)), span(0, rows))),
                                       Ref(src, (span(0, rows), Point(Lin(s)), span((first + j) * P, width)))))
            if all(width == P for width in widths):
                out.append(Copy(Ref(dst, (span(0, P), span(first, n), span(s * P, rows))),
                                Ref(ps, (span(0, P), span(0, n), span(0, rows)))))
            else:  # a ragged last feature tile: its own copy
                out += [Copy(Ref(dst, (span(0, width), Point(Lin(first + j)), span(s * P, rows))),
                             Ref(ps, (span(0, width), Point(Lin(j)), span(0, rows)))) for j, width in enumerate(widths)]
        return out

    def tile(self, t0: Expr, tok: int) -> list[Stmt]:
        b, h, ic = self.b, self.hidden, self.inter_c
        subs = self._subs(tok)
        body: list[Stmt] = [Alloc(b["x_rows"]), Alloc(b["x_strip"])]
        for s, rows in subs:
            body += [DmaCopy(Ref(b["x_rows"], (span(0, rows), Point(Lin(s)), span(0, h))),
                             Ref(self.x, (span(add(t0, s * P), rows), span(0, h)))),
                     *self._transposes(b["x_rows"], b["x_strip"], s, rows, h, "x")]
        body += [Alloc(b["h_rows"]), Alloc(b["ring"], copies=self.nbuf)]
        idim = Dim("i", ic, MOVING, -(-ic // MOVING), 1)
        for proj in ("gate", "up"):
            acc = Buffer(f"{proj}_psum", (P, len(subs) * idim.tiles, MOVING), "float32", "psum")
            body += [Comment(f"{proj}: slabs of {SLAB_ROWS} rows of H x {ic} columns through {self.nbuf} buffers"),
                     Alloc(acc, accumulator=True)]
            for slab, r0 in enumerate(range(0, h, SLAB_ROWS)):
                n8 = min(SLAB_ROWS, h - r0) // P
                slot = Lin(slab % self.nbuf)
                body += loop("j", Lin(n8), n8, [DmaCopy(
                    Ref(b["ring"], (span(0, P), Point(slot), Point(iv("j", n8)), span(0, ic))),
                    Ref(self.w[proj], (span(add(r0, scale(iv("j", n8), P)), P), span(self.inter0, ic))))])
                for s, rows in subs:
                    k = iv("k", n8)
                    it = iv("it", idim.tiles)
                    width = idim.tile_size(it)
                    mm = Matmul(Ref(acc, (span(0, rows), Point(add(s * idim.tiles, it)), span(0, width))),
                                Ref(b["x_strip"], (span(0, P), Point(add(r0 // P, k)), span(s * P, rows))),
                                Ref(b["ring"], (span(0, P), Point(slot), Point(k), span(scale(it, MOVING), width))))
                    body += loop("k", Lin(n8), n8, loop("it", Lin(idim.tiles), idim.tiles, [mm]))
            for s, rows in subs:
                it = iv("it", idim.tiles)
                width = idim.tile_size(it)
                dst = Ref(b["h_rows"], (span(0, rows), Point(Lin(s)), span(scale(it, MOVING), width)))
                src = Ref(acc, (span(0, rows), Point(add(s * idim.tiles, it)), span(0, width)))
                op = (Activation(dst, src, ElementwiseOp.SILU) if proj == "gate"
                      else TensorTensor(dst, dst, src, ElementwiseOp.MULTIPLY))
                body += loop("it", Lin(idim.tiles), idim.tiles, [op])
        return body + self._transpose_down_store(b["h_rows"], t0, subs)

    def _transpose_down_store(self, h: Buffer, t0: Expr, subs: list[tuple[int, int]]) -> list[Stmt]:
        """A token tile's end: ``h`` (tokens on partitions) transposed into the strip, the down projection, the
        store."""
        b, ic = self.b, self.inter_c
        body: list[Stmt] = [Alloc(b["h_strip"])]
        for s, rows in subs:
            body += self._transposes(h, b["h_strip"], s, rows, ic, "h")
        return body + self._down(subs) + self._store(t0, subs)

    def _down(self, subs: list[tuple[int, int]]) -> list[Stmt]:
        b, h, ic = self.b, self.hidden, self.inter_c
        i128 = -(-ic // P)
        idim = Dim("i", ic, P, i128, 1)
        body: list[Stmt] = [Comment(f"down: {P} rows of I x {DOWN_COLS} columns of H per DMA through {DOWN_BUFFERS} "
                                    "buffers"), Alloc(b["out_rows"]), Alloc(b["down_ring"], copies=DOWN_BUFFERS)]
        for d, c0 in enumerate(range(0, h, DOWN_COLS)):
            cols = min(DOWN_COLS, h - c0)
            halves = [(hs, min(MOVING, cols - hs * MOVING)) for hs in range(-(-cols // MOVING))]
            acc = Buffer("down_psum", (P, len(subs) * len(halves), MOVING), "float32", "psum")
            it = iv("it", i128)
            rows_i = idim.tile_size(it)
            slot = modulo(add(d * i128, it), DOWN_BUFFERS)
            inner: list[Stmt] = [DmaCopy(Ref(b["down_ring"], (span(0, rows_i), Point(slot), span(0, cols))),
                                         Ref(self.w_down, (span(add(self.inter0, scale(it, P)), rows_i),
                                                           span(c0, cols))))]
            for s, rows in subs:
                for hs, wc in halves:
                    inner.append(Matmul(Ref(acc, (span(0, rows), Point(Lin(s * len(halves) + hs)), span(0, wc))),
                                        Ref(b["h_strip"], (span(0, rows_i), Point(it), span(s * P, rows))),
                                        Ref(b["down_ring"], (span(0, rows_i), Point(slot), span(hs * MOVING, wc)))))
            body += [Alloc(acc, accumulator=True), *loop("it", Lin(i128), i128, inner)]
            for s, rows in subs:
                for hs, wc in halves:
                    body.append(Copy(Ref(b["out_rows"], (span(0, rows), Point(Lin(s)), span(c0 + hs * MOVING, wc))),
                                     Ref(acc, (span(0, rows), Point(Lin(s * len(halves) + hs)), span(0, wc)))))
        return body

    def _store(self, t0: Expr, subs: list[tuple[int, int]]) -> list[Stmt]:
        b, h = self.b, self.hidden
        body: list[Stmt] = []
        if not self.on_inter:
            for s, rows in subs:
                body.append(DmaCopy(Ref(self.out, (span(add(t0, s * P), rows), span(0, h))),
                                    Ref(b["out_rows"], (span(0, rows), Point(Lin(s)), span(0, h)))))
            return body
        half = h // 2
        mine = scale(self.pid, half)
        theirs = sub(half, scale(self.pid, half))
        body.append(Comment("reduce-scatter over H with the other core (bf16): each adds the other's partial sums "
                            "for its half and stores it"))
        for s, rows in subs:
            recv = Ref(b["recv"], (span(0, rows), span(0, half)))
            own = Ref(b["out_rows"], (span(0, rows), Point(Lin(s)), span(mine, half)))
            body += [Alloc(b["recv"]),
                     SendRecv(recv, Ref(b["out_rows"], (span(0, rows), Point(Lin(s)), span(theirs, half)))),
                     TensorTensor(own, own, recv, ElementwiseOp.ADD),
                     DmaCopy(Ref(self.out, (span(add(t0, s * P), rows), span(mine, half))), own)]
        return body

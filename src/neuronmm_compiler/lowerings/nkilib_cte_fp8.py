"""nki-library's FP8 ROW prefill MLP (``QuantizationType.ROW`` above 128 tokens, as NxD Inference calls it) as two
programs of nmmc's kernel IR, and its check in nmmc's interpreter.

It is two kernels, so two launches in a model graph:

1. ``rmsnorm_quant`` with ``NO_NORM`` and ``ROW`` (aws-neuron/nki-library@d2ad3a57,
   ``src/nkilib_src/nkilib/core/rmsnorm/rmsnorm_quant.py``; the newest readable version, the code index holds only the
   older 1edc7bbe): the tokens split between the programs of a logical core (``_rmsnorm_quant_sharded_kernel``); per
   128-token tile one bf16 load, ``tensor_scalar_reduce(abs, max)`` of each row on VectorE (``_row_quantize_tile``),
   the dequantization scale ``max(amax * (1/240), 1e-6)`` (an ScalarE ``activation`` and a ``tensor_scalar``;
   ``rmsnorm_quant_constants.py``: ``quant_data_type_range = 240``, ``min_dequant_scale_value = 1e-6``), its
   ``reciprocal``, one ``tensor_scalar`` multiply into float8_e4m3, and two stores: the FP8 rows and the fp32 scale
   the kernel packs as the row's last 4 FP8 elements (``_store_tensor_tile_and_dequant_scales``; here a separate
   ``x_scale`` [T, 1] array: the same DMAs, 4 bytes per token).
2. ``mlp_cte`` with an FP8 hidden and FP8 weights (aws-neuron/nki-library@092a49dc, ``core/mlp/mlp_cte/``, the same
   prefill kernel as :mod:`.nkilib_cte` with its quantized branches; ``basic/`` omitted below): the same split, token
   tiles and transposes (one-byte PE transposes into FP8 PSUM, ``mlp_cte_constants.py, _get_xpose_data_type``); the
   gate and up per-channel weight scales [128, I] loaded once (``mlp_cte_basic.py``,
   ``load_source_projection_row_scales``), the hidden's per-token scales once per 128-token subtile
   (``mlp_cte_basic_tensor_io.py, load_packed_hidden_scales``); gate and up in 1024-row slabs of FP8 weights through a
   ring of as many buffers as fit, at most 4, the matmuls in ``double_row`` mode, 256 rows of H each
   (``mlp_cte_basic_projection.py, _project_quantized_source_tensor_tile``); the gate eviction multiplies by the
   weight scales on VectorE and applies silu scaled by the token's scale on ScalarE
   (``mlp_cte_basic_utils.py, apply_source_projection_activation``), up's multiplies by gate and by its scales and
   applies the token's scale (``perform_elementwise_multiply``); the product re-quantized per token
   (``mlp_cte_basic_quantization.py, _perform_intermediate_row_quantization``: ``tensor_scalar_reduce(abs, max)``, the
   scale ``max(amax / 240, 1e-6)``, its reciprocal, one ScalarE copy scaled into FP8) and transposed; down in 256 rows
   of I x 1024 columns of H per DMA through a ring of 8, ``double_row``, each 1024-column tile's weight scales [128,
   1024] through a ring of 4, evicted by a VectorE multiply by them and a ScalarE copy scaled by the token's
   intermediate scale (``_perform_quantized_down_projection``); stores or the bf16 reduce-scatter as in bf16.

Modelling differences: a ``double_row`` matmul over 256 rows is two matmuls of 128 rows here, each in ``double_row``
mode (the cost model prices a ``double_row`` instruction at half a bf16 one's cycles, docs/cost_model.md "FP8", so
the two cost what the one does, but issue two instructions: a few cycles more for nki-library); ``reciprocal`` is a
``tensor_scalar`` divide of a column of ones (one [128, 1] VectorE instruction either way); the kernel's in-place
reuse of SBUF tiles is left to nmmc's allocation, as for bf16. The norm is off (``NO_NORM``): nmmc's kernel is
compared without a prologue, so nki-library is charged less than with its RMSNorm.
"""

from __future__ import annotations

from ..kernel_ir.coalesce import coalesce_slab_loads
from ..kernel_ir.dims import Dim, iv, loop
from ..kernel_ir.expr import Expr, Lin, add, modulo, scale, var
from ..kernel_ir.lnc import PROGRAM_ID
from ..kernel_ir.program import (
    Activation,
    Alloc,
    Buffer,
    Comment,
    DmaCopy,
    Matmul,
    Memset,
    Point,
    Program,
    Ref,
    Stmt,
    TensorScalar,
    TensorScalarReduce,
    TensorTensor,
    span,
)
from ..targets import Target
from ..vocab import ElementwiseOp
from .nkilib_cte import (
    CONSTANT_BYTES,
    DOWN_BUFFERS,
    DOWN_COLS,
    MOVING,
    SBUF_WINDOW,
    SLAB_BUFFERS,
    SLAB_ROWS,
    P,
    _Cte,
    split_on_intermediate,
    token_tile,
)
from .nkilib_source import DoesNotRun, NotModelled

FMT = "float8_e4m3"
#: The FP8 range and the scale floor of both kernels' row quantization (rmsnorm_quant_constants.py:
#: ``quant_data_type_range = 240``, ``min_dequant_scale_value = 1e-6``; mlp_cte_basic_quantization.py:
#: ``get_max_positive_value_for_dtype`` of float8_e4m3, ``_MINVAL = 1e-6``).
FP8_RANGE, SCALE_FLOOR = 240.0, 1e-6
#: Buffers of the down projection's per-column weight scales (mlp_cte_constants.py, build_mlp_cte_constants:
#: ``down_proj_weights_scales_buffer_count = 4``).
DOWN_SCALE_BUFFERS = 4


def fp8_slab_buffers(hidden: int, inter_c: int, nsub: int) -> int:
    """Gate/up FP8 slabs in the ring: as for bf16 (:func:`.nkilib_cte.slab_buffers`), with what the quantized path
    holds before the ring: the FP8 hidden rows (heap), the gate and up weight scales [128, I] fp32 (heap,
    ``load_source_projection_row_scales``), the hidden scales [128, 1] fp32 per subtile and the products (stack);
    a slab is 1024 x I_c bytes (basic/mlp_cte_basic_allocation.py, allocate_src_projection_weights)."""
    held = (CONSTANT_BYTES + 2 * 4 * inter_c + nsub * hidden + nsub * 4
            + nsub * -(-inter_c // MOVING) * MOVING * 2)
    slab = (SLAB_ROWS // P) * inter_c
    count = min((SBUF_WINDOW - held) // slab, SLAB_BUFFERS)
    if count < 1:
        raise DoesNotRun(f"nki-library's FP8 prefill kernel does not fit: not one gate/up slab of {SLAB_ROWS} x "
                         f"{inter_c} FP8 ({slab} bytes per partition) fits the {SBUF_WINDOW - held} bytes its "
                         f"{SBUF_WINDOW}-byte SBUF window has left after the hidden rows, the products and the "
                         f"{2 * 4 * inter_c} bytes of gate/up weight scales (allocate_src_projection_weights)")
    return count


def fp8_prefill_programs(tokens: int, hidden: int, inter: int, target: Target) -> list[Program]:
    """``[rmsnorm_quant, mlp_cte]`` for x[tokens, hidden] on ``target`` (its logical-core degree), module docstring.
    :class:`DoesNotRun` with the assert that stops it; :class:`NotModelled` for shapes nmmc does not model."""
    lnc = target.lnc
    if hidden % P or inter % P:
        raise NotModelled(f"nki-library's FP8 prefill with hidden={hidden} or intermediate={inter} not a multiple of "
                          f"{P} (ragged FP8 tiles) is not modelled")
    if tokens % lnc:
        raise NotModelled(f"nki-library's FP8 prefill with {tokens} tokens on {lnc} programs (uneven shards) is not "
                          "modelled")
    on_inter = lnc > 1 and split_on_intermediate(tokens, hidden, inter)
    inter_c = inter // lnc if on_inter else inter
    if on_inter and (inter_c % P or hidden % (2 * lnc)):
        raise NotModelled(f"intermediate={inter} or hidden={hidden} does not halve into whole 128-row tiles")
    core_tokens = tokens if on_inter else tokens // lnc
    tt = token_tile(core_tokens, hidden, inter_c)
    nbuf = fp8_slab_buffers(hidden, inter_c, tt // P)
    return [quant_program(tokens, hidden, target), _mlp_program(tokens, hidden, inter, target, on_inter, tt, nbuf)]


def quant_program(tokens: int, hidden: int, target: Target) -> Program:
    """``rmsnorm_quant`` (NO_NORM, ROW) over x[tokens, hidden]: FP8 rows and a dequantization scale per token."""
    lnc = target.lnc
    core = tokens // lnc
    pid: Expr = var(PROGRAM_ID) if lnc > 1 else Lin(0)
    x = Buffer("x", (tokens, hidden), "bfloat16", "hbm")
    xq = Buffer("x_fp8", (tokens, hidden), FMT, "hbm")
    xs = Buffer("x_scale", (tokens, 1), "float32", "hbm")
    ones = Buffer("ones", (P, 1), "float32", "sbuf")
    body: list[Stmt] = [Comment("nki-library rmsnorm_quant (NO_NORM, ROW); see neuronmm_compiler.lowerings."
                                "nkilib_cte_fp8 for the source lines"),
                        Alloc(ones), Memset(Ref(ones, (span(0, P), span(0, 1))), 1.0)]

    def tile(t0: Expr, rows: int) -> list[Stmt]:
        bufs = {"in": Buffer("in_tile", (P, hidden), "bfloat16", "sbuf"),
                "abs": Buffer("abs_tile", (P, hidden), "bfloat16", "sbuf"),
                "q": Buffer("quant_tile", (P, hidden), FMT, "sbuf"),
                "ds": Buffer("dequant_scale", (P, 1), "float32", "sbuf"),
                "qs": Buffer("quant_scale", (P, 1), "float32", "sbuf")}
        r = {k: Ref(v, (span(0, rows), span(0, v.shape[1]))) for k, v in bufs.items()}
        return [*[Alloc(v) for v in bufs.values()],
                DmaCopy(r["in"], Ref(x, (span(t0, rows), span(0, hidden)))),
                TensorScalarReduce(r["abs"], r["in"], r["ds"]),
                Activation(r["ds"], r["ds"], "copy", scale=1.0 / FP8_RANGE),
                TensorScalar(r["ds"], r["ds"], "maximum", SCALE_FLOOR),
                TensorScalar(r["qs"], Ref(ones, (span(0, rows), span(0, 1))), "divide", r["ds"]),
                TensorScalar(r["q"], r["in"], "multiply", r["qs"]),
                DmaCopy(Ref(xq, (span(t0, rows), span(0, hidden))), r["q"]),
                DmaCopy(Ref(xs, (span(t0, rows), span(0, 1))), r["ds"])]

    base = scale(pid, core)
    full, tail = divmod(core, P)
    if full:
        body += loop("t", Lin(full), full, tile(add(base, scale(iv("t", full), P)), P), comment="128-token tiles")
    if tail:
        body += tile(add(base, full * P), tail)
    doc = (f"nki-library rmsnorm_quant (NO_NORM, ROW) over {tokens} tokens, hidden {hidden}, as nmmc models it.\n"
           f"Arguments: x{list(x.shape)}. Returns x_fp8{list(xq.shape)}, x_scale{list(xs.shape)}.")
    return Program("nkilib_rmsnorm_quant", [x], [xq, xs], body, doc=doc, programs=lnc,
                   split="tokens" if lnc > 1 else "")


def _mlp_program(tokens: int, hidden: int, inter: int, target: Target, on_inter: bool, tt: int,
                 nbuf: int) -> Program:
    lnc = target.lnc
    pid: Expr = var(PROGRAM_ID) if lnc > 1 else Lin(0)
    inter_c = inter // lnc if on_inter else inter
    core_tokens = tokens if on_inter else tokens // lnc
    token0: Expr = Lin(0) if on_inter else scale(pid, core_tokens)
    inter0: Expr = scale(pid, inter_c) if on_inter else Lin(0)
    nsub = tt // P
    x = Buffer("x", (tokens, hidden), FMT, "hbm")
    xs = Buffer("x_scale", (tokens, 1), "float32", "hbm")
    w = {p: Buffer(f"w_{p}", (hidden, inter), FMT, "hbm") for p in ("gate", "up")}
    ws = {p: Buffer(f"w_{p}_scale", (P, inter), "float32", "hbm") for p in ("gate", "up")}
    w_down = Buffer("w_down", (inter, hidden), FMT, "hbm")
    wds = Buffer("w_down_scale", (P, hidden), "float32", "hbm")
    out = Buffer("out", (tokens, hidden), "bfloat16", "hbm")
    n_htiles = -(-hidden // DOWN_COLS)
    bufs = {
        "x_rows": Buffer("x_rows", (P, nsub, hidden), FMT, "sbuf"),
        "x_scale": Buffer("x_scale_cols", (P, nsub), "float32", "sbuf"),
        "x_strip": Buffer("x_strip", (P, hidden // P, tt), FMT, "sbuf"),
        "h_rows": Buffer("h_rows", (P, nsub, inter_c), "bfloat16", "sbuf"),
        "h_abs": Buffer("h_abs", (P, inter_c), "bfloat16", "sbuf"),
        "h_scale": Buffer("h_dequant_scale", (P, nsub), "float32", "sbuf"),
        "h_qscale": Buffer("h_quant_scale", (P, nsub), "float32", "sbuf"),
        "h_q": Buffer("h_fp8", (P, nsub, inter_c), FMT, "sbuf"),
        "h_strip": Buffer("h_strip", (P, inter_c // P, tt), FMT, "sbuf"),
        "out_rows": Buffer("out_rows", (P, nsub, hidden), "bfloat16", "sbuf"),
        "ring": Buffer("w_ring", (P, nbuf, SLAB_ROWS // P, inter_c), FMT, "sbuf"),
        "down_ring": Buffer("w_down_ring", (P, DOWN_BUFFERS, 2, DOWN_COLS), FMT, "sbuf"),
        "down_scale_ring": Buffer("w_down_scale_ring", (P, min(DOWN_SCALE_BUFFERS, n_htiles), DOWN_COLS), "float32",
                                  "sbuf"),
        "ones": Buffer("ones", (P, 1), "float32", "sbuf"),
        **{f"{p}_scale": Buffer(f"{p}_scale_rows", (P, inter_c), "float32", "sbuf") for p in ("gate", "up")},
    }
    if on_inter:
        bufs["recv"] = Buffer("out_recv", (P, hidden // 2), "bfloat16", "sbuf")
    ctx = _Fp8Cte(tokens, hidden, inter_c, tt, nsub, nbuf, FMT, pid, inter0, on_inter, x, w, w_down, out, bufs)
    ctx.xs, ctx.wds = xs, wds
    body: list[Stmt] = [Comment(f"nki-library mlp_cte, QuantizationType.ROW, {'intermediate' if on_inter else 'token'}"
                                f" split, {tt}-token tiles; see neuronmm_compiler.lowerings.nkilib_cte_fp8"),
                        Alloc(bufs["ones"]), Memset(Ref(bufs["ones"], (span(0, P), span(0, 1))), 1.0)]
    for p in ("gate", "up"):  # load_source_projection_row_scales: [128, I_c] once per kernel
        body += [Alloc(bufs[f"{p}_scale"]), DmaCopy(Ref(bufs[f"{p}_scale"], (span(0, P), span(0, inter_c))),
                                                    Ref(ws[p], (span(0, P), span(inter0, inter_c))))]
    full, tail = divmod(core_tokens, tt)
    if full:
        body += loop("tile", Lin(full), full, ctx.tile(add(token0, scale(iv("tile", full), tt)), tt),
                     comment="token tiles")
    if tail:
        body += ctx.tile(add(token0, full * tt), tail)
    doc = (f"nki-library prefill MLP (mlp_cte, QuantizationType.ROW) over {tokens} tokens, hidden {hidden}, "
           f"intermediate {inter}, as nmmc models it.\nArguments: x{list(x.shape)} float8_e4m3 with x_scale "
           f"{list(xs.shape)}, FP8 weights with [128, N] scales. Returns out{list(out.shape)}.")
    params = [x, xs, w["gate"], ws["gate"], w["up"], ws["up"], w_down, wds]
    return coalesce_slab_loads(Program("nkilib_mlp_cte_fp8", params, [out], body, doc=doc, programs=lnc,
                                       split=("intermediate" if on_inter else "tokens") if lnc > 1 else ""))


class _Fp8Cte(_Cte):
    """One token tile of the quantized prefill kernel (the bf16 one's transposes and stores)."""

    xs: Buffer
    wds: Buffer

    def tile(self, t0: Expr, tok: int) -> list[Stmt]:
        b, h, ic = self.b, self.hidden, self.inter_c
        subs = self._subs(tok)
        body: list[Stmt] = [Alloc(b["x_rows"]), Alloc(b["x_scale"]), Alloc(b["x_strip"])]
        for s, rows in subs:
            body += [DmaCopy(Ref(b["x_rows"], (span(0, rows), Point(Lin(s)), span(0, h))),
                             Ref(self.x, (span(add(t0, s * P), rows), span(0, h)))),
                     DmaCopy(Ref(b["x_scale"], (span(0, rows), span(s, 1))),
                             Ref(self.xs, (span(add(t0, s * P), rows), span(0, 1)))),
                     *self._transposes(b["x_rows"], b["x_strip"], s, rows, h, "x")]
        body += [Alloc(b["h_rows"]), Alloc(b["ring"], copies=self.nbuf)]
        idim = Dim("i", ic, MOVING, -(-ic // MOVING), 1)
        for proj in ("gate", "up"):
            acc = Buffer(f"{proj}_psum", (P, len(subs) * idim.tiles, MOVING), "float32", "psum")
            body += [Comment(f"{proj}: FP8 slabs of {SLAB_ROWS} rows of H x {ic} columns through {self.nbuf} buffers, "
                             "double_row matmuls"), Alloc(acc, accumulator=True)]
            for slab, r0 in enumerate(range(0, h, SLAB_ROWS)):
                n8 = min(SLAB_ROWS, h - r0) // P
                slot = Lin(slab % self.nbuf)
                body += loop("j", Lin(n8), n8, [DmaCopy(
                    Ref(b["ring"], (span(0, P), Point(slot), Point(iv("j", n8)), span(0, ic))),
                    Ref(self.w[proj], (span(add(r0, scale(iv("j", n8), P)), P), span(self.inter0, ic))))])
                for s, rows in subs:
                    k, it = iv("k", n8), iv("it", idim.tiles)
                    width = idim.tile_size(it)
                    mm = Matmul(Ref(acc, (span(0, rows), Point(add(s * idim.tiles, it)), span(0, width))),
                                Ref(b["x_strip"], (span(0, P), Point(add(r0 // P, k)), span(s * P, rows))),
                                Ref(b["ring"], (span(0, P), Point(slot), Point(k), span(scale(it, MOVING), width))),
                                perf_mode="double_row")
                    body += loop("k", Lin(n8), n8, loop("it", Lin(idim.tiles), idim.tiles, [mm]))
            for s, rows in subs:
                it = iv("it", idim.tiles)
                width = idim.tile_size(it)
                cols = span(scale(it, MOVING), width)
                dst = Ref(b["h_rows"], (span(0, rows), Point(Lin(s)), cols))
                src = Ref(acc, (span(0, rows), Point(add(s * idim.tiles, it)), span(0, width)))
                wscale = Ref(b[f"{proj}_scale"], (span(0, rows), cols))
                token_scale = Ref(b["x_scale"], (span(0, rows), span(s, 1)))
                ops: list[Stmt] = ([TensorTensor(dst, src, wscale, ElementwiseOp.MULTIPLY),
                                    Activation(dst, dst, ElementwiseOp.SILU, scale=token_scale)] if proj == "gate" else
                                   [TensorTensor(dst, dst, src, ElementwiseOp.MULTIPLY),
                                    TensorTensor(dst, dst, wscale, ElementwiseOp.MULTIPLY),
                                    Activation(dst, dst, "copy", scale=token_scale)])
                body += loop("it", Lin(idim.tiles), idim.tiles, ops)
        body += self._quantize(subs)
        return body + self._transpose_down_store(b["h_q"], t0, subs)

    def _quantize(self, subs: list[tuple[int, int]]) -> list[Stmt]:
        """_perform_intermediate_row_quantization: each token's scale over its I_c products, the FP8 product."""
        b, ic = self.b, self.inter_c
        body: list[Stmt] = [Comment("the product quantized per token (tensor_scalar_reduce abs max)"),
                            *[Alloc(b[k]) for k in ("h_abs", "h_scale", "h_qscale", "h_q")]]
        for s, rows in subs:
            ds, qs = (Ref(b[k], (span(0, rows), span(s, 1))) for k in ("h_scale", "h_qscale"))
            h = Ref(b["h_rows"], (span(0, rows), Point(Lin(s)), span(0, ic)))
            body += [TensorScalarReduce(Ref(b["h_abs"], (span(0, rows), span(0, ic))), h, ds),
                     TensorScalar(ds, ds, "multiply", 1.0 / FP8_RANGE, "maximum", SCALE_FLOOR),
                     TensorScalar(qs, Ref(b["ones"], (span(0, rows), span(0, 1))), "divide", ds),
                     Activation(Ref(b["h_q"], h.index), h, "copy", scale=qs)]
        return body

    def _down(self, subs: list[tuple[int, int]]) -> list[Stmt]:
        """_perform_quantized_down_projection: 256 rows of I per DMA and per double_row matmul pair."""
        b, h, ic = self.b, self.hidden, self.inter_c
        i128 = ic // P
        pairs, odd = divmod(i128, 2)
        n_int = pairs + odd
        nsc = b["down_scale_ring"].shape[1]
        body: list[Stmt] = [Comment(f"down: 256 rows of I x {DOWN_COLS} columns of H per DMA through {DOWN_BUFFERS} "
                                    "buffers, double_row"), Alloc(b["out_rows"]),
                            Alloc(b["down_ring"], copies=DOWN_BUFFERS), Alloc(b["down_scale_ring"], copies=nsc)]
        for d, c0 in enumerate(range(0, h, DOWN_COLS)):
            cols = min(DOWN_COLS, h - c0)
            halves = [(hs, min(MOVING, cols - hs * MOVING)) for hs in range(-(-cols // MOVING))]
            acc = Buffer("down_psum", (P, len(subs) * len(halves), MOVING), "float32", "psum")
            sslot = Lin(d % nsc)
            body += [DmaCopy(Ref(b["down_scale_ring"], (span(0, P), Point(sslot), span(0, cols))),
                             Ref(self.wds, (span(0, P), span(c0, cols)))), Alloc(acc, accumulator=True)]

            where = (modulo(add(d * n_int, iv("q", pairs)), DOWN_BUFFERS), c0, cols, acc, halves)
            if pairs:
                body += loop("q", Lin(pairs), pairs, self._down_step(subs, iv("q", pairs), 2, *where))
            if odd:
                body += self._down_step(subs, Lin(pairs), 1, modulo(add(d * n_int, pairs), DOWN_BUFFERS), *where[1:])
            for s, rows in subs:
                for hs, wc in halves:
                    dst = Ref(b["out_rows"], (span(0, rows), Point(Lin(s)), span(c0 + hs * MOVING, wc)))
                    body += [TensorTensor(dst, Ref(acc, (span(0, rows), Point(Lin(s * len(halves) + hs)),
                                                         span(0, wc))),
                                          Ref(b["down_scale_ring"], (span(0, rows), Point(sslot),
                                                                     span(hs * MOVING, wc))), ElementwiseOp.MULTIPLY),
                             Activation(dst, dst, "copy", scale=Ref(b["h_scale"], (span(0, rows), span(s, 1))))]
        return body

    def _down_step(self, subs: list[tuple[int, int]], q: Expr, rows_pair: int, slot: Expr, c0: int, cols: int,
                   acc: Buffer, halves: list[tuple[int, int]]) -> list[Stmt]:
        """One DMA of ``rows_pair`` x 128 rows of I (from row ``256 q``) and its matmuls, double_row for a pair."""
        b = self.b
        r0 = add(self.inter0, scale(q, 2 * P))
        j = iv("j", 2)
        load = (loop("j", Lin(2), 2, [DmaCopy(Ref(b["down_ring"], (span(0, P), Point(slot), Point(j), span(0, cols))),
                                              Ref(self.w_down, (span(add(r0, scale(j, P)), P), span(c0, cols))))])
                if rows_pair == 2 else
                [DmaCopy(Ref(b["down_ring"], (span(0, P), Point(slot), Point(Lin(0)), span(0, cols))),
                         Ref(self.w_down, (span(r0, P), span(c0, cols))))])
        mode = "double_row" if rows_pair == 2 else "none"
        mms: list[Stmt] = [Matmul(
            Ref(acc, (span(0, rows), Point(Lin(s * len(halves) + hs)), span(0, wc))),
            Ref(b["h_strip"], (span(0, P), Point(add(scale(q, 2), r)), span(s * P, rows))),
            Ref(b["down_ring"], (span(0, P), Point(slot), Point(Lin(r)), span(hs * MOVING, wc))),
            perf_mode=mode) for s, rows in subs for hs, wc in halves for r in range(rows_pair)]
        return [*load, *mms]


# ---- the kernel files nmmc's interpreter runs (lowerings/nkilib_fp8.py, verify_fp8_prefill) ----

def fp8_prefill_sources(programs: list[Program], target: Target) -> list[str]:
    """Each program as a kernel file of the nki dialect for nmmc's interpreter (never written for users)."""
    from ..codegen.printer import PRINTERS
    from ..kernel_ir.psum_banks import split_psum_banks
    from ..vocab import Dialect

    out = []
    for program in programs:
        printer = PRINTERS[Dialect.NKI]()
        lines = ['"""nki-library FP8 prefill kernel as nmmc models it (not a user kernel)."""', "",
                 "import numpy as np", "", *printer.imports, "", "",
                 *printer.kernel(split_psum_banks(program, target.psum_bank_bytes))]
        out.append("\n".join(lines) + "\n")
    return out


__all__ = ["FP8_RANGE", "SCALE_FLOOR", "fp8_prefill_programs", "fp8_prefill_sources", "fp8_slab_buffers",
           "quant_program"]

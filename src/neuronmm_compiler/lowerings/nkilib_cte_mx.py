"""nki-library's MX prefill MLP (``mlp_cte_mx``, ``QuantizationType.MX`` above 96 tokens) as a program of nmmc's
kernel IR, and its check in nmmc's interpreter.

Read from aws-neuron/nki-library@092a49dc (:data:`~.nkilib_source.NKILIB_CTE_COMMIT`), paths under
``src/nkilib_src/nkilib/core/mlp/mlp_cte/mx/`` (the ``mlp_cte_mx_`` prefix omitted below). The intermediate's
quantization, ``mlp_cte_mx_quantization.py``, is in no stored snapshot with a path: it is read from a code-index copy
(read_file id 66639696666) whose ``perform_intermediate_quantization`` takes exactly the arguments 092a49dc's
``mlp_cte_mx.py`` passes; its provenance is unattributed. Per program of a logical core (the tokens split between
them, ``mlp_cte_sharding.py, calculate_sharding`` as :func:`.nkilib_cte.split_on_intermediate`):

1. the hidden arrives already MX-quantized (MXFP8 E4M3 elements and their E8M0 block scales, as
   ``rmsnorm_mx_prefill`` packs them; ``tensor_io.py, load_mx_block_hidden_scales``): a separate kernel nmmc does
   not model, so nki-library is charged less than it runs (one launch and the quantization of x are missing);
2. token tiles of ``min(256 * (8 // ceil(I/512)), 512)`` tokens (``tile_info.py, calc_batch_seqlen_dim_tile_size``;
   more than 8 tiles of 512 intermediate columns: its assert stops it); per 256-token subtile and 512 rows of H the
   hidden is transposed into ``[128, H/512, 256]`` x4 words (here the ``dma_transpose`` path,
   ``tensor_io.py, load_and_transpose_hidden_tile``) and its scales into ``[128, ., 256]``;
3. gate, then up (``projection.py, _project_source_tensor_tile``): per 512 rows of H one DMA of ``[128, I]`` x4 words
   into a ring of as many buffers as fit, at most 4 (``allocation.py, allocate_src_projection_weights``), the weight
   scales loaded once per kernel (``tensor_io.py, load_source_projection_weight_scales``, one DMA per quadrant and H
   tile); per 256 tokens, 512 columns of I and 128 of its rows one ``nc_matmul_mx`` (weights stationary, tokens
   moving) into a bf16 PSUM bank ``[128, 256, 4]``; silu straight from PSUM into bf16 ``[128, I/512, 128, 4]`` per 128
   tokens, then up's PSUM multiplied in (``utils.py, apply_source_projection_activation``,
   ``perform_elementwise_multiply``, block-scale branch);
4. one ``quantize_mx`` per 128 tokens and 512 columns of I (the code-index copy, ``_perform_intermediate_mx_
   quantization``);
5. down (``projection.py, perform_down_projection``): per 1024 columns of H its weight scales, one DMA per quadrant
   (a ring of 4), per 512 rows of I one ``[128, 1024]`` x4 DMA (a ring of 8), per 128 tokens one ``nc_matmul_mx``
   (intermediate stationary, weights moving) into a bf16 PSUM bank ``[128, 1024]``, one ``tensor_copy`` to the
   ``[128, H]`` output rows after the last I tile; one store per 128 tokens (``tensor_io.py,
   store_hidden_tensor_tile``).

Modelling differences: the kernel packs the scales of 4 H tiles into one 128-partition buffer (4 partitions per slot
in each quadrant, ``tensor_io.py``); nmmc's interpreter reads a scale tile at partitions ``32 q + r`` of a
128-partition region, so each H tile has its own slot here (the same DMAs, 4x the SBUF bytes of those buffers; the
fit check below charges the kernel's own bytes). Only ``mxfp8_e4m3`` weights: the kernel reads every operand as
``float8_e4m3fn_x4`` (``projection.py``). The intermediate split at LNC=2 (H >= 7168 or I > 4096) is not modelled.
"""

from __future__ import annotations

import numpy as np

from ..ir.mx import MX_FORMATS, MX_PACK, QUADRANT, SCALES_PER_QUADRANT
from ..kernel_ir.expr import Expr, Lin, add, scale, var
from ..kernel_ir.lnc import PROGRAM_ID
from ..kernel_ir.mx import MatmulMx, QuantizeMx
from ..kernel_ir.program import (
    Activation,
    Alloc,
    Buffer,
    Comment,
    Copy,
    DmaCopy,
    Point,
    Program,
    Ref,
    Stmt,
    TensorTensor,
    span,
)
from ..targets import Target
from ..vocab import ElementwiseOp
from .nkilib_cte import SBUF_WINDOW, P, split_on_intermediate
from .nkilib_mx import TILE, MxCheck, check_mx_model
from .nkilib_source import DoesNotRun, NotModelled

#: PSUM banks (tile_info.py: NUM_HW_PSUM_BANKS = 8), tokens per gate/up subtile (2 * pmax, tile_info.py) and the most
#: tokens per tile (tile_info.py, calc_batch_seqlen_dim_tile_size: ``min(tile_size, 512)``).
BANKS, SUB, MAX_TILE = 8, 2 * P, 512
#: Columns of H per down-projection tile and buffers of its weights / weight scales (tile_info.py:
#: ``_down_proj_hidden_dim_tile_size = 1024``; mlp_cte_constants.py, build_mlp_cte_constants:
#: ``down_proj_weights_buffer_count = 8``, ``down_proj_weights_scales_buffer_count = 4``) and the most gate/up
#: weight buffers (``src_proj_weights_buffer_count = 4``).
DOWN_COLS, DOWN_BUFFERS, DOWN_SCALE_BUFFERS, SRC_BUFFERS = 1024, 8, 4, 4
FORMAT = "mxfp8_e4m3"


def mx_cte_tile(tokens: int, inter_c: int) -> int:
    """Tokens per tile (tile_info.py, calc_batch_seqlen_dim_tile_size); :class:`DoesNotRun` where its assert fails."""
    n_i = -(-inter_c // TILE)
    subtiles = BANKS // n_i * 2
    if subtiles * P < 2 * P:
        raise DoesNotRun(f"nki-library's MX prefill MLP asserts PSUM room for 256 tokens: {n_i} tiles of 512 "
                         f"intermediate columns per core leave {BANKS // n_i} of {BANKS} banks per 256 tokens "
                         "(mlp_cte/mx/mlp_cte_mx_tile_info.py, calc_batch_seqlen_dim_tile_size)")
    return min(subtiles * P, -(-tokens // P) * P, MAX_TILE)


def src_buffers(hidden: int, inter_c: int, tile: int) -> int:
    """Gate/up weight buffers: ``min(free // (4 I), 4)`` after what the kernel's heap holds first (two [128, 1] zero
    and epsilon vectors, the gate and up weight scales [128, ceil(H/2048), I] uint8, the hidden subtiles [128, H/512,
    256, 4] fp8 and their scales [128, ceil(H/2048), 256]; allocation.py, allocate_src_projection_weights); the
    intermediate's bf16 rows [128, I/512, 128, 4] per 128 tokens on the stack. :class:`DoesNotRun` with the bytes
    where not one fits."""
    n_sub = -(-tile // SUB)
    packs = -(-hidden // (4 * TILE))
    held = (8 + 2 * packs * inter_c + n_sub * (hidden // TILE * SUB * MX_PACK + packs * SUB)
            + (tile // P) * inter_c * 2)
    slab = MX_PACK * inter_c
    count = min((SBUF_WINDOW - held) // slab, SRC_BUFFERS)
    if count < 1:
        raise DoesNotRun(f"nki-library's MX prefill MLP does not fit: not one gate/up weight buffer of {slab} bytes "
                         f"per partition fits the {SBUF_WINDOW - held} bytes its {SBUF_WINDOW}-byte SBUF window "
                         "has left (mlp_cte_mx_allocation.py, allocate_src_projection_weights)")
    return count


def mx_cte_program(tokens: int, hidden: int, inter: int, target: Target, fmt: str = FORMAT) -> Program:
    """``mlp_cte_mx`` for an MX-quantized x[tokens, hidden] on ``target`` (module docstring)."""
    lnc = target.lnc
    if fmt != FORMAT:
        raise NotModelled(f"nki-library's MX prefill MLP reads every operand as float8_e4m3fn_x4 (aws-neuron/nki-"
                          f"library@092a49dc, mlp_cte/mx/mlp_cte_mx_projection.py): {fmt} weights are not its format")
    if hidden % TILE or inter % TILE:
        raise NotModelled(f"nki-library's MX prefill MLP with hidden={hidden} or intermediate={inter} not a multiple "
                          f"of {TILE} is not modelled")
    if tokens % lnc or (tokens // lnc) % P:
        raise NotModelled(f"nki-library's MX prefill MLP with {tokens} tokens on {lnc} programs (not whole 128-token "
                          "subtiles per program) is not modelled")
    if lnc > 1 and split_on_intermediate(tokens, hidden, inter):
        mx_cte_tile(tokens, inter // lnc)
        raise NotModelled("nki-library's MX prefill MLP split on the intermediate dim at LNC=2 is not modelled")
    core = tokens // lnc
    tile = mx_cte_tile(core, inter)
    nbuf = src_buffers(hidden, inter, tile)
    spec = MX_FORMATS[fmt]
    wdt, adt = spec.weight_dtype, spec.activation_dtype
    pid: Expr = var(PROGRAM_ID) if lnc > 1 else Lin(0)
    h512, n_i, hq = hidden // TILE, inter // TILE, hidden // MX_PACK

    x = Buffer("x", (tokens, hq), adt, "hbm")
    xs = Buffer("x_scale", (tokens, h512, P), "uint8", "hbm")
    w = {p: Buffer(f"w_{p}", (P, h512, inter), wdt, "hbm") for p in ("gate", "up")}
    ws = {p: Buffer(f"w_{p}_scale", (P // 8, h512, inter), "uint8", "hbm") for p in ("gate", "up")}
    w_down = Buffer("w_down", (P, n_i, hidden), wdt, "hbm")
    wds = Buffer("w_down_scale", (P // 8, n_i, hidden), "uint8", "hbm")
    out = Buffer("out", (tokens, hidden), "bfloat16", "hbm")
    body: list[Stmt] = [Comment("nki-library mlp_cte_mx (MX prefill); see neuronmm_compiler.lowerings.nkilib_cte_mx "
                                "for the source lines")]
    ssb = {}
    for p in ("gate", "up"):  # load_source_projection_weight_scales: one DMA per quadrant and H tile
        ssb[p] = Buffer(f"{p}_w_scale_sb", (P, h512, inter), "uint8", "sbuf")
        body.append(Alloc(ssb[p]))
        body += [DmaCopy(Ref(ssb[p], (span(q * QUADRANT, SCALES_PER_QUADRANT), span(kt, 1), span(0, inter))),
                         Ref(ws[p], (span(q * SCALES_PER_QUADRANT, SCALES_PER_QUADRANT), span(kt, 1),
                                     span(0, inter))))
                 for q in range(P // QUADRANT) for kt in range(h512)]
    for t0 in range(0, core, tile):
        body += _tile(add(scale(pid, core), t0), min(tile, core - t0), hidden, inter, nbuf, x, xs, w, ssb, w_down,
                      wds, out, adt, wdt)
    doc = (f"nki-library MX prefill MLP (mlp_cte_mx) over {tokens} tokens, hidden {hidden}, intermediate {inter} "
           f"({fmt}), as nmmc models it.\nArguments: x{list(x.shape)} {adt} (MX-quantized) and x_scale, MX weights "
           f"and their scales. Returns out{list(out.shape)}.")
    params = [x, xs, w["gate"], ws["gate"], w["up"], ws["up"], w_down, wds]
    return Program("nkilib_mlp_cte_mx", params, [out], body, doc=doc, programs=lnc,
                   split="tokens" if lnc > 1 else "")


def _tile(t0: Expr, tok: int, hidden: int, inter: int, nbuf: int, x: Buffer, xs: Buffer, w: dict[str, Buffer],
          ssb: dict[str, Buffer], w_down: Buffer, wds: Buffer, out: Buffer, adt: str, wdt: str) -> list[Stmt]:
    h512, n_i = hidden // TILE, inter // TILE
    subs = [(s0, min(SUB, tok - s0)) for s0 in range(0, tok, SUB)]
    rows128 = [(u0, min(P, tok - u0)) for u0 in range(0, tok, P)]
    body: list[Stmt] = [Comment(f"token tile of {tok}: hidden transposed per 256 tokens and 512 rows of H")]
    hx = [Buffer(f"hidden_{s}", (P, h512, SUB), adt, "sbuf") for s in range(len(subs))]
    hxs = [Buffer(f"hidden_scale_{s}", (P, h512, SUB), "uint8", "sbuf") for s in range(len(subs))]
    for s, (s0, n) in enumerate(subs):
        body += [Alloc(hx[s]), Alloc(hxs[s])]
        for kt in range(h512):
            body += [DmaCopy(Ref(hx[s], (span(0, P), Point(Lin(kt)), span(0, n))),
                             Ref(x, (span(add(t0, s0), n), span(kt * P, P))), transpose=True),
                     DmaCopy(Ref(hxs[s], (span(0, P), Point(Lin(kt)), span(0, n))),
                             Ref(xs, (span(add(t0, s0), n), Point(Lin(kt)), span(0, P))), transpose=True)]
    h = [Buffer(f"src_proj_res_{u}", (P, n_i, P, MX_PACK), "bfloat16", "sbuf") for u in range(len(rows128))]
    ring = Buffer("weights_ring", (P, nbuf, inter), wdt, "sbuf")
    body += [Alloc(b) for b in h] + [Alloc(ring, copies=nbuf)]
    for proj in ("gate", "up"):
        psums = {(s, i): Buffer(f"{proj}_psum_{s}_{i}", (P, SUB, MX_PACK), "bfloat16", "psum")
                 for s in range(len(subs)) for i in range(n_i)}
        body += [Comment(f"{proj}: [128, I] x4 per 512 rows of H through {nbuf} buffers"),
                 *[Alloc(b, accumulator=True) for b in psums.values()]]
        for kt in range(h512):
            slot = kt % nbuf
            body.append(DmaCopy(Ref(ring, (span(0, P), Point(Lin(slot)), span(0, inter))),
                                Ref(w[proj], (span(0, P), Point(Lin(kt)), span(0, inter)))))
            for s, (_, n) in enumerate(subs):
                for i in range(n_i):
                    for j in range(MX_PACK):
                        cols = span(i * TILE + j * P, P)
                        body.append(MatmulMx(
                            Ref(psums[s, i], (span(0, P), span(0, n), Point(Lin(j)))),
                            Ref(ring, (span(0, P), Point(Lin(slot)), cols)),
                            Ref(hx[s], (span(0, P), Point(Lin(kt)), span(0, n))),
                            stationary_scale=Ref(ssb[proj], (span(0, P), Point(Lin(kt)), cols)),
                            moving_scale=Ref(hxs[s], (span(0, P), Point(Lin(kt)), span(0, n)))))
        for u, (u0, n) in enumerate(rows128):
            for i in range(n_i):
                dst = Ref(h[u], (span(0, P), Point(Lin(i)), span(0, n), span(0, MX_PACK)))
                src = Ref(psums[u0 // SUB, i], (span(0, P), span(u0 % SUB, n), span(0, MX_PACK)))
                body.append(Activation(dst, src, ElementwiseOp.SILU) if proj == "gate" else
                            TensorTensor(dst, dst, src, ElementwiseOp.MULTIPLY))
    hq = [Buffer(f"intermediate_{u}", (P, n_i, P), adt, "sbuf") for u in range(len(rows128))]
    hqs = [Buffer(f"intermediate_scale_{u}", (P, n_i, P), "uint8", "sbuf") for u in range(len(rows128))]
    body.append(Comment("the product quantize_mx'd per 128 tokens and 512 columns of I"))
    for u, (_, n) in enumerate(rows128):
        body += [Alloc(hq[u]), Alloc(hqs[u])]
        body += [QuantizeMx(Ref(hq[u], (span(0, P), Point(Lin(i)), span(0, n))),
                            Ref(h[u], (span(0, P), Point(Lin(i)), span(0, n), span(0, MX_PACK))),
                            Ref(hqs[u], (span(0, P), Point(Lin(i)), span(0, n)))) for i in range(n_i)]
    body += _down(t0, rows128, hidden, inter, hq, hqs, w_down, wds, out, wdt)
    return body


def _down(t0: Expr, rows128: list[tuple[int, int]], hidden: int, inter: int, hq: list[Buffer], hqs: list[Buffer],
          w_down: Buffer, wds: Buffer, out: Buffer, wdt: str) -> list[Stmt]:
    n_i = inter // TILE
    n_h = -(-hidden // DOWN_COLS)
    nsc = min(DOWN_SCALE_BUFFERS, n_h)
    orows = [Buffer(f"output_{u}", (P, hidden), "bfloat16", "sbuf") for u in range(len(rows128))]
    dring = Buffer("down_weights_ring", (P, DOWN_BUFFERS, DOWN_COLS), wdt, "sbuf")
    sring = Buffer("down_weight_scale_ring", (P, nsc, n_i, DOWN_COLS), "uint8", "sbuf")
    body: list[Stmt] = [Comment(f"down: {DOWN_COLS} columns of H per PSUM bank, 512 rows of I per DMA"),
                        *[Alloc(b) for b in orows], Alloc(dring, copies=DOWN_BUFFERS), Alloc(sring, copies=nsc)]
    for hti, c0 in enumerate(range(0, hidden, DOWN_COLS)):
        cols = min(DOWN_COLS, hidden - c0)
        ss = hti % DOWN_SCALE_BUFFERS
        body += [DmaCopy(Ref(sring, (span(q * QUADRANT, SCALES_PER_QUADRANT), Point(Lin(ss)), span(0, n_i),
                                     span(0, cols))),
                         Ref(wds, (span(q * SCALES_PER_QUADRANT, SCALES_PER_QUADRANT), span(0, n_i), span(c0, cols))))
                 for q in range(P // QUADRANT)]
        psums = [Buffer(f"down_psum_{u}", (P, DOWN_COLS), "bfloat16", "psum") for u in range(len(rows128))]
        body += [Alloc(b, accumulator=True) for b in psums]
        for i in range(n_i):
            slot = (hti * n_i + i) % DOWN_BUFFERS
            body.append(DmaCopy(Ref(dring, (span(0, P), Point(Lin(slot)), span(0, cols))),
                                Ref(w_down, (span(0, P), Point(Lin(i)), span(c0, cols)))))
            for u, (_, n) in enumerate(rows128):
                body.append(MatmulMx(
                    Ref(psums[u], (span(0, n), span(0, cols))), Ref(hq[u], (span(0, P), Point(Lin(i)), span(0, n))),
                    Ref(dring, (span(0, P), Point(Lin(slot)), span(0, cols))),
                    stationary_scale=Ref(hqs[u], (span(0, P), Point(Lin(i)), span(0, n))),
                    moving_scale=Ref(sring, (span(0, P), Point(Lin(ss)), Point(Lin(i)), span(0, cols)))))
        body += [Copy(Ref(orows[u], (span(0, n), span(c0, cols))), Ref(psums[u], (span(0, n), span(0, cols))))
                 for u, (_, n) in enumerate(rows128)]
    body += [DmaCopy(Ref(out, (span(add(t0, u0), n), span(0, hidden))), Ref(orows[u], (span(0, n), span(0, hidden))))
             for u, (u0, n) in enumerate(rows128)]
    return body


# ---- verification: its own inputs (the hidden MX-quantized, as rmsnorm_mx_prefill leaves it), float64 reference

def mx_cte_inputs(tokens: int, hidden: int, inter: int, fmt: str = FORMAT,
                  seed: int = 0) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    """``(kernel arguments, real matrices)``: the weights as :func:`.nkilib_mx.mx_inputs` stores them; x (bf16
    standard normal) quantized to the format's activation element along H with nmmc's offline rule
    (:func:`~..ir.mx.pack`), its x4 word ``128 kt + p`` of token t holding the 4 positions the weights' packed row
    ``128 kt + p`` holds, its scales ``[T, H/512, 128]`` (row ``32 q + r``: partitions ``8 (4 q + r)`` on)."""
    import ml_dtypes

    from ..ir.mx import pack, unpack
    from .nkilib_mx import mx_inputs

    args, real = mx_inputs(tokens, hidden, inter, fmt, seed)
    xb = real["x"].astype(np.float32).astype(ml_dtypes.bfloat16).astype(np.float32)
    data, scales = pack(xb.T, MX_FORMATS[fmt].activations)  # [H/4, T] x4, [16, H/512, T]
    args["x"] = np.ascontiguousarray(data.T)
    xsc = np.zeros((tokens, hidden // TILE, P), np.uint8)
    for q in range(P // QUADRANT):
        for r in range(SCALES_PER_QUADRANT):
            xsc[:, :, q * QUADRANT + r] = scales[q * SCALES_PER_QUADRANT + r].T
    args["x_scale"] = xsc
    real["x"] = unpack(data, scales).T
    return args, real


def mx_cte_reference(real: dict[str, np.ndarray], fmt: str = FORMAT) -> np.ndarray:
    """float64 ``q(b(b(silu(g)) * u)) Wd`` with ``g = x Wg``, ``u = x Wu``, ``x`` the quantized hidden, ``q``
    quantize_mx to the activation element, ``b`` the bf16 rounding where the kernel holds a value in bf16: each
    projection accumulates in a bf16 PSUM bank, 512 contraction rows per step (rounded after each step; gate/up over
    H, down over I; projection.py), the silu written into bf16 rows and the product in place (utils.py)."""
    import ml_dtypes

    from ..ir.mx import quantize_activation

    def b(a: np.ndarray) -> np.ndarray:
        return a.astype(ml_dtypes.bfloat16).astype(np.float64)

    def project(a: np.ndarray, w: np.ndarray) -> np.ndarray:
        total = np.zeros((a.shape[0], w.shape[1]))
        for k0 in range(0, a.shape[1], TILE):
            total = b(total + a[:, k0:k0 + TILE] @ w[k0:k0 + TILE])
        return total

    gate, up = project(real["x"], real["w_gate"]), project(real["x"], real["w_up"])
    hmid = b(b(gate / (1.0 + np.exp(-gate))) * up)
    return project(quantize_activation(hmid, MX_FORMATS[fmt].activations), real["w_down"])


def verify_nkilib_mx_prefill(tokens: int, hidden: int, inter: int, target: Target, fmt: str = FORMAT, seed: int = 0,
                             source: str | None = None) -> MxCheck:
    """Run the MX prefill kernel against :func:`mx_cte_reference` (:func:`.nkilib_mx.check_mx_model`, as the MX
    decode model). ``source``: a (mutated) kernel file instead of the model's."""
    args, real = mx_cte_inputs(tokens, hidden, inter, fmt, seed)
    return check_mx_model(mx_cte_program(tokens, hidden, inter, target, fmt), target, args,
                          mx_cte_reference(real, fmt), f"nkilib_cte_mx_{tokens}x{hidden}x{inter}.py", source)


__all__ = ["mx_cte_inputs", "mx_cte_program", "mx_cte_reference", "mx_cte_tile", "src_buffers",
           "verify_nkilib_mx_prefill"]

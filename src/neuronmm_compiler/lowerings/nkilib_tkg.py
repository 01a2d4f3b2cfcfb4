"""nki-library's decode MLP kernel (``mlp_tkg``, bf16 or FP8 weights, gated SiLU, no bias) as a program of nmmc's
kernel IR.

Every tile size, buffer count, loop order and split below is read from aws-neuron/nki-library at
:data:`~.nkilib_source.NKILIB_TKG_COMMIT` (d2ad3a57: the code index holds no later version of these
files), paths under ``src/nkilib_src/nkilib/core/mlp/`` (cited per line as
``mlp_tkg/<file>:<line>``). Per physical core of a logical core of ``L`` cores:

1. x [T, H/L] (this core's slice of the hidden dim) is loaded with one DMA and turned into ``[128, H/(128 L), T]``
   by TensorE transposes, ``512 // T`` of them packed per PSUM bank and evicted with one copy
   (``subkernels/norm_tkg_utils.py:150-267``);
2. gate, then up: the hidden dim in slabs of 2048 rows (512 when no slab fits) of all I columns (at most 4096 at
   once), streamed through one ring of SBUF buffers the two projections share, as many as fit the 200 KiB window
   (``mlp_tkg_constants.py:256-358``); the activations stationary ([128, T]), the weights moving (512 columns),
   and for T <= 64 the PE array split into column tiles (``tile_position``), each accumulating the partial sums of
   every f-th hidden tile (``mlp_tkg_gate_up_projection.py:160-224``; rule ``mlp_tkg_constants.py:201-214``);
   the column tiles' partial sums are added on the eviction into fp32 [T, 2I];
3. on LNC=2 the two cores each hold partial sums over their half of H and exchange all of them with one fp32
   ``sendrecv`` and an add (``mlp_tkg_gate_up_projection.py:595-601, 938-948``); silu on ScalarE and the multiply on
   VectorE over the whole [T, I] on both cores (``:936-1020``);
4. the product is transposed back by fp32 TensorE transposes into ``[128, I/128, T]`` bf16 (``:1022-1040``);
5. down: this core's H/L output columns in tiles of 4096, 128 rows of I per DMA through a second ring; the
   intermediate stationary, ``W_down`` moving, column tiles holding different 512-column chunks; evictions
   alternate between ScalarE and VectorE (``mlp_tkg_down_projection.py:39-209``, ``utils/interleave_copy.py``);
   one store of the core's [T, H/L] columns (``mlp_tkg.py:244-255``).

**FP8** (``fp8``: ``quantization_type=ROW``, what NxD Inference passes with ``quantized_mlp_kernel_enabled``,
aws-neuron/neuronx-distributed-inference@4bcdc54b, ``models/llama/modeling_llama.py:481-505``): the decode kernel
quantizes no activation. Only the weights are FP8 (1 byte, so slabs of twice the rows: 4096 / 1024 rows for gate/up,
8192 columns for down, ``mlp_tkg_constants.py:286, 301, 389``); the matmuls read bf16 activations against FP8 weights
with no ``perf_mode`` (``mlp_tkg_gate_up_projection.py:187-203``); the per-output-channel scales ([128, I] and
[128, H] fp32 in HBM, ``mlp_parameters.py:197-208``) are DMA'd as [T, I] / [T, H/L] tiles (``:147-154``;
``mlp_tkg_down_projection.py:467-481``) and applied by VectorE multiplies: on gate's and up's fp32 sums after the
column tiles are added (``mlp_tkg_gate_up_projection.py:226-236``, ``utils/interleave_copy.py:91-99``), and on every
down eviction (``mlp_tkg_down_projection.py:187-198``). ``gate_up_in_scale``/``down_in_scale`` are read nowhere in
the decode kernel (``:588``; ``mlp_tkg_down_projection.py:429-433``).

What nmmc's IR does not express, and how it is modelled instead (docs/nkilib-mlp.md):
the kernel splits H as (partition outer, tile inner) so that each partition reads one contiguous run per slab and a
slab is one DMA; nmmc's buffers split H as (tile outer, partition inner), so a slab is one DMA per 128 rows (the
same bytes; per-partition runs of 2·I instead of 32·I bytes). For H/L > 2048 the kernel loads x with one strided
DMA instead of the transposes (``mlp_tkg_utils.py:451-463``); the transposes are kept (the difference is a few
microseconds of a memory-bound kernel). The down ring's start slot (offset past gate/up's buffers to avoid a
write-after-read stall, ``mlp_tkg_constants.py:427-436``) is 0 here: nmmc allocates the rings separately.
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
    Copy,
    DmaCopy,
    Matmul,
    PeTile,
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

KIB = 1024
#: SBUF bytes per partition the decode kernel allocates from (mlp.py:256, asserted mlp_tkg/mlp_tkg.py:139-142).
SBUF_WINDOW = 200 * KIB
#: Rows of H per gate/up weight slab, and the fallback when no slab fits (mlp_tkg_constants.py:286, 300-313).
HTILE, HTILE_FALLBACK = 2048, 512
#: Columns of I held in PSUM at once with column tiling: 512 per bank x 8 banks (mlp_tkg_constants.py:189-195).
I_CHUNK = 4096
#: Output columns of H per down-projection tile (mlp_tkg_constants.py:387-401; never halved for bf16).
DOWN_HTILE = 4096
MOVING = 512  # moving free size of every matmul: gemm_moving_fmax (mlp_tkg_gate_up_projection.py:186)
P = 128


def column_tile(tokens: int) -> int:
    """PE columns per matmul: 32 for T <= 32 (4 column tiles), 64 for T <= 64 (2), else the whole array
    (mlp_tkg_constants.py:201-214; 64 on NeuronCore-v2, which nmmc does not model for nki-library)."""
    return 32 if tokens <= 32 else 64 if tokens <= 64 else 128


def _slab_rows(free: int, hs: int, cols: int, wbytes: int = 2) -> tuple[int, int]:
    """(rows of H per slab, ring buffers): 2048 rows, or 512 when not one slab fits ``free`` bytes per partition
    (twice as many rows of 1-byte FP8 weights); as many buffers as fit, at most two projections' worth
    (mlp_tkg_constants.py:285-319). A buffer holds a whole slab even when the core's H/L rows are fewer (the tile
    shape is ``HTile // 128`` rows, :291-294, allocated at mlp_tkg_gate_up_projection.py:796-801)."""
    for rows in (HTILE, HTILE_FALLBACK):
        rows *= 2 // wbytes
        slab = (rows // P) * cols * wbytes
        tiles = -(-hs // rows)
        count = min(2 * tiles, free // slab)
        if count > 0:
            return rows, count
    raise DoesNotRun(f"no gate/up weight slab fits nki-library's {SBUF_WINDOW // KIB} KiB SBUF window "
                      f"(mlp_tkg_constants.py:315-319 asserts)")


def _ceil(a: int, b: int) -> int:
    return -(-a // b)


def down_htile(hs: int, f: int, fp8: bool) -> int:
    """Output columns per down-projection tile: 4096 (8192 of FP8 weights), at most H/L, halved while its PSUM banks
    after column tiling exceed 8 (mlp_tkg_constants.py:387-401)."""
    htd = min(hs, DOWN_HTILE * (2 if fp8 else 1))
    while -(-_ceil(htd, MOVING) // f) > 8:
        htd = -(-htd // 2)
    return htd


def tkg_program(tokens: int, hidden: int, inter: int, target: Target, dtype: str = "bfloat16",
                fp8: str | None = None) -> Program:
    """nki-library's ``mlp_tkg`` for x[tokens, hidden] on ``target`` (its logical-core degree), as a program; ``fp8``
    (an FP8 format) for its ``QuantizationType.ROW`` path (FP8 weights and per-channel scales, see above)."""
    lnc = target.lnc
    if hidden % (P * lnc):
        raise DoesNotRun(f"hidden={hidden} is not a multiple of {P * lnc}: nki-library's decode MLP asserts it "
                          "(mlp_tkg/mlp_tkg_constants.py:176-186)")
    pid: Expr = var(PROGRAM_ID) if lnc > 1 else Lin(0)
    t, hs = tokens, hidden // lnc
    h1 = hs // P
    cdim = column_tile(t)
    f = P // cdim
    i128 = -(-inter // P)

    wdtype = fp8 or dtype
    wbytes = 1 if fp8 else 2
    x = Buffer("x", (t, hidden), dtype, "hbm")
    w = {p: Buffer(f"w_{p}", (hidden, inter), wdtype, "hbm") for p in ("gate", "up")}
    w_down = Buffer("w_down", (inter, hidden), wdtype, "hbm")
    out = Buffer("out", (t, hidden), dtype, "hbm")
    # ROW scales, broadcast over 128 rows in HBM (mlp_parameters.py:197-208)
    ws = {p: Buffer(f"w_{p}_scale", (P, n), "float32", "hbm") for p, n in (("gate", inter), ("up", inter),
                                                                         ("down", hidden))} if fp8 else {}

    x_rows = Buffer("x_rows", (t, hs), dtype, "sbuf")
    xs = Buffer("x_strip", (P, h1, t), dtype, "sbuf")
    gu = Buffer("gate_up", (t, 2 * inter), "float32", "sbuf")
    inter_sb = Buffer("inter_strip", (P, i128, t), dtype, "sbuf")
    down_sb = Buffer("down_rows", (t, hs), dtype, "sbuf")
    body: list[Stmt] = [Comment("nki-library mlp_tkg (decode); see the module docstring of "
                                "neuronmm_compiler.lowerings.nkilib_tkg for the source lines")]

    # 1. x: one DMA of this core's columns, TensorE transposes packed 512 // T per PSUM bank (T rounded to even)
    packed = max(1, 512 // (t + t % 2))
    body += [Alloc(x_rows), Alloc(xs),
             DmaCopy(Ref(x_rows, (span(0, t), span(0, hs))), Ref(x, (span(0, t), span(scale(pid, hs), hs))))]
    for first in range(0, h1, packed):
        n = min(packed, h1 - first)
        xt = Buffer(f"x_tpsum{first // packed}" if h1 > packed else "x_tpsum", (P, min(packed, h1), t), dtype,
                    "psum")
        body += [Alloc(xt), *loop("j", Lin(n), n, [PeTranspose(
            Ref(xt, (span(0, P), Point(iv("j", n)), span(0, t))),
            Ref(x_rows, (span(0, t), span(scale(add(iv("j", n), first), P), P))))]),
            Copy(Ref(xs, (span(0, P), span(first, n), span(0, t))), Ref(xt, (span(0, P), span(0, n), span(0, t))))]

    # 2. gate and up through one ring of slabs (after FP8's two [T, <=4096] fp32 scale tiles, :731-748)
    scale_cols = min(I_CHUNK, inter)
    live = h1 * t * 2 + i128 * t * 2 + 8 * inter * (2 if lnc > 1 else 1) + (2 * 4 * scale_cols if fp8 else 0)
    if live >= SBUF_WINDOW:
        held = "fp32 gate/up sums [T, 2I]" + (" and their receive buffer" if lnc > 1 else "") + (
            ", the FP8 scale tiles" if fp8 else "")
        raise DoesNotRun(f"nki-library's decode kernel holds {live} bytes per partition ({held}) before any weight "
                          f"slab, more than its {SBUF_WINDOW}-byte SBUF window (its allocator asserts 'Stack out of "
                          "memory', utils/allocator.py:400; mlp_tkg_gate_up_projection.py:602-615, 765-775)")
    body += [Alloc(gu)]
    sc = {p: Buffer(f"{p}_scale_rows", (t, scale_cols), "float32", "sbuf") for p in ("gate", "up")} if fp8 else {}
    body += [Alloc(b) for b in sc.values()]
    chunks = [(c0, min(I_CHUNK, inter - c0)) for c0 in range(0, inter, I_CHUNK)]
    # slabs hold all I columns (gate_up_projection.py:796)
    htile, nbuf = _slab_rows(SBUF_WINDOW - live, hs, inter, wbytes)
    ht1, rows = htile // P, min(htile, hs)
    slabs = [(r0, min(rows, hs - r0)) for r0 in range(0, hs, rows)]
    ring = Buffer("w_ring", (P, nbuf, ht1, inter), wdtype, "sbuf")
    body.append(Alloc(ring, copies=nbuf))
    for c0, cols in chunks:
        body.append(Comment(f"gate/up: I columns {c0}..{c0 + cols}, slabs of {rows} rows of H through {nbuf} "
                            "buffers"))
        idim = Dim("i", cols, MOVING, -(-cols // MOVING), 1)
        for proj_index, proj in enumerate(("gate", "up")):
            acc = Buffer(f"{proj}_psum", (P, idim.tiles, MOVING), "float32", "psum")
            body += [Alloc(acc, accumulator=True)]
            if fp8:  # this chunk's scales, rows 0..T of the [128, I] tensor (gate_up_projection.py:147-154)
                body.append(DmaCopy(Ref(sc[proj], (span(0, t), span(0, cols))),
                                    Ref(ws[proj], (span(0, t), span(c0, cols)))))
            for s, (r0, nrows) in enumerate(slabs):
                slot = (proj_index * len(slabs) + s) % nbuf
                n1 = nrows // P
                body += loop("j", Lin(n1), n1, [DmaCopy(
                    Ref(ring, (span(0, P), Point(Lin(slot)), Point(iv("j", n1)), span(c0, cols))),
                    Ref(w[proj], (span(add(scale(pid, hs), r0, scale(iv("j", n1), P)), P), span(c0, cols))))])
                body += _gate_up_matmuls(acc, xs, ring, slot, r0 // P, n1, t, cdim, f, idim, c0)
            used = min(f, h1)
            evict: list[Stmt] = []
            it = iv("it", idim.tiles)
            width = idim.tile_size(it)
            col = add(proj_index * inter + c0, scale(it, MOVING))
            dst = Ref(gu, (span(0, t), span(col, width)))
            evict.append(Activation(dst, Ref(acc, (span(0, t), Point(it), span(0, width))), "copy"))
            evict += [TensorTensor(dst, dst, Ref(acc, (span(k * cdim, t), Point(it), span(0, width))),
                                   ElementwiseOp.ADD) for k in range(1, used)]
            body += loop("it", Lin(idim.tiles), idim.tiles, evict)
            if fp8:  # dequantization of the whole chunk on VectorE (gate_up_projection.py:226-236)
                chunk = Ref(gu, (span(0, t), span(proj_index * inter + c0, cols)))
                body.append(TensorTensor(chunk, chunk, Ref(sc[proj], (span(0, t), span(0, cols))),
                                         ElementwiseOp.MULTIPLY))

    # 3. the cores' partial sums added, then silu(gate) * up on both cores
    whole = Ref(gu, (span(0, t), span(0, 2 * inter)))
    if lnc > 1:
        recv = Buffer("gate_up_recv", (t, 2 * inter), "float32", "sbuf")
        body += [Comment("all-reduce of the partial sums over H with the other core (fp32)"), Alloc(recv),
                 SendRecv(Ref(recv, (span(0, t), span(0, 2 * inter))), whole),
                 TensorTensor(whole, whole, Ref(recv, (span(0, t), span(0, 2 * inter))), ElementwiseOp.ADD)]
    gate_ref = Ref(gu, (span(0, t), span(0, inter)))
    up_ref = Ref(gu, (span(0, t), span(inter, inter)))
    body += [Activation(gate_ref, gate_ref, ElementwiseOp.SILU), TensorTensor(up_ref, gate_ref, up_ref,
                                                                               ElementwiseOp.MULTIPLY)]

    # 4. fp32 TensorE transposes into [128, I/128, T]
    idim128 = Dim("i", inter, P, i128, 1)
    i = iv("i", i128)
    wi = idim128.tile_size(i)
    tp = Buffer("inter_tpsum", (P, t), "float32", "psum")
    body += [Alloc(inter_sb), *loop("i", Lin(i128), i128, [
        Alloc(tp), PeTranspose(Ref(tp, (span(0, wi), span(0, t))), Ref(gu, (span(0, t), span(add(inter, scale(i, P)),
                                                                                                  wi)))),
        Copy(Ref(inter_sb, (span(0, wi), Point(i), span(0, t))), Ref(tp, (span(0, wi), span(0, t))))])]

    # 5. down: this core's output columns
    htd = down_htile(hs, f, bool(fp8))
    live_down = i128 * t * 2 + hs * 2 + (4 * hs if fp8 else 0)
    nbuf_d = min(i128 * -(-hs // htd), (SBUF_WINDOW - live_down) // (wbytes * htd))
    if nbuf_d < 1:
        raise DoesNotRun("no down-projection weight slab fits nki-library's SBUF window "
                          "(mlp_tkg_down_projection.py:500 asserts)")
    dring = Buffer("w_down_ring", (P, nbuf_d, htd), wdtype, "sbuf")
    body += [Comment(f"down: output columns in tiles of {htd}, 128 rows of I per DMA through {nbuf_d} buffers"),
             Alloc(down_sb)]
    if fp8:  # the core's [T, H/L] scales in one DMA (mlp_tkg_down_projection.py:467-481)
        dsc = Buffer("down_scale_rows", (t, hs), "float32", "sbuf")
        body += [Alloc(dsc), DmaCopy(Ref(dsc, (span(0, t), span(0, hs))),
                                     Ref(ws["down"], (span(0, t), span(scale(pid, hs), hs))))]
    body.append(Alloc(dring, copies=nbuf_d))
    for d, h0 in enumerate(range(0, hs, htd)):
        hcols = min(htd, hs - h0)
        chunks512 = -(-hcols // MOVING)
        banks = -(-chunks512 // f)
        acc = Buffer(f"down_psum{d}" if hs > htd else "down_psum", (P, banks, MOVING), "float32", "psum")
        it = iv("it", i128)
        slot = modulo(add(d * i128, it), nbuf_d) if nbuf_d > 1 else Lin(0)
        rows = idim128.tile_size(it)
        inner: list[Stmt] = [DmaCopy(
            Ref(dring, (span(0, rows), Point(slot), span(0, hcols))),
            Ref(w_down, (span(scale(it, P), rows), span(add(scale(pid, hs), h0), hcols))))]
        for ct in range(chunks512):
            c, bank = ct % f, ct // f
            wc = min(MOVING, hcols - ct * MOVING)
            inner.append(Matmul(Ref(acc, (span(c * cdim, t), Point(Lin(bank)), span(0, wc))),
                                Ref(inter_sb, (span(0, rows), Point(it), span(0, t))),
                                Ref(dring, (span(0, rows), Point(slot), span(ct * MOVING, wc))),
                                tile=PeTile(Lin(0), Lin(c * cdim), P, cdim) if f > 1 else None))
        body += [Alloc(acc, accumulator=True), *loop("it", Lin(i128), i128, inner)]
        for ct in range(chunks512):
            c, bank = ct % f, ct // f
            wc = min(MOVING, hcols - ct * MOVING)
            src = Ref(acc, (span(c * cdim, t), Point(Lin(bank)), span(0, wc)))
            dst = Ref(down_sb, (span(0, t), span(h0 + ct * MOVING, wc)))
            if fp8:  # a [T, 512] scale is no per-partition vector: VectorE multiply (interleave_copy.py:91-99)
                body.append(TensorTensor(dst, src, Ref(dsc, (span(0, t), span(h0 + ct * MOVING, wc))),
                                         ElementwiseOp.MULTIPLY))
            else:
                body.append(Activation(dst, src, "copy") if f == 1 or ct % 2 == 0 else Copy(dst, src))
    body.append(DmaCopy(Ref(out, (span(0, t), span(scale(pid, hs), hs))), Ref(down_sb, (span(0, t), span(0, hs)))))
    weights = f"{fp8} weights with per-channel scales (ROW)" if fp8 else dtype
    doc = (f"nki-library decode MLP (mlp_tkg) over {t} tokens, hidden {hidden}, intermediate {inter} ({weights}), "
           f"as nmmc models it.\nArguments: x{list(x.shape)}, w_gate{list(w['gate'].shape)}, "
           f"w_up{list(w['up'].shape)}, w_down{list(w_down.shape)}"
           + "".join(f", {b.name}{list(b.shape)}" for b in ws.values()) + f". Returns out{list(out.shape)}.")
    # one DMA per gate/up weight tile, as the kernel loads it (mlp_tkg_gate_up_projection.py:163-181)
    return coalesce_slab_loads(Program("nkilib_mlp_tkg", [x, w["gate"], w["up"], w_down, *ws.values()], [out], body,
                                       doc=doc, programs=lnc, split="hidden" if lnc > 1 else ""))


def _gate_up_matmuls(acc: Buffer, xs: Buffer, ring: Buffer, slot: int, first_tile: int, tiles: int, t: int,
                     cdim: int, f: int, idim: Dim, c0: int) -> list[Stmt]:
    """The matmuls of one slab: hidden tile ``h`` accumulates into column tile ``h % f`` (PSUM partitions
    ``cdim * (h % f)`` on), for every 512-column tile of I."""
    out: list[Stmt] = []
    it = iv("it", idim.tiles)
    width = idim.tile_size(it)

    def matmul(h: Expr, c: int) -> list[Stmt]:
        mm = Matmul(Ref(acc, (span(c * cdim, t), Point(it), span(0, width))),
                    Ref(xs, (span(0, P), Point(add(first_tile, h)), span(0, t))),
                    Ref(ring, (span(0, P), Point(Lin(slot)), Point(h), span(add(c0, scale(it, MOVING)), width))),
                    tile=PeTile(Lin(0), Lin(c * cdim), P, cdim) if f > 1 else None)
        return loop("it", Lin(idim.tiles), idim.tiles, [mm])

    groups = tiles // f
    if groups:
        full: list[Stmt] = []
        ho = iv("ho", groups)
        for c in range(f):
            full += matmul(add(scale(ho, f), c), c)
        out += loop("ho", Lin(groups), groups, full)
    for c in range(tiles % f):  # a slab of fewer tiles than a round of column tiles
        out += matmul(Lin(groups * f + c), c)
    return out

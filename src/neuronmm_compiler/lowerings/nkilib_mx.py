"""nki-library's MX decode MLP (``mlp_tkg_mx``, ``QuantizationType.MX``: MXFP8 or MXFP4 weights, activations
quantized on chip to MXFP8 E4M3) as a program of nmmc's kernel IR, and its check in nmmc's interpreter.

Read from aws-neuron/nki-library at :data:`~.nkilib_source.NKILIB_TKG_COMMIT` (d2ad3a57, the fetched snapshot: every
file of the MX decode path is readable there), paths under ``src/nkilib_src/nkilib/core/mlp/`` (``mlp_tkg/`` omitted
below). ``mlp`` sends an MX MLP of <= 96 tokens to ``mlp_tkg_mx`` (``mlp.py:285-287``); its column tiling must be off
(``mlp_parameters.py:754-763`` asserts). Per physical core of a logical core of ``L`` cores (H split between them):

1. x, stored by the caller shuffled as ``[T, 4, H/512, 128]`` ("internally shuffled layout", element ``[t, j, kt, p]``
   the contraction position ``512 kt + 128 j + p``), is zeroed and loaded into ``[16, T/4, H/(512L), 128]`` by one DMA
   per token and ``j`` (4 tokens x 4 ``j`` on 16 partitions), then TensorE transposes ``[16, 128] -> [128, 16]`` per
   4-token group and 512-position tile, one copy each, into ``[128, H/(512L), T/4 * 4, 4]`` bf16
   (``mlp_tkg_utils.py:43-113``, ``_layout_adapter_hbm``); one ``quantize_mx`` of the whole tile into
   ``float8_e4m3fn_x4`` and its scales (``mlp_tkg_mx.py:160-198``; T padded to a multiple of 4, the pad zero);
2. gate, then up (``gate_up_projection_mx_shard_H.py:79-225``): the core's whole weight ``[128, H/(512L), I]`` in one
   DMA (``:98-102``), its scales one DMA per SBUF quadrant (``:120-131``); ``nc_matmul_mx`` with 128 weight columns
   stationary and the tokens moving, for each 512-position tile of H, 512-column tile of I and its 4 quarters, into one
   bf16 PSUM tile ``[128, 4, T]`` per 512 columns of I, all live across H (``:137-174``); each evicted by one strided
   ``tensor_copy`` into ``[128, I/512, T, 4]`` bf16, quantize_mx's layout (``:209-217``); at LNC=2 the whole tile
   exchanged with one ``sendrecv`` and added (``:219-223``); silu on gate, then gate * up (``mlp_tkg_mx.py:245-298``);
3. down (``down_projection_mx_shard_H.py:43-209``): one ``quantize_mx`` of the product (``:73-78``), the core's H/L
   output columns of the weight ``[128, I/512, H]`` in one DMA (``:87-100``), its scales one DMA per partition of
   each quadrant's 4 (``:117-132``); per 128 output columns a bf16 PSUM ``[128, T]``, ``nc_matmul_mx`` over the I tiles,
   weights stationary, and one ScalarE copy into ``[128, H/(128L), T]`` (``:171-195``; the output stays per core,
   ``partial_output``, ``mlp_tkg_mx.py:337-344``);
4. per 128 columns a TensorE transpose to ``[T, 128]`` and a copy alternating ScalarE/VectorE
   (``utils/interleave_copy.py``), one store of the core's ``[T, H/L]`` (``mlp_tkg_mx.py:349-395``).

PSUM: the kernel allocates the ``ceil(I/512)`` gate tiles as separate tensors (``:146-148``); nmmc's footprint gives
each PSUM allocation whole banks (docs/cost_model.md), so above 4096 intermediate columns per core they exceed the 8
banks (nki-library's own MX decode tests stop at I = 3584:
``test/integration/nkilib/core/mlp/test_mlp_tkg.py:418-439``).
Not modelled: ``I < 512`` (its unpadded weight rows), biases, the fused RMSNorm.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..ir.mx import MX_FORMATS, MX_PACK, QUADRANT, SCALES_PER_QUADRANT
from ..kernel_ir.dims import iv, loop
from ..kernel_ir.expr import Expr, Lin, add, scale, var
from ..kernel_ir.lnc import PROGRAM_ID
from ..kernel_ir.mx import Interleave, MatmulMx, QuantizeMx
from ..kernel_ir.program import (
    Activation,
    Alloc,
    Buffer,
    Comment,
    Copy,
    DmaCopy,
    Memset,
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
from .nkilib_source import DoesNotRun, NotModelled
from .nkilib_tkg import P

#: Contraction positions per nc_matmul_mx / quantize_mx tile (128 partitions x 4 packed elements).
TILE = P * MX_PACK
#: Tokens per gate/up tile: a bf16 PSUM [128, 4, T] holds 256 tokens (gate_up_projection_mx_shard_H.py:82).
BXS_TILE = 256


def mx_asserts(tokens: int, hidden: int, inter: int, lnc: int) -> None:
    """nki-library's asserts for an MX MLP, :class:`DoesNotRun` with the one that fails; :class:`NotModelled` for the
    cases it runs and nmmc does not model."""
    if hidden % TILE:
        raise DoesNotRun(f"hidden={hidden}: nki-library's MX MLP asserts H % 512 == 0 (mlp_parameters.py:647-652)")
    if inter % TILE and not (inter < TILE and inter % 32 == 0):
        raise DoesNotRun(f"intermediate={inter}: nki-library's MX MLP asserts I % 512 == 0 or (I < 512 and I % 32 == "
                         "0) (mlp_parameters.py:653-657)")
    if hidden // P // lnc % MX_PACK or (hidden // P) % lnc:
        raise DoesNotRun(f"hidden={hidden} at LNC={lnc}: H/128 per core must be a multiple of 4 "
                         "(mlp_tkg/projection_mx_constants.py:101-107)")
    if inter < TILE:
        raise NotModelled("nki-library's MX decode MLP with I < 512 (unpadded weight rows, memsets of the last tile, "
                          "down_projection_mx_shard_H.py:63-132) is not modelled")


def mx_tkg_program(tokens: int, hidden: int, inter: int, target: Target, fmt: str) -> Program:
    """nki-library's ``mlp_tkg_mx`` for x[tokens, hidden] and MX weights of ``fmt`` (an nmmc MX format name) on
    ``target`` (its logical-core degree), as a program (module docstring)."""
    lnc = target.lnc
    mx_asserts(tokens, hidden, inter, lnc)
    spec = MX_FORMATS[fmt]
    wdt, adt = spec.weight_dtype, spec.activation_dtype
    pid: Expr = var(PROGRAM_ID) if lnc > 1 else Lin(0)
    t, hs = tokens, hidden // lnc
    h512, h512s, n_i = hidden // TILE, hs // TILE, inter // TILE
    t4 = -(-t // 4)
    tp = 4 * t4  # T padded to a multiple of 4 (mlp_tkg_mx.py:162)
    h1s = hs // P

    x = Buffer("x", (t, MX_PACK, h512, P), "bfloat16", "hbm")  # [T, 4_H, H/512, 128]: the caller's shuffle
    w = {p: Buffer(f"w_{p}", (P, h512, inter), wdt, "hbm") for p in ("gate", "up")}
    w_down = Buffer("w_down", (P, n_i, hidden), wdt, "hbm")
    ws = {p: Buffer(f"w_{p}_scale", (P // 8, h512, inter), "uint8", "hbm") for p in ("gate", "up")}
    ws["down"] = Buffer("w_down_scale", (P // 8, n_i, hidden), "uint8", "hbm")
    out = Buffer("out", (t, hidden), "bfloat16", "hbm")
    body: list[Stmt] = [Comment("nki-library mlp_tkg_mx (MX decode); see neuronmm_compiler.lowerings.nkilib_mx for "
                                "the source lines")]

    # 1. x into quantize_mx's layout, then quantized (mlp_tkg_utils.py:43-113, mlp_tkg_mx.py:179-198)
    rows = Buffer("x_rows", (4 * MX_PACK, t4, h512s, P), "bfloat16", "sbuf")
    shuffled = Buffer("x_shuffled", (P, h512s, t4, 4 * MX_PACK), "bfloat16", "sbuf")
    xq = Buffer("x_qtz", (P, h512s, tp), adt, "sbuf")
    xs = Buffer("x_qtz_scale", (P, h512s, tp), "uint8", "sbuf")
    body += [Alloc(rows), Memset(Ref(rows, (span(0, 16), span(0, t4), span(0, h512s), span(0, P))), 0.0)]
    for tok in range(t):
        body += [DmaCopy(Ref(rows, (span(tok % 4 * 4 + j, 1), Point(Lin(tok // 4)), span(0, h512s), span(0, P))),
                         Ref(x, (span(tok, 1), Point(Lin(j)), span(scale(pid, h512s), h512s), span(0, P))))
                 for j in range(MX_PACK)]
    body.append(Alloc(shuffled))
    for q in range(t4):
        tpsum = Buffer("x_tpsum", (P, 16), "bfloat16", "psum")
        kt = iv("kt", h512s)
        body += loop("kt", Lin(h512s), h512s, [
            Alloc(tpsum), PeTranspose(Ref(tpsum, (span(0, P), span(0, 16))),
                                      Ref(rows, (span(0, 16), Point(Lin(q)), Point(kt), span(0, P)))),
            Copy(Ref(shuffled, (span(0, P), Point(kt), Point(Lin(q)), span(0, 16))), Ref(tpsum, (span(0, P),
                                                                                                   span(0, 16))))])
    body += [Alloc(xq), Alloc(xs),
             QuantizeMx(Ref(xq, (span(0, P), span(0, h512s), span(0, tp))),
                        Ref(shuffled, (span(0, P), span(0, h512s), span(0, t4), span(0, 16))),
                        Ref(xs, (span(0, P), span(0, h512s), span(0, tp))))]

    # 2. gate, then up (gate_up_projection_mx_shard_H.py:79-225); silu and the product (mlp_tkg_mx.py:245-298)
    proj = {p: Buffer(f"{p}_out", (P, n_i, tp, MX_PACK), "bfloat16", "sbuf") for p in ("gate", "up")}
    for name in ("gate", "up"):
        body += [Comment(f"{name}: the core's whole weight in one DMA, {n_i} PSUM tiles live across H"),
                 *_projection(name, w[name], ws[name], proj[name], xq, xs, pid, h512s, inter, tp, min(tp, BXS_TILE),
                              lnc)]
        if name == "gate":
            whole = Ref(proj["gate"], (span(0, P), span(0, n_i), span(0, tp), span(0, MX_PACK)))
            body.append(Activation(whole, whole, ElementwiseOp.SILU))
    g = Ref(proj["gate"], (span(0, P), span(0, n_i), span(0, tp), span(0, MX_PACK)))
    body.append(TensorTensor(g, g, Ref(proj["up"], g.index), ElementwiseOp.MULTIPLY))

    # 3. down (down_projection_mx_shard_H.py:43-209)
    hq = Buffer("inter_qtz", (P, n_i, tp), adt, "sbuf")
    hqs = Buffer("inter_qtz_scale", (P, n_i, tp), "uint8", "sbuf")
    wd = Buffer("down_w_qtz_sb", (P, n_i, hs), wdt, "sbuf")
    wds = Buffer("down_w_scale_sb", (P, n_i, hs), "uint8", "sbuf")
    down = Buffer("down_out", (P, h1s, tp), "bfloat16", "sbuf")
    body += [Comment("down: the product quantized, the core's output columns of the weight in one DMA"),
             Alloc(hq), Alloc(hqs), QuantizeMx(Ref(hq, (span(0, P), span(0, n_i), span(0, tp))), g,
                                               Ref(hqs, (span(0, P), span(0, n_i), span(0, tp)))),
             Alloc(wd), DmaCopy(Ref(wd, (span(0, P), span(0, n_i), span(0, hs))),
                                Ref(w_down, (span(0, P), span(0, n_i), span(scale(pid, hs), hs)))), Alloc(wds)]
    for q in range(P // QUADRANT):
        body += [DmaCopy(Ref(wds, (span(q * QUADRANT + r, 1), span(0, n_i), span(0, hs))),
                         Ref(ws["down"], (span(q * SCALES_PER_QUADRANT + r, 1), span(0, n_i),
                                          span(scale(pid, hs), hs))))
                 for r in range(SCALES_PER_QUADRANT)]
    body.append(Alloc(down))
    h1 = iv("h1", h1s)
    dpsum = Buffer("down_psum", (P, tp), "bfloat16", "psum")
    cols = span(scale(h1, P), P)
    body += loop("h1", Lin(h1s), h1s, [Alloc(dpsum, accumulator=True), *[MatmulMx(
        Ref(dpsum, (span(0, P), span(0, tp))), Ref(wd, (span(0, P), Point(Lin(i)), cols)),
        Ref(hq, (span(0, P), Point(Lin(i)), span(0, tp))), stationary_scale=Ref(wds, (span(0, P), Point(Lin(i)), cols)),
        moving_scale=Ref(hqs, (span(0, P), Point(Lin(i)), span(0, tp)))) for i in range(n_i)],
        Activation(Ref(down, (span(0, P), Point(h1), span(0, tp))), Ref(dpsum, (span(0, P), span(0, tp))), "copy")])

    # 4. back to [T, H/L] and one store (mlp_tkg_mx.py:349-395)
    out_sb = Buffer("out_rows", (t, hs), "bfloat16", "sbuf")
    body.append(Alloc(out_sb))
    for k in range(h1s):
        tps = Buffer("out_tpsum", (t, P), "bfloat16", "psum")
        dst = Ref(out_sb, (span(0, t), span(k * P, P)))
        src = Ref(tps, (span(0, t), span(0, P)))
        body += [Alloc(tps), PeTranspose(src, Ref(down, (span(0, P), Point(Lin(k)), span(0, t)))),
                 Activation(dst, src, "copy") if k % 2 == 0 else Copy(dst, src)]
    body.append(DmaCopy(Ref(out, (span(0, t), span(scale(pid, hs), hs))), Ref(out_sb, (span(0, t), span(0, hs)))))
    doc = (f"nki-library MX decode MLP (mlp_tkg_mx) over {t} tokens, hidden {hidden}, intermediate {inter} ({fmt} "
           f"weights, activations quantize_mx'd to {spec.activations}), as nmmc models it.\nArguments: "
           f"x{list(x.shape)} (shuffled), w_gate{list(w['gate'].shape)}, w_up{list(w['up'].shape)}, "
           f"w_down{list(w_down.shape)} and their scales. Returns out{list(out.shape)}.")
    params = [x, w["gate"], ws["gate"], w["up"], ws["up"], w_down, ws["down"]]
    return Program("nkilib_mlp_tkg_mx", params, [out], body, doc=doc, programs=lnc, split="hidden" if lnc > 1 else "")


def _projection(name: str, w: Buffer, ws: Buffer, out: Buffer, xq: Buffer, xs: Buffer, pid: Expr, h512s: int,
                inter: int, tp: int, tile: int, lnc: int) -> list[Stmt]:
    """gate_up_projection_mx_tp_shard_H (gate_up_projection_mx_shard_H.py:79-225) into ``out``."""
    n_i = inter // TILE
    wsb = Buffer(f"{name}_w_sb", (P, h512s, inter), w.dtype, "sbuf")
    ssb = Buffer(f"{name}_w_scale_sb", (P, h512s, inter), "uint8", "sbuf")
    q = iv("q", 4)
    body: list[Stmt] = [
        Alloc(wsb), DmaCopy(Ref(wsb, (span(0, P), span(0, h512s), span(0, inter))),
                            Ref(w, (span(0, P), span(scale(pid, h512s), h512s), span(0, inter)))),
        Alloc(ssb), *loop("q", Lin(4), 4, [DmaCopy(
            Ref(ssb, (span(scale(q, QUADRANT), SCALES_PER_QUADRANT), span(0, h512s), span(0, inter))),
            Ref(ws, (span(scale(q, SCALES_PER_QUADRANT), SCALES_PER_QUADRANT), span(scale(pid, h512s), h512s),
                     span(0, inter))))]), Alloc(out)]
    for b0 in range(0, tp, tile):
        bt = min(tile, tp - b0)
        psums = [Buffer(f"{name}_psum{i}", (P, MX_PACK, bt), "bfloat16", "psum") for i in range(n_i)]
        body += [Alloc(ps, accumulator=True) for ps in psums]
        kt, j = iv("kt", h512s), iv("j", MX_PACK)
        mm: list[Stmt] = []
        for i, ps in enumerate(psums):
            cols = span(add(i * TILE, scale(j, P)), P)
            mm += loop("j", Lin(MX_PACK), MX_PACK, [MatmulMx(
                Ref(ps, (span(0, P), Point(j), span(0, bt))), Ref(wsb, (span(0, P), Point(kt), cols)),
                Ref(xq, (span(0, P), Point(kt), span(b0, bt))),
                stationary_scale=Ref(ssb, (span(0, P), Point(kt), cols)),
                moving_scale=Ref(xs, (span(0, P), Point(kt), span(b0, bt))))])
        body += loop("kt", Lin(h512s), h512s, mm)
        body += [Interleave(Ref(out, (span(0, P), Point(Lin(i)), span(b0, bt), span(0, MX_PACK))),
                            Ref(ps, (span(0, P), span(0, MX_PACK), span(0, bt)))) for i, ps in enumerate(psums)]
    if lnc > 1:
        recv = Buffer(f"{name}_recv", out.shape, "bfloat16", "sbuf")
        whole = Ref(out, tuple(span(0, n) for n in out.shape))
        other = Ref(recv, whole.index)
        body += [Alloc(recv), SendRecv(other, whole), TensorTensor(whole, whole, other, ElementwiseOp.ADD)]
    return body


# ---- verification: its own inputs (the caller's layouts) and float64 reference ----

@dataclass
class MxCheck:
    """The outcome of :func:`verify_nkilib_mx`: ``rel_error`` = ``||out - ref||_F / ||ref||_F`` (None when the kernel
    failed, ``error`` then says why), the NKI rule violations, and the bound it is held to."""

    ok: bool
    rel_error: float | None
    tolerance: float
    violations: list[str]
    error: str | None = None


def mx_inputs(tokens: int, hidden: int, inter: int, fmt: str, seed: int = 0) -> tuple[dict[str, np.ndarray],
                                                                                       dict[str, np.ndarray]]:
    """``(kernel arguments by name, the real matrices)``: x bf16 (standard normal) shuffled to ``[T, 4, H/512, 128]``;
    each weight quantized offline (:func:`~..ir.mx.pack`) and its packed rows ``128 kt + p`` stored as
    ``[128, K/512, N]`` (nki-library's layout), its scales ``[16, K/512, N]``."""
    import ml_dtypes

    from ..ir.mx import pack, unpack

    rng = np.random.default_rng(seed)
    x = rng.standard_normal((tokens, hidden), dtype=np.float32).astype(ml_dtypes.bfloat16)
    element = MX_FORMATS[fmt].weights
    args: dict[str, np.ndarray] = {"x": np.ascontiguousarray(x.reshape(tokens, hidden // TILE, MX_PACK, P)
                                                             .transpose(0, 2, 1, 3))}
    real: dict[str, np.ndarray] = {"x": x.astype(np.float64)}
    for name, shape in (("w_gate", (hidden, inter)), ("w_up", (hidden, inter)), ("w_down", (inter, hidden))):
        data, scales = pack(rng.standard_normal(shape, dtype=np.float32), element)
        real[name] = unpack(data, scales)
        args[name] = np.ascontiguousarray(data.reshape(shape[0] // TILE, P, shape[1]).transpose(1, 0, 2))
        args[f"{name}_scale"] = scales
    return args, real


def mx_reference(real: dict[str, np.ndarray], fmt: str, lnc: int = 1) -> np.ndarray:
    """float64 ``q(b(b(silu(g)) * u)) Wd`` with ``g = b(q(x) Wg)``, ``u = b(q(x) Wu)``, ``q`` quantize_mx to the
    format's activation element (:func:`~..ir.mx.quantize_activation`), ``W`` the real matrices of the MX weights and
    ``b`` the bf16 rounding where the kernel holds a value in bf16 (gate and up in bf16 PSUM and SBUF,
    gate_up_projection_mx_shard_H.py:137, 148, each of ``lnc`` cores' partial sums over its part of H rounded before
    the exchange's add, :219-223; silu and the product written in place, mlp_tkg_mx.py:246-298)."""
    import ml_dtypes

    from ..ir.mx import quantize_activation

    def b(a: np.ndarray) -> np.ndarray:
        return a.astype(ml_dtypes.bfloat16).astype(np.float64)

    element = MX_FORMATS[fmt].activations
    xq = quantize_activation(real["x"], element)
    parts = np.split(np.arange(xq.shape[1]), lnc)

    def project(w: np.ndarray) -> np.ndarray:
        total = np.zeros((xq.shape[0], w.shape[1]))
        for rows in parts:
            total = b(total + b(xq[:, rows] @ w[rows]))
        return total

    gate, up = project(real["w_gate"]), project(real["w_up"])
    h = b(b(gate / (1.0 + np.exp(-gate))) * up)
    return quantize_activation(h, element) @ real["w_down"]


def mx_source(program: Program, target: Target) -> str:
    """The program as a kernel file of the nki dialect (MX statements included) for nmmc's interpreter."""
    from ..codegen.mx import MX_PRINTERS
    from ..kernel_ir.psum_banks import split_psum_banks
    from ..vocab import Dialect

    printer = MX_PRINTERS[Dialect.NKI]()
    lines = ['"""nki-library MX MLP as nmmc models it (not a user kernel)."""', "", "import numpy as np", "",
             *printer.imports, "", "", *printer.kernel(split_psum_banks(program, target.psum_bank_bytes))]
    return "\n".join(lines) + "\n"


def check_mx_model(program: Program, target: Target, args: dict[str, np.ndarray], reference: np.ndarray,
                   filename: str, source: str | None = None) -> MxCheck:
    """Run an nki-library MX kernel model's ``program`` (or a mutated ``source`` of it) in the interpreter, every
    program of ``target``'s logical core, on ``args``, against its float64 ``reference`` (relative tolerance 1e-2,
    as nmmc's MX kernels); rules checked statically."""
    from ..errors import KernelError
    from ..interpreter import run_kernel
    from ..verification import static_rules

    source = source if source is not None else mx_source(program, target)
    _, violations = static_rules(source, "nki", target.name, None)
    names = [b.name for b in program.params]
    try:
        run = run_kernel(source, filename=filename, kernel_name=program.name, args=[args[n] for n in names],
                         target=target, arg_names=names, output_names=["out"])
    except KernelError as exc:
        return MxCheck(False, None, 1e-2, [str(v) for v in violations], error=str(exc))
    rel = float(np.linalg.norm(run.outputs[0].astype(np.float64) - reference) / (np.linalg.norm(reference) or 1.0))
    return MxCheck(rel <= 1e-2 and not violations, rel, 1e-2, [str(v) for v in violations])


def verify_nkilib_mx(tokens: int, hidden: int, inter: int, target: Target, fmt: str = "mxfp8_e4m3",
                     seed: int = 0, source: str | None = None) -> MxCheck:
    """Run the MX decode kernel against :func:`mx_reference` (:func:`check_mx_model`). ``source``: a (mutated)
    kernel file instead of the model's."""
    args, real = mx_inputs(tokens, hidden, inter, fmt, seed)
    return check_mx_model(mx_tkg_program(tokens, hidden, inter, target, fmt), target, args,
                          mx_reference(real, fmt, target.lnc), f"nkilib_mx_{tokens}x{hidden}x{inter}.py", source)

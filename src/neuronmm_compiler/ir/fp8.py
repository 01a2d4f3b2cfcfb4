"""FP8 formats of the graph IR and their exact rounding (docs/quantization.md).

Three formats. Two are listed for trn1, trn2 and trn3 by the NKI language reference (``nki.language.float8_e4m3``,
"8-bit floating-point number (1S,4E,3M)"; ``nki.language.float8_e5m2``, "(1S,5E,2M)"). Their largest finite values
are AWS nki-library's (aws-neuron/nki-library@d2ad3a579498d1888aa8740af97fd325dd5f2740,
src/nkilib_src/nkilib/core/utils/kernel_helpers.py, ``get_max_positive_value_for_dtype``: float8_e4m3 240.0,
float8_e5m2 57344.0), i.e. the IEEE-style layouts with infinities, which ml_dtypes names ``float8_e4m3`` and
``float8_e5m2``. nki-library clamps to that value before every cast to FP8 (core/mlp/mlp_cte/mlp_cte_quantization.py:
``nisa.tensor_scalar(..., op0=nl.minimum, operand0=max_pos_val, op1=nl.maximum, operand1=-max_pos_val)`` into the FP8
tile), so nmmc's quantization is *saturating*: ``q = rne(clip(x / scale, -max, max))``, round to nearest even, the
quotient an fp32 division (as the Vector Engine computes it).

The third, ``float8_e4m3fn`` (OCP FP8: ``nki.language.float8_e4m3fn``, "8-bit floating-point number (1S,4E,3M),
Extended range", "no inf, NaN represented by 0bS111'1111"; ml_dtypes ``float8_e4m3fn``, largest finite 448), is an
``nc_matmul`` input from NeuronCore-v4 on only (trn3): "Starting NeuronCore-v4, float8_e4m3fn (OCP FP8) is also
supported; float8_e4m3 (legacy) and float8_e4m3fn cannot be mixed in the same matmul" (NKI ISA reference,
``nki.isa.nc_matmul``, "Data types"; aws-neuron/aws-neuron-sdk@81ce03ae, nki/api/nki/isa/__init__.py). Which
targets take which formats is :attr:`~neuronmm_compiler.targets.Target.fp8_formats` (rule NKI-MATMUL-E4M3FN);
:func:`check_on_target` refuses the others. No page documents how a conversion into it overflows (the layout has no
inf: ml_dtypes makes an overflow NaN), so it is clamped to +-448 like the others (rule NKI-FP8-SATURATE).

:func:`round_fp8` is that rounding in float64 NumPy (the reference and the emitted ``reference()`` use it); the
interpreter stores into ml_dtypes arrays, whose casts round to nearest even too (tests hold the two equal).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import TYPE_CHECKING

from ..errors import ScheduleError
from .mx import MX_ALIASES

if TYPE_CHECKING:
    import numpy as np

    from ..targets import Target

__all__ = ["E4M3FN_RULE", "E4M3_MODE_RULE", "FP8_FORMATS", "MX_DTYPES", "ROW_SCALE_FLOOR", "Fp8Format",
           "check_on_target", "is_fp8", "mx_refusal", "quantize", "round_fp8", "row_scale"]

#: The rule a format a target's nc_matmul does not take breaks (verification/rules.py).
E4M3FN_RULE = "NKI-MATMUL-E4M3FN"
#: The rule one kernel holding both E4M3 types breaks: "float8_e4m3 (legacy) and float8_e4m3fn cannot be mixed in the
#: same matmul" (same section); a compiled module selects one E4M3 conversion mode (compiler error NCC_EOCP001).
E4M3_MODE_RULE = "NKI-FP8-E4M3-MODE"
#: Where that rule is documented.
E4M3FN_SOURCE = ("NKI ISA reference, nki.isa.nc_matmul, 'Data types': \"Starting NeuronCore-v4, float8_e4m3fn (OCP "
                 "FP8) is also supported\"")

#: The least dynamic per-row scale: nki-library's floor (aws-neuron/nki-library@d2ad3a57,
#: src/nkilib_src/nkilib/core/mlp/mlp_cte/mlp_cte_quantization.py, ``_MINVAL = 1e-6``, applied with ``nl.maximum``
#: to ``absmax / max`` in ``perform_intermediate_row_quantization``), so a row of zeros quantizes to zeros, not NaN.
ROW_SCALE_FLOOR = 1e-6


@dataclass(frozen=True)
class Fp8Format:
    """One FP8 format: its canonical dtype name (the NKI one), mantissa bits, smallest normal exponent (``frexp``
    convention: a normal value is ``f * 2**e`` with ``f`` in [0.5, 1) and ``e >= min_exponent``) and largest finite
    value."""

    name: str
    mantissa_bits: int
    min_exponent: int
    max: float


#: The FP8 formats, by canonical dtype name.
FP8_FORMATS: Mapping[str, Fp8Format] = MappingProxyType({
    "float8_e4m3": Fp8Format("float8_e4m3", 3, -5, 240.0),
    "float8_e5m2": Fp8Format("float8_e5m2", 2, -13, 57344.0),
    # OCP E4M3: the same exponent bias as float8_e4m3 (smallest normal 2^-6) and the top exponent holding finite
    # values up to 1.75 * 2^8 (only S.1111.111 is NaN)
    "float8_e4m3fn": Fp8Format("float8_e4m3fn", 3, -5, 448.0),
})


#: The ``--dtype`` spellings of the microscaling (OCP MX) formats of NeuronCore-v4 (ir/mx.py): not element types of
#: the IR, but a request for MX weights, which only GEMM and MLP compilation on trn3 takes.
MX_DTYPES = tuple(MX_ALIASES)


def mx_refusal(dtype: str) -> str:
    """The one sentence a ``--dtype`` MX format (any :data:`MX_DTYPES`) is refused with where MX weights are not
    compiled (docs/mx.md, "What is not done")."""
    return (f"--dtype {dtype}: OCP MX weights (nisa.nc_matmul_mx, trn3) are compiled by nmmc tune, emit, cost and "
            "verify of --shape GEMMs and --mlp MLPs and by tune --model, and nmmc compress measures them (docs/mx.md); "
            "graph files and export do not take them yet; use fp8, fp8_e5m2 or fp8_e4m3fn here")


def is_fp8(dtype: str) -> bool:
    """True for a canonical FP8 dtype name."""
    return dtype in FP8_FORMATS


def check_on_target(dtype: str, target: Target) -> None:
    """Refuse an FP8 format ``target``'s ``nc_matmul`` does not take (:class:`ScheduleError` naming rule
    NKI-MATMUL-E4M3FN and its source)."""
    if is_fp8(dtype) and dtype not in target.fp8_formats:
        where = ", ".join(target.fp8_formats) or "no FP8 format"
        raise ScheduleError(f"{E4M3FN_RULE}: {dtype} is not an nc_matmul input on {target.name} ({target.core}: "
                            f"{where}); {E4M3FN_SOURCE}, i.e. trn3. Use --dtype fp8 (float8_e4m3) or fp8_e5m2 here")


def round_fp8(x: np.ndarray, dtype: str) -> np.ndarray:
    """``x`` (float64) rounded to nearest even into ``dtype`` after clamping to its finite range: a float64 array of
    FP8 values (subnormals included)."""
    import numpy as np

    fmt = FP8_FORMATS[dtype]
    clipped = np.clip(np.asarray(x, dtype=np.float64), -fmt.max, fmt.max)
    quantum = np.exp2(np.maximum(np.frexp(clipped)[1], fmt.min_exponent) - fmt.mantissa_bits - 1)
    return np.round(clipped / quantum) * quantum


def quantize(x: np.ndarray, scale: np.ndarray, dtype: str) -> np.ndarray:
    """The ``quantize`` op: ``round_fp8(fp32(x) / fp32(scale))``, ``scale`` [1, 1] (per tensor) or [M, 1] (per row)
    broadcast over ``x``.
    The quotient is an fp32 division, as the engines compute it (then rounded once into the format): a float64
    quotient would round differently wherever ``x / scale`` lies within an fp32 ulp of a tie of the format, which
    bf16 values over a calibrated scale hit often (about 1% of the elements of a 512 x 4096 activation)."""
    import numpy as np

    quotient = np.asarray(x, dtype=np.float32) / np.asarray(scale, dtype=np.float32)
    return round_fp8(quotient.astype(np.float64), dtype)


def row_scale(x: np.ndarray, dtype: str) -> np.ndarray:
    """The ``row_scale`` op: each row's dynamic scale ``max(fp32(max|x[i, :]|) / fp32(max), fp32(1e-6))`` [M, 1]
    (float64 holding float32 values): the absmax in float32 (exact: a max of float32 values), one fp32 division by
    the format's largest value, then the floor (:data:`ROW_SCALE_FLOOR`), as the kernel computes it on chip."""
    import numpy as np

    amax = np.max(np.abs(np.asarray(x, dtype=np.float32)), axis=1, keepdims=True)
    scale = np.maximum(amax / np.float32(FP8_FORMATS[dtype].max), np.float32(ROW_SCALE_FLOOR))
    return scale.astype(np.float64)


def row_scale_source(x: str, dtype: str) -> str:
    """:func:`row_scale` as a NumPy expression (the emitted ``reference()``)."""
    amax = f"np.max(np.abs(np.float32({x})), axis=1, keepdims=True)"
    floor = f"np.float32({ROW_SCALE_FLOOR!r})"
    return f"np.float64(np.maximum({amax} / np.float32({FP8_FORMATS[dtype].max!r}), {floor}))"


def numpy_source(x: str, scale: str, dtype: str) -> str:
    """:func:`quantize` as a NumPy expression (the emitted ``reference()``)."""
    fmt = FP8_FORMATS[dtype]
    quotient = f"np.float64(np.float32({x}) / np.float32({scale}))"
    c = f"np.clip({quotient}, {-fmt.max!r}, {fmt.max!r})"
    q = f"np.exp2(np.maximum(np.frexp({c})[1], {fmt.min_exponent}) - {fmt.mantissa_bits + 1})"
    return f"np.round({c} / {q}) * {q}"

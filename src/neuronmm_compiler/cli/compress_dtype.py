"""``nmmc compress --dtype`` and ``--act-scale``: the dtype of the MLP kernels the compressed layers are for
(docs/quantization.md; docs/compression.md, "FP8 layers" and "MX layers").

``--dtype fp8`` (``fp8_e4m3``, ``fp8_e5m2``, ``fp8_e4m3fn``: trn3's OCP format) quantizes every layer's weights
(every SVD factor) to FP8 with per-output-channel scales and calibrates static activation scales on the calibration
tokens (``--act-scale row``: per-token scales computed on chip instead, nothing calibrated); with ``--choose-ranks``
it makes FP8 a per-layer candidate next to bf16 instead (likewise one MX format, or a list ``bf16,fp8,mxfp8,mxfp4``:
:mod:`~neuronmm_compiler.compression.format_choice`). ``--dtype mxfp8_e4m3`` (``mxfp8``, ``mxfp8_e4m3fn``),
``mxfp8_e5m2`` or ``mxfp4`` (trn3's OCP MX formats, the spellings ``nmmc tune`` takes) records MX layers, measured by
``--eval`` as nmmc's MX kernels compute them (:mod:`~neuronmm_compiler.compression.mx_layers`). Other values
(``bfloat16``, ``float32``, ...) are the stored factors' dtype, as ``--factor-dtype`` says. The options are added to
the command here (``cli/__init__.py`` registers :func:`with_dtype` ``(models.compress)``) and reach the compression
as the request's ``dtype`` (the field ``--factor-dtype`` fills) and ``act_scale``.
"""

from __future__ import annotations

import functools
from typing import Any

import click

from ..errors import InputError

__all__ = ["with_dtype"]

HELP = ("dtype of the MLP kernels: fp8 (fp8_e4m3, fp8_e5m2, fp8_e4m3fn for trn3) quantizes weights (per output "
        "channel) and activations (static scales from the calibration tokens, needs --calibration) as nmmc's FP8 "
        "kernels do, and --eval measures that; with --choose-ranks each layer is chosen among dense/SVD x bf16/fp8 "
        "within --max-ppl-increase. mxfp8_e4m3 (mxfp8), mxfp8_e5m2, mxfp4: OCP MX layers (trn3), measured by --eval "
        "as nmmc's MX kernels compute them; the files hold float32 factors, not pre-quantized. With --choose-ranks "
        "a list (bf16,fp8,mxfp8,mxfp4, as tune --model --dtype takes it) is chosen among per layer; MX candidates "
        "need --target trn3 and shapes nmmc's MX kernel takes (multiples of 512). "
        "bfloat16/float32/...: the stored factors' dtype (as --factor-dtype).")
ACT_HELP = ("FP8 activation scales (with --dtype fp8): static (default; per tensor, calibrated on --calibration and "
            "stored) or row (per token, computed on chip as 'nmmc tune --dtype fp8 --act-scale row' kernels do).")


def with_dtype(command: click.Command) -> click.Command:
    """``command`` (``nmmc compress``) with ``--dtype``, passed on as its ``--factor-dtype``, and ``--act-scale``."""
    callback = command.callback
    assert callback is not None

    @functools.wraps(callback)
    def run(*args: Any, dtype: str | None, **kwargs: Any) -> Any:
        if dtype is not None:
            if kwargs["factor_dtype"] != "float32":
                raise InputError("give --dtype or --factor-dtype, not both")
            kwargs["factor_dtype"] = dtype
        return callback(*args, **kwargs)

    command.callback = run
    command.params.append(click.Option(["--dtype"], default=None, metavar="DTYPE", help=HELP))
    command.params.append(click.Option(["--act-scale"], default="static", metavar="static|row", help=ACT_HELP,
                                       type=click.Choice(["static", "row"], case_sensitive=False)))
    return command

"""``nmmc compress --dtype``: the dtype of the MLP kernels the compressed layers are for (docs/fp8.md).

``--dtype fp8`` (``fp8_e4m3``, ``fp8_e5m2``, ``fp8_e4m3fn``: trn3's OCP format) quantizes every layer's weights
(every SVD factor) to FP8 with per-output-channel scales and calibrates static activation scales on the calibration
tokens; with ``--choose-ranks`` it makes FP8 a per-layer candidate next to bf16 instead. Other values (``bfloat16``,
``float32``, ...) are the stored factors' dtype, as ``--factor-dtype`` says. The option is added to the command
here (``cli/__init__.py`` registers :func:`with_dtype` ``(models.compress)``) and reaches the compression as the
request's ``dtype``, the same field ``--factor-dtype`` fills.
"""

from __future__ import annotations

import functools
from typing import Any

import click

from ..errors import InputError
from ..ir.fp8 import MX_DTYPES, mx_refusal

__all__ = ["with_dtype"]

HELP = ("dtype of the MLP kernels: fp8 (fp8_e4m3, fp8_e5m2, fp8_e4m3fn for trn3) quantizes weights (per output "
        "channel) and activations (static scales from the calibration tokens, needs --calibration) as nmmc's FP8 "
        "kernels do, and --eval measures that; with --choose-ranks each layer is chosen among dense/SVD x bf16/fp8 "
        "within --max-ppl-increase. bfloat16/float32/...: the stored factors' dtype (as --factor-dtype).")


def with_dtype(command: click.Command) -> click.Command:
    """``command`` (``nmmc compress``) with ``--dtype``, passed on as its ``--factor-dtype``."""
    callback = command.callback
    assert callback is not None

    @functools.wraps(callback)
    def run(*args: Any, dtype: str | None, **kwargs: Any) -> Any:
        if dtype is not None:
            if dtype.lower() in MX_DTYPES:
                raise InputError(mx_refusal(dtype.lower()))
            if kwargs["factor_dtype"] != "float32":
                raise InputError("give --dtype or --factor-dtype, not both")
            kwargs["factor_dtype"] = dtype
        return callback(*args, **kwargs)

    command.callback = run
    command.params.append(click.Option(["--dtype"], default=None, metavar="DTYPE", help=HELP))
    return command

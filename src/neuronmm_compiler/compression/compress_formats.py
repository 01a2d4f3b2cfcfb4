"""What ``nmmc compress --dtype`` asks for (:mod:`.workflow` reads it first): the FP8 format, the MX format, or the
weight formats a ``--choose-ranks`` format choice takes (:mod:`.format_choice`), and what each is refused with, in
one line, before any work (docs/compression.md, "FP8 layers", "MX layers", "Choosing formats per layer")."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..checkpoints.config import read_config
from ..errors import InputError
from ..ir.mx import check_mx_on_target, mx_format
from .formats import ACT_SCALES, fp8_format

if TYPE_CHECKING:
    from .workflow import CompressRequest

__all__ = ["check_formats", "resolve_formats"]


def resolve_formats(request: CompressRequest) -> tuple[str | None, Any, tuple[str, ...] | None]:
    """The FP8 format of ``--dtype`` (or of its list), its one MX format, and the weight formats a ``--choose-ranks``
    format choice takes (:func:`.format_choice.allowed_formats`; None: no format choice), each refused in one line
    where the choice cannot take it (docs/compression.md, "Choosing formats per layer")."""
    from ..model_tuning.formats import FormatRequest
    from .format_choice import allowed_formats

    spelled = str(request.dtype)
    if "," not in spelled:
        fmt, mx = fp8_format(spelled), mx_format(spelled)
        single = fmt or (mx.name if mx else None)
        return fmt, mx, allowed_formats(single) if request.choose_ranks and single else None
    if not request.choose_ranks or request.target_speedup is not None:
        raise InputError(f"--dtype {spelled}: a list of weight formats is chosen among per layer by --choose-ranks "
                         "(without --target-speedup); give one format otherwise")
    allowed = FormatRequest.parse(spelled).weights
    fp8s = [w for w in allowed if fp8_format(w)]
    if len(fp8s) > 1:
        raise InputError(f"--dtype {spelled}: one FP8 format at a time (the FP8 layers share one calibration and "
                         f"manifest record); got {', '.join(fp8s)}")
    return (fp8s[0] if fp8s else None), None, allowed


def check_formats(request: CompressRequest, fmt: str | None, mx: Any, allowed: tuple[str, ...] | None) -> None:
    """Refuse, in one line, what the FP8 and MX outputs do not do (docs/compression.md, "FP8 layers", "MX layers")."""
    from ..errors import NmmcError
    from ..ir.mx import MX_FORMATS

    if request.act_scale not in ACT_SCALES:
        raise InputError(f"--act-scale must be one of {', '.join(ACT_SCALES)}; got {request.act_scale!r}")
    if request.act_scale != "static" and fmt is None:
        raise InputError(f"--act-scale {request.act_scale} scales FP8 activations: it needs --dtype fp8 (fp8_e4m3, "
                         "fp8_e5m2, fp8_e4m3fn)" + ("; MX activations get quantize_mx's block scales" if mx else ""))
    if mx is not None and request.target_speedup is not None:
        raise InputError(f"--dtype {mx.name} with --target-speedup is not supported: choose MX layers within the "
                         "accuracy budget with --choose-ranks (docs/compression.md, 'Choosing formats per layer')")
    chosen_mx = [w for w in allowed or () if w in MX_FORMATS]
    if chosen_mx:  # priced and built for nmmc's MX kernel: trn3's nc_matmul_mx (rule NKI-MX-TARGET)
        if request.target is None:
            raise InputError(f"--choose-ranks among {', '.join(chosen_mx)} prices MX candidates for nmmc's MX kernel "
                             "on trn3: give --target trn3")
        try:
            for w in chosen_mx:
                check_mx_on_target(MX_FORMATS[w], request.target)
        except NmmcError as err:
            raise InputError(f"--choose-ranks with MX candidates ({', '.join(chosen_mx)}): {err}") from None
    if request.tp > 1 and (mx is not None or chosen_mx):
        _check_mx_tp(request, mx.name if mx is not None else chosen_mx[0])


def _check_mx_tp(request: CompressRequest, name: str) -> None:
    """Refuse a ``--tp`` whose intermediate shards split an MX block of the down projection's contraction."""
    from ..ir.mx import MX_TILE
    from ..tensor_parallel.shard_factors import shard_spans

    intermediate = read_config(request.model_dir).intermediate_size
    split = [a for a, _ in shard_spans(intermediate, request.tp) if a % MX_TILE]
    if split:
        # nmmc's packed order puts a block's 32 positions in the 4 quarters of one 512-position tile (512 kt + 128 j +
        # 8 g + i; ir/mx.py, docs/mx.md "Packed order"), so only a shard boundary at a multiple of 512 keeps every
        # block of the down projection's contraction (the intermediate dimension, split by --tp) whole
        raise InputError(f"--dtype {name} with --tp {request.tp}: the down projection's contraction (intermediate "
                         f"{intermediate}) is split at column {split[0]}, inside a 512-position MX tile whose "
                         "32-element blocks (one E8M0 scale each, nmmc's packed order) span all of it: a rank would "
                         f"hold part of a block; use a --tp that splits {intermediate} into multiples of {MX_TILE}")

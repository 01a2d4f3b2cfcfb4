"""The formats ``nmmc tune --model`` chooses among for each token bucket: {dense, SVD} x {bf16, FP8, MX}
(docs/quantization.md "Choosing a format"; MX on trn3 only, docs/mx.md).

A :class:`FormatRequest` is what the user allows: the weight formats given to ``--dtype`` (``bf16,fp8``), in their
order; the structures follow from the model source (dense always, SVD where it has ranks). Every allowed
:class:`MlpFormat` is tuned alike and the fastest predicted one is chosen, the more exact one on a tie (dense before
SVD, bf16 before FP8 or MX). Accuracy is not judged here: ``nmmc compress --eval`` measures it, and the user lists the
formats whose accuracy they accept. The first allowed format's SVD MLP (its dense MLP for a dense source) is the
bucket's primary kernel, ``mlp_t{tokens}.py``, as without a choice.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ..errors import InputError
from ..frontends.mx import MxWeights
from ..frontends.shapes import Fp8Weights
from ..frontends.workloads import MlpWorkload, mlp_workload
from ..ir.fp8 import is_fp8
from ..ir.mx import MX_FORMATS, check_mx_on_target, mx_format
from ..ir.node import canonical_dtype
from ..targets import Target

#: Short names of the weight formats in format names and files.
_SHORT = {"bfloat16": "bf16", "float8_e4m3": "fp8", "float8_e5m2": "fp8_e5m2", "float8_e4m3fn": "fp8_e4m3fn",
          **{name: name for name in MX_FORMATS}}


@dataclass(frozen=True)
class MlpFormat:
    """One candidate: the MLP's structure (``svd``: the model's SVD factors, else the dense weights) and the weights'
    element type (``bfloat16``, an FP8 format with per-channel scales, docs/quantization.md, or an OCP MX format by its
    canonical name, ``mxfp8_e4m3``, ``mxfp8_e5m2``, ``mxfp4``: docs/mx.md); ``act_scale``: how an FP8 format's kernel
    scales the activations, ``static`` (per tensor, an argument) or ``row`` (per token, computed in the kernel: an
    ``nmmc compress --act-scale row`` output's)."""

    svd: bool
    weights: str = "bfloat16"
    act_scale: str = "static"

    @property
    def name(self) -> str:
        """``dense-bf16``, ``svd-fp8``, ``svd-fp8_e5m2``, ``svd-fp8-row`` (per-token scales), ..."""
        row = "-row" if self.act_scale != "static" and is_fp8(self.weights) else ""
        return f"{'svd' if self.svd else 'dense'}-{_SHORT[self.weights]}{row}"

    @property
    def lossiness(self) -> int:
        """How many approximations the format makes (SVD, FP8 or MX): the tie-break, fewer first."""
        return int(self.svd) + int(self.quantized)

    @property
    def quantized(self) -> bool:
        """FP8 or MX weights (and activations quantized in the kernel)."""
        return is_fp8(self.weights) or self.weights in MX_FORMATS

    def workload(self, tokens: int, hidden: int, intermediate: int,
                 ranks: tuple[int, int, int] | None) -> MlpWorkload:
        """The MLP of this format at ``tokens`` (``ranks``: the source's, for an SVD format)."""
        fp8 = Fp8Weights(self.weights, act_scale=self.act_scale) if is_fp8(self.weights) else None
        mx = MxWeights(self.weights) if self.weights in MX_FORMATS else None
        if self.svd:
            if ranks is None:
                raise InputError(f"format {self.name} needs SVD ranks (a keep ratio or an 'nmmc compress' output)")
            return mlp_workload(tokens, hidden, intermediate, ranks=ranks, fp8=fp8, mx=mx)
        return mlp_workload(tokens, hidden, intermediate, dense=True, fp8=fp8, mx=mx)

    def file(self, tokens: int, primary: MlpFormat) -> str:
        """The kernel file of this format in a ``tune --model`` directory: the primary's ``mlp_t{tokens}.py``, the
        bf16 dense MLP's ``mlp_t{tokens}_dense.py`` (as before formats were chosen), else
        ``mlp_t{tokens}_{structure}_{weights}.py``."""
        if self == primary:
            return f"mlp_t{tokens}.py"
        if self == MlpFormat(False):
            return f"mlp_t{tokens}_dense.py"
        return f"mlp_t{tokens}_{self.name.replace('-', '_')}.py"


@dataclass(frozen=True)
class FormatRequest:
    """The weight formats ``tune --model`` may choose among (``--dtype bf16,fp8,mxfp4``), first the primary one;
    ``act_scale``: the FP8 formats' activation scales (static, or row: an ``nmmc compress --act-scale row`` output's,
    which every FP8 candidate then takes)."""

    weights: tuple[str, ...] = ("bfloat16",)
    act_scale: str = "static"

    def __post_init__(self) -> None:
        if not self.weights:
            raise InputError("give at least one weight format (--dtype bf16, fp8, mxfp8, mxfp4 or a list: bf16,fp8)")
        wrong = [w for w in self.weights if w not in _SHORT]
        if wrong:
            raise InputError("tune --model chooses among bf16, FP8 (fp8, fp8_e5m2, fp8_e4m3fn on trn3) and MX weights "
                             f"(mxfp8_e4m3, mxfp8_e5m2, mxfp4: trn3); not {', '.join(wrong)}")

    @classmethod
    def parse(cls, text: str | None) -> FormatRequest:
        """``bf16,fp8,mxfp8`` -> (bfloat16, float8_e4m3, mxfp8_e4m3); duplicates dropped, order kept; None: bf16
        alone."""
        if text is None:
            return cls()
        weights: list[str] = []
        for item in str(text).split(","):
            mx = mx_format(item)
            dtype = mx.name if mx is not None else canonical_dtype(item)
            if dtype not in weights:
                weights.append(dtype)
        return cls(tuple(weights))

    def check_target(self, target: Target, dialect: str = "nki") -> None:
        """Refuse, in one line, an allowed MX format ``target`` (or ``dialect``) does not compile (rule NKI-MX-TARGET:
        trn3's nc_matmul_mx only), before anything is tuned."""
        for weights in self.weights:
            if weights in MX_FORMATS:
                check_mx_on_target(MX_FORMATS[weights], target, dialect)

    @property
    def several(self) -> bool:
        return len(self.weights) > 1

    def candidates(self, svd: bool) -> tuple[MlpFormat, ...]:
        """Every allowed format for a source with (``svd``) or without SVD ranks: per weight format, its SVD MLP
        then its dense MLP."""
        structures = (True, False) if svd else (False,)
        return tuple(MlpFormat(s, w, self.format_scale(w)) for w in self.weights for s in structures)

    def format_scale(self, weights: str) -> str:
        """The activation scales of a candidate of ``weights``: the request's for FP8, static otherwise."""
        return self.act_scale if is_fp8(weights) else "static"

    def as_dict(self) -> dict[str, Any]:
        return {"weights": list(self.weights), **({"act_scale": self.act_scale} if self.act_scale != "static" else {})}


def choose(latencies: Mapping[MlpFormat, float], order: Sequence[MlpFormat]) -> MlpFormat:
    """The fastest predicted format; on a tie the more exact one (fewer approximations), then the earlier one."""
    return min(order, key=lambda f: (latencies[f], f.lossiness, order.index(f)))


def format_lines(entry: Mapping[str, Any], indent: str) -> list[str]:
    """``tune --model``'s lines for a bucket's format choice: the front where several weight formats were allowed
    (every format's predicted latency, the chosen one marked), and the recommendation where the chosen format is
    another weight format than the primary one (the primary's own dense MLP has its line in report.py)."""
    formats = entry.get("formats") or []
    if len({f["weights"] for f in formats}) < 2:
        return []
    front = ", ".join(f"{f['name']} {f['predicted_us']:.1f} us" + (" (chosen)" if f["chosen"] else "")
                      for f in formats)
    lines = [f"{indent}formats: {front}"]
    chosen = next(f for f in formats if f["chosen"])
    if entry.get("chosen_by") == "manifest":
        lines.append(f"{indent}chosen: {chosen['name']} ({chosen['file']}), the format the compress output records for "
                     "its layers (manifest layers[i].fp8; a layer without one is bf16), whatever the latencies above")
    elif entry.get("recommended") != "nkilib" and chosen["weights"] != formats[0]["weights"]:
        lines.append(f"{indent}recommended: {chosen['name']} ({chosen['file']}): the fastest predicted of the allowed "
                     "formats (their accuracy is not judged here: nmmc compress --eval measures it)")
    return lines


def kernel_buckets(index: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    """Every bucket entry of a ``tune --model`` index that names kernel files: its buckets, or for an output of
    layer groups (``groups``, model_groups.py) each group's, whose files are under the group's directory."""
    if index.get("groups"):
        return [e for group in index["groups"] for e in group["buckets"]]
    return list(index["buckets"])


def written_files(index: Mapping[str, Any]) -> int:
    """How many kernel files a ``tune --model`` directory holds: each bucket's primary and its chosen one."""
    return sum(len({e["file"]} | {f["file"] for f in e.get("formats", []) if f["file"]}) for e in kernel_buckets(index))

"""Which NKI dialect runs where: the dialect x target x Neuron SDK support matrix, and what a dialect may emit.

Chosen from the rule book (:mod:`neuronmm_compiler.verification.rules`, the ids named below); every
range here is the documentation nmmc's rules were read in, not a promise about releases nobody read:

- ``neuronxcc`` (NKI 0.1, ``import neuronxcc.nki``): from SDK 2.26 (the NKI 0.1 documentation the rule
  book cites, ``rules.LEGACY_DOCS``, is of that release; 2.27 on trn3, whose NKI architecture guide
  came with 2.27, release-notes/components/nki.rst "NKI (0.1.0) [2.27]") up to SDK 2.29: from NKI 0.4
  (SDK 2.30) ``neuronxcc.nki`` inside a kernel is a compilation error (NKI-NEURONXCC-IMPORT), and Neuron 2.34
  removes the namespace (NKI-NEURONXCC-REMOVED): ``--dialect neuronxcc --sdk 2.34`` is refused with that reason
  (:func:`check_sdk`).
- ``nki`` (NKI 0.3+, ``import nki``): from SDK 2.29 (NKI 0.3, whose API nmmc's nki printer follows:
  ``dst=`` everywhere, nki/migration "Migrating from NKI 0.2.0 to NKI 0.3.0"; earlier releases are
  NKI-DIALECT-SDK) up to SDK 2.34 (NKI 0.8.0), the newest release the rule book was read in
  (``rules.SDK234_DOCS``); on trn2 and trn3 only. On trn1 the docs
  conflict (``nki.jit`` and the simulator accept a trn1 target; the NxD Inference 2.29 notes and the NKI
  FAQ say NKI 0.3 kernels are not supported on Trn1): conservatively unsupported (NKI-DIALECT-TRN1).

One thing nmmc emits depends on the release within the ``nki`` range: the exchange between the programs of a
logical core. NKI 0.8.0 (SDK 2.34) deprecates ``nki.isa.sendrecv`` for ``nki.lnc.sendrecv`` (no ``pipe_id``;
NKI-ISA-LNC-DEPRECATED), a module no earlier release has (NKI-LNC-MODULE): a kernel for SDK 2.34 exchanges through
``nki.lnc`` (:func:`uses_nki_lnc`), one for 2.29 to 2.33 through ``nisa.sendrecv``, so an exchanging kernel runs on
those releases only (:func:`kernel_range`).

``--dialect auto`` (the default) picks, for the target and SDK, the supported dialect, preferring ``nki``
where both are (SDK 2.29 on trn2/trn3: ``neuronxcc.nki`` is deprecated there); without ``--sdk`` it is the
dialect of the newest SDK that supports the target: ``neuronxcc`` on trn1, ``nki`` on trn2 and trn3. Without
``--sdk`` a kernel is emitted for the newest release of its dialect on its target (:func:`newest_sdk`).

What a dialect may emit also depends on the target and dtype: the ``nki`` dialect's transposing load
``nisa.dma_transpose`` is documented on NeuronCore-v3+ (trn2, trn3) for 2-byte dtypes only
(NKI-DMA-TRANSPOSE-TARGET, NKI-DMA-TRANSPOSE-DTYPE); the ``neuronxcc`` dialect's ``nl.load_transpose2d``
on every target and dtype (NKI-LOAD-TRANSPOSE2D). Where it is not documented, schedules make A^T / X^T
on the TensorEngine (``pe``) instead (:func:`dma_transpose_rule`).
"""

from __future__ import annotations

from dataclasses import dataclass

from .errors import InputError, UnknownNameError
from .vocab import Dialect

#: The Neuron SDK releases whose documentation the rule book was read against, oldest first.
KNOWN_SDKS: tuple[str, ...] = ("2.26", "2.27", "2.28", "2.29", "2.30", "2.31", "2.32", "2.33", "2.34")
#: Releases after the rule book that ``--sdk`` still recognises, only to say why nmmc refuses them (:func:`check_sdk`);
#: none since the rule book reached 2.34.
LATER_SDKS: tuple[str, ...] = ()
#: Neuron 2.34 removes ``neuronxcc.nki`` from neuronx-cc: the release and the announcement (page, title) that says so,
#: quoted by :func:`check_sdk` and cited by the rule book (NKI-NEURONXCC-REMOVED).
NEURONXCC_REMOVED_IN = "2.34"
REMOVAL_ANNOUNCEMENT = ("https://awsdocs-neuron.readthedocs-hosted.com/en/latest/about-neuron/announcements/neuron2.x/"
                        "announce-removal-neuronxcc-nki-2-34.html",
                        "Announcing the removal of the neuronxcc.nki namespace from neuronx-cc in Neuron 2.34")
#: The first release with ``nki.lnc`` (NKI 0.8.0), which deprecates the ``nki.isa`` LNC functions in its favour: rules
#: NKI-LNC-MODULE (absent before) and NKI-ISA-LNC-DEPRECATED (deprecated from), docs/nki-rules.md.
NKI_LNC_FROM = "2.34"
#: ``--dialect`` values: the dialects and ``auto``.
AUTO = "auto"
DIALECT_CHOICES: tuple[str, ...] = (AUTO, *(d.value for d in Dialect))


@dataclass(frozen=True)
class Support:
    """A dialect runs on these targets for SDK releases ``sdk_min`` to ``sdk_max`` (inclusive)."""

    dialect: Dialect
    targets: tuple[str, ...]
    sdk_min: str
    sdk_max: str
    rules: tuple[str, ...]

    def covers(self, dialect: Dialect, target: str, sdk: str | None) -> bool:
        if dialect is not self.dialect or target not in self.targets:
            return False
        return sdk is None or _version(self.sdk_min) <= _version(sdk) <= _version(self.sdk_max)

    @property
    def sdk_range(self) -> str:
        """``Neuron SDK 2.26 to 2.29``."""
        return f"Neuron SDK {self.sdk_min} to {self.sdk_max}"


SUPPORT: tuple[Support, ...] = (
    Support(Dialect.NEURONXCC, ("trn1", "trn2"), "2.26", "2.29", ("NKI-NEURONXCC-IMPORT", "NKI-BLOCK-DIM")),
    Support(Dialect.NEURONXCC, ("trn3",), "2.27", "2.29", ("NKI-NEURONXCC-IMPORT", "NKI-BLOCK-DIM")),
    Support(Dialect.NKI, ("trn2", "trn3"), "2.29", "2.34", ("NKI-DIALECT-SDK", "NKI-DIALECT-TRN1", "NKI-LNC-MODULE",
                                                            "NKI-ISA-LNC-DEPRECATED")),
)


def _version(sdk: str) -> tuple[int, ...]:
    return tuple(int(part) for part in sdk.split("."))


def check_sdk(sdk: str, dialect: Dialect | str | None = None) -> str:
    """``sdk`` when it is a release the rule book was read against and, for ``dialect`` (None: any, as ``--dialect
    auto``), one the dialect can still run on; InputError otherwise: the neuronxcc dialect from the release that removes
    ``neuronxcc.nki`` (the announcement, NKI-NEURONXCC-REMOVED), a release after the rule book (``LATER_SDKS``) with
    why, any other with the releases it was read for."""
    removed = sdk in KNOWN_SDKS + LATER_SDKS and _version(sdk) >= _version(NEURONXCC_REMOVED_IN)
    if dialect is not None and Dialect(dialect) is Dialect.NEURONXCC and removed:
        raise InputError(f"Neuron SDK {sdk}: {_removal()}; pick --sdk {newest_sdk(Dialect.NEURONXCC, 'trn1')} or "
                         "earlier, or emit the kernel in the nki dialect")
    if sdk in KNOWN_SDKS:
        return sdk
    if sdk not in LATER_SDKS:
        raise InputError(f"unknown Neuron SDK release {sdk!r}: nmmc's NKI rules were read for "
                         f"{', '.join(KNOWN_SDKS)}")
    reasons = [_removal()] if removed and dialect is None else []
    reasons.append(f"nmmc's NKI rule book stops at Neuron SDK {KNOWN_SDKS[-1]} (the nki dialect was not checked "
                   f"against {sdk})")
    raise InputError(f"Neuron SDK {sdk}: " + "; ".join(reasons) + f"; pick --sdk {KNOWN_SDKS[-1]} or earlier")


def _removal() -> str:
    return f"it removes the neuronxcc.nki namespace ('{REMOVAL_ANNOUNCEMENT[1]}', {REMOVAL_ANNOUNCEMENT[0]})"


def sdk_summary() -> str:
    """What ``--sdk`` changes besides the dialect, in words (the CLI's help texts)."""
    return (f"the nki dialect's exchange between the programs of a logical core is nki.lnc.sendrecv from "
            f"{NKI_LNC_FROM}, nisa.sendrecv before; --dialect neuronxcc on {NEURONXCC_REMOVED_IN} or later is refused "
            "with the reason (it removes neuronxcc.nki)")


def uses_nki_lnc(sdk: str) -> bool:
    """Whether a kernel of the nki dialect for Neuron SDK ``sdk`` exchanges through ``nki.lnc.sendrecv`` (2.34 and
    later, NKI-ISA-LNC-DEPRECATED) rather than ``nisa.sendrecv`` (2.29 to 2.33, NKI-LNC-MODULE)."""
    return _version(sdk) >= _version(NKI_LNC_FROM)


def support_for(dialect: Dialect, target: str) -> Support | None:
    """The support entry of a dialect on a target (None: the docs do not support it)."""
    return next((s for s in SUPPORT if dialect is s.dialect and target in s.targets), None)


def resolve_dialect(dialect: str | Dialect, target: str, sdk: str | None = None) -> Dialect:
    """The concrete dialect for ``--dialect`` (``auto`` or a dialect) on ``target`` and SDK ``sdk`` (None: any).

    ``auto`` picks as the module docstring says; a named dialect is returned as is (an unsupported pairing
    is the rule checker's to report, so an explicit choice still emits, for the simulator or older SDKs).
    InputError when ``auto`` finds no supported dialect for that SDK.
    """
    if str(dialect) != AUTO:
        checked = Dialect.lookup(dialect)
        if checked is None:
            raise UnknownNameError(f"unknown dialect {dialect!r}; accepted: {', '.join(DIALECT_CHOICES)}")
        return checked
    if sdk is not None:
        check_sdk(sdk)
    for candidate in (Dialect.NKI, Dialect.NEURONXCC):
        if any(s.covers(candidate, target, sdk) for s in SUPPORT):
            return candidate
    ranges = "; ".join(f"{s.dialect} on {s.sdk_range}" for s in SUPPORT if target in s.targets)
    removed = sdk is not None and _version(sdk) >= _version(NEURONXCC_REMOVED_IN)
    raise InputError(f"no NKI dialect is documented for {target} on Neuron SDK {sdk} ({ranges}"
                     + (f"; Neuron {sdk} {_removal()}" if removed else "") + "); pick --sdk within one of those ranges")


def newest_sdk(dialect: Dialect, target: str) -> str:
    """The default ``--sdk`` of ``nmmc emit``, ``tune`` and ``verify``: the newest release supporting the dialect on
    the target (or, where the docs support it nowhere on that target, the newest release that has the dialect at
    all)."""
    entry = support_for(dialect, target)
    return entry.sdk_max if entry is not None else newest_release(dialect)


def newest_release(dialect: Dialect) -> str:
    """The newest release that has the dialect on any target."""
    return max((s.sdk_max for s in SUPPORT if s.dialect is dialect), key=_version)


def kernel_range(dialect: Dialect, target: str, sdk: str, exchanges: bool) -> tuple[str, str] | None:
    """(first, last) Neuron SDK release a kernel of ``dialect`` emitted for ``sdk`` on ``target`` runs on, per the rule
    book: the dialect's range on the target, narrowed for a kernel whose programs exchange (``exchanges``) to the
    releases of its exchange's spelling (``nki.lnc.sendrecv``: from 2.34; ``nisa.sendrecv``: to 2.33). None where the
    docs support the dialect nowhere on that target."""
    entry = support_for(dialect, target)
    if entry is None:
        return None
    first, last = entry.sdk_min, entry.sdk_max
    if exchanges and dialect is Dialect.NKI:
        if uses_nki_lnc(sdk):
            first = max(first, NKI_LNC_FROM, key=_version)
        else:
            last = KNOWN_SDKS[KNOWN_SDKS.index(NKI_LNC_FROM) - 1]
    return first, last


def support_note(dialect: Dialect, target: str, sdk: str | None = None, exchanges: bool = False) -> str:
    """The kernel header's statement of where the file runs: the SDK range its rules were checked against (of a kernel
    emitted for ``sdk``, None: the newest, whose programs exchange or not, :func:`kernel_range`)."""
    release = sdk or newest_sdk(dialect, target)
    span = kernel_range(dialect, target, release, exchanges)
    if span is None:
        return (f"not documented for {target} (see NKI-DIALECT-TRN1 in docs/nki-rules.md); "
                f"rules checked against Neuron SDK {release}")
    first, last = span
    return f"rules checked against Neuron SDK {first}" + ("" if first == last else f" to {last}") + f" on {target}"


def support_warning(dialect: Dialect, target: str, sdk: str | None) -> str | None:
    """What is wrong with emitting ``dialect`` for ``target`` (on SDK ``sdk``; None: any), or None when the docs
    support it."""
    entry = support_for(dialect, target)
    if entry is None:
        return (f"the {dialect} dialect is not documented for {target} (NKI-DIALECT-TRN1, docs/nki-rules.md); "
                "'nmmc verify' will reject the kernel; --dialect auto picks a supported one")
    if sdk is not None and not entry.covers(dialect, target, sdk):
        return (f"the {dialect} dialect is documented for {target} on {entry.sdk_range}, not on SDK {sdk} "
                "(docs/nki-rules.md, 'Support matrix')")
    return None


def dma_transpose_rule(dialect: Dialect | str, target: str, dtype_bytes: int) -> str | None:
    """The rule the dialect's transposing DMA load would break on this target and dtype size (None: it is
    documented there)."""
    if Dialect(dialect) is Dialect.NEURONXCC:
        return None  # nl.load_transpose2d (NKI-LOAD-TRANSPOSE2D)
    if target == "trn1":
        return "NKI-DMA-TRANSPOSE-TARGET"  # nisa.dma_transpose: NeuronCore-v3 and newer
    return None if dtype_bytes == 2 else "NKI-DMA-TRANSPOSE-DTYPE"

"""The NKI rule book: the documented rules nmmc's kernels rely on, each with its source.

One data module: a single table (:data:`RULES`) whose entries each carry their citations and, where
sources conflict, a note saying which reading was chosen (always the conservative one).

Every rule was read in the cited text (the Neuron SDK documentation repository at a fixed commit, or
the NKI 0.1 documentation as it stood before its removal; for SDK 2.33 and 2.34, whose documentation that repository's
snapshot does not yet hold, the published documentation site at its v2.33.1 and v2.34.0 versions, and for later
announcements and the pages of the newest release the site's latest version); nothing here is from memory. Where a
limit is a hardware number that :mod:`neuronmm_compiler.targets` also holds, the rule names the
:class:`~neuronmm_compiler.targets.Target` field (``target_field``) and records the documented value
per target (``documented``) instead of restating it as a limit; ``tests/test_nki_rules.py`` checks
the two agree, except for the targets listed in ``targets_disagree`` (explained in the note; the
hardware table is fixed by another change, not here).

SDK ranges are Neuron SDK release numbers (``"2.30"``), inclusive; ``None`` means unbounded. A rule
whose ``checkable`` is True is enforced by :mod:`neuronmm_compiler.verification.static_check`.
``docs/nki-rules.md`` is generated from this table by ``scripts/nki_rules_doc.py``.

It is longer than the project's 400-line guideline on purpose: it is one table of data, one entry per
documented rule with its citations, and splitting it by SDK release would scatter a rule's history.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..support import KNOWN_SDKS, NEURONXCC_REMOVED_IN, NKI_LNC_FROM, REMOVAL_ANNOUNCEMENT
from ..vocab import Dialect

#: The Neuron SDK documentation (docs for NKI 0.1 to 0.6, SDK up to 2.32) these rules were read in.
SDK_DOCS = "aws-neuron/aws-neuron-sdk@81ce03ae261e12925e53437a0f690478e6366155"
#: The same repository before the NKI 0.1 pages under general/nki/ were removed (NKI 0.1 docs).
LEGACY_DOCS = "aws-neuron/aws-neuron-sdk@cca378474a507331b7c0cd4b6cbbf2bbe0956324"
#: The Neuron SDK 2.33 (NKI 0.7.0) documentation as published; the repository snapshot above ends at 2.32.
SDK233_DOCS = "https://awsdocs-neuron.readthedocs-hosted.com/en/v2.33.1"
#: The Neuron SDK 2.34 (NKI 0.8.0) documentation as published.
SDK234_DOCS = "https://awsdocs-neuron.readthedocs-hosted.com/en/v2.34.0"
#: The published documentation's newest version: announcements made after 2.33 and pages of the newest release (2.34)
#: the stored v2.34.0 copy lacks (not pinned to a release).
LATEST_DOCS = "https://awsdocs-neuron.readthedocs-hosted.com/en/latest"
#: AWS's NKI library (the kernels bundled with neuronx-cc): evidence of how the documented APIs are used.
NKILIB = "aws-neuron/nki-library@d2ad3a579498d1888aa8740af97fd325dd5f2740"
#: nmmc's own definitions (not an AWS rule): a rule of nmmc's graph semantics, cited from nmmc's documentation.
NMMC = "nmmc (not an AWS rule)"
#: The published API pages of Neuron SDK 2.29.1 and 2.32.0 (the MX scale dtype changed between them).
SDK229_DOCS = "https://awsdocs-neuron.readthedocs-hosted.com/en/v2.29.1"
SDK232_DOCS = "https://awsdocs-neuron.readthedocs-hosted.com/en/v2.32.0"
#: Every source a citation may name.
SOURCES = (SDK_DOCS, LEGACY_DOCS, SDK233_DOCS, SDK234_DOCS, LATEST_DOCS, NKILIB, NMMC, SDK229_DOCS, SDK232_DOCS)

BOTH = (Dialect.NKI, Dialect.NEURONXCC)
#: Why the capacity rules are not checked from the source.
_LIVE = ("Not checked statically: what fits depends on which allocations are live at once (loop-scoped buffers "
         "rotate); nmmc's interpreter checks capacity when the kernel runs (nmmc verify).")
ALL_TARGETS = ("trn1", "trn2", "trn3")
KIB = 1024

#: Topics, in the order the generated document lists them.
TOPICS = ("memory", "tiles", "loops", "isa", "fp8", "mx", "dialect")

#: ``op=`` values the Scalar Engine accepts in ``nisa.activation``: the table "Supported Activation
#: Functions for NKI ISA" (names under ``nki.language``). There is no ``identity``: the identity is
#: ``copy``.
ACTIVATION_FUNCTIONS = frozenset((
    "copy", "square", "sigmoid", "relu", "prelu", "gelu", "gelu_dx", "gelu_apprx_tanh", "gelu_apprx_sigmoid",
    "gelu_apprx_sigmoid_dx", "silu", "silu_dx", "tanh", "softplus", "mish", "erf", "erf_dx", "exp", "log", "sin",
    "arctan", "sqrt", "rsqrt", "reciprocal", "sign", "abs",
))

#: The NKI 0.1 table (same section of the NKI 0.1 docs): the above without prelu and gelu_apprx_sigmoid_dx.
ACTIVATION_FUNCTIONS_LEGACY = ACTIVATION_FUNCTIONS - {"prelu", "gelu_apprx_sigmoid_dx"}

#: Input dtypes ``nc_matmul`` accepts (section "Data types" of its API page); float8_e4m3fn from v4 on (the FP8
#: formats per target are ``Target.fp8_formats``, rule NKI-MATMUL-E4M3FN).
MATMUL_INPUT_DTYPES = frozenset(("float8_e4m3", "float8_e5m2", "float8_e4m3fn", "bfloat16", "float16", "tfloat32",
                                 "float32"))
#: The FP8 formats ``nc_matmul`` takes per target (same section): float8_e4m3fn "Starting NeuronCore-v4".
FP8_MATMUL_FORMATS = (("trn1", ("float8_e4m3", "float8_e5m2")), ("trn2", ("float8_e4m3", "float8_e5m2")),
                      ("trn3", ("float8_e4m3", "float8_e5m2", "float8_e4m3fn")))
#: ``nc_matmul`` result dtypes (PSUM) per target: float32 on NeuronCore-v2/v3, float32 or bfloat16 on v4.
MATMUL_DST_DTYPES = {"trn1": ("float32",), "trn2": ("float32",), "trn3": ("float32", "bfloat16")}

#: ``dma_transpose`` of a static access pattern: the DGE modes the DGE guide allows ("How .ap() Affects DGE Mode":
#: none, hwdge or compiler-selected), its source's largest last dimension (API page: ``src.shape[-1] <= 128``), and
#: the hardware-DGE row counts (2-D: ``src.shape[0] == 16``; 3-D/4-D: one of these, times ``shape[-2]`` a
#: multiple of 16).
DMA_TRANSPOSE_STATIC_MODES = ("unknown", "none", "hwdge")
DMA_TRANSPOSE_MAX_LAST = 128
HWDGE_ROWS = 16
HWDGE_ROWS_ND = (1, 2, 4, 8, 16)

#: ``nki.language`` wrappers absent from NKI 0.2 -> the ``nki.isa`` call that replaced them (migration guide).
LANG_WRAPPERS = {"load": "dma_copy", "store": "dma_copy", "copy": "tensor_copy", "matmul": "nc_matmul"}


@dataclass(frozen=True)
class Rule:
    """One documented NKI rule. ``limit`` is the value(s) the rule bounds by (None when it is not a number or
    when ``target_field`` holds it); ``documented`` maps target -> the value the docs give for ``target_field``."""

    id: str
    topic: str
    summary: str
    citations: tuple[str, ...]
    dialects: tuple[Dialect, ...] = BOTH
    targets: tuple[str, ...] = ALL_TARGETS
    sdk_min: str | None = None
    sdk_max: str | None = None
    limit: object = None
    target_field: str | None = None
    documented: tuple[tuple[str, int], ...] = ()
    targets_disagree: tuple[str, ...] = ()
    checkable: bool = False
    note: str = ""

    @property
    def citation(self) -> str:
        """The first (main) source, as violations quote it."""
        return self.citations[0]

    def applies(self, dialect: Dialect, target: str, sdk: str | None) -> bool:
        """True when the rule holds for this dialect, target and SDK (an unknown SDK: only rules without an SDK
        bound apply, since a bounded rule cannot be said to hold)."""
        if dialect not in self.dialects or target not in self.targets:
            return False
        if self.sdk_min is None and self.sdk_max is None:
            return True
        if sdk is None:
            return False
        version = sdk_tuple(sdk)
        return ((self.sdk_min is None or version >= sdk_tuple(self.sdk_min))
                and (self.sdk_max is None or version <= sdk_tuple(self.sdk_max)))


def sdk_tuple(version: str) -> tuple[int, ...]:
    """``"2.30"`` -> ``(2, 30)``, for comparing SDK releases."""
    return tuple(int(part) for part in version.split("."))


def _sdk(path: str, where: str) -> str:
    return f"{SDK_DOCS}:{path} ({where})"


def _legacy(path: str, where: str) -> str:
    return f"{LEGACY_DOCS}:{path} ({where})"


def _nkilib(path: str, where: str) -> str:
    return f"{NKILIB}:{path} ({where})"


def _v233(page: str, where: str) -> str:
    return f"{SDK233_DOCS}/{page} ({where})"


def _v234(page: str, where: str) -> str:
    return f"{SDK234_DOCS}/{page} ({where})"


def _latest(page: str, where: str) -> str:
    return f"{LATEST_DOCS}/{page} ({where})"


def _sdk229(page: str, where: str) -> str:
    return f"{SDK229_DOCS}/{page} ({where})"


def _sdk232(page: str, where: str) -> str:
    return f"{SDK232_DOCS}/{page} ({where})"


_TILING = "nki/get-started/about/tiling-overview.rst"
_ISA = "nki/api/nki/isa/__init__.py"
_LANG = "nki/api/nki/language/__init__.py"
_MIGRATION = "nki/migration/index.rst"
_RELNOTES = "release-notes/components/nki.rst"
_ARCH1 = "nki/guides/architecture/trainium_inferentia2_arch.rst"
_ARCH2 = "nki/guides/architecture/trainium2_arch.rst"
_ARCH3 = "nki/guides/architecture/trainium3_arch.rst"
_MXFP = "nki/deep-dives/mxfp-matmul.rst"
#: The MX formats per target (Target.mx_formats): nc_matmul_mx is NeuronCore-v4's (docs/mx.md)
MX_TARGET_FORMATS = (("trn1", ()), ("trn2", ()), ("trn3", ("mxfp8_e4m3", "mxfp8_e5m2", "mxfp4")))
_LEGACY_PM = "general/nki/programming_model.rst"
_LEGACY_LANG = "general/nki/api/nki/language/__init__.py"
_MIGRATION_233 = "nki/migration/index.html"
_NKI_07 = "Migrating from NKI 0.6.0 to NKI 0.7.0"
#: The announcement of neuronxcc.nki's removal (support.py holds it: nmmc quotes it when refusing --sdk 2.34).
_REMOVAL_234 = f"{REMOVAL_ANNOUNCEMENT[0]} ({REMOVAL_ANNOUNCEMENT[1]}, posted November 30, 2026)"
_RELNOTES_234 = "release-notes/components/nki.html"
_NKI_08 = "Neuron Kernel Interface (NKI) [0.8.0] (Neuron 2.34.0 Release), date of release 11/30/2026"
#: NKI 0.8.0's deprecations: the announcement (latest site; its v2.34.0 tag page carries the same post).
_EOS_08 = "about-neuron/announcements/neuron2.x/announce-intent-eos-nki-virtualregister-lnc-apis.html"
_EOS_08_TITLE = ("Announcing end of support for NKI VirtualRegister APIs and nki.isa LNC functions in a future "
                 "release, posted November 17, 2026")
_EOS_08_TAG = "about-neuron/announcements/index/tag/announce-intent-eos-nki-virtualregister-lnc-apis.html"
_MIGRATION_234 = ("_sources/nki/migration/index.rst", "NKI version to Neuron SDK mapping: 0.8.0 2.34.0, migration "
                  "section 'Migrating from NKI 0.7.0 to NKI 0.8.0'")
#: The last release before nki.lnc.
_BEFORE_LNC = KNOWN_SDKS[KNOWN_SDKS.index(NKI_LNC_FROM) - 1]
#: What nmmc's 2.34 kernels call, and the deprecated calls they no longer make.
ISA_LNC_FUNCTIONS = frozenset(("sendrecv", "sendrecv_compute", "core_barrier"))
#: The VirtualRegister API NKI 0.8.0 deprecates for nki.isa.scalar_load / scalar_store and NkiScalar.
VIRTUAL_REGISTER_API = frozenset(("register_alloc", "register_move", "register_load", "register_store",
                                  "VirtualRegister"))

RULES: tuple[Rule, ...] = (
    # --- memory ---------------------------------------------------------------------------------
    Rule("NKI-SBUF-SIZE", "memory", "SBUF bytes per partition (128 partitions)",
         (_sdk(_ARCH1, "NeuronCore-v2 Compute Engines: 24MiB SBUF, 192KiB per partition"),
          _sdk(_ARCH2, "NeuronCore-v3 Compute Engine Updates: 28MiB, 128 partitions of 224KiB"),
          _sdk(_ARCH3, "NeuronCore-v4 Compute Engine Updates: 32 MiB")),
         target_field="sbuf_bytes_per_partition",
         documented=(("trn1", 192 * KIB), ("trn2", 224 * KIB), ("trn3", 256 * KIB)),
         note="trn3: the guide gives 32 MiB in total; 256 KiB per partition is 32 MiB / 128 partitions. " + _LIVE),
    Rule("NKI-PSUM-SIZE", "memory", "PSUM bytes per partition (2 MiB over 128 partitions)",
         (_sdk(_ARCH1, "NeuronCore-v2 Compute Engines: one PSUM partition has 16KiB"),
          _sdk(_MIGRATION, "Improved allocation API: PSUM on NeuronCore v2/v3/v4, 16KB per partition")),
         target_field="psum_bytes_per_partition",
         documented=(("trn1", 16 * KIB), ("trn2", 16 * KIB), ("trn3", 16 * KIB)), note=_LIVE),
    Rule("NKI-PSUM-BANK-COUNT", "memory", "PSUM banks per partition; at most this many matmul accumulation "
         "groups are live at once",
         (_sdk(_ARCH1, "Near-memory accumulation in PSUM: 8 PSUM banks per partition"),
          _sdk("nki/api/nki.language.tile_size.rst", "psum_num_banks")),
         target_field="psum_banks", documented=(("trn1", 8), ("trn2", 8), ("trn3", 8)),
         note="tile_size.psum_num_banks is 7 when NKI_DMA_TRANSPOSE_AS_PE_TRANSPOSE=true on trn2+ (bank 7 "
              "reserved for nc_transpose); nmmc does not set it, so 8. " + _LIVE),
    Rule("NKI-PSUM-BANK", "memory", "PSUM bank size per partition: 2 KiB = 512 float32",
         (_sdk(_ARCH1, "Near-memory accumulation in PSUM: each bank holds up to 512 FP32 values"),
          _sdk(_MIGRATION, "Improved allocation API: each bank holding up to 2KB")),
         target_field="psum_bank_bytes", documented=(("trn1", 2 * KIB), ("trn2", 2 * KIB), ("trn3", 2 * KIB)),
         note="A size, not a constraint of its own: a PSUM tile is checked against it by NKI-PSUM-TILE-FMAX and a "
              "PSUM address by NKI-PSUM-ALIGN."),
    Rule("NKI-PSUM-ALIGN", "memory", "a PSUM allocation starts at the beginning of a bank: the free offset of "
         "nl.ndarray(..., address=(partition, offset)) is a multiple of the 2 KiB bank",
         (_sdk(_MIGRATION, "Improved allocation API"), _sdk(_LANG, "ndarray: address (partition_offset, "
                                                                  "free_offset)")),
         dialects=(Dialect.NKI,), checkable=True,
         note="Only explicit address= allocations can break it; nmmc emits none. The offset is in bytes (the guide "
              "puts bank 3 at 3 * 2048). The address= form is NKI 0.2+; NKI 0.1 allocates through allocator "
              "functions (nki_direct_allocation_guide), so the rule is checked in the nki dialect."),
    # --- tiles ----------------------------------------------------------------------------------
    Rule("NKI-PARTITION-MAX", "tiles", "partition dimension (dim 0) of an SBUF or PSUM tile <= pmax",
         (_sdk(_TILING, "Tile size considerations, Tile-Size Constraint#1"),
          _legacy(_LEGACY_PM, "Tile size considerations, TC#1")),
         target_field="pmax", documented=(("trn1", 128), ("trn2", 128), ("trn3", 128)), checkable=True),
    Rule("NKI-PSUM-TILE-FMAX", "tiles", "a PSUM tile's free size fits one bank (2 KiB per partition); "
         "NKI 0.1 kernels may put block dimensions before nl.par_dim to hold several banks",
         (_sdk(_TILING, "Tile size considerations, Tile-Size Constraint#2: psum_bank_fmax == 512"),
          _legacy(_LEGACY_PM, "Tile size considerations, TC#2: psum_fmax == 512"),
          _legacy(_LEGACY_PM, "Representing data in NKI: par_dim"),
          _sdk(_MIGRATION, "Removing block dimensions from NKI kernels: What are block dimensions?")),
         limit=2 * KIB, checkable=True,
         note="Checked in bytes (psum_bank_fmax_bytes): 512 float32 or 1024 bfloat16. nc_matmul on NeuronCore-v4 "
              "may write a moving free size up to 8 banks, which conflicts with Tile-Size Constraint#2; "
              "conservatively one bank on every target."),
    Rule("NKI-BLOCK-DIM", "tiles", "block dimensions (dims before nl.par_dim) are an error from SDK 2.25",
         (_sdk("about-neuron/announcements/neuron2.x/announce-eos-block-dimension-nki.rst",
               "Announcing end of support for NKI block dimension"),
          _sdk(_MIGRATION, "Removing block dimensions from NKI kernels"),
          _sdk(_MIGRATION, "NKI Migration Guides, note under the version table: block dimension support was removed")),
         dialects=(Dialect.NEURONXCC,), sdk_min="2.25", checkable=True,
         note="The announcement says warnings in 2.24 and errors from 2.25; the release notes (NKI (Beta) [2.23]) only "
              "record the warning. Conservatively an error from 2.25: a PSUM accumulator wider than a bank is "
              "split into separate one-bank tiles (a Python list), not a block dimension. Conflict: the NKI 0.1 "
              "matrix multiplication tutorial of the SDK 2.26 docs (" + _legacy("general/nki/tutorials/"
              "matrix_multiplication.rst", "Optimization 1-3") + ") still lays its tiles out with block "
              "dimensions; tests/test_nki_tutorials.py writes those kernels in the migration guide's layout."),
    Rule("NKI-MATMUL-STATIONARY-FMAX", "tiles", "nc_matmul stationary free size <= 128 (partition size equal "
         "to moving's, <= 128)",
         (_sdk(_ISA, "nc_matmul, Tile size"), _sdk(_TILING, "Tile size considerations, TileSize Constraint#3")),
         target_field="gemm_stationary_fmax", documented=(("trn1", 128), ("trn2", 128), ("trn3", 128)),
         checkable=True),
    Rule("NKI-MATMUL-MOVING-FMAX", "tiles", "nc_matmul moving free size: 512 on NeuronCore-v2/v3; on v4 up to "
         "4096 (float32 dst) or 8192 (bfloat16 dst)",
         (_sdk(_ISA, "nc_matmul, Tile size"), _sdk(_TILING, "Tile size considerations, TileSize Constraint#3")),
         target_field="gemm_moving_fmax", documented=(("trn1", 512), ("trn2", 512), ("trn3", 4096)),
         targets_disagree=("trn3",), checkable=True,
         note="Discrepancy: targets.py has gemm_moving_fmax = 512 on trn3, where the nc_matmul page allows 4096 "
              "(float32 dst). 512 is still valid (the tiling overview's constraint #3 and the PSUM tile rule say "
              "512), so it is the conservative value; left for the hardware-table owner. The checker bounds by the "
              "targets.py value."),
    Rule("NKI-MATMUL-TILE", "tiles", "nc_matmul PE tiling: tile_position (start_row, start_column) and tile_size "
         "(row_size, column_size) are both given or neither; each size is a documented tile size (2 x 64 from "
         "NeuronCore-v2, 4 x 32 from v3, or the whole 128); each start is a multiple of its size, the tile inside the "
         "128 x 128 array; the stationary's partitions fit row_size and its free size column_size; column tiles are "
         "not combined with perf_mode double_row",
         (_sdk(_ISA, "nc_matmul, Tiling mode"), _sdk(_ISA, "nc_matmul, Tile size"),
          _sdk(_ISA, "nc_matmul, Performance mode: double_row cannot be combined with column tiling mode"),
          _sdk(_ARCH2, "Double FP8 Matmul Performance: cannot be combined with column tiling mode"),
          _legacy("general/nki/api/nki/isa/__init__.py", "nc_matmul: PE tiling, requirements 1-5"),
          _sdk("nki/test/test_nki_isa_nc_matmul.py", "example 3: tile_position=((i % 2) * 64, (j % 2) * 64), "
               "tile_size=(64, 64)"),
          _nkilib("src/nkilib_src/nkilib/core/mlp/mlp_tkg/mlp_tkg_gate_up_projection.py", "column-tiled nc_matmul")),
         target_field="pe_tile_sizes",
         documented=(("trn1", (64, 128)), ("trn2", (32, 64, 128)), ("trn3", (32, 64, 128))), checkable=True,
         note="Conflict: the :param lines of the nc_matmul page (SDK 2.27 to 2.32) say start_column must be 0 and "
              "column_size 128, the wording of nc_matmul_mx, which has row tiling only; the page's own Tiling mode "
              "section describes column tiling, its double_row paragraph excludes it (so it exists), the SDK's "
              "example runs 64 x 64 tiles at column 64, and AWS's decode MLP packs tokens into 32- and 64-column "
              "tiles. The Tiling mode section is followed. The NKI 0.1 page asks for multiples of 32 and forbids 32 "
              "for both sizes on NeuronCore-v2; the newer text's narrower sizes (64 or 128 on v2) are used on every "
              "SDK. 'must not exceed 128' of a start is read as the tile lying inside the array (start + size <= "
              "128). Checked statically where the values are constants; nmmc's interpreter checks every call."),
    Rule("NKI-MATMUL-TILE-DST", "tiles", "a matmul in a PE column tile writes the PSUM partitions of its columns: "
         "dst starts at partition tile_position[1] (the start column), an allowed start partition for its size",
         (_nkilib("src/nkilib_src/nkilib/core/mlp/mlp_tkg/mlp_tkg_gate_up_projection.py",
                  "dst=result_psums[...][nl.ds(column_tiling_dim * column_idx, T), ...] with tile_position=(0, "
                  "column_tiling_dim * column_idx)"),
          _nkilib("src/nkilib_src/nkilib/core/router_topk/router_topk.py", "dst partition = tile_position column"),
          _sdk(_ARCH1, "Accessing SBUF/PSUM tensors using compute engines: start_partition 0/32/64/96 for up to 32 "
                       "partitions, 0/64 for up to 64"),
          _sdk(_ISA, "nc_matmul: the free dimension of stationary matches the partition dimension of dst")),
         dialects=(Dialect.NKI,), checkable=True,
         note="Inferred, not stated: the API page says a PE column computes one element of the stationary's free "
              "dimension, which is dst's partition dimension, but not that a column tile's results land on the "
              "partitions of its columns. Every column-tiled nc_matmul of AWS's NKI library places dst there, so "
              "nmmc does too and (conservatively) flags a kernel that does not. Checked in the nki dialect (dst= "
              "names the tile); in NKI 0.1 the call returns a new tile the compiler places. Checked statically "
              "where the values are constants; nmmc's interpreter checks every call."),
    # --- loops ----------------------------------------------------------------------------------
    Rule("NKI-AFFINE-WRITE-RACE", "loops", "inside nl.affine_range, a write to a buffer allocated outside the loop "
         "must be indexed by the loop variable; the one exception is += accumulation of matmul results into PSUM",
         (_legacy(_LEGACY_LANG, "affine_range: no loop carried dependency; associative reductions"),
          _legacy(_LEGACY_PM, "affine_range paragraph: accumulating matmul results with +=")),
         dialects=(Dialect.NEURONXCC,), checkable=True,
         note="Current NKI makes affine_range a deprecated alias of range (" + _LANG + ", affine_range): loops "
              "run in program order, so the rule is checked in the NKI 0.1 dialect only."),
    Rule("NKI-LIST-INDEX-STATIC", "loops", "NKI 0.1: a Python list of tiles is indexed only by integers known at "
         "trace time: constants and nl.static_range variables, not nl.affine_range / nl.sequential_range (or range) "
         "variables",
         (_legacy(_LEGACY_LANG, "static_range: the loop is fully unrolled during NKI kernel tracing; affine_range, "
                                "sequential_range: not unrolled until the compiler backend; range is replaced with "
                                "sequential_range"),
          _sdk(_MIGRATION, "Removing block dimensions from NKI kernels: Use a Python-like list")),
         dialects=(Dialect.NEURONXCC,), checkable=True,
         note="Inferred from the loop iterators' pages: a loop not unrolled at trace time gives its body a symbolic "
              "index, which a Python list cannot take. nmmc prints a loop whose variable picks a list entry as "
              "nl.static_range (kernel_ir/psum_banks.py). Current NKI runs every loop as a Python range "
              "(NKI-RANGE-ALIAS): a list takes any loop variable there."),
    Rule("NKI-RANGE-ALIAS", "loops", "current NKI: affine_range, sequential_range and static_range are deprecated "
         "aliases of Python range (fully unrolled)",
         (_sdk(_LANG, "affine_range, sequential_range, static_range"),),
         dialects=(Dialect.NKI,),
         note="Read in the SDK 2.32 (NKI 0.6) API pages; the release that first made them aliases was not checked. "
              "Not checked: it permits, it forbids nothing (a kernel relying on affine_range parallelism is still "
              "correct when run in order)."),
    Rule("NKI-DYNAMIC-LOOP", "loops", "nl.dynamic_range loops and bare `while reg:` loops are removed in NKI 0.7 "
         "(SDK 2.33; deprecated in NKI 0.6, SDK 2.32): runtime-bounded loops are nl.fori_loop / nl.while_loop",
         (_v233(_MIGRATION_233, _NKI_07 + ": removes the dynamic loop constructs deprecated in NKI 0.6.0"),
          _sdk(_MIGRATION, "Migrating from NKI 0.5.0 to NKI 0.6.0: Deprecated: dynamic nl.dynamic_range and while "
                           "loops"),
          _latest("about-neuron/announcements/neuron2.x/announce-nki-specialization-change.html",
                  "Announcing changes to NKI specialization, posted October 16, 2026")),
         dialects=(Dialect.NKI,), sdk_min="2.33", checkable=True,
         note="Checked: a call of nl.dynamic_range. A while loop on a register is not (whether its condition is a "
              "register is not known from the source); nmmc emits neither, only Python range loops with constant "
              "bounds. NKI 0.8.0 (SDK 2.34) adds dynamic control flow, nl.if_else and nl.while_loop on a condition "
              "the kernel computes on the device (" + _v234(_RELNOTES_234, _NKI_08) + "): it permits, and nmmc "
              "emits neither."),
    Rule("NKI-PYTHON-TRACING", "loops", "NKI 0.7 (SDK 2.33) specializes a kernel by running it as Python: each NKI "
         "call records one operation, and the meta-program (range loops, Python variables, classes) follows "
         "standard Python semantics",
         (_v233("release-notes/components/nki.html", "Neuron Kernel Interface (NKI) [0.7.0] (Neuron 2.33.0 Release), "
                "New Features: Specialization by Python tracing"),
          _v233(_MIGRATION_233, _NKI_07 + ": Updated Kernel Specialization"),
          _latest("about-neuron/announcements/neuron2.x/announce-nki-specialization-change.html",
                  "Announcing changes to NKI specialization, posted October 16, 2026"),
          _v234(_RELNOTES_234, _NKI_08 + ": the custom NKI language is removed, so all kernels are specialized by "
                "Python tracing; NKI allocation and scheduling are experimental and off by default, and a kernel that "
                "does not turn them on compiles as in NKI 0.7.0")),
         dialects=(Dialect.NKI,), sdk_min="2.33",
         note="Not checked: it permits, it forbids nothing. It is the model nmmc's interpreter already runs kernels "
              "by (eagerly, in program order). The previous specialization (NKI_COMPILER_FRONTEND=custom) is "
              "deprecated in 2.33 and removed in 2.34 (NKI 0.8.0 release notes); nmmc sets neither. == on "
              "user-defined classes may behave differently; nmmc's kernels define no classes. nmmc's kernels pass "
              "@nki.jit no compile_config, so on 2.34 they compile as in NKI 0.7.0 (no NKI allocation or "
              "scheduling)."),
    # --- isa ------------------------------------------------------------------------------------
    Rule("NKI-MATMUL-MEMORY", "isa", "nc_matmul reads stationary and moving from SBUF and writes dst in PSUM",
         (_sdk(_ISA, "nc_matmul, Memory types"),), checkable=True),
    Rule("NKI-MATMUL-DTYPE", "isa", "nc_matmul inputs float8_e4m3/float8_e5m2/bfloat16/float16/tfloat32/float32, and "
         "float8_e4m3fn from v4 on (NKI-MATMUL-E4M3FN) (float32 pairs only with float32); dst float32 on "
         "NeuronCore-v2/v3, float32 or bfloat16 on v4",
         (_sdk(_ISA, "nc_matmul, Data types"),), limit=MATMUL_DST_DTYPES, checkable=True),
    Rule("NKI-MATMUL-ACC-INIT", "isa", "NeuronCore-v2/v3: a matmul must not accumulate into PSUM initialised by a "
         "non-matmul instruction (memset, tensor_copy): undefined on hardware",
         (_sdk(_ISA, "nc_matmul, Accumulation mode, note"),),
         dialects=(Dialect.NKI,), targets=("trn1", "trn2"), checkable=True,
         note="The NKI 0.1 docs themselves accumulate with += into nl.zeros(..., buffer=nl.psum) (affine_range "
              "example 2), so the rule is checked in the nki dialect only."),
    Rule("NKI-TRANSPOSE-DTYPE", "isa", "nc_transpose: dst dtype equals data dtype; TensorE reads SBUF, writes PSUM",
         (_sdk(_ISA, "nc_transpose, Data types"),), dialects=(Dialect.NKI,), checkable=True),
    Rule("NKI-TENSOR-COPY", "isa", "tensor_copy: src in SBUF or PSUM (not HBM); casts through float32 when dtypes "
         "differ; NeuronCore-v2 does not run it on the Scalar Engine",
         (_sdk(_ISA, "tensor_copy"),), dialects=(Dialect.NKI,), checkable=True),
    Rule("NKI-MEMSET", "isa", "memset accepts every NKI dtype",
         (_sdk(_ISA, "memset"),), dialects=(Dialect.NKI,),
         note="Not checked: it permits every dtype, so no source can violate it."),
    Rule("NKI-TENSOR-TENSOR-PSUM", "isa", "tensor_tensor: data1 and data2 not both in PSUM; math in float32",
         (_sdk(_ISA, "tensor_tensor"),), dialects=(Dialect.NKI,), checkable=True),
    Rule("NKI-ACTIVATION-OP", "isa", "activation functions are the documented table's names (identity is nl.copy; "
         "there is no nl.identity)",
         (_sdk("nki/api/nki.api.shared.rst", "Supported Activation Functions for NKI ISA"),
          _legacy("general/nki/api/nki.api.shared.rst", "Supported Activation Functions for NKI ISA"),
          _sdk(_LANG, "module functions: no identity")),
         limit=ACTIVATION_FUNCTIONS, checkable=True,
         note="The NKI 0.1 table lacks prelu and gelu_apprx_sigmoid_dx; the neuronxcc dialect is checked against it."),
    Rule("NKI-ACTIVATION-DTYPE", "isa", "activation: data and dst any dtype in SBUF or PSUM (not HBM), math in "
         "float32, scale float32, partition size <= 128",
         (_sdk(_ISA, "activation, Data types"), _sdk(_ISA, "activation, Memory types")),
         dialects=(Dialect.NKI,), checkable=True,
         note="Checked: data or dst resolved to an HBM tensor. Any dtype is allowed, the float32 math and scale are "
              "the engine's, and the partition size is NKI-PARTITION-MAX's. The NKI 0.1 page returns a new tile and "
              "states no memory type for data, so the check is in the nki dialect."),
    Rule("NKI-BN-STATS-FMAX", "tiles", "bn_stats reads at most bn_stats_fmax (512) elements per partition; longer "
         "rows take one bn_stats per chunk, aggregated by one bn_aggr",
         (_latest("general/nki/api/generated/nki.isa.bn_stats.html", "nl.tile_size.bn_stats_fmax"),
          _latest("nki/api/generated/nki.isa.bn_stats.html", "bn_stats")),
         target_field="bn_stats_fmax", documented=(("trn1", 512), ("trn2", 512), ("trn3", 512)),
         note="Not checked statically; nmmc's interpreter refuses a longer bn_stats (nmmc verify), and the layernorm "
              "prologue cuts rows into chunks of Target.bn_stats_fmax."),
    Rule("NKI-BN-AGGR", "isa", "bn_stats writes six values per partition (count, mean, variance * count of the even "
         "and of the odd elements); bn_aggr reads a multiple of three per partition and writes mean then variance; "
         "both compute in float32 on the Vector Engine",
         (_latest("nki/api/generated/nki.isa.bn_stats.html", "bn_stats"),
          _latest("nki/api/generated/nki.isa.bn_aggr.html", "bn_aggr")),
         dialects=(Dialect.NKI,),
         note="Not checked statically; the interpreter checks the shapes of dst and data."),
    Rule("NKI-ACTIVATION-REDUCE", "isa", "activation_reduce reduces the activated data along the free axis into "
         "reduce_res, one element per partition of data; reduce_op must be nl.add (the Scalar Engine reduction "
         "registers only sum)",
         (_latest("nki/api/generated/nki.isa.activation_reduce.html", "activation_reduce"),
          _latest("nki/api/generated/nki.isa.activation.html", "activation, reduce_op")),
         dialects=(Dialect.NKI,),
         note="Not checked statically; the interpreter refuses another reduce_op or a reduce_res of another shape."),
    Rule("NKI-TENSOR-SCALAR-REDUCE", "isa", "tensor_scalar_reduce applies one arithmetic op0 to data (a unary one, "
         "such as nl.abs, with operand0 None or 0) and reduces the result along all free axes with reduce_op (add, "
         "multiply, max, min) into reduce_res, one element per partition of data, on the Vector Engine; dst receives "
         "the op0 result",
         (_sdk(_ISA, "tensor_scalar_reduce"), _sdk(_ISA, "tensor_scalar: operand0 None or 0 for a unary op0"),
          _sdk("nki/api/nki.api.shared.rst", "Supported Math Operators for NKI ISA: Absolute nl.abs, arithmetic "
               "unary; Max nl.maximum, a legal reduction op"),
          _nkilib("src/nkilib_src/nkilib/core/mlp/mlp_cte/mlp_cte_quantization.py",
                  "perform_intermediate_row_quantization: op0=nl.abs, operand0=0.0, reduce_op=nl.maximum"),
          _nkilib("src/nkilib_src/nkilib/core/rmsnorm/rmsnorm_quant.py", "_row_quantize_tile: the same call")),
         dialects=(Dialect.NKI,),
         note="The page lists the reduce ops as nl.add, nl.multiply, nl.max, nl.min; the operator table names the "
              "elementwise maximum nl.maximum as a legal reduction op, and nki-library passes reduce_op=nl.maximum, "
              "which nmmc emits. Not checked statically; the interpreter refuses another op0 or reduce_op than the "
              "absolute maximum nmmc emits (per-token FP8 scales, lowerings/row_scales.py), or a reduce_res of "
              "another shape."),
    Rule("NKI-TENSOR-REDUCE", "isa", "tensor_reduce reduces free axes only, the last contiguous ones ending at the "
         "final dimension (axis 0, the partitions, cannot be reduced), on the Vector Engine in float32; a partition "
         "reduction is an nc_transpose then a tensor_reduce",
         (_sdk(_ISA, "tensor_reduce, Layout"),
          _nkilib("src/nkilib_src/nkilib/core/max/cascaded_max.py", "tensor_reduce(op=nl.maximum, ..., axis=1) into "
                  "a [P, 1] dst")),
         dialects=(Dialect.NKI,),
         note="Not checked statically; the interpreter refuses another axis than the free axis of a 2-D tile or a "
              "dst other than [P, 1]. nmmc reduces across partitions as the page says: TensorE transposes of the "
              "strip, then the reduction along the free axis (lowerings/row_scales.py)."),
    Rule("NKI-PER-PARTITION-OPERAND", "isa", "activation's scale and bias, and tensor_scalar's operand0/operand1, are "
         "compile-time scalars or vectors of shape (data.shape[0], 1) broadcast along the free axis; tensor_scalar's "
         "op1/operand1 are None when unused",
         (_latest("nki/api/generated/nki.isa.tensor_scalar.html", "tensor_scalar"),
          _latest("general/nki/api/generated/nki.isa.activation_reduce.html", "activation: scale/bias vectors")),
         dialects=(Dialect.NKI,),
         note="Not checked statically; the interpreter checks the operand shapes. The norm prologue passes gamma "
              "and beta this way on the transposes' eviction, where the features are on partitions."),
    Rule("NKI-MATMUL-DOUBLE-ROW", "fp8", "nc_matmul perf_mode=nisa.matmul_perf_mode.double_row (\"Double FP8 mode, "
         "2x matmul throughput by packing two FP8 weight/ifmap element pairs\") only on NeuronCore-v3/v4 (trn2, "
         "trn3; \"On NeuronCore-v2, performance mode is not supported\") and with FP8 stationary and moving operands",
         (_latest("nki/api/generated/nki.isa.matmul_perf_mode.html", "double_row"),
          _latest("nki/api/generated/nki.isa.nc_matmul.html", "Performance mode"),
          _sdk(_ARCH2, "Double FP8 Matmul Performance"),
          _nkilib("src/nkilib_src/nkilib/core/mlp/mlp_cte/mlp_cte_projection.py",
                  "perf_mode=('double_row' if perform_doublerow_matmul else 'none') on FP8 tiles")),
         dialects=(Dialect.NKI,), target_field="matmul_perf_modes",
         documented=(("trn1", ("none",)), ("trn2", ("none", "double_row")), ("trn3", ("none", "double_row"))),
         note="Not checked statically; nmmc's interpreter checks every call (target, operand dtypes) and the column "
              "tiling exclusion under NKI-MATMUL-TILE. The docs do not say whether a double_row matmul with bf16 "
              "operands is an error or a no-op; nmmc refuses it."),
    Rule("NKI-MATMUL-E4M3FN", "fp8", "nc_matmul takes float8_e4m3fn (OCP FP8) operands from NeuronCore-v4 on (trn3) "
         "only; float8_e4m3 and float8_e5m2 on every target",
         (_sdk(_ISA, "nc_matmul, Data types: \"Starting NeuronCore-v4, float8_e4m3fn (OCP FP8) is also supported\""),
          _sdk(_LANG, "float8_e4m3fn: (1S,4E,3M), Extended range: no inf, NaN represented by 0bS111'1111")),
         dialects=(Dialect.NKI,), target_field="fp8_formats", documented=FP8_MATMUL_FORMATS, checkable=True,
         note="Checked statically (an nc_matmul operand declared float8_e4m3fn on trn1/trn2) and by the interpreter on "
              "every nc_matmul; nmmc refuses --dtype fp8_e4m3fn on those targets before lowering. The docs give no "
              "separate rule for double_row: it takes float8_e4m3fn \"on NeuronCore-v4\" too (same section)."),
    Rule("NKI-FP8-E4M3-MODE", "fp8", "one kernel uses one FP8 E4M3 type: float8_e4m3 (legacy) and float8_e4m3fn (OCP) "
         "never appear together, neither in one nc_matmul nor in one compiled module",
         (_sdk(_ISA, "nc_matmul, Data types: \"float8_e4m3 (legacy) and float8_e4m3fn cannot be mixed in the same "
                     "matmul\""),
          _latest("compiler/error-codes/EOCP001.html", "NCC_EOCP001: each compiled module selects a single FP8 E4M3 "
                  "conversion mode; a module cannot use both formats")),
         dialects=(Dialect.NKI,), checkable=True,
         note="Checked statically (tensors of both types declared in one kernel file; an MX tensor of "
              "float8_e4m3fn_x4 counts as float8_e4m3fn, four of them packed: nki.isa.nc_matmul_mx, \"Data types\") "
              "and by the interpreter (an nc_matmul reading both). The compiler error is per module, so a "
              "float8_e4m3fn kernel embedded in a model whose other FP8 E4M3 tensors are legacy float8_e4m3 fails "
              "there too; nmmc cannot see the rest of the model."),
    Rule("NKI-FP8-SATURATE", "fp8", "a value written into an FP8 tile (nl.float8_e4m3, largest finite 240; "
         "nl.float8_e5m2, 57344; nl.float8_e4m3fn, 448) lies in the format's finite range: clamp it first "
         "(tensor_scalar minimum/maximum into the FP8 tile), as the conversion is not documented to saturate",
         (_latest("nki/api/generated/nki.language.float8_e4m3.html", "8-bit floating-point number (1S,4E,3M)"),
          _latest("nki/api/generated/nki.language.float8_e5m2.html", "8-bit floating-point number (1S,5E,2M)"),
          _sdk(_LANG, "float8_e4m3fn: Extended range: no inf, NaN represented by 0bS111'1111"),
          _nkilib("src/nkilib_src/nkilib/core/utils/kernel_helpers.py",
                  "get_max_positive_value_for_dtype: float8_e4m3 240.0, float8_e5m2 57344.0"),
          _nkilib("src/nkilib_src/nkilib/core/mlp/mlp_cte/mlp_cte_quantization.py",
                  "perform_intermediate_static_quantization: tensor_scalar minimum/maximum into the quantized tile")),
         dialects=(Dialect.NKI,),
         note="Inferred: the NKI pages give the layouts, not the overflow behaviour; nki-library clamps before every "
              "FP8 cast. float8_e4m3fn has no inf, so an overflow could only be NaN or a saturation; its largest "
              "finite value, 448 (S.1111.110), follows from the layout the page gives (only S.1111.111 is NaN), as "
              "ml_dtypes.float8_e4m3fn has it. Not checked statically; the interpreter (ml_dtypes casts: round to "
              "nearest even, an overflow becomes inf, NaN in float8_e4m3fn) refuses a write of a non-finite value "
              "into an FP8 tile, naming this rule."),
    Rule("NMMC-FP8-SCALE-ONCE", "fp8", "every FP8 product reaches the output scaled exactly once by each of its "
         "scales (the weight's, the activation's): in scale units (each scale input one unit, an FP8 weight carrying "
         "its scale^-1, a quantization dividing one scale away), a kernel's values keep the quantized graph's units: "
         "FP8 matmul operands carry exactly one scale^-1, one PSUM accumulation one unit, nonlinear functions and "
         "outputs no scale",
         (f"{NMMC}: docs/quantization.md (The graph: dequantize = acc * v_scale * W_scale^T; Verification: scale "
          "units)",
          f"{NMMC}: src/neuronmm_compiler/ir/quantized.py (scale_exponents)"),
         dialects=(Dialect.NKI,),
         note="nmmc's quantized-graph semantics, not a hardware or NKI rule: a scale applied twice, or not at all, "
              "compiles and runs, but computes another function than the graph. Not checked statically; the "
              "interpreter follows every value's scale units through the kernel in nmmc verify of an FP8 file "
              "(interpreter/scale_units.py) and names the first instruction that breaks them. Units are per scale "
              "tensor: a per-channel scale applied from the wrong channel keeps the units and is caught by the "
              "value comparison only."),
    Rule("NKI-DMA-BROADCAST", "fp8", "a partition broadcast is a DMA source access pattern t.ap(pattern=[[0, P], [1, "
         "F]], offset=o): step 0 over the partitions, F contiguous elements; nmmc loads its FP8 scales this way, "
         "once per kernel",
         (_latest("nki/deep-dives/nki-aps.html", "NKI Access Patterns: [step, num] pairs, offset"),
          _latest("nki/api/generated/nki.language.NkiTensor.html", "ap: low-level access pattern override")),
         dialects=(Dialect.NKI,),
         note="Not checked statically; the interpreter reads .ap() of whole HBM tensors only, bounds-checked. The "
              "access-pattern page documents patterns for SBUF/PSUM instructions; its use as a dma_copy source of an "
              "HBM tensor follows nki-library's dequantisation-scale loads (mlp_tkg_gate_up_projection.py, "
              "dequant_scale ... .ap(pattern=...)) and is not measured by nmmc."),
    Rule("NKI-DMA-SLABS", "isa", "a weight block of KT slabs of P rows is one DMA source access pattern t.ap(pattern="
         "[[C, P], [P * C, KT], [1, F]], offset=o) into a [P, KT, F] tile: row kt * P + p to partition p, slot kt "
         "(weight_dma=block)",
         (_latest("nki/deep-dives/nki-aps.html", "NKI Access Patterns: [step, num] pairs, offset"),
          _nkilib("src/nkilib_src/nkilib/core/mlp/mlp_cte/mlp_cte_projection.py",
                  "project_standard_source_tensor_tile: weights_tensor_hbm.ap(pattern=[[I, 128], [I * 128, "
                  "len(hidden_subtiles)], [1, I_SHARD_SIZE]]) as a dma_copy source"),
          _nkilib("src/nkilib_src/nkilib/core/mlp/mlp_tkg/mlp_tkg_gate_up_projection.py",
                  "weight tile [HTile, I] -> SBUF [H0, HTile/H0, I] in one dma_copy of unsharded_weight.ap(...)")),
         dialects=(Dialect.NKI,),
         note="Not checked statically; the interpreter reads .ap() of whole HBM tensors only, bounds-checked, and "
              "tests compare each coalesced load with the slab loads it replaces. Not measured by nmmc: the cost "
              "model pays one DMA fixed cost for it and the efficiency of one row's bytes (docs/cost_model.md)."),
    Rule("NKI-DMA-COPY-PSUM", "isa", "dma_copy moves between HBM and SBUF only (no PSUM); dtype casts through "
         "float32",
         (_sdk(_ISA, "dma_copy"), _sdk(_MIGRATION, "Migrating from NKI 0.2.0 to NKI 0.3.0: dma_copy reading "
                                                    "from PSUM")),
         dialects=(Dialect.NKI,), checkable=True),
    Rule("NKI-DMA-TRANSPOSE-TARGET", "isa", "nisa.dma_transpose is documented for NeuronCore-v3 (trn2) and newer",
         (_sdk(_ARCH2, "DMA Transpose"), _sdk("nki/deep-dives/nki-dge.rst", "Mode Selection Summary")),
         targets=("trn1",), checkable=True,
         note="Rule holds on trn1: no trn1 page documents DMA transpose; NKI 0.1 kernels there use "
              "nl.load_transpose2d, which the performance guide (Opt #8) warns runs at 'much lower DMA bandwidth'. "
              "The dma_transpose page itself names no minimum core; conservatively trn2+."),
    Rule("NKI-DMA-TRANSPOSE-DTYPE", "isa", "nisa.dma_transpose source dtype is 2 bytes (float16/bfloat16)",
         (_sdk(_ISA, "dma_transpose, DMA Direct/Indirect Transpose Constraints"),
          _sdk("nki/deep-dives/nki-dge.rst", "Hardware DGE constraints for dma_transpose"),
          _sdk(_ARCH2, "DMA Transpose")),
         limit=2, checkable=True,
         note="Conflict: the Trainium2 guide says DMA transpose handles 2- and 4-byte types; the API page and "
              "the DGE guide require 2 bytes. Conservatively 2 bytes."),
    Rule("NKI-DMA-TRANSPOSE-SHAPE", "isa", "nisa.dma_transpose of a static access: dge_mode none, hwdge or "
         "unknown; src.shape[-1] <= 128; with dge_mode=hwdge also 2-D src.shape[0] == 16 (3-D/4-D: in {1, 2, 4, 8, "
         "16}, times shape[-2] a multiple of 16) and src.shape[-1] % 128 == 0; dst shape is src's transposed",
         (_sdk(_ISA, "dma_transpose, DMA Direct Transpose Constraints"),
          _sdk("nki/deep-dives/nki-dge.rst", "Hardware DGE constraints for dma_transpose"),
          _sdk("nki/deep-dives/nki-dge.rst", "How .ap() Affects DGE Mode: static access pattern"),
          _sdk("nki/deep-dives/nki-dge.rst", "Mode Selection Summary"),
          _sdk(_MIGRATION, "Migrating from NKI 0.3.0 to NKI 0.4.0: dma_transpose dst shape and rank")),
         dialects=(Dialect.NKI,), limit=DMA_TRANSPOSE_MAX_LAST, checkable=True,
         note="A static access pattern (no .ap() with vector_offset) allows modes none, hwdge or compiler-selected "
              "(nki-dge.rst, the table after 'Mode Selection Summary'); with unknown the compiler may pick hwdge, so "
              "src.shape[-1] <= 128 (the API page's direct and indirect constraints both state it) is checked on "
              "every mode, the hardware-DGE row and multiple-of-128 limits only with an explicit dge_mode=hwdge "
              "(DGE guide: % 128 == 0; API page: <= 128; together exactly 128). The shape is the access's: the "
              "widths of its slices (an integer index drops its dimension); a width that is not constant is not "
              "guessed. dst must be src transposed (checked for 2-D accesses; the rank rule is NKI 0.4's). The NKI "
              "0.1 dma_transpose page states no shape limit, so the rule is checked in the nki dialect."),
    Rule("NKI-LANG-WRAPPERS", "isa", "nl.load, nl.store, nl.copy, nl.matmul are not in NKI 0.2 (SDK 2.28), "
         "replaced by nisa.dma_copy / tensor_copy / nc_matmul; NKI 0.3 (SDK 2.29) brought them back as "
         "experimental wrappers of nki.isa calls",
         (_sdk(_MIGRATION, "What features in neuronxcc.nki.* are not available in nki.*?, note"),
          _sdk(_MIGRATION, "Migrating from NKI 0.2.0 to NKI 0.3.0: nki.language APIs"),
          _sdk(_LANG, "load: experimental")),
         dialects=(Dialect.NKI,), sdk_min="2.28", sdk_max="2.28", checkable=True,
         note="Checked on SDK 2.28 only (from 2.29 they exist). nmmc's nki dialect emits nisa.* calls, not these "
              "experimental wrappers."),
    Rule("NKI-LOAD-TRANSPOSE2D", "isa", "nl.load_transpose2d loads an HBM tensor 2D-transposed into SBUF; its "
         "partition size is bounded by pmax; DMA bandwidth much lower than nl.load",
         (_legacy(_LEGACY_LANG, "load_transpose2d, note"),
          _sdk("nki/deep-dives/nki_perf_guide.rst", "Opt #8: Mitigating overhead from tensor transposes"),
          _sdk(_LANG, "load_transpose2d: experimental")),
         checkable=True,
         note="The NKI 0.1 dialect's transposing load on every target; prefer nl.load + nisa.nc_transpose in a "
              "memory-bound kernel (performance guide). Checked: the source's last dimension (the result's "
              "partition dimension) where its width is constant."),
    Rule("NKI-VIRTUAL-REGISTER", "isa", "NKI 0.8.0 (SDK 2.34) deprecates nisa.register_alloc, register_move, "
         "register_load, register_store and nisa.VirtualRegister for nisa.scalar_load / scalar_store with "
         "nisa.NkiScalar (a DeprecationWarning; a future release removes them)",
         (_latest(_EOS_08, _EOS_08_TITLE + ": Deprecated API / Use instead"),
          _v234(_EOS_08_TAG, "the same post: In Neuron Release 2.34.0, NKI 0.8.0 deprecates the following APIs"),
          _v234("nki/deep-dives/nki-scalar.html", "NKI Scalar Values: Loading and Storing"),
          _v234(*_MIGRATION_234)),
         dialects=(Dialect.NKI,), sdk_min=NKI_LNC_FROM, checkable=True,
         note="nmmc emits no register or scalar API (docs/nki-subset.md: no runtime loop bound, no dynamic "
              "offset), so no emitted kernel can break it; checked (a use of those names through nisa) so that a "
              "hand-edited kernel verified for 2.34 is told. NKI 0.7.0 (2.33) introduced NkiScalar as the future "
              "replacement (" + _v233(_MIGRATION_233, _NKI_07) + ")."),
    Rule("NKI-LOCAL-GATHER-VALID", "isa", "nisa.local_gather without an explicit num_valid_indices gives undefined "
         "results from NKI 0.8.0 (SDK 2.34, with a warning); pass it explicitly (a future release changes its "
         "default to dst_free_size / num_elem_per_idx)",
         (_latest(_EOS_08, _EOS_08_TITLE + ": NKI 0.8.0 also announces these future changes: local_gather"),
          _sdk(_RELNOTES, "NKI [0.6.0] (Neuron 2.32.0 Release), Known Issues: local_gather num_elem_per_idx ignored "
                          "unless num_valid_indices * num_elem_per_idx == dst.size / dst.shape[0]; pass both")),
         dialects=(Dialect.NKI,), sdk_min=NKI_LNC_FROM, checkable=True,
         note="nmmc emits no local_gather (its gathers are DMA access patterns, NKI-DMA-BROADCAST/NKI-DMA-SLABS), so "
              "no emitted kernel can break it; checked (a local_gather call without the num_valid_indices keyword) "
              "for hand-edited kernels. The 2.32 known issue already asked for both arguments; the rule starts where "
              "the announcement calls the result undefined."),
    Rule("NKI-BITVEC-ENGINE", "isa", "announced by NKI 0.8.0 (SDK 2.34) for a future release: nisa.tensor_tensor with "
         "a bitvec operator rejects engine=gpsimd, nisa.tensor_scalar with one rejects engine=scalar or gpsimd (pass "
         "engine=vector or no engine)",
         (_latest(_EOS_08, _EOS_08_TITLE + ": NKI 0.8.0 also announces these future changes: Bitvec operators"),),
         dialects=(Dialect.NKI,), sdk_min=NKI_LNC_FROM,
         note="Not checked: not yet an error in 2.34, and nmmc's tensor_tensor / tensor_scalar calls pass no engine= "
              "and use arithmetic operators only (add, subtract, multiply, divide, minimum, maximum), no bitvec one."),
    # --- mx -------------------------------------------------------------------------------------
    Rule("NKI-MX-TARGET", "mx", "nisa.nc_matmul_mx and nisa.quantize_mx run on NeuronCore-v4 (trn3) only; nmmc's MX "
         "formats per target are Target.mx_formats (--dtype mxfp8_e4m3, mxfp8_e5m2, mxfp4)",
         (_sdk(_ISA, "nc_matmul_mx: \"Available only on NeuronCore-v4 and newer\""),
          _sdk(_ISA, "quantize_mx: \"Available only on NeuronCore-v4 and newer\""),
          _sdk(_ARCH3, "Quad-MXFP8/MXFP4 Matmul Performance: MXFP8 and MXFP4, \"Multiplying an MXFP8 matrix with an "
                       "MXFP4 matrix is also allowed\"")),
         dialects=(Dialect.NKI,), target_field="mx_formats", documented=MX_TARGET_FORMATS, checkable=True,
         note="Checked statically (a call of either on trn1/trn2) and by the interpreter on every call; nmmc refuses "
              "an MX --dtype on trn1/trn2 (and in the neuronxcc dialect) before anything is lowered or searched."),
    Rule("NKI-MX-RATE", "mx", "an MX matmul runs at 4x the bf16 rate: 315 MXFP8/MXFP4 TFLOPS per NeuronCore-v4 against "
         "79 BF16, one nc_matmul_mx over N moving x4 columns in the cycles of an nc_matmul over N; quantize_mx takes "
         "four input elements per partition per cycle",
         (_sdk(_ARCH3, "Tensor Engine: \"315 MXFP8/MXFP4 TFLOPS ... 79 BF16/FP16/TF32\""),
          _sdk(_ARCH3, "Quad-MXFP8/MXFP4 Matmul Performance: \"4x the throughput compared to a BF16/FP16 matmul\", "
                       "each PE \"performs four pairs of MX multiplications ... per cycle\""),
          _sdk(_ARCH3, "MX data-type Quantization: \"four input elements per partition, per cycle (i.e., 4x Vector "
                       "performance mode)\"")),
         dialects=(Dialect.NKI,), target_field="peak_mx_tflops", documented=(("trn1", 0.0), ("trn2", 0.0),
                                                                              ("trn3", 315.0)),
         note="The cost model's MX rates (targets.py MX_MATMUL_SPEEDUP, MX_QUANTIZE_ELEMENTS_PER_CYCLE; docs/mx.md, "
              "'Cost'); 4 x 79 = 316, the guide rounds to 315. No MX kernel has been measured on Trainium: the "
              "nc_matmul's 64-cycle floor is assumed for nc_matmul_mx too."),
    Rule("NKI-MX-LAYOUT", "mx", "an nc_matmul_mx contracts 512 positions: 128 partitions x 4 packed elements, the four "
         "elements of a partition 128 apart on the contraction (\"interleaving\"); a scaling group is 8 partitions x "
         "4 packed elements (32 values), one E8M0 scale each; nmmc holds MX weights packed so ([K/4, N] of an _x4 "
         "type, scales [16, K/512, N] uint8) and K a whole number of 512-tiles",
         (_sdk(_ISA, "nc_matmul_mx: \"The micro-scaling group size is 32 elements in groups of 8 partitions x 4 "
                     "elements per partition\"; Layout"),
          _sdk(_ARCH3, "Quad-MXFP8/MXFP4 Matmul Performance: \"These four elements are 128 (K//4) elements apart\""),
          _sdk(_MXFP, "Data Tensor: \"take 4 elements originating 128 apart on the contraction axis and pack them "
                      "together on the SBUF free-dimension\""),
          _nkilib("src/nkilib_src/nkilib/core/mlp/mlp_tkg/mlp_tkg_mx.py", "H must be divisible by 512; hidden "
                  "layout [_pmax, n_H512_tile, T, 4] quantized by quantize_mx"),
          _nkilib("src/nkilib_src/nkilib/core/mlp/mlp_tkg/down_projection_mx_shard_H.py", "weight scales uint8 "
                  "[_pmax // 8, ceil(I/512), H] in HBM")),
         dialects=(Dialect.NKI,), targets=("trn3",),
         note="The contraction's order inside a 512-tile is nmmc's to choose as long as both operands share it; nmmc "
              "takes the documented interleaving, so a weight's blocks are the 32 positions 512t + 128j + 8g + i "
              "(j < 4, i < 8), not 32 consecutive ones (ir/mx.py). Checked by the interpreter (the data's packing and "
              "the reference's blocks) and the value comparison of nmmc verify, not from the source."),
    Rule("NKI-MX-MATMUL-TILE", "mx", "nc_matmul_mx: stationary and moving in SBUF of an _x4 type (float8_e5m2_x4, "
         "float8_e4m3fn_x4, float4_e2m1fn_x4), partitions identical, a multiple of 32 and at most 128; the "
         "stationary's free size even and at most 128; the moving's at most 4096 (fp32 dst) or 8192 (bf16 dst); dst in "
         "PSUM; row tiling only (tile_size (row, 128), tile_position (row, 0)); no perf_mode",
         (_sdk(_ISA, "nc_matmul_mx: Tiling Mode, Memory types, Data types, Tile size"),
          _sdk(_MXFP, "Layout and Tile Size Requirements: max tile sizes [128P, 128F] / [128P, 512F] in _x4 elements")),
         dialects=(Dialect.NKI,), targets=("trn3",), checkable=True,
         note="Checked statically where the source shows it (operand dtypes and memories, a column tile) and by the "
              "interpreter on every call (shapes, evenness, dst). An MX kernel over an odd token count computes one "
              "zero token more, so that its row-major matmuls' stationary (a token tile) is even (lowerings/mx.py)."),
    Rule("NKI-MX-QUANTIZE-TILE", "mx", "quantize_mx: src bf16/fp16 in SBUF, partitions a multiple of 32 and at most "
         "128, free size a multiple of 4 (the 4 packed elements innermost); dst float8_e5m2_x4 or float8_e4m3fn_x4 "
         "(no FP4 output) with a quarter of src's free size",
         (_sdk(_ISA, "quantize_mx: Memory types, Data types, Layout, Tile size"),
          _sdk(_MXFP, "Data Tensor: \"Quantize-MX does not support an FP4 output but Matmul-MX does support FP4 "
                      "input\""),
          _nkilib("src/nkilib_src/nkilib/core/mlp/mlp_tkg/projection_mx_constants.py",
                  "SUPPORTED_QMX_OUTPUT_DTYPES = [nl.float8_e4m3fn_x4]")),
         dialects=(Dialect.NKI,), targets=("trn3",), checkable=True,
         note="Checked statically (dtypes) and by the interpreter (shapes). nmmc passes src as the [P, F, 4] view of "
              "an interleaved tile, its free axes flattened to the [P, 4F] the page describes (nki-library reshapes "
              "its [_pmax, n, T, 4] tile to 2-D first: mlp_tkg_mx.py); an assumption no measurement has checked."),
    Rule("NKI-MX-SCALE-LAYOUT", "mx", "an MX scale tile is uint8 (or float8_e8m0fnu) of the data tile's shape when the "
         "data spans more than one 32-partition quadrant (P // 8 rows within one); the scale of the group of "
         "partitions 8g .. 8g + 7 sits on partition 32 (g // 4) + g % 4, the first 4 partitions of its quadrant",
         (_sdk(_MXFP, "Scale Tensor: \"Scales must be placed in the quadrant from which the corresponding scaling "
                      "group originated\"; \"If P > 32 (Oversize required) MX Quantized Scale = [P, F//4] UINT8\""),
          _sdk(_ARCH3, "Quad-MXFP8/MXFP4 Matmul Performance: each quadrant holds 4 partitions worth of scales"),
          _nkilib("src/nkilib_src/nkilib/core/mlp/mlp_tkg/gate_up_projection_mx_shard_H.py",
                  "Load 4 partitions of scales for every quadrant: one dma_copy per quadrant")),
         dialects=(Dialect.NKI,), targets=("trn3",), checkable=True,
         note="Checked statically (the scale tile's dtype) and by the interpreter (quantize_mx writes, nc_matmul_mx "
              "reads each group's scale on that partition; a scale partition never written fails here). nmmc loads a "
              "weight block's scales with one DMA per quadrant (4 partitions each, as the guide's "
              "load_scales_scattered and nki-library's gate/up projection do; its down projection loads one partition "
              "per DMA, citing a scalar-DGE restriction to 1 or 16k partitions that nmmc's DMAs, which name no "
              "dge_mode, do not meet). Under mx_scales=hoisted a weight streamed in K blocks loads the scales of "
              "every K tile of its column block into one [P, K tiles, F] buffer before the K blocks, still one DMA "
              "per quadrant (the K tiles are a free axis: the partitions are the same 4 per quadrant, as nki-library's "
              "gate/up projection loads [_pmax, n_H512_tile_sharded, I] per quadrant), and each nc_matmul_mx reads "
              "its [P, F] tile at the global K tile; the buffer's K tiles x F bytes per partition are in the "
              "footprint. The offsets 0/4/8/12 that pack four tensors' scales into one tile are not used."),
    Rule("NKI-MX-SCALE-DTYPE", "mx", "before Neuron SDK 2.32 an MX scale tile is uint8 (\"The dst_scale tile must be "
         "uint8\"); from 2.32 float8_e8m0fnu or uint8 (\"uint8 accepted for backward compatibility\"): nmmc's MX "
         "kernels use uint8 holding the E8M0 exponent, for every release its nki dialect covers",
         (_sdk229("nki/api/generated/nki.isa.quantize_mx.html", "Data types: \"The dst_scale tile must be uint8\""),
          _sdk232("nki/api/generated/nki.isa.quantize_mx.html", "Data types: \"float8_e8m0fnu or uint8 (prefer "
                  "float8_e8m0fnu: OCP MX standard; uint8 accepted for backward compatibility)\""),
          _sdk(_ISA, "nc_matmul_mx: Data types: stationary_scale and moving_scale \"float8_e8m0fnu or uint8\"")),
         dialects=(Dialect.NKI,), targets=("trn3",), sdk_max="2.31", checkable=True,
         note="Releases 2.30 and 2.31 were not read; the rule takes the older text for them (the conservative "
              "reading). Checked statically: a scale tile allocated float8_e8m0fnu on those releases."),
    Rule("NKI-MX-QUANTIZE-SCALE", "mx", "quantize_mx's block scale is 2^(floor(log2(max|V|)) - (E_max - 1)), E_max 8 "
         "for float8_e4m3fn and 15 for float8_e5m2 (twice the OCP sample algorithm's, so the largest values round "
         "without saturation), 2^-127 for an all-zero group; the elements are V / scale rounded into the format",
         (_sdk(_ISA, "quantize_mx: Scale calculation; \"this instruction uses a block scale that is two times "
                     "larger\""),
          _nkilib("src/nkilib_src/nkilib/core/utils/mx_torch_common.py", "quantize_to_mx: the OCP sample algorithm "
                  "(block_max_exp - max_exp, clip to max_val) nmmc quantizes offline weights with")),
         dialects=(Dialect.NKI,), targets=("trn3",),
         note="The rounding of V / scale (exact: a power of two) into the element type is not stated; round to nearest "
              "even is assumed, as every narrowing cast nmmc models. nmmc's reference (ir/mx.py), the emitted "
              "reference() and the interpreter compute the same; offline weights use the OCP sample algorithm, clamped "
              "(their elements reach the format's largest value; quantize_mx's never exceed 2^E_max)."),
    Rule("NMMC-MX-SCALE-PAIR", "mx", "every MX operand reaches nc_matmul_mx with its own scales: in scale units (an MX "
         "weight's elements carry <name>_scale^-1 and its scale argument ^+1; each quantize_mx makes a unit of its "
         "own), each operand's elements and scale tile cancel, so the product carries no scale",
         (f"{NMMC}: docs/mx.md (Verification: scale pairs)",
          f"{NMMC}: src/neuronmm_compiler/interpreter/scale_units_mx.py"),
         dialects=(Dialect.NKI,), targets=("trn3",),
         note="nmmc's quantized-graph semantics, not an NKI rule: a weight's scale tile given to the activation (the "
              "weight's scale applied twice, the activation's never) runs, but computes another function. Checked by "
              "the interpreter in nmmc verify of an MX file."),
    # --- dialect --------------------------------------------------------------------------------
    Rule("NKI-NEURONXCC-IMPORT", "dialect", "neuronxcc.nki inside a kernel is a compilation error from NKI 0.4 "
         "(SDK 2.30)",
         (_sdk(_RELNOTES, "NKI [0.4.0] (Neuron 2.30.0 Release), Breaking Changes"),
          _sdk(_MIGRATION, "Migrating from NKI 0.3.0 to NKI 0.4.0: neuronxcc.nki.* inside kernels"),
          _sdk(_RELNOTES, "NKI (0.2.0) [2.28]: removal of neuronxcc.nki postponed"),
          _REMOVAL_234),
         dialects=(Dialect.NEURONXCC,), sdk_min="2.30", checkable=True,
         note="The end-of-support announcement named 2.28; the 2.28 notes postponed it to 2.29, the 2.29 notes "
              "postponed it again (both namespaces supported), and NKI 0.4 (SDK 2.30) made it an error. Conflict: "
              "the 2.34 removal announcement says neuronxcc.nki inside an NKI kernel is a compilation error 'in "
              "Neuron 2.28 and later'. The release notes of 2.28, 2.29 and 2.30 each say what that release did (2.30: "
              "'now raises a compilation error instead of a warning'), so the rule keeps 2.30; the stricter reading "
              "would end the neuronxcc range at 2.27 (support.py)."),
    Rule("NKI-NEURONXCC-REMOVED", "dialect", "Neuron 2.34 removes the neuronxcc.nki namespace from neuronx-cc: "
         "importing neuronxcc.nki (or any module under it) fails",
         (_REMOVAL_234,),
         dialects=(Dialect.NEURONXCC,), sdk_min=NEURONXCC_REMOVED_IN,
         note="Not checked in the source: no neuronxcc kernel can run there, so nmmc refuses --sdk 2.34 with the "
              "neuronxcc dialect (a one-line user error naming this announcement; support.check_sdk). The "
              "announcement's source carries an editor's note to confirm with the compiler team that the removal "
              "ships in 2.34 before publishing; it is published, and nmmc takes it as stated."),
    Rule("NKI-ISA-LNC-DEPRECATED", "dialect", "NKI 0.8.0 (SDK 2.34) deprecates nisa.sendrecv, nisa.sendrecv_compute "
         "and nisa.core_barrier for the same functions in nki.lnc (a DeprecationWarning; a future release removes "
         "them); nki.lnc.sendrecv takes no pipe_id",
         (_latest(_EOS_08, _EOS_08_TITLE + ": Deprecated API / Use instead: the same functions in nki.lnc; remove "
                           "the pipe_id argument, which NKI 0.8.0 ignores"),
          _v234(_EOS_08_TAG, "the same post: In Neuron Release 2.34.0, NKI 0.8.0 deprecates the following APIs"),
          _latest("nki/api/nki.lnc.html", "LNC communication: the nki.isa entry points are deprecated compatibility "
                  "wrappers; nki.lnc.sendrecv has no pipe_id argument"),
          _latest("nki/api/generated/nki.lnc.sendrecv.html", "nki.lnc.sendrecv(src, dst, send_to_rank, "
                  "recv_from_rank, dma_engine=dma_engine.dma, name=None, priority=None)"),
          _v234(_RELNOTES_234, _NKI_08),
          _v234(*_MIGRATION_234)),
         dialects=(Dialect.NKI,), sdk_min=NKI_LNC_FROM, checkable=True,
         note="Checked: a call of nisa.sendrecv, nisa.sendrecv_compute or nisa.core_barrier (or the same under "
              "nki.isa). Deprecated, not removed, in 2.34: such a kernel still runs there with a warning, but nmmc "
              "holds a 2.34 kernel to the replacement (conservatively: the announcement removes the old names in a "
              "future release), and emits its exchange as nki.lnc.sendrecv(src=, dst=, send_to_rank=, "
              "recv_from_rank=) for 2.34 (codegen/printer.py; the file imports nki.lnc, as no page says 'import nki' "
              "alone loads it). The migration guide's 0.7-to-0.8 section is referenced by the announcement and "
              "listed in the 2.34 migration index; its body was not in the stored documentation, so the deprecation "
              "list is the announcement's. nmmc emits no sendrecv_compute and no core_barrier."),
    Rule("NKI-LNC-MODULE", "dialect", "nki.lnc (sendrecv, sendrecv_compute, core_barrier) exists from NKI 0.8.0 "
         "(SDK 2.34); a kernel for an earlier release exchanges with nisa.sendrecv(..., pipe_id)",
         (_v234("nki/api/index.html", "NKI API reference manual, Multi-core communication: nki.lnc, nki.collectives"),
          _sdk("nki/api/index.rst", "NKI API reference manual: the nki, nki.language, nki.isa and nki.collectives "
                                    "modules (SDK 2.32: no nki.lnc)"),
          _sdk(_ISA, "sendrecv(src, dst, send_to_rank, recv_from_rank, pipe_id, dma_engine=dma_engine.dma, "
                     "name=None); core_barrier"),
          _latest(_EOS_08, _EOS_08_TITLE)),
         dialects=(Dialect.NKI,), sdk_max=_BEFORE_LNC, checkable=True,
         note="Checked: 'import nki.lnc' or any nki.lnc attribute, on an SDK given before 2.34. The SDK 2.32 API "
              "reference (the repository snapshot) has no nki.lnc module, and the 2.33 page of the barrier is still "
              "nki.isa.core_barrier, telling kernels to call nisa.core_barrier (https://awsdocs-neuron.readthedocs-"
              "hosted.com/en/v2.33.0/nki/api/generated/nki.isa.core_barrier.html); the announcement introduces the "
              "nki.lnc functions with NKI 0.8.0. No page states that 2.33 lacks nki.lnc, so conservatively it does: "
              "nmmc emits nisa.sendrecv(..., pipe_id=0) for 2.29 to 2.33."),
    Rule("NKI-DIALECT-SDK", "dialect", "the nki dialect as nmmc prints it (the NKI 0.3 API: dst= first in every "
         "nisa call) needs NKI 0.3.0, Neuron SDK 2.29; SDK 2.27 and 2.28 ship NKI 0.2, older "
         "releases no nki package",
         (_sdk(_MIGRATION, "NKI version to Neuron SDK mapping: 0.3.0 2.29.0, 0.2.0 2.28.0 / 2.27.0"),
          _sdk(_RELNOTES, "Neuron Kernel Interface (NKI) [0.3.0] (Neuron 2.29.0 Release)"),
          _sdk(_RELNOTES, "Neuron Kernel Interface (NKI) (0.1.0) [2.27] (Neuron 2.27.0 Release)")),
         dialects=(Dialect.NKI,), sdk_max="2.28", checkable=True,
         note="Checked at the first 'import nki' line, like NKI-DIALECT-TRN1: the support matrix's lower bound of the "
              "nki dialect (support.py), so nmmc verify --sdk 2.26 (or 2.27, 2.28) fails an nki-dialect file. On "
              "2.28 NKI-LANG-WRAPPERS names the calls NKI 0.2 lacks as well. The release notes number "
              "the nki package of 2.27 0.1.0 (Beta 2) where the migration table says 0.2.0; either way not 0.3."),
    Rule("NKI-LNC-DEGREE", "dialect", "a kernel compiled into a model graph has the graph's LNC degree (neuronx-cc "
         "defaults to LNC=2 on trn2 and later); from NKI 0.7 (SDK 2.33) the compiler rejects a mismatch "
         "(NCC_EVRF066). The SPMD launch grid is no longer to be required for LNC=2, and a grid dimension other "
         "than the LNC degree is a compile-time error",
         (_v233(_MIGRATION_233, _NKI_07 + ": the compiler now validates that the kernel and compiler LNC degrees "
                "match"),
          _v233("nki/get-started/about/lnc.html", "Configuring the LNC degree of kernels, note"),
          _latest("compiler/error-codes/EVRF066.html", "NCC_EVRF066, Common causes: the launch-grid bracket syntax "
                  "is being deprecated"),
          _sdk("about-neuron/announcements/neuron2.x/announce-intent-eos-nki-spmd-launch-grid.rst",
               "Announcing upcoming deprecation of the SPMD launch grid requirement for LNC2 NKI kernels")),
         dialects=(Dialect.NKI,), targets=("trn2", "trn3"), sdk_min="2.33",
         note="Not checked: the LNC degree is chosen where a kernel is launched (NEURON_LOGICAL_NC_CONFIG or "
              "kernel[n](...)), not in the file nmmc emits. nmmc's kernels are written for one core (no "
              "nl.program_id, no launch grid): run standalone (nki.jit on NumPy arrays, nmmc bench) they need no "
              "LNC setting; embedded in a graph compiled at LNC=2 they must be launched at the graph's degree, and "
              "then do not split their work between the two cores. Conflict: the announcement (June 2026) leaves "
              "the release of the launch-grid deprecation open, and the 2.33 LNC page still documents the bracket "
              "syntax; conservatively nmmc relies on neither the grid nor its absence."),
    Rule("NKI-DIALECT-TRN1", "dialect", "NKI 0.3+ kernels (import nki) are not supported on trn1/inf2",
         (_sdk("release-notes/components/nxd-inference.rst", "Neuron 2.29.0 Release, Breaking Changes"),
          _sdk("nki/nki_faq.rst", "Which AWS chips does NKI support?: Trainium2 and Trainium3"),
          _sdk("nki/api/nki/__init__.py", "jit: NEURON_PLATFORM_TARGET_OVERRIDE trn1|inf2|gen2"),
          _sdk("nki/guides/nki_simulator.rst", "Target Platform")),
         dialects=(Dialect.NKI,), targets=("trn1",), sdk_min="2.29", checkable=True,
         note="Conflict: nki.jit and the simulator list trn1 as a target, but the NxD Inference 2.29 notes say "
              "'NKI 0.3.0 kernels are not supported on Trn1/Inf2' and the current NKI FAQ names only Trainium2 and "
              "Trainium3 (the SDK 2.26 FAQ still listed Trn1/Inf2). A user asked AWS about the contradiction "
              "(github.com/aws-neuron/aws-neuron-sdk/issues/1322, no answer seen). Conservatively unsupported: for "
              "trn1 hardware emit the neuronxcc dialect and run it on SDK <= 2.29."),
    Rule("NKI-BENCHMARK", "dialect", "nki.benchmark, nki.profile and nki.baremetal are not in NKI 0.2+; "
         "profile with NEURON_FRAMEWORK_DEBUG=1 (saves the NEFF) and neuron-explorer capture",
         (_sdk(_RELNOTES, "NKI (0.1.0) [2.27], Known Issues; NKI (0.2.0) [2.28], Bug Fixes"),
          _sdk("nki/guides/use-neuron-profile.rst", "How to profile using neuron-explorer capture"),
          _sdk("tools/neuron-explorer/profile-schema-reference.rst", "Summary: total_time"),
          _sdk("tools/neuron-explorer/troubleshooting.rst", "Is summary-json still supported?")),
         dialects=(Dialect.NKI,), checkable=True,
         note="`neuron-explorer capture -n <file>.neff -s profile.ntff --profile-nth-exec=N` runs the NEFF N times and "
              "profiles the N-th (profile_exec_N.ntff); a standalone kernel (nki.jit called with NumPy arrays) saves "
              "its NEFF in the working directory under NEURON_FRAMEWORK_DEBUG=1. The latency is the summary's "
              "total_time (seconds of on-device execution, no host overhead) from `neuron-explorer view -n <neff> -s "
              "<ntff> --output-format summary-json` (its schema 'may change between versions'). nmmc bench uses "
              "this route for the nki dialect (calibration/bench_routes.py). The migration FAQ of Neuron Explorer "
              "still says to use nki.benchmark/nki.profile for NKI kernels: true of NKI 0.1 only."),
)

RULES_BY_ID: dict[str, Rule] = {rule.id: rule for rule in RULES}

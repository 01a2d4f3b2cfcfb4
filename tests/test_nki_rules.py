"""The NKI rule book (verification/rules.py), its generated document and the static checker.

Mutation tests: for each checkable rule, a small kernel that breaks it (in each dialect the rule covers) yields that
rule id on the line marked ``# VIOLATION``, and the corrected kernel yields no violation at all.
"""

from __future__ import annotations

import importlib.util
import re
import sys
from pathlib import Path

import pytest

from neuronmm_compiler.targets import TARGETS
from neuronmm_compiler.verification.rules import NMMC, RULES, RULES_BY_ID, SOURCES, TOPICS
from neuronmm_compiler.verification.static_check import check_kernel_source
from neuronmm_compiler.vocab import Dialect

ROOT = Path(__file__).resolve().parents[1]


def _script(name: str):
    sys.path.insert(0, str(ROOT / "scripts"))
    spec = importlib.util.spec_from_file_location(name, ROOT / "scripts" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# --- the rule book ------------------------------------------------------------------------------

def test_rule_ids_are_unique_and_well_formed():
    assert len(RULES_BY_ID) == len(RULES)
    for rule in RULES:
        assert re.fullmatch(r"(NKI|NMMC)(-[A-Z0-9]+)+", rule.id), rule.id
        assert rule.id.startswith("NKI-") or all(c.startswith(NMMC) for c in rule.citations), rule.id
        assert rule.topic in TOPICS
        assert rule.citations and rule.summary
        assert set(rule.targets) <= set(TARGETS)


def test_every_citation_names_a_pinned_source():
    for rule in RULES:
        for citation in rule.citations:
            assert any(citation.startswith(source) for source in SOURCES), (rule.id, citation)


@pytest.mark.parametrize("rule", [r for r in RULES if r.target_field], ids=lambda r: r.id)
def test_targets_agree_with_the_documented_values(rule):
    """targets.py holds the hardware numbers; the rule book records what the docs say. A known disagreement is
    listed in targets_disagree (and explained in the note) and must still be one, so the note stays true."""
    assert {t for t, _ in rule.documented} == set(rule.targets)
    for target, documented in rule.documented:
        held = getattr(TARGETS[target], rule.target_field)
        if target in rule.targets_disagree:
            assert held != documented and rule.note, (rule.id, target)
        else:
            assert held == documented, (rule.id, target, held, documented)


def test_sdk_bounded_rules_apply_only_with_an_sdk():
    rule = RULES_BY_ID["NKI-NEURONXCC-IMPORT"]
    assert not rule.applies(Dialect.NEURONXCC, "trn2", None)
    assert not rule.applies(Dialect.NEURONXCC, "trn2", "2.29")
    assert rule.applies(Dialect.NEURONXCC, "trn2", "2.30")
    assert rule.applies(Dialect.NEURONXCC, "trn2", "2.32.0")


def test_the_document_is_up_to_date():
    doc = _script("nki_rules_doc")
    assert (ROOT / "docs" / "nki-rules.md").read_text(encoding="utf-8") == doc.render(), (
        "docs/nki-rules.md is out of date: run python scripts/nki_rules_doc.py")


def test_golden_counts_script_runs(capsys):
    check = _script("check_nki_rules")
    assert check.main([]) == 0
    kernels = len(list((ROOT / "tests" / "golden" / "kernels").glob("*.py")))
    assert f"{kernels} kernel files" in capsys.readouterr().out


# --- mutation tests -----------------------------------------------------------------------------

NKI_HEAD = "import nki\nimport nki.isa as nisa\nimport nki.language as nl\n\n\n@nki.jit\ndef kernel(a, b):\n"
LEGACY_HEAD = ("import neuronxcc.nki as nki\nimport neuronxcc.nki.isa as nisa\nimport neuronxcc.nki.language as nl"
               "\n\n\n@nki.jit\ndef kernel(a, b):\n")


def _kernel(dialect: str, body: str) -> str:
    head = NKI_HEAD if dialect == "nki" else LEGACY_HEAD
    lines = [line[8:] if line.startswith(" " * 8) else line for line in body.strip("\n").splitlines()]
    return head + "\n".join("    " + line for line in lines) + "\n    return out\n"


def _matmul_body(x: str = "bfloat16", y: str = "bfloat16", acc: str = "float32", buffer: str = "psum",
                 violation: str | None = None, before: str = "") -> str:
    """The nki-dialect body of one ``nc_matmul`` of an x [128, 128] and a y [128, 512] operand into ``acc``, with
    ``before`` ahead of the matmul; ``violation`` ("x", "y", "acc" or "matmul") marks that line "# VIOLATION"."""
    lines = {"out": "out = nl.ndarray((128, 512), dtype=nl.float32, buffer=nl.shared_hbm)",
             "x": f"x = nl.ndarray((128, 128), dtype=nl.{x}, buffer=nl.sbuf)",
             "y": f"y = nl.ndarray((128, 512), dtype=nl.{y}, buffer=nl.sbuf)",
             "acc": f"acc = nl.ndarray((128, 512), dtype=nl.{acc}, buffer=nl.{buffer})",
             "before": before, "matmul": "nisa.nc_matmul(dst=acc, stationary=x, moving=y)"}
    return "\n".join(line + ("  # VIOLATION" if key == violation else "") for key, line in lines.items() if line)


def _mx_body(moving: str = "float8_e4m3fn_x4", quantized: str = "float8_e4m3fn_x4", scale: str = "uint8",
             violation: str | None = None, target_ok: bool = False) -> str:
    """The nki-dialect body of an MX matmul (docs/mx.md): a bf16 [128, 256] tile quantize_mx'd into x [128, 64] and
    its scales, times a weight y [128, 512] of dtype ``moving`` into PSUM; ``violation`` ("quantize" or "matmul")
    marks that line "# VIOLATION". ``target_ok``: the good body of a target case (its tiles, no MX call)."""
    lines = {"out": "out = nl.ndarray((64, 512), dtype=nl.float32, buffer=nl.shared_hbm)",
             "src": "src = nl.ndarray((128, 256), dtype=nl.bfloat16, buffer=nl.sbuf)",
             "x": f"x = nl.ndarray((128, 64), dtype=nl.{quantized}, buffer=nl.sbuf)",
             "xs": f"xs = nl.ndarray((128, 64), dtype=nl.{scale}, buffer=nl.sbuf)",
             "y": f"y = nl.ndarray((128, 512), dtype=nl.{moving}, buffer=nl.sbuf)",
             "ys": "ys = nl.ndarray((128, 512), dtype=nl.uint8, buffer=nl.sbuf)",
             "acc": "acc = nl.ndarray((64, 512), dtype=nl.float32, buffer=nl.psum)",
             "quantize": "nisa.quantize_mx(dst=x, src=src, dst_scale=xs)",
             "matmul": "nisa.nc_matmul_mx(dst=acc, stationary=x, moving=y, stationary_scale=xs, moving_scale=ys)"}
    calls = () if target_ok else ("quantize", "matmul")
    return "\n".join(line + ("  # VIOLATION" if key == violation else "") for key, line in lines.items()
                     if key in calls or key not in ("quantize", "matmul"))


# (rule, dialect, target, sdk, bad body, good body); the bad body marks its line with "# VIOLATION".
CASES = [
    ("NKI-PARTITION-MAX", "nki", "trn2", None,
     """
        out = nl.ndarray((256, 512), dtype=nl.bfloat16, buffer=nl.shared_hbm)
        t = nl.ndarray((256, 512), dtype=nl.bfloat16, buffer=nl.sbuf)  # VIOLATION
        """,
     """
        out = nl.ndarray((256, 512), dtype=nl.bfloat16, buffer=nl.shared_hbm)
        t = nl.ndarray((128, 2, 512), dtype=nl.bfloat16, buffer=nl.sbuf)
        """),
    ("NKI-PARTITION-MAX", "neuronxcc", "trn1", None,
     """
        out = nl.ndarray((256, 512), dtype=nl.bfloat16, buffer=nl.shared_hbm)
        t = nl.zeros((nl.par_dim(256), 512), dtype=nl.bfloat16, buffer=nl.sbuf)  # VIOLATION
        """,
     """
        out = nl.ndarray((256, 512), dtype=nl.bfloat16, buffer=nl.shared_hbm)
        t = nl.zeros((nl.par_dim(128), 512), dtype=nl.bfloat16, buffer=nl.sbuf)
        """),
    ("NKI-PSUM-TILE-FMAX", "nki", "trn3", None,
     """
        out = nl.ndarray((128, 1024), dtype=nl.float32, buffer=nl.shared_hbm)
        acc = nl.ndarray((128, 1024), dtype=nl.float32, buffer=nl.psum)  # VIOLATION
        """,
     """
        out = nl.ndarray((128, 1024), dtype=nl.float32, buffer=nl.shared_hbm)
        acc0 = nl.ndarray((128, 512), dtype=nl.float32, buffer=nl.psum)
        acc1 = nl.ndarray((128, 1024), dtype=nl.bfloat16, buffer=nl.psum)
        """),
    ("NKI-PSUM-TILE-FMAX", "neuronxcc", "trn1", None,
     """
        out = nl.ndarray((128, 2048), dtype=nl.float32, buffer=nl.shared_hbm)
        acc = nl.zeros((128, 4, 512), dtype=nl.float32, buffer=nl.psum)  # VIOLATION
        """,
     """
        out = nl.ndarray((128, 2048), dtype=nl.float32, buffer=nl.shared_hbm)
        acc = nl.zeros((4, nl.par_dim(128), 512), dtype=nl.float32, buffer=nl.psum)
        """),
    ("NKI-BLOCK-DIM", "neuronxcc", "trn1", "2.25",
     """
        out = nl.ndarray((128, 2048), dtype=nl.float32, buffer=nl.shared_hbm)
        acc = nl.zeros((4, nl.par_dim(128), 512), dtype=nl.float32, buffer=nl.psum)  # VIOLATION
        """,
     """
        out = nl.ndarray((128, 2048), dtype=nl.float32, buffer=nl.shared_hbm)
        acc0 = nl.zeros((nl.par_dim(128), 512), dtype=nl.float32, buffer=nl.psum)
        acc1 = nl.zeros((nl.par_dim(128), 512), dtype=nl.float32, buffer=nl.psum)
        """),
    ("NKI-LIST-INDEX-STATIC", "neuronxcc", "trn1", None,
     """
        out = nl.ndarray((128, 1024), dtype=nl.float32, buffer=nl.shared_hbm)
        acc = []
        for bank in nl.static_range(2):
            acc.append(nl.zeros((128, 512), dtype=nl.float32, buffer=nl.psum))
        lhs = nl.ndarray((128, 128), dtype=nl.bfloat16, buffer=nl.sbuf)
        rhs = nl.ndarray((128, 1024), dtype=nl.bfloat16, buffer=nl.sbuf)
        for j in nl.affine_range(2):
            acc[j][0:128, 0:512] += nisa.nc_matmul(lhs[0:128, 0:128], rhs[0:128, 512 * j:512 * j + 512])  # VIOLATION
        """,
     """
        out = nl.ndarray((128, 1024), dtype=nl.float32, buffer=nl.shared_hbm)
        acc = []
        for bank in nl.static_range(2):
            acc.append(nl.zeros((128, 512), dtype=nl.float32, buffer=nl.psum))
        lhs = nl.ndarray((128, 128), dtype=nl.bfloat16, buffer=nl.sbuf)
        rhs = nl.ndarray((128, 1024), dtype=nl.bfloat16, buffer=nl.sbuf)
        for j in nl.static_range(2):
            acc[j][0:128, 0:512] += nisa.nc_matmul(lhs[0:128, 0:128], rhs[0:128, 512 * j:512 * j + 512])
        """),
    ("NKI-AFFINE-WRITE-RACE", "neuronxcc", "trn1", None,
     """
        out = nl.ndarray((128, 2048), dtype=nl.float32, buffer=nl.shared_hbm)
        scratch = nl.ndarray((128, 512), dtype=nl.float32, buffer=nl.sbuf)
        for j in nl.affine_range(4):
            scratch[0:128, 0:512] = nl.load(a[0:128, 512 * j:512 * j + 512])  # VIOLATION
            nl.store(out[0:128, 512 * j:512 * j + 512], value=scratch[0:128, 0:512])
        """,
     """
        out = nl.ndarray((128, 2048), dtype=nl.float32, buffer=nl.shared_hbm)
        acc = nl.zeros((128, 512), dtype=nl.float32, buffer=nl.psum)
        for j in nl.affine_range(4):
            scratch = nl.ndarray((128, 512), dtype=nl.float32, buffer=nl.sbuf)
            scratch[0:128, 0:512] = nl.load(a[0:128, 512 * j:512 * j + 512])
            offset = 512 * j
            nl.store(out[0:128, offset:offset + 512], value=scratch[0:128, 0:512])
            acc[0:128, 0:512] += nisa.nc_matmul(scratch[0:128, 0:128], scratch[0:128, 0:512])
        """),
    ("NKI-MATMUL-MEMORY", "nki", "trn2", None,
     _matmul_body(buffer="sbuf", violation="matmul"),
     _matmul_body()),
    ("NKI-MATMUL-MEMORY", "neuronxcc", "trn1", None,
     """
        out = nl.ndarray((128, 512), dtype=nl.float32, buffer=nl.shared_hbm)
        y = nl.ndarray((128, 512), dtype=nl.bfloat16, buffer=nl.sbuf)
        acc = nl.zeros((128, 512), dtype=nl.float32, buffer=nl.psum)
        acc[0:128, 0:512] += nisa.nc_matmul(a[0:128, 0:128], y[0:128, 0:512])  # VIOLATION
        """,
     """
        out = nl.ndarray((128, 512), dtype=nl.float32, buffer=nl.shared_hbm)
        x = nl.load(a[0:128, 0:128])
        y = nl.ndarray((128, 512), dtype=nl.bfloat16, buffer=nl.sbuf)
        acc = nl.zeros((128, 512), dtype=nl.float32, buffer=nl.psum)
        acc[0:128, 0:512] += nisa.nc_matmul(x[0:128, 0:128], y[0:128, 0:512])
        """),
    ("NKI-MATMUL-MOVING-FMAX", "nki", "trn2", None,
     """
        out = nl.ndarray((128, 1024), dtype=nl.float32, buffer=nl.shared_hbm)
        x = nl.ndarray((128, 128), dtype=nl.bfloat16, buffer=nl.sbuf)
        y = nl.ndarray((128, 2, 1024), dtype=nl.bfloat16, buffer=nl.sbuf)
        acc = nl.ndarray((128, 512), dtype=nl.float32, buffer=nl.psum)
        for j in range(2):
            nisa.nc_matmul(dst=acc[0:128, 0:512], stationary=x, moving=y[0:128, j, 0:1024])  # VIOLATION
        """,
     """
        out = nl.ndarray((128, 1024), dtype=nl.float32, buffer=nl.shared_hbm)
        x = nl.ndarray((128, 128), dtype=nl.bfloat16, buffer=nl.sbuf)
        y = nl.ndarray((128, 2, 1024), dtype=nl.bfloat16, buffer=nl.sbuf)
        acc = nl.ndarray((128, 512), dtype=nl.float32, buffer=nl.psum)
        for j in range(2):
            nisa.nc_matmul(dst=acc[0:128, 0:512], stationary=x, moving=y[0:128, j, 512 * j:512 * j + 512])
        """),
    ("NKI-MATMUL-MOVING-FMAX", "neuronxcc", "trn1", None,
     """
        out = nl.ndarray((128, 1024), dtype=nl.float32, buffer=nl.shared_hbm)
        x = nl.ndarray((128, 128), dtype=nl.bfloat16, buffer=nl.sbuf)
        y = nl.ndarray((128, 1024), dtype=nl.bfloat16, buffer=nl.sbuf)
        acc = nl.zeros((128, 512), dtype=nl.float32, buffer=nl.psum)
        acc[0:128, 0:512] += nisa.nc_matmul(x, y)  # VIOLATION
        """,
     """
        out = nl.ndarray((128, 1024), dtype=nl.float32, buffer=nl.shared_hbm)
        x = nl.ndarray((128, 128), dtype=nl.bfloat16, buffer=nl.sbuf)
        y = nl.ndarray((128, 1024), dtype=nl.bfloat16, buffer=nl.sbuf)
        acc = nl.zeros((128, 512), dtype=nl.float32, buffer=nl.psum)
        acc[0:128, 0:512] += nisa.nc_matmul(x, y[0:128, 0:512])
        """),
    ("NKI-MATMUL-STATIONARY-FMAX", "nki", "trn3", None,
     """
        out = nl.ndarray((128, 512), dtype=nl.float32, buffer=nl.shared_hbm)
        x = nl.ndarray((128, 256), dtype=nl.bfloat16, buffer=nl.sbuf)
        y = nl.ndarray((128, 512), dtype=nl.bfloat16, buffer=nl.sbuf)
        acc = nl.ndarray((128, 512), dtype=nl.float32, buffer=nl.psum)
        nisa.nc_matmul(dst=acc, stationary=x[0:128, 0:256], moving=y)  # VIOLATION
        """,
     """
        out = nl.ndarray((128, 512), dtype=nl.float32, buffer=nl.shared_hbm)
        x = nl.ndarray((128, 256), dtype=nl.bfloat16, buffer=nl.sbuf)
        y = nl.ndarray((128, 512), dtype=nl.bfloat16, buffer=nl.sbuf)
        acc = nl.ndarray((128, 512), dtype=nl.float32, buffer=nl.psum)
        nisa.nc_matmul(dst=acc, stationary=x[0:128, 128:256], moving=y)
        """),
    ("NKI-MATMUL-STATIONARY-FMAX", "neuronxcc", "trn2", None,
     """
        out = nl.ndarray((128, 512), dtype=nl.float32, buffer=nl.shared_hbm)
        x = nl.ndarray((128, 2, 256), dtype=nl.bfloat16, buffer=nl.sbuf)
        y = nl.ndarray((128, 512), dtype=nl.bfloat16, buffer=nl.sbuf)
        acc = nl.zeros((128, 512), dtype=nl.float32, buffer=nl.psum)
        for k in nl.affine_range(2):
            acc[0:128, 0:512] += nisa.nc_matmul(x[0:128, k, 0:256], y[0:128, 0:512])  # VIOLATION
        """,
     """
        out = nl.ndarray((128, 512), dtype=nl.float32, buffer=nl.shared_hbm)
        x = nl.ndarray((128, 2, 256), dtype=nl.bfloat16, buffer=nl.sbuf)
        y = nl.ndarray((128, 512), dtype=nl.bfloat16, buffer=nl.sbuf)
        acc = nl.zeros((128, 512), dtype=nl.float32, buffer=nl.psum)
        for k in nl.affine_range(2):
            acc[0:128, 0:512] += nisa.nc_matmul(x[0:128, k, 0:128], y[0:128, 0:512])
        """),
    ("NKI-MATMUL-TILE", "nki", "trn2", None,
     """
        out = nl.ndarray((8, 512), dtype=nl.float32, buffer=nl.shared_hbm)
        x = nl.ndarray((128, 8), dtype=nl.bfloat16, buffer=nl.sbuf)
        y = nl.ndarray((128, 512), dtype=nl.bfloat16, buffer=nl.sbuf)
        p = nl.ndarray((128, 512), dtype=nl.float32, buffer=nl.psum)
        nisa.nc_matmul(dst=p[48:56, :], stationary=x, moving=y, tile_position=(0, 48), tile_size=(128, 32))  # VIOLATION
        """,
     """
        out = nl.ndarray((8, 512), dtype=nl.float32, buffer=nl.shared_hbm)
        x = nl.ndarray((128, 8), dtype=nl.bfloat16, buffer=nl.sbuf)
        y = nl.ndarray((128, 512), dtype=nl.bfloat16, buffer=nl.sbuf)
        acc = nl.ndarray((128, 512), dtype=nl.float32, buffer=nl.psum)
        nisa.nc_matmul(dst=acc[64:72, 0:512], stationary=x, moving=y, tile_position=(0, 64), tile_size=(128, 32))
        """),
    ("NKI-MATMUL-TILE", "neuronxcc", "trn1", None,
     """
        out = nl.ndarray((8, 512), dtype=nl.float32, buffer=nl.shared_hbm)
        x = nl.ndarray((128, 8), dtype=nl.bfloat16, buffer=nl.sbuf)
        y = nl.ndarray((128, 512), dtype=nl.bfloat16, buffer=nl.sbuf)
        acc = nl.zeros((128, 512), dtype=nl.float32, buffer=nl.psum)
        acc[32:40, 0:512] += nisa.nc_matmul(x, y, tile_position=(0, 32), tile_size=(128, 32))  # VIOLATION
        """,
     """
        out = nl.ndarray((8, 512), dtype=nl.float32, buffer=nl.shared_hbm)
        x = nl.ndarray((128, 8), dtype=nl.bfloat16, buffer=nl.sbuf)
        y = nl.ndarray((128, 512), dtype=nl.bfloat16, buffer=nl.sbuf)
        acc = nl.zeros((128, 512), dtype=nl.float32, buffer=nl.psum)
        acc[64:72, 0:512] += nisa.nc_matmul(x, y, tile_position=(0, 64), tile_size=(128, 64))
        """),
    ("NKI-MATMUL-TILE-DST", "nki", "trn3", None,
     """
        out = nl.ndarray((8, 512), dtype=nl.float32, buffer=nl.shared_hbm)
        x = nl.ndarray((128, 8), dtype=nl.bfloat16, buffer=nl.sbuf)
        y = nl.ndarray((128, 512), dtype=nl.bfloat16, buffer=nl.sbuf)
        p = nl.ndarray((128, 512), dtype=nl.float32, buffer=nl.psum)
        nisa.nc_matmul(dst=p[0:8, :], stationary=x, moving=y, tile_position=(0, 32), tile_size=(128, 32))  # VIOLATION
        """,
     """
        out = nl.ndarray((8, 512), dtype=nl.float32, buffer=nl.shared_hbm)
        x = nl.ndarray((128, 8), dtype=nl.bfloat16, buffer=nl.sbuf)
        y = nl.ndarray((128, 512), dtype=nl.bfloat16, buffer=nl.sbuf)
        acc = nl.ndarray((128, 512), dtype=nl.float32, buffer=nl.psum)
        nisa.nc_matmul(dst=acc[32:40, 0:512], stationary=x, moving=y, tile_position=(0, 32), tile_size=(128, 32))
        """),
    ("NKI-MATMUL-DTYPE", "nki", "trn2", None,
     _matmul_body(acc="bfloat16", violation="matmul"),
     _matmul_body()),
    ("NKI-MATMUL-DTYPE", "neuronxcc", "trn1", None,
     """
        out = nl.ndarray((128, 512), dtype=nl.float32, buffer=nl.shared_hbm)
        x = nl.ndarray((128, 128), dtype=nl.float32, buffer=nl.sbuf)
        y = nl.ndarray((128, 512), dtype=nl.bfloat16, buffer=nl.sbuf)
        acc = nl.zeros((128, 512), dtype=nl.float32, buffer=nl.psum)
        acc[0:128, 0:512] += nisa.nc_matmul(x[0:128, 0:128], y[0:128, 0:512])  # VIOLATION
        """,
     """
        out = nl.ndarray((128, 512), dtype=nl.float32, buffer=nl.shared_hbm)
        x = nl.ndarray((128, 128), dtype=nl.float32, buffer=nl.sbuf)
        y = nl.ndarray((128, 512), dtype=nl.float32, buffer=nl.sbuf)
        acc = nl.zeros((128, 512), dtype=nl.float32, buffer=nl.psum)
        acc[0:128, 0:512] += nisa.nc_matmul(x[0:128, 0:128], y[0:128, 0:512])
        """),
    # float8_e4m3fn operands are nc_matmul inputs from NeuronCore-v4 on: the same matmul is fine on trn3
    ("NKI-MATMUL-E4M3FN", "nki", "trn2", None,
     _matmul_body(x="float8_e4m3fn", y="float8_e5m2", violation="matmul"),
     _matmul_body(x="float8_e4m3", y="float8_e5m2")),
    ("NKI-FP8-E4M3-MODE", "nki", "trn3", None,
     _matmul_body(x="float8_e4m3fn", y="float8_e4m3", violation="y"),
     _matmul_body(x="float8_e4m3fn", y="float8_e5m2")),
    ("NKI-MATMUL-ACC-INIT", "nki", "trn2", None,
     _matmul_body(before="nisa.memset(dst=acc, value=0.0)", violation="matmul"),
     _matmul_body()),
    ("NKI-TRANSPOSE-DTYPE", "nki", "trn2", None,
     """
        out = nl.ndarray((128, 128), dtype=nl.bfloat16, buffer=nl.shared_hbm)
        x = nl.ndarray((128, 128), dtype=nl.bfloat16, buffer=nl.sbuf)
        t = nl.ndarray((128, 128), dtype=nl.float32, buffer=nl.psum)
        nisa.nc_transpose(dst=t, data=x)  # VIOLATION
        """,
     """
        out = nl.ndarray((128, 128), dtype=nl.bfloat16, buffer=nl.shared_hbm)
        x = nl.ndarray((128, 128), dtype=nl.bfloat16, buffer=nl.sbuf)
        t = nl.ndarray((128, 128), dtype=nl.bfloat16, buffer=nl.psum)
        nisa.nc_transpose(dst=t, data=x)
        """),
    ("NKI-TENSOR-TENSOR-PSUM", "nki", "trn2", None,
     """
        out = nl.ndarray((128, 512), dtype=nl.float32, buffer=nl.shared_hbm)
        p = nl.ndarray((128, 512), dtype=nl.float32, buffer=nl.psum)
        q = nl.ndarray((128, 512), dtype=nl.float32, buffer=nl.psum)
        s = nl.ndarray((128, 512), dtype=nl.float32, buffer=nl.sbuf)
        nisa.tensor_tensor(dst=s, data1=p, data2=q, op=nl.add)  # VIOLATION
        """,
     """
        out = nl.ndarray((128, 512), dtype=nl.float32, buffer=nl.shared_hbm)
        p = nl.ndarray((128, 512), dtype=nl.float32, buffer=nl.psum)
        q = nl.ndarray((128, 512), dtype=nl.float32, buffer=nl.sbuf)
        s = nl.ndarray((128, 512), dtype=nl.float32, buffer=nl.sbuf)
        nisa.tensor_tensor(dst=s, data1=p, data2=q, op=nl.add)
        """),
    ("NKI-ACTIVATION-OP", "nki", "trn2", None,
     """
        out = nl.ndarray((128, 512), dtype=nl.float32, buffer=nl.shared_hbm)
        p = nl.ndarray((128, 512), dtype=nl.float32, buffer=nl.psum)
        s = nl.ndarray((128, 512), dtype=nl.float32, buffer=nl.sbuf)
        nisa.activation(dst=s, op=nl.identity, data=p)  # VIOLATION
        """,
     """
        out = nl.ndarray((128, 512), dtype=nl.float32, buffer=nl.shared_hbm)
        p = nl.ndarray((128, 512), dtype=nl.float32, buffer=nl.psum)
        s = nl.ndarray((128, 512), dtype=nl.float32, buffer=nl.sbuf)
        nisa.activation(dst=s, op=nl.copy, data=p)
        """),
    ("NKI-ACTIVATION-OP", "neuronxcc", "trn1", None,
     """
        out = nl.ndarray((128, 512), dtype=nl.float32, buffer=nl.shared_hbm)
        p = nl.zeros((128, 512), dtype=nl.float32, buffer=nl.psum)
        s = nisa.activation(op=nl.gelu_fast, data=p)  # VIOLATION
        """,
     """
        out = nl.ndarray((128, 512), dtype=nl.float32, buffer=nl.shared_hbm)
        p = nl.zeros((128, 512), dtype=nl.float32, buffer=nl.psum)
        s = nisa.activation(op=nl.gelu_apprx_tanh, data=p)
        """),
    ("NKI-ACTIVATION-OP", "neuronxcc", "trn2", None,
     """
        out = nl.ndarray((128, 512), dtype=nl.float32, buffer=nl.shared_hbm)
        p = nl.zeros((128, 512), dtype=nl.float32, buffer=nl.psum)
        s = nisa.activation(op=nl.prelu, data=p)  # VIOLATION
        """,
     """
        out = nl.ndarray((128, 512), dtype=nl.float32, buffer=nl.shared_hbm)
        p = nl.zeros((128, 512), dtype=nl.float32, buffer=nl.psum)
        s = nisa.activation(op=nl.relu, data=p)
        """),
    ("NKI-TENSOR-COPY", "nki", "trn2", None,
     """
        out = nl.ndarray((128, 512), dtype=nl.float32, buffer=nl.shared_hbm)
        s = nl.ndarray((128, 512), dtype=nl.float32, buffer=nl.sbuf)
        nisa.tensor_copy(dst=s, src=a)  # VIOLATION
        """,
     """
        out = nl.ndarray((128, 512), dtype=nl.float32, buffer=nl.shared_hbm)
        s = nl.ndarray((128, 512), dtype=nl.float32, buffer=nl.sbuf)
        nisa.dma_copy(dst=s, src=a)
        """),
    ("NKI-DMA-COPY-PSUM", "nki", "trn2", None,
     """
        out = nl.ndarray((128, 512), dtype=nl.float32, buffer=nl.shared_hbm)
        p = nl.ndarray((128, 512), dtype=nl.float32, buffer=nl.psum)
        nisa.dma_copy(dst=out, src=p)  # VIOLATION
        """,
     """
        out = nl.ndarray((128, 512), dtype=nl.float32, buffer=nl.shared_hbm)
        p = nl.ndarray((128, 512), dtype=nl.float32, buffer=nl.psum)
        s = nl.ndarray((128, 512), dtype=nl.float32, buffer=nl.sbuf)
        nisa.tensor_copy(dst=s, src=p)
        nisa.dma_copy(dst=out, src=s)
        """),
    ("NKI-DMA-TRANSPOSE-TARGET", "nki", "trn1", None,
     """
        out = nl.ndarray((128, 128), dtype=nl.bfloat16, buffer=nl.shared_hbm)
        t = nl.ndarray((128, 128), dtype=nl.bfloat16, buffer=nl.sbuf)
        nisa.dma_transpose(dst=t, src=a[0:128, 0:128])  # VIOLATION
        """,
     """
        out = nl.ndarray((128, 128), dtype=nl.bfloat16, buffer=nl.shared_hbm)
        t = nl.ndarray((128, 128), dtype=nl.bfloat16, buffer=nl.sbuf)
        p = nl.ndarray((128, 128), dtype=nl.bfloat16, buffer=nl.psum)
        nisa.dma_copy(dst=t, src=a[0:128, 0:128])
        nisa.nc_transpose(dst=p, data=t)
        """),
    ("NKI-DMA-TRANSPOSE-TARGET", "neuronxcc", "trn1", None,
     """
        out = nl.ndarray((128, 128), dtype=nl.bfloat16, buffer=nl.shared_hbm)
        t = nisa.dma_transpose(a[0:128, 0:128])  # VIOLATION
        """,
     """
        out = nl.ndarray((128, 128), dtype=nl.bfloat16, buffer=nl.shared_hbm)
        t = nl.load_transpose2d(a[0:128, 0:128])
        """),
    ("NKI-DMA-TRANSPOSE-DTYPE", "nki", "trn2", None,
     """
        out = nl.ndarray((128, 128), dtype=nl.float32, buffer=nl.shared_hbm)
        x = nl.ndarray((128, 128), dtype=nl.float32, buffer=nl.sbuf)
        t = nl.ndarray((128, 128), dtype=nl.float32, buffer=nl.sbuf)
        nisa.dma_transpose(dst=t, src=x)  # VIOLATION
        """,
     """
        out = nl.ndarray((128, 128), dtype=nl.float32, buffer=nl.shared_hbm)
        x = nl.ndarray((128, 128), dtype=nl.bfloat16, buffer=nl.sbuf)
        t = nl.ndarray((128, 128), dtype=nl.bfloat16, buffer=nl.sbuf)
        nisa.dma_transpose(dst=t, src=x)
        """),
    ("NKI-DMA-TRANSPOSE-DTYPE", "neuronxcc", "trn2", None,
     """
        out = nl.ndarray((128, 128), dtype=nl.float32, buffer=nl.shared_hbm)
        x = nl.ndarray((128, 128), dtype=nl.float32, buffer=nl.sbuf)
        t = nisa.dma_transpose(x)  # VIOLATION
        """,
     """
        out = nl.ndarray((128, 128), dtype=nl.float32, buffer=nl.shared_hbm)
        x = nl.ndarray((128, 128), dtype=nl.bfloat16, buffer=nl.sbuf)
        t = nisa.dma_transpose(x)
        """),
    ("NKI-DMA-TRANSPOSE-SHAPE", "nki", "trn2", None,  # last dimension > 128, any DGE mode
     """
        out = nl.ndarray((256, 64), dtype=nl.bfloat16, buffer=nl.shared_hbm)
        t = nl.ndarray((128, 2, 64), dtype=nl.bfloat16, buffer=nl.sbuf)
        nisa.dma_transpose(dst=out[0:256, 0:64], src=a[0:64, 0:256])  # VIOLATION
        """,
     """
        out = nl.ndarray((256, 64), dtype=nl.bfloat16, buffer=nl.shared_hbm)
        t = nl.ndarray((128, 2, 64), dtype=nl.bfloat16, buffer=nl.sbuf)
        for j in range(2):
            nisa.dma_transpose(dst=t[0:128, j, 0:64], src=a[0:64, 128 * j:128 * j + 128])
        """),
    ("NKI-DMA-TRANSPOSE-SHAPE", "nki", "trn2", None,  # hardware DGE: 2-D src.shape[0] must be 16
     """
        out = nl.ndarray((128, 32), dtype=nl.bfloat16, buffer=nl.shared_hbm)
        t = nl.ndarray((128, 32), dtype=nl.bfloat16, buffer=nl.sbuf)
        nisa.dma_transpose(dst=t, src=a[0:32, 0:128], dge_mode=nisa.dge_mode.hwdge)  # VIOLATION
        """,
     """
        out = nl.ndarray((128, 32), dtype=nl.bfloat16, buffer=nl.shared_hbm)
        t = nl.ndarray((128, 32), dtype=nl.bfloat16, buffer=nl.sbuf)
        nisa.dma_transpose(dst=t[0:128, 0:16], src=a[0:16, 0:128], dge_mode=nisa.dge_mode.hwdge)
        nisa.dma_transpose(dst=t[0:128, 16:32], src=a[16:32, 0:128])
        """),
    ("NKI-DMA-TRANSPOSE-SHAPE", "nki", "trn3", None,  # hardware DGE: last dimension a multiple of 128
     """
        out = nl.ndarray((64, 16), dtype=nl.bfloat16, buffer=nl.shared_hbm)
        t = nl.ndarray((64, 16), dtype=nl.bfloat16, buffer=nl.sbuf)
        nisa.dma_transpose(dst=t, src=a[0:16, 0:64], dge_mode=nisa.dge_mode.hwdge)  # VIOLATION
        """,
     """
        out = nl.ndarray((64, 16), dtype=nl.bfloat16, buffer=nl.shared_hbm)
        t = nl.ndarray((64, 16), dtype=nl.bfloat16, buffer=nl.sbuf)
        nisa.dma_transpose(dst=t, src=a[0:16, 0:64])
        """),
    ("NKI-DMA-TRANSPOSE-SHAPE", "nki", "trn2", None,  # hardware DGE, 3-D: shape[0] in {1, 2, 4, 8, 16}
     """
        out = nl.ndarray((128, 8, 3), dtype=nl.bfloat16, buffer=nl.shared_hbm)
        nisa.dma_transpose(dst=out, src=a[0:3, 0:8, 0:128], dge_mode=nisa.dge_mode.hwdge)  # VIOLATION
        """,
     """
        out = nl.ndarray((128, 8, 2), dtype=nl.bfloat16, buffer=nl.shared_hbm)
        nisa.dma_transpose(dst=out, src=a[0:2, 0:8, 0:128], dge_mode=nisa.dge_mode.hwdge)
        """),
    ("NKI-DMA-TRANSPOSE-SHAPE", "nki", "trn2", None,  # software DGE is for indirect (.ap) sources only
     """
        out = nl.ndarray((128, 64), dtype=nl.bfloat16, buffer=nl.shared_hbm)
        t = nl.ndarray((128, 64), dtype=nl.bfloat16, buffer=nl.sbuf)
        nisa.dma_transpose(dst=t, src=a[0:64, 0:128], dge_mode=nisa.dge_mode.swdge)  # VIOLATION
        """,
     """
        out = nl.ndarray((128, 64), dtype=nl.bfloat16, buffer=nl.shared_hbm)
        t = nl.ndarray((128, 64), dtype=nl.bfloat16, buffer=nl.sbuf)
        nisa.dma_transpose(dst=t, src=a[0:64, 0:128], dge_mode=nisa.dge_mode.none)
        """),
    ("NKI-DMA-TRANSPOSE-SHAPE", "nki", "trn2", None,  # dst is not src transposed
     """
        out = nl.ndarray((128, 64), dtype=nl.bfloat16, buffer=nl.shared_hbm)
        t = nl.ndarray((128, 128), dtype=nl.bfloat16, buffer=nl.sbuf)
        nisa.dma_transpose(dst=t[0:64, 0:128], src=a[0:64, 0:128])  # VIOLATION
        """,
     """
        out = nl.ndarray((128, 64), dtype=nl.bfloat16, buffer=nl.shared_hbm)
        t = nl.ndarray((128, 128), dtype=nl.bfloat16, buffer=nl.sbuf)
        nisa.dma_transpose(dst=t[0:128, 0:64], src=a[0:64, 0:128])
        """),
    ("NKI-PSUM-ALIGN", "nki", "trn2", None,
     """
        out = nl.ndarray((128, 512), dtype=nl.float32, buffer=nl.shared_hbm)
        acc = nl.ndarray((128, 512), dtype=nl.float32, buffer=nl.psum, address=(0, 1024))  # VIOLATION
        """,
     """
        out = nl.ndarray((128, 512), dtype=nl.float32, buffer=nl.shared_hbm)
        acc = nl.ndarray((128, 512), dtype=nl.float32, buffer=nl.psum, address=(0, 3 * 2048))
        """),
    ("NKI-ACTIVATION-DTYPE", "nki", "trn2", None,
     """
        out = nl.ndarray((128, 512), dtype=nl.float32, buffer=nl.shared_hbm)
        p = nl.ndarray((128, 512), dtype=nl.float32, buffer=nl.psum)
        nisa.activation(dst=out, op=nl.silu, data=p)  # VIOLATION
        """,
     """
        out = nl.ndarray((128, 512), dtype=nl.float32, buffer=nl.shared_hbm)
        p = nl.ndarray((128, 512), dtype=nl.float32, buffer=nl.psum)
        s = nl.ndarray((128, 512), dtype=nl.bfloat16, buffer=nl.sbuf)
        nisa.activation(dst=s, op=nl.silu, data=p)
        nisa.dma_copy(dst=out, src=s)
        """),
    ("NKI-DYNAMIC-LOOP", "nki", "trn2", "2.33",
     """
        out = nl.ndarray((128, 512), dtype=nl.float32, buffer=nl.shared_hbm)
        t = nl.ndarray((128, 512), dtype=nl.float32, buffer=nl.sbuf)
        for i in nl.dynamic_range(4):  # VIOLATION
            nisa.dma_copy(dst=t, src=a[0:128, 0:512])
        """,
     """
        out = nl.ndarray((128, 512), dtype=nl.float32, buffer=nl.shared_hbm)
        t = nl.ndarray((128, 512), dtype=nl.float32, buffer=nl.sbuf)
        for i in range(4):
            nisa.dma_copy(dst=t, src=a[0:128, 0:512])
        """),
    ("NKI-LANG-WRAPPERS", "nki", "trn2", "2.28",
     """
        out = nl.ndarray((128, 512), dtype=nl.float32, buffer=nl.shared_hbm)
        t = nl.load(a[0:128, 0:512])  # VIOLATION
        """,
     """
        out = nl.ndarray((128, 512), dtype=nl.float32, buffer=nl.shared_hbm)
        t = nl.ndarray((128, 512), dtype=nl.float32, buffer=nl.sbuf)
        nisa.dma_copy(dst=t, src=a[0:128, 0:512])
        """),
    ("NKI-LOAD-TRANSPOSE2D", "neuronxcc", "trn1", None,
     """
        out = nl.ndarray((256, 128), dtype=nl.bfloat16, buffer=nl.shared_hbm)
        t = nl.load_transpose2d(a[0:128, 0:256])  # VIOLATION
        """,
     """
        out = nl.ndarray((256, 128), dtype=nl.bfloat16, buffer=nl.shared_hbm)
        t = nl.load_transpose2d(a[0:256, 0:128])
        """),
    ("NKI-LOAD-TRANSPOSE2D", "nki", "trn2", None,
     """
        out = nl.ndarray((256, 128), dtype=nl.bfloat16, buffer=nl.shared_hbm)
        t = nl.load_transpose2d(a[0:128, 0:256])  # VIOLATION
        """,
     """
        out = nl.ndarray((256, 128), dtype=nl.bfloat16, buffer=nl.shared_hbm)
        t = nl.load_transpose2d(a[0:256, 0:128])
        """),
    # NKI 0.8.0 (SDK 2.34) moves the LNC exchange to nki.lnc (no pipe_id): the old spelling is flagged there, the new
    # one before it
    ("NKI-ISA-LNC-DEPRECATED", "nki", "trn2", "2.34",
     """
        out = nl.ndarray((128, 512), dtype=nl.bfloat16, buffer=nl.shared_hbm)
        t = nl.ndarray((128, 512), dtype=nl.bfloat16, buffer=nl.sbuf)
        r = nl.ndarray((128, 512), dtype=nl.bfloat16, buffer=nl.sbuf)
        nisa.sendrecv(src=t, dst=r, send_to_rank=1, recv_from_rank=1, pipe_id=0)  # VIOLATION
        """,
     """
        out = nl.ndarray((128, 512), dtype=nl.bfloat16, buffer=nl.shared_hbm)
        t = nl.ndarray((128, 512), dtype=nl.bfloat16, buffer=nl.sbuf)
        r = nl.ndarray((128, 512), dtype=nl.bfloat16, buffer=nl.sbuf)
        nki.lnc.sendrecv(src=t, dst=r, send_to_rank=1, recv_from_rank=1)
        """),
    ("NKI-LNC-MODULE", "nki", "trn2", "2.33",
     """
        out = nl.ndarray((128, 512), dtype=nl.bfloat16, buffer=nl.shared_hbm)
        t = nl.ndarray((128, 512), dtype=nl.bfloat16, buffer=nl.sbuf)
        r = nl.ndarray((128, 512), dtype=nl.bfloat16, buffer=nl.sbuf)
        nki.lnc.sendrecv(src=t, dst=r, send_to_rank=1, recv_from_rank=1)  # VIOLATION
        """,
     """
        out = nl.ndarray((128, 512), dtype=nl.bfloat16, buffer=nl.shared_hbm)
        t = nl.ndarray((128, 512), dtype=nl.bfloat16, buffer=nl.sbuf)
        r = nl.ndarray((128, 512), dtype=nl.bfloat16, buffer=nl.sbuf)
        nisa.sendrecv(src=t, dst=r, send_to_rank=1, recv_from_rank=1, pipe_id=0)
        """),
    ("NKI-VIRTUAL-REGISTER", "nki", "trn2", "2.34",
     """
        out = nl.ndarray((1, 1), dtype=nl.int32, buffer=nl.shared_hbm)
        t = nl.ndarray((1, 1), dtype=nl.int32, buffer=nl.sbuf)
        count = nisa.register_alloc(4)  # VIOLATION
        """,
     """
        out = nl.ndarray((1, 1), dtype=nl.int32, buffer=nl.shared_hbm)
        t = nl.ndarray((1, 1), dtype=nl.int32, buffer=nl.sbuf)
        count = nisa.scalar_load(t)
        """),
    ("NKI-LOCAL-GATHER-VALID", "nki", "trn3", "2.34",
     """
        out = nl.ndarray((128, 64), dtype=nl.bfloat16, buffer=nl.shared_hbm)
        src = nl.ndarray((128, 512), dtype=nl.bfloat16, buffer=nl.sbuf)
        idx = nl.ndarray((128, 4), dtype=nl.uint16, buffer=nl.sbuf)
        g = nl.ndarray((128, 64), dtype=nl.bfloat16, buffer=nl.sbuf)
        nisa.local_gather(dst=g, src_buffer=src, index=idx, num_elem_per_idx=16)  # VIOLATION
        """,
     """
        out = nl.ndarray((128, 64), dtype=nl.bfloat16, buffer=nl.shared_hbm)
        src = nl.ndarray((128, 512), dtype=nl.bfloat16, buffer=nl.sbuf)
        idx = nl.ndarray((128, 4), dtype=nl.uint16, buffer=nl.sbuf)
        g = nl.ndarray((128, 64), dtype=nl.bfloat16, buffer=nl.sbuf)
        nisa.local_gather(dst=g, src_buffer=src, index=idx, num_elem_per_idx=16, num_valid_indices=4)
        """),
    ("NKI-BENCHMARK", "nki", "trn2", None,
     """
        out = nl.ndarray((128, 128), dtype=nl.float32, buffer=nl.shared_hbm)
        timer = nki.benchmark  # VIOLATION
        """,
     """
        out = nl.ndarray((128, 128), dtype=nl.float32, buffer=nl.shared_hbm)
        """),
    # MX (docs/mx.md): a quantize_mx on trn2; a moving operand of bf16; an FP4 quantize_mx output; a scale tile of
    # bfloat16; a float8_e8m0fnu scale tile on SDK 2.29 (uint8 there)
    ("NKI-MX-TARGET", "nki", "trn2", None, _mx_body(violation="quantize"), _mx_body(target_ok=True)),
    ("NKI-MX-MATMUL-TILE", "nki", "trn3", None, _mx_body(moving="bfloat16", violation="matmul"), _mx_body()),
    ("NKI-MX-QUANTIZE-TILE", "nki", "trn3", None, _mx_body(quantized="float4_e2m1fn_x4", violation="quantize"),
     _mx_body()),
    ("NKI-MX-SCALE-LAYOUT", "nki", "trn3", None, _mx_body(scale="bfloat16", violation="quantize"), _mx_body()),
    ("NKI-MX-SCALE-DTYPE", "nki", "trn3", "2.29", _mx_body(scale="float8_e8m0fnu", violation="quantize"),
     _mx_body()),
    # an MX tile of float8_e4m3fn_x4 is OCP E4M3: a legacy float8_e4m3 tile beside it mixes the two modes
    ("NKI-FP8-E4M3-MODE", "nki", "trn3", None,
     _mx_body() + "\nlegacy = nl.ndarray((128, 64), dtype=nl.float8_e4m3, buffer=nl.sbuf)  # VIOLATION",
     _mx_body() + "\nlegacy = nl.ndarray((128, 64), dtype=nl.float8_e5m2, buffer=nl.sbuf)"),
]


def _marked_line(source: str) -> int:
    return next(i for i, line in enumerate(source.splitlines(), 1) if "# VIOLATION" in line)


def _pairing(dialect: str, target: str, sdk: str | None) -> list:
    """The violations of an empty kernel: what the dialect x target x SDK pairing itself breaks (reported at the
    imports, e.g. NKI-DIALECT-SDK for the nki dialect on SDK 2.28), whatever the body."""
    return check_kernel_source(_kernel(dialect, "out = a"), dialect=dialect, target=target, sdk=sdk)


@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{c[0]}-{c[1]}")
def test_mutation(case):
    rule_id, dialect, target, sdk, bad, good = case
    assert dialect in {d.value for d in RULES_BY_ID[rule_id].dialects}
    bad_source, good_source = _kernel(dialect, bad), _kernel(dialect, good)
    found = check_kernel_source(bad_source, dialect=dialect, target=target, sdk=sdk)
    assert (rule_id, _marked_line(bad_source)) in {(v.rule_id, v.line) for v in found}, found
    assert all(v.citation == RULES_BY_ID[v.rule_id].citation for v in found)
    assert check_kernel_source(good_source, dialect=dialect, target=target, sdk=sdk) == _pairing(dialect, target, sdk)


def test_every_checkable_rule_has_a_mutation_test_in_each_dialect():
    covered = {(c[0], c[1]) for c in CASES} | {
        ("NKI-NEURONXCC-IMPORT", "neuronxcc"), ("NKI-DIALECT-TRN1", "nki"), ("NKI-DIALECT-SDK", "nki")}
    for rule in RULES:
        if rule.checkable:
            for dialect in rule.dialects:
                assert (rule.id, dialect.value) in covered, (rule.id, dialect.value)


def test_neuronxcc_imports_are_errors_from_sdk_2_30():
    source = _kernel("neuronxcc", "out = nl.ndarray((128, 128), dtype=nl.float32, buffer=nl.shared_hbm)")
    found = check_kernel_source(source, dialect="neuronxcc", target="trn2", sdk="2.30")
    assert [(v.rule_id, v.line) for v in found] == [("NKI-NEURONXCC-IMPORT", n) for n in (1, 2, 3)]
    assert check_kernel_source(source, dialect="neuronxcc", target="trn2", sdk="2.29") == []


def test_nki_dialect_on_trn1_is_flagged_from_sdk_2_29():
    body = "out = nl.ndarray((128, 128), dtype=nl.float32, buffer=nl.shared_hbm)"
    found = check_kernel_source(_kernel("nki", body), dialect="nki", target="trn1", sdk="2.29")
    assert [(v.rule_id, v.line) for v in found] == [("NKI-DIALECT-TRN1", 1)]
    # the conservative correction: the NKI 0.1 dialect on an SDK that still accepts it
    assert check_kernel_source(_kernel("neuronxcc", body), dialect="neuronxcc", target="trn1", sdk="2.29") == []
    assert check_kernel_source(_kernel("nki", body), dialect="nki", target="trn2", sdk="2.29") == []


def test_nki_dialect_before_sdk_2_29_is_flagged():
    """Issue 28, item 8: the support matrix starts the nki dialect at SDK 2.29 (NKI 0.3.0); before it, the import
    line is a violation of NKI-DIALECT-SDK, once, on every target."""
    body = "out = nl.ndarray((128, 128), dtype=nl.float32, buffer=nl.shared_hbm)"
    for sdk in ("2.26", "2.27", "2.28"):
        for target in ("trn2", "trn3"):
            found = check_kernel_source(_kernel("nki", body), dialect="nki", target=target, sdk=sdk)
            assert [(v.rule_id, v.line) for v in found] == [("NKI-DIALECT-SDK", 1)], (sdk, target)
    for sdk in (None, "2.29", "2.33", "2.34"):
        assert check_kernel_source(_kernel("nki", body), dialect="nki", target="trn2", sdk=sdk) == []
    # the neuronxcc dialect is not bounded by it
    assert check_kernel_source(_kernel("neuronxcc", body), dialect="neuronxcc", target="trn2", sdk="2.26") == []


def test_the_exchange_spelling_is_checked_per_release():
    """NKI 0.8.0 (SDK 2.34): nisa.sendrecv / sendrecv_compute / core_barrier are deprecated for nki.lnc's (flagged
    from 2.34, also spelled nki.isa.*); nki.lnc, and its import, do not exist before 2.34 (flagged on 2.29 to 2.33);
    without an SDK neither is checked."""
    tiles = """
        out = nl.ndarray((128, 512), dtype=nl.bfloat16, buffer=nl.shared_hbm)
        t = nl.ndarray((128, 512), dtype=nl.bfloat16, buffer=nl.sbuf)
        r = nl.ndarray((128, 512), dtype=nl.bfloat16, buffer=nl.sbuf)
        """
    old = tiles + """
        nisa.sendrecv(src=t, dst=r, send_to_rank=1, recv_from_rank=1, pipe_id=0)
        nki.isa.core_barrier(data=out, cores=(0, 1))
        nisa.sendrecv_compute(src=t, dst=r, send_to_rank=1, recv_from_rank=1, reduce_op=nl.add)
        """
    new = tiles + """
        nki.lnc.sendrecv(src=t, dst=r, send_to_rank=1, recv_from_rank=1)
        """

    def rules(body: str, sdk: str | None, extra: str = "") -> list[str]:
        source = _kernel("nki", body).replace("import nki.language as nl\n", "import nki.language as nl\n" + extra)
        return [v.rule_id for v in check_kernel_source(source, dialect="nki", target="trn2", sdk=sdk)]

    assert rules(old, "2.34") == ["NKI-ISA-LNC-DEPRECATED"] * 3
    for sdk in (None, "2.29", "2.33"):
        assert rules(old, sdk) == [] and rules(new, "2.34", "import nki.lnc\n") == []
    assert rules(new, "2.33", "import nki.lnc\n") == ["NKI-LNC-MODULE"] * 2  # the import line and the call
    assert rules(new, None) == [] and rules(new, "2.29") == ["NKI-LNC-MODULE"]


def test_dynamic_range_is_flagged_from_sdk_2_33():
    body = """
        out = nl.ndarray((128, 128), dtype=nl.float32, buffer=nl.shared_hbm)
        for i in nl.dynamic_range(4):
            out = a
        """
    assert [v.rule_id for v in check_kernel_source(_kernel("nki", body), dialect="nki", target="trn3",
                                                   sdk="2.33")] == ["NKI-DYNAMIC-LOOP"]
    for sdk in (None, "2.32"):  # deprecated in 2.32, removed in 2.33
        assert check_kernel_source(_kernel("nki", body), dialect="nki", target="trn3", sdk=sdk) == []


def test_nl_wrappers_are_flagged_only_on_nki_0_2():
    body = """
        out = nl.ndarray((128, 512), dtype=nl.float32, buffer=nl.shared_hbm)
        t = nl.load(a[0:128, 0:512])
        """
    # SDK 2.28 predates the nki dialect as nmmc prints it (NKI-DIALECT-SDK, at the import line) as well
    assert [v.rule_id for v in check_kernel_source(_kernel("nki", body), dialect="nki", target="trn2",
                                                   sdk="2.28")] == ["NKI-DIALECT-SDK", "NKI-LANG-WRAPPERS"]
    for sdk in (None, "2.29", "2.32", "2.33", "2.34"):
        assert check_kernel_source(_kernel("nki", body), dialect="nki", target="trn2", sdk=sdk) == []


def test_dma_transpose_shapes_that_are_not_constant_or_indirect_are_not_guessed_about():
    body = """
        out = nl.ndarray((128, 512), dtype=nl.bfloat16, buffer=nl.shared_hbm)
        t = nl.ndarray((128, 512), dtype=nl.bfloat16, buffer=nl.sbuf)
        for m in range(3):
            nisa.dma_transpose(dst=t[0:128, 0:min(512, 700 - 512 * m)], src=a[512 * m:min(512 * m + 512, 700), 0:128],
                               dge_mode=nisa.dge_mode.hwdge)
        nisa.dma_transpose(dst=t, src=a.ap(pattern=[[512, 128], [1, 512]]), dge_mode=nisa.dge_mode.swdge)
        """
    # a min(...) bound is not a constant width, .ap() (an access pattern, maybe indirect) and nl.mgrid indices
    # (arrays, not one integer) are left alone
    body += """
        ip, jf = nl.mgrid[0:16, 0:256]
        nisa.dma_transpose(dst=t, src=a[ip, jf], dge_mode=nisa.dge_mode.hwdge)
        """
    assert check_kernel_source(_kernel("nki", body), dialect="nki", target="trn2") == []
    constant = body.replace("min(512 * m + 512, 700)", "512 * m + 512")
    found = check_kernel_source(_kernel("nki", constant), dialect="nki", target="trn2")
    assert [v.rule_id for v in found] == ["NKI-DMA-TRANSPOSE-SHAPE"] and "src.shape[0] == 512" in found[0].message


def test_operands_of_unknown_dtype_or_buffer_are_not_guessed_about():
    body = """
        out = nl.ndarray((128, 512), dtype=nl.float32, buffer=nl.shared_hbm)
        x = nl.ndarray((128, 128), dtype=a.dtype, buffer=nl.sbuf)
        y = nl.ndarray((128, 512), dtype=b.dtype)
        acc = nl.ndarray((128, 512), dtype=nl.float32, buffer=nl.psum)
        nisa.nc_matmul(dst=acc, stationary=x, moving=y)
        t = nl.ndarray((128, 128), dtype=a.dtype, buffer=nl.sbuf)
        nisa.dma_transpose(dst=t, src=a[0:128, 0:128])
        """
    assert check_kernel_source(_kernel("nki", body), dialect="nki", target="trn2") == []


def test_kernel_argument_dtypes_come_from_the_metadata_line():
    body = """
        out = nl.ndarray((128, 128), dtype=nl.float32, buffer=nl.shared_hbm)
        t = nl.ndarray((128, 128), dtype=nl.float32, buffer=nl.sbuf)
        nisa.dma_transpose(dst=t, src=a[0:128, 0:128])  # VIOLATION
        """
    meta = '# nmmc-metadata: {"inputs": [{"name": "a", "dtype": "float32", "shape": [128, 128]}]}\n'
    source = meta + _kernel("nki", body)
    found = check_kernel_source(source, dialect="nki", target="trn2")
    assert [(v.rule_id, v.line) for v in found] == [("NKI-DMA-TRANSPOSE-DTYPE", _marked_line(source))]


def test_an_unknown_target_is_an_error():
    with pytest.raises(ValueError, match="unknown target"):
        check_kernel_source("", dialect="nki", target="trn9")


#: Rules the emitter has been fixed to obey: no emitted kernel may violate them again.
FIXED_IN_THE_EMITTER = ("NKI-AFFINE-WRITE-RACE", "NKI-PSUM-TILE-FMAX", "NKI-DMA-TRANSPOSE-TARGET",
                        "NKI-DMA-TRANSPOSE-DTYPE", "NKI-DMA-TRANSPOSE-SHAPE", "NKI-LIST-INDEX-STATIC")


@pytest.mark.parametrize("rule", FIXED_IN_THE_EMITTER)
def test_no_golden_kernel_violates_a_rule_the_emitter_obeys(rule):
    """Issue 12: the legacy MLP kernels once allocated their epilogue scratch (act_f32) above an affine_range
    loop and wrote it in every iteration (finding 2); multi-bank PSUM accumulators were one tile (finding 1);
    nisa.dma_transpose was emitted on trn1 and for fp32 (finding 3)."""
    from neuronmm_compiler.codegen import read_metadata

    kernels = sorted((Path(__file__).parent / "golden" / "kernels").glob("*.py"))
    assert len(kernels) >= 60
    found = []
    for path in kernels:
        source = path.read_text()
        meta = read_metadata(source)
        found += [(path.name, v.line) for v in check_kernel_source(source, dialect=meta.dialect, target=meta.target)
                  if v.rule_id == rule]
    assert not found, found

"""nmmc verify runs only the NKI subset nmmc emits (verification/sandbox.py), and refuses files it
should not read (a FIFO, /dev/zero, a binary file) and negative seeds, each with one error line.

Every escape attempt is a golden kernel with one injected line; verify must refuse it with exit 2
and one ``nmmc: error:`` line naming that line, before any of the file runs (no marker file, no
other side effect).
"""

from __future__ import annotations

import os
import re
import warnings
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from neuronmm_compiler.cli import main
from neuronmm_compiler.interpreter import run_kernel
from neuronmm_compiler.interpreter.loader import KERNEL_BUILTINS
from neuronmm_compiler.targets import get_target
from neuronmm_compiler.verification import MAX_KERNEL_BYTES, sandbox, verify_file

KERNELS = Path(__file__).parent / "golden" / "kernels"
NKI_KERNEL = KERNELS / "gemm-pe-transpose-psum-nki.py"
LEGACY_KERNEL = KERNELS / "gemm-pe-transpose-psum-neuronxcc.py"
MARK = "pwned"
SUFFIX = "is not part of the NKI subset nmmc verifies"

#: (id, where the line goes: "module" after the imports or "kernel" before the kernel's return, the line)
ESCAPES = [
    ("open-write-module", "module", f"open('{MARK}', 'w').write('x')"),
    ("open-write-kernel", "kernel", f"open('{MARK}', 'w').write('x')"),
    ("open-assigned", "kernel", f"handle = open('{MARK}', 'w')"),
    ("ctypes-cdll", "kernel", f"np.ctypeslib.ctypes.CDLL(None).system(b'touch {MARK}')"),
    ("ctypes-assigned", "kernel", "lib = np.ctypeslib"),
    ("subclasses", "kernel", "classes = ().__class__.__base__.__subclasses__()"),
    ("dunder-import", "kernel", f"__import__('os').system('touch {MARK}')"),
    ("getattr-dunder", "kernel", "g = getattr(nl, '__dict__')"),
    ("eval", "kernel", f"eval(\"open('{MARK}', 'w')\")"),
    ("exec", "module", f"exec(\"open('{MARK}', 'w')\")"),
    ("globals", "kernel", "b = globals()"),
    ("builtins-name", "kernel", "b = __builtins__"),
    ("lambda", "kernel", f"f = lambda: open('{MARK}', 'w')"),
    ("nested-def", "kernel", "def helper(): return 0"),
    ("module-def-called", "module", f"def helper(): return open('{MARK}', 'w')"),
    ("import-os", "module", "import os"),
    ("import-os-kernel", "kernel", "import os"),
    ("from-import", "module", "from os import system"),
    ("import-as-alias", "module", "import subprocess as nl2"),
    ("import-numpy-submodule", "module", "import numpy.ctypeslib as npc"),
    ("import-nki-as-other-name", "module", "import nki.language as language"),
    ("relative-import", "module", "from . import kernel"),
    ("future-import", "module", "from __future__ import annotations"),
    ("numpy-lib", "kernel", "m = np.lib"),
    ("numpy-os-chain", "kernel", "s = np.lib.format.os.system"),
    ("numpy-load", "kernel", f"data = np.load('{MARK}')"),
    ("numpy-save", "kernel", f"np.save('{MARK}', np.asarray(x))"),
    ("numpy-fromfile", "kernel", "data = np.fromfile('/etc/passwd')"),
    ("numpy-tofile", "kernel", f"np.asarray(x).tofile('{MARK}')"),
    ("rebind-alias", "kernel", "nl = np"),
    ("rebind-builtin", "kernel", "range = open"),
    ("fstring-dunder", "kernel", "s = f'{x.__class__}'"),
    ("fstring-format-spec", "kernel", "s = f'{x!r:>10}'"),
    ("str-format", "kernel", "s = '{0.__class__}'.format(x)"),
    ("class-def", "module", "class Evil: pass"),
    ("breakpoint", "kernel", "breakpoint()"),
    ("comprehension", "kernel", f"r = [open('{MARK}', 'w') for i in range(1)]"),
    ("walrus", "kernel", "t = (n := 1)"),
    ("with", "kernel", f"with open('{MARK}', 'w'): pass"),
    ("try", "kernel", "try: y = y\nexcept Exception: pass"),
    ("while", "kernel", "while False: pass"),
    ("stand-in-globals", "kernel", "g = nisa.dma_copy.__globals__"),
    ("stand-in-wrapped", "kernel", "g = nisa.dma_copy.__wrapped__"),
    ("op-attribute", "kernel", "c = nl.silu.call"),
    ("unknown-nki", "kernel", "nisa.iota(dst=y)"),
    ("star-args", "kernel", "t = tuple(*x.shape)"),
    ("kwargs-splat", "kernel", "t = nl.ndarray((1,), **dict(dtype=nl.float32))"),
    ("fullwidth-open", "kernel", f"\uff4f\uff50\uff45\uff4e('{MARK}', 'w')"),
    ("string-repeat", "kernel", "s = 'x' * 10"),
    ("bytes-literal", "kernel", "s = len(b'x')"),
    ("power", "kernel", "n = 10 ** 10"),
    ("if", "kernel", "if x: pass"),
    ("global", "kernel", "global np"),
    ("del", "kernel", "del x"),
    ("attribute-store", "kernel", "x.shape = 1"),
    ("vars", "kernel", "v = vars(nl)"),
    ("type-call", "kernel", "t = type(x)"),
    ("print", "kernel", "print(x)"),
    ("input", "kernel", "s = input()"),
]


def _inject(source: str, where: str, code: str) -> tuple[str, int]:
    """The source with ``code`` inserted, and the number of its first line."""
    lines = source.splitlines(keepends=True)
    if where == "module":
        at = lines.index("import numpy as np\n") + 1
        indent = ""
    else:
        at = next(i for i, line in enumerate(lines) if line.startswith("    return "))
        indent = "    "
    block = "".join(indent + line + "\n" for line in code.splitlines())
    return "".join([*lines[:at], block, *lines[at:]]), at + 1


def _verify(path: Path, *args: str):
    return CliRunner().invoke(main, ["verify", str(path), *args])


def _one_error_line(result) -> str:
    assert "Traceback" not in result.output + result.stderr
    assert result.exit_code == 2, (result.exit_code, result.stdout, result.stderr)
    assert result.stdout == ""
    assert result.stderr.startswith("nmmc: error: ") and result.stderr.count("\n") == 1, result.stderr
    return result.stderr.rstrip("\n")


@pytest.mark.parametrize(("where", "code"), [(w, c) for _, w, c in ESCAPES], ids=[i for i, _, _ in ESCAPES])
def test_an_escape_attempt_is_refused_before_anything_runs(tmp_path, monkeypatch, where, code):
    monkeypatch.chdir(tmp_path)
    source, line = _inject(NKI_KERNEL.read_text(), where, code)
    kernel = tmp_path / "kernel.py"
    kernel.write_text(source)
    before = sorted(p.name for p in tmp_path.iterdir())

    message = _one_error_line(_verify(kernel))

    assert re.fullmatch(rf"nmmc: error: {re.escape(str(kernel))} line {line}: .+ {SUFFIX}", message), message
    assert not (tmp_path / MARK).exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == before


def test_there_are_enough_escape_attempts():
    assert len(ESCAPES) >= 15


def test_a_decorator_other_than_nki_jit_is_refused(tmp_path):
    source = NKI_KERNEL.read_text()
    assert source.count("@nki.jit\n") == 1
    kernel = tmp_path / "kernel.py"
    kernel.write_text(source.replace("@nki.jit\n", "@nki.jit\n@np.vectorize\n"))
    message = _one_error_line(_verify(kernel))
    assert message.endswith(f"the decorator @np.vectorize {SUFFIX}")


def test_a_default_argument_is_refused(tmp_path):
    source = LEGACY_KERNEL.read_text()
    match = re.search(r"^def \w+\([^)]*", source, re.MULTILINE)
    assert match
    kernel = tmp_path / "kernel.py"
    kernel.write_text(source.replace(match.group(0), f"{match.group(0)}=open", 1))
    name = match.group(0)[4:].partition("(")[0]
    message = _one_error_line(_verify(kernel))
    assert message.endswith(f"a default, keyword-only or variadic parameter of {name} {SUFFIX}")


def test_the_message_names_the_construct(tmp_path):
    source, line = _inject(NKI_KERNEL.read_text(), "kernel", f"open('{MARK}', 'w').write('x')")
    kernel = tmp_path / "kernel.py"
    kernel.write_text(source)
    assert _one_error_line(_verify(kernel)) == (
        f"nmmc: error: {kernel} line {line}: a call of open('{MARK}', 'w').write {SUFFIX}")
    source, line = _inject(NKI_KERNEL.read_text(), "module", "import os")
    kernel.write_text(source)
    assert _one_error_line(_verify(kernel)) == (
        f"nmmc: error: {kernel} line {line}: 'import os' (a kernel imports only numpy as np and its NKI "
        f"modules as nki, nisa, nl, and nki.lnc) {SUFFIX}")


@pytest.mark.parametrize("code", ["t = " + "-" * 200000 + "1", "t = " + "1 + " * 100000 + "1",
                                  "t = " + "(" * 150 + "1" + ")" * 150 + " + " + "-" * 2000 + "1"],
                         ids=["unary-200000", "binary-100000", "parenthesized"])
def test_deep_nesting_is_one_error_line(tmp_path, code):
    source, _ = _inject(NKI_KERNEL.read_text(), "kernel", code)
    kernel = tmp_path / "kernel.py"
    kernel.write_text(source)
    assert re.fullmatch(rf"nmmc: error: {re.escape(str(kernel))}:? .*(nest|parse).*", _one_error_line(_verify(kernel)))


def test_the_simulator_backend_gets_the_static_check_too():
    from neuronmm_compiler.verification import verify_source

    source, line = _inject(NKI_KERNEL.read_text(), "kernel", f"open('{MARK}', 'w')")
    with pytest.raises(sandbox.SandboxError, match=f"^k.py line {line}: a call of open {SUFFIX}$"):
        verify_source(source, filename="k.py", backend="nki-simulator")


# ----------------------------------------------------------------------------- the golden corpus passes

GOLDEN = sorted(KERNELS.glob("*.py"))
#: a dozen quick ones, both dialects, every kind (GEMM, chain, graph, MLP, tuned, ragged, decode)
REPRESENTATIVE = [
    "chain-decode-1x4096x4096-rank512", "chain-ragged-77x1000x600-rank256", "chain-pe-cacheall-neuronxcc",
    "gemm-km-1024x1024x512-neuronxcc", "gemm-km-1024x1024x512-nki", "gemm-pe-transpose-psum-neuronxcc",
    "gemm-ragged-tiles-200x700x300-trn3", "gemm-decode-1x4096x4096-trn2", "graph-lora-decode-trn2",
    "graph-lora-neuronxcc", "graph-three_factor_chain-decode-trn2", "mlp-decode-1-ranks", "tuned-graph-lora",
]


def test_every_golden_kernel_passes_the_static_check():
    assert len(GOLDEN) >= 60
    for path in GOLDEN:
        sandbox.check_source(path.read_text(), str(path))


@pytest.mark.parametrize("name", REPRESENTATIVE)
def test_golden_kernels_still_verify(name):
    report = verify_file(KERNELS / f"{name}.py")
    assert report.ok, report.error


def test_the_allowlist_follows_the_stand_ins_and_the_reference():
    attrs = sandbox.module_attributes()
    assert {"nl.load", "nl.store", "nl.tile_size.pmax"} <= attrs["neuronxcc.nki.language"]
    assert "nl.load" not in attrs["nki.language"]
    assert {"nisa.nc_matmul", "nisa.dma_copy", "nisa.memset"} <= attrs["nki.isa"]
    assert "nki.jit" in attrs["nki"] and "nki.jit" in attrs["neuronxcc.nki"]
    fp8 = {"np.float32", "np.clip", "np.exp2", "np.maximum", "np.frexp", "np.round"}  # ir/fp8.py's quantize
    fp8 |= {"np.max", "np.abs"}  # and its row_scale
    norms = {"np.sqrt", "np.mean"}  # the norm prologue's reference
    mx = {"np.frombuffer", "np.ascontiguousarray", "np.uint8", "np.int64", "np.reshape", "np.stack", "np.where",
          "np.repeat", "np.transpose"}  # an MX weight's real matrix and quantize_mx (codegen/mx.py)
    assert attrs["numpy"] == {"np.asarray", "np.float64", "np.exp"} | fp8 | norms | mx
    assert {"range", "min", "tuple"} <= KERNEL_BUILTINS and not {"open", "getattr", "eval"} & KERNEL_BUILTINS


def test_the_interpreter_runs_a_kernel_with_only_the_kernel_builtins():
    source = """
import nki.language as nl

def k(a):
    assert open is None
    return a
"""
    with pytest.raises(Exception, match="NameError: name 'open' is not defined"):
        run_kernel(source, filename="<k>", kernel_name="k", args=[np.zeros((2, 2), np.float32)],
                   target=get_target("trn1"))


# ----------------------------------------------------------------------------- files verify refuses to read


def test_a_fifo_is_refused_without_blocking(tmp_path):
    fifo = tmp_path / "kernel.py"
    os.mkfifo(fifo)
    assert _one_error_line(_verify(fifo)) == f"nmmc: error: cannot read kernel file '{fifo}': not a regular file"


def test_a_symlink_to_a_device_is_refused(tmp_path):
    link = tmp_path / "kernel.py"
    link.symlink_to("/dev/zero")
    assert _one_error_line(_verify(link)) == f"nmmc: error: cannot read kernel file '{link}': not a regular file"


def test_dev_zero_is_refused():
    assert _one_error_line(_verify(Path("/dev/zero"))) == (
        "nmmc: error: cannot read kernel file '/dev/zero': not a regular file")


def test_a_binary_file_is_refused(tmp_path):
    binary = tmp_path / "kernel.py"
    binary.write_bytes(b"\x7fELF\x02\x01\x01\x00" + bytes(range(256)))
    assert _one_error_line(_verify(binary)) == (
        f"nmmc: error: cannot read kernel file '{binary}': it holds NUL bytes (a binary file, not a kernel)")
    binary.write_bytes(b"# nmmc-metadata: \xff\xfe\n")
    assert _one_error_line(_verify(binary)) == (
        f"nmmc: error: cannot read kernel file '{binary}': not UTF-8 text (byte 17); a binary file, not a kernel")


def test_a_file_over_the_size_cap_is_refused(tmp_path):
    big = tmp_path / "kernel.py"
    with big.open("w") as f:
        f.write("#" * (MAX_KERNEL_BYTES + 1))
    assert _one_error_line(_verify(big)) == f"nmmc: error: cannot read kernel file '{big}': larger than 8 MiB"


def test_a_negative_seed_is_refused():
    message = _one_error_line(_verify(NKI_KERNEL, "--seed", "-5"))
    assert message.startswith("nmmc: error: Invalid value for '--seed': -5 is not in the range x>=0.")


def test_verify_source_refuses_a_negative_seed_too():
    from neuronmm_compiler.errors import InputError
    from neuronmm_compiler.verification import verify_source

    with pytest.raises(InputError, match="the seed must be a non-negative integer; got -5"):
        verify_source(NKI_KERNEL.read_text(), seed=-5)


# ----------------------------------------------------------------------------- no NumPy warnings leak


def test_verify_leaks_no_numpy_runtime_warnings(monkeypatch):
    """Inputs of 1e30 overflow float32 products and float64 silu: verify reports the kernel as
    failing, but no RuntimeWarning reaches the caller."""
    import neuronmm_compiler.verification as verification

    real = verification.random_inputs

    def huge(specs, seed):
        return {name: (value.astype(np.float32) * np.float32(1e30)).astype(value.dtype)
                for name, value in real(specs, seed).items()}

    monkeypatch.setattr(verification, "random_inputs", huge)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        report = verify_file(KERNELS / "graph-lora-decode-trn2.py")
        result = _verify(KERNELS / "mlp-decode-1-ranks.py")
    assert not report.ok
    assert "Warning" not in result.output + result.stderr


@pytest.mark.parametrize("kernel", ["graph-svd_mlp-nki", "graph-svd_mlp-neuronxcc"])
def test_a_documented_activation_the_interpreter_lacks_is_said_as_nmmcs_limit(tmp_path, kernel):
    """nl.gelu is documented NKI (the activation table): verify says nmmc's interpreter does not implement
    it, not that the kernel left the NKI subset; a name NKI does not document keeps the subset message."""
    source = (KERNELS / f"{kernel}.py").read_text()
    path = tmp_path / "gelu.py"
    path.write_text(source.replace("nl.silu", "nl.gelu"))
    result = CliRunner().invoke(main, ["verify", str(path)])
    assert result.exit_code == 2
    line = result.stderr.strip()
    assert "nl.gelu is documented NKI" in line and "nmmc's interpreter does not implement it" in line
    assert "not an error in the kernel" in line and SUFFIX not in line
    path.write_text(source.replace("nl.silu", "nl.swish"))
    assert SUFFIX in CliRunner().invoke(main, ["verify", str(path)]).stderr

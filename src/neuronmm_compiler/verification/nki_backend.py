"""AWS's own NKI toolchain, when it is installed: its CPU simulator (``nmmc verify --backend
nki-simulator``), and the package and device checks ``nmmc bench`` builds on (its timing routes are
:mod:`neuronmm_compiler.calibration.bench_routes`).

Neither package is a dependency: ``nki`` (NKI 0.3+) and ``neuronx-cc`` (``neuronxcc.nki``, NKI 0.1)
are published only on AWS's Neuron pip index. Each is imported on first use, for the dialect of
the kernel file at hand; when it is absent the error says which package is missing and how to get
it. The emitted file is imported as a module as it is (its ``import nki`` / ``import neuronxcc.nki``
then binds the real package), and its kernel functions are handed to the package's simulator:
``nki.simulate(kernel)(*arrays)`` (``nki.simulate_kernel`` on older builds) for the ``nki`` dialect,
``neuronxcc.nki.simulate_kernel(kernel, *arrays)`` for ``neuronxcc``.
"""

from __future__ import annotations

import functools
import glob
import hashlib
import importlib
import importlib.util
import re
import sys
import tempfile
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any

import numpy as np

from ..errors import KernelError, NmmcError
from ..targets import Target
from ..vocab import Dialect

if TYPE_CHECKING:  # verification imports this module lazily to run kernels here
    from ..codegen import KernelSpec
    from . import KernelRunner

NEURON_INDEX = "https://pip.repos.neuron.amazonaws.com"
INSTALL_HINT = (f"it is published only on AWS's Neuron pip index: pip install --extra-index-url {NEURON_INDEX} "
                "'nmmc[neuron]' (on a Trainium host, or a Neuron DLAMI environment)")
#: dialect -> (module to import, what to call it in messages)
PACKAGES: dict[Dialect, tuple[str, str]] = {dialect: (dialect.module, dialect.info.package) for dialect in Dialect}
MIN_NKI_VERSION = tuple(int(part) for part in Dialect.NKI.nki_version.split("."))


class NeuronUnavailableError(NmmcError):
    """AWS's NKI package for a kernel's dialect, or a Neuron device, is not there."""


def nki_package(dialect: str) -> ModuleType:
    """The NKI module a kernel of ``dialect`` runs under (``nki`` or ``neuronxcc.nki``), imported;
    NeuronUnavailableError when it is not installed (or, for ``nki``, older than 0.3)."""
    if dialect not in PACKAGES:
        raise NmmcError(f"unknown NKI dialect {dialect!r} in the kernel file; dialects: {', '.join(PACKAGES)}")
    module_name, package = PACKAGES[dialect]
    try:
        module = importlib.import_module(module_name)
    except ImportError:
        raise NeuronUnavailableError(f"running a {dialect}-dialect kernel on AWS's toolchain needs the package "
                                     f"{package}, which is not installed; {INSTALL_HINT}") from None
    if dialect == Dialect.NKI:
        version = _version_tuple(getattr(module, "__version__", None))
        if version is not None and version < MIN_NKI_VERSION:
            raise NeuronUnavailableError(f"the installed nki is version {module.__version__}; nmmc's nki dialect "
                                         f"needs NKI 0.3 or later; {INSTALL_HINT}")
    return module


def _version_tuple(text: object) -> tuple[int, ...] | None:
    match = re.match(r"(\d+)\.(\d+)", str(text)) if text is not None else None
    return (int(match.group(1)), int(match.group(2))) if match else None


class KernelModule:
    """An emitted kernel file imported as a Python module under the real NKI package.

    The file is imported from its own path when that holds exactly ``source``; otherwise (source text
    without a file) from a copy in a temporary directory that lives as long as this object, since
    ``@nki.jit`` reads a kernel's source back from its file."""

    def __init__(self, source: str, filename: str) -> None:
        self._tmp: tempfile.TemporaryDirectory[str] | None = None
        path = Path(filename)
        try:
            on_disk = path.is_file() and path.read_text(encoding="utf-8") == source
        except (OSError, UnicodeDecodeError):
            on_disk = False
        if not on_disk:
            self._tmp = tempfile.TemporaryDirectory(prefix="nmmc-kernel-")
            path = Path(self._tmp.name) / "kernel.py"
            path.write_text(source, encoding="utf-8")
        name = "_nmmc_kernel_" + hashlib.sha256(source.encode("utf-8")).hexdigest()[:16]
        spec = importlib.util.spec_from_file_location(name, path)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module  # some decorators look their function's module up
        try:
            spec.loader.exec_module(module)
        except Exception as exc:
            sys.modules.pop(name, None)
            raise KernelError(f"importing the kernel file under AWS's NKI failed: {type(exc).__name__}: {exc}") from exc
        self.module = module

    def function(self, kernel_name: str) -> Any:
        fn = getattr(self.module, kernel_name, None)
        if not callable(fn):
            raise KernelError(f"the kernel file defines no function {kernel_name!r}")
        return fn


def _outputs(result: Any) -> list[np.ndarray]:
    values = list(result) if isinstance(result, (tuple, list)) else [result]
    return [np.asarray(v) for v in values]


def simulate(package: ModuleType, dialect: str, fn: Any, args: list[np.ndarray]) -> list[np.ndarray]:
    """Run one kernel in AWS's simulator (see the module docstring for the API of each dialect)."""
    if dialect == Dialect.NKI and hasattr(package, "simulate"):
        return _outputs(package.simulate(fn)(*args))
    if hasattr(package, "simulate_kernel"):
        return _outputs(package.simulate_kernel(fn, *args))
    raise NeuronUnavailableError(f"the installed {PACKAGES[dialect][0]} has no simulator API (simulate or "
                                 f"simulate_kernel); {INSTALL_HINT}")


def simulator_runner(source: str, filename: str, dialect: str) -> KernelRunner:
    """A :data:`~neuronmm_compiler.verification.KernelRunner` running kernels in AWS's simulator
    (NeuronUnavailableError at once when the dialect's package is absent)."""
    package = nki_package(dialect)

    @functools.cache
    def module() -> KernelModule:  # imported when the first kernel runs, once
        return KernelModule(source, filename)

    def run(kernel: KernelSpec, args: list[np.ndarray], target: Target) -> tuple[list[np.ndarray], None]:
        fn = module().function(kernel.name)
        try:
            outputs = simulate(package, dialect, fn, args)
        except NmmcError:
            raise
        except Exception as exc:
            raise KernelError(f"the NKI simulator raised {type(exc).__name__}: {exc}") from exc
        return outputs, None

    return run


def neuron_devices() -> list[str]:
    """The Neuron device nodes of this host (``/dev/neuron0``, ...); empty off Trainium/Inferentia."""
    return sorted(glob.glob("/dev/neuron[0-9]*"))

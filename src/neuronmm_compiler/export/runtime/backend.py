"""How this package runs a kernel file: through ``nki.jit`` on a Neuron device (the emitted file imported as it
is, launched on the manifest's logical-core degree), or through nmmc's NumPy interpreter of NKI on the CPU. The
model reaches both through the custom operators of :mod:`.ops`, whose implementations call :meth:`KernelRunner.run`.

Part of a package written by ``nmmc export``; reads ``manifest.json`` beside it.
"""

from __future__ import annotations

import importlib.util
import os
import threading
from pathlib import Path
from typing import Any

import numpy as np
import torch

#: The interpreter is not re-entrant across threads (a caller may run ranks or requests in threads): one kernel run
#: at a time.
_INTERPRETER = threading.Lock()
#: The kernels' dtypes as torch dtypes. nmmc's ``float8_e4m3`` (IEEE-style, largest 240, NKI's ``nl.float8_e4m3``)
#: is held in ``torch.float8_e4m3fn`` (largest 448): the two share every bit pattern of magnitude <= 240 and the
#: weights are quantized into +-240, so the bytes mean the same values in both (nmmc's compression/fp8_files.py);
#: ``float8_e5m2`` is the same IEEE layout in both. The MX kernels' packed ``_x4`` arguments are held as the words of
#: their 4 elements (torch has no 4-packed dtype): ``torch.int32`` for the float8 ones, ``torch.int16`` for float4, of
#: the argument's shape; their E8M0 scales as the ``uint8`` the kernels declare (:mod:`.mx`).
_TORCH_DTYPES = {"bfloat16": torch.bfloat16, "float32": torch.float32, "float16": torch.float16,
                 "float8_e4m3": torch.float8_e4m3fn, "float8_e5m2": torch.float8_e5m2, "uint8": torch.uint8,
                 "float8_e4m3fn_x4": torch.int32, "float8_e5m2_x4": torch.int32, "float4_e2m1fn_x4": torch.int16}
#: The packed MX dtypes: NumPy holds each as one unsigned field of its word's width named after it, as nmmc's
#: interpreter does (nmmc's ir/mx.py ``numpy_dtype``).
_PACKED_WORDS = {"float8_e4m3fn_x4": "<u4", "float8_e5m2_x4": "<u4", "float4_e2m1fn_x4": "<u2"}


def torch_dtype(name: str) -> torch.dtype:
    return _TORCH_DTYPES[name]


def to_numpy(tensor: torch.Tensor, dtype: str | None = None) -> np.ndarray:
    """A CPU tensor as a NumPy array, bits unchanged: bfloat16 as ml_dtypes.bfloat16, an FP8 tensor as the
    ml_dtypes type of the kernel argument's ``dtype`` (``float8_e4m3``: nmmc's IEEE-style e4m3, whose values up to
    240 have the bits of torch's float8_e4m3fn), the words of a packed MX argument as its NumPy field dtype."""
    tensor = tensor.detach().cpu().contiguous()
    if dtype in _PACKED_WORDS:
        return tensor.numpy().view(np.dtype([(dtype, _PACKED_WORDS[dtype])]))
    if tensor.dtype == torch.bfloat16:
        import ml_dtypes

        return tensor.view(torch.int16).numpy().view(ml_dtypes.bfloat16)
    if tensor.dtype in (torch.float8_e4m3fn, torch.float8_e5m2):
        import ml_dtypes

        name = dtype or ("float8_e4m3" if tensor.dtype == torch.float8_e4m3fn else "float8_e5m2")
        return tensor.view(torch.uint8).numpy().view(getattr(ml_dtypes, name))
    return tensor.numpy()


def from_numpy(array: np.ndarray) -> torch.Tensor:
    """The inverse of :func:`to_numpy`."""
    array = np.ascontiguousarray(array)
    names = array.dtype.names
    if names and names[0] in _PACKED_WORDS:
        return torch.from_numpy(array.view(np.int32 if array.dtype.itemsize == 4 else np.int16).copy())
    if array.dtype.name == "bfloat16":
        return torch.from_numpy(array.view(np.int16).copy()).view(torch.bfloat16)
    if array.dtype.name in _TORCH_DTYPES and array.dtype.name.startswith("float8"):
        return torch.from_numpy(array.view(np.uint8).copy()).view(torch_dtype(array.dtype.name))
    return torch.from_numpy(array.copy())


class KernelRunner:
    """Runs the kernel files of one package. ``run(kernel, args, backend)`` calls the kernel's functions in order
    (a split MLP hands its intermediate from the first to the second by name) and returns its results by name."""

    def __init__(self, root: Path, manifest: dict[str, Any]) -> None:
        self.root = Path(root)
        self.manifest = manifest
        self._sources: dict[str, str] = {}
        self._modules: dict[str, Any] = {}
        self._target: Any = None

    def run(self, kernel: dict[str, Any], args: dict[str, torch.Tensor], backend: str) -> dict[str, torch.Tensor]:
        if backend == "neuron":
            return self._run_device(kernel, args)
        return self._run_interpreter(kernel, args)

    # -- CPU: nmmc's interpreter --------------------------------------------------------------------------------
    def _run_interpreter(self, kernel: dict[str, Any], args: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        try:
            from neuronmm_compiler.interpreter import run_kernel
            from neuronmm_compiler.targets import get_target
        except ImportError as exc:  # pragma: no cover - the package is written by nmmc
            raise RuntimeError("running an exported kernel on the CPU needs nmmc (pip install nmmc): its "
                               "interpreter executes the NKI file") from exc
        if self._target is None:
            self._target = get_target(self.manifest["target"])
        file = kernel["file"]
        if file not in self._sources:
            self._sources[file] = (self.root / file).read_text(encoding="utf-8")
        dtypes = {a["name"]: a["dtype"] for function in kernel["functions"] for a in function["arguments"]}
        env = {name: to_numpy(value, dtypes.get(name)) for name, value in args.items()}
        with _INTERPRETER:
            for function in kernel["functions"]:
                names = [a["name"] for a in function["arguments"]]
                outputs = [r["name"] for r in function["results"]]
                run = run_kernel(self._sources[file], filename=str(self.root / file), kernel_name=function["name"],
                                 args=[env[name] for name in names], target=self._target, arg_names=names,
                                 output_names=outputs)
                env.update(zip(outputs, run.outputs, strict=True))
        last = kernel["functions"][-1]["results"]
        return {r["name"]: from_numpy(env[r["name"]]) for r in last}

    # -- Neuron device: nki.jit ---------------------------------------------------------------------------------
    def preload(self, kernel: dict[str, Any]) -> None:
        """Import ``kernel``'s file now (it imports AWS's ``nki``), so that a launch does not."""
        self._module(kernel["file"])

    def _module(self, file: str) -> Any:
        if file not in self._modules:
            path = self.root / file
            name = "nmmc_export_" + file.replace("/", "_").removesuffix(".py")
            spec = importlib.util.spec_from_file_location(name, path)
            assert spec is not None and spec.loader is not None
            module = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(module)  # imports nki (or neuronxcc.nki): AWS's package on the Neuron host
            self._modules[file] = module
        return self._modules[file]

    def launcher(self, function: Any) -> Any:
        """``function`` as launched on the manifest's logical core: ``kernel[lnc]`` (nki dialect) or
        ``kernel[nl.nc(lnc)]`` (neuronxcc) at LNC=2, as NxD Inference calls its own MLP kernel
        (``mlp[logical_nc_config](...)``); the bare kernel at LNC=1. A NEURON_LOGICAL_NC_CONFIG that says another
        degree is refused here, before neuronx-cc would fail the graph with NCC_EVRF066."""
        lnc = int(self.manifest["lnc"])
        env = os.environ.get("NEURON_LOGICAL_NC_CONFIG")
        if env is not None and env.strip() != str(lnc):
            raise RuntimeError(f"NEURON_LOGICAL_NC_CONFIG={env} but these kernels were compiled for LNC={lnc} "
                               f"({self.manifest['target']}): all NKI kernels of a model graph must use the graph's "
                               "LNC (NCC_EVRF066); export again with --lnc matching your neuronx-cc --lnc")
        if lnc == 1:
            return function
        if self.manifest["dialect"] == "nki":
            return function[lnc]
        import neuronxcc.nki.language as nl

        return function[nl.nc(lnc)]

    def _run_device(self, kernel: dict[str, Any], args: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        module = self._module(kernel["file"])
        env = dict(args)
        for function in kernel["functions"]:
            launch = self.launcher(getattr(module, function["name"]))
            result = launch(*[env[a["name"]] for a in function["arguments"]])
            results = result if isinstance(result, (tuple, list)) else (result,)
            env.update(zip([r["name"] for r in function["results"]], results, strict=True))
        return {r["name"]: env[r["name"]] for r in kernel["functions"][-1]["results"]}

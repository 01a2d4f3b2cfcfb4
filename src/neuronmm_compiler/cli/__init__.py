"""The ``nmmc`` command line.

Every user error (bad shape, unknown name, a schedule over a hardware limit) prints one line,
``nmmc: error: ...``, and exits with code 2, writing nothing. ``nmmc verify`` (and ``tune --verify``)
exit 1 when a kernel fails verification.

This package holds the ``main`` group and registers the commands, which live in modules grouped by
what they do: :mod:`.compile` (emit, cost, explain, schedules, tune), :mod:`.verify` (verify, bench),
:mod:`.artifacts` (regress, report, cache), :mod:`.models` (compress), :mod:`.calibrate` (calibrate,
targets), :mod:`.opt` (opt) and :mod:`.export` (export). A command function only parses its options and
calls the driver or an orchestration function (:mod:`neuronmm_compiler.tuning.request`, ...); what it
prints comes from the views (:mod:`neuronmm_compiler.tuning.report`, :mod:`.views`). :mod:`.options` holds the
error handling and the options several commands share.
"""

from __future__ import annotations

import click

from .. import __version__
from . import artifacts, calibrate, compile, compress_dtype, export, models, opt, verify
from .options import NmmcGroup

__all__ = ["main"]


@click.group(cls=NmmcGroup, context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.version_option(__version__, prog_name="nmmc")
def main() -> None:
    """nmmc, the NeuronMM compiler: lowers matmul graphs (GEMMs, SVD-compressed X·U·V chains,
    gated MLPs, graphs described in a graph file) to tuned NKI kernels for AWS Trainium, and
    verifies them on the CPU with its own NKI interpreter.

    \b
    Typical use:
      nmmc tune --shape 1024x2048x1024 -o gemm.py      # search a schedule, write its kernel
      nmmc verify gemm.py                               # run it in the interpreter vs NumPy
      nmmc tune --shape 512x8192x2048 --keep-ratio 0.8 -o chain.py           # fused X·U·V
      nmmc tune --mlp --tokens 128 --hidden 2048 --intermediate 8192 --keep-ratio 0.8 -o mlp.py
      nmmc tune --graph examples/graphs/lora.yaml --dim tokens=256 -o lora.py   # your own graph
      nmmc emit --shape 1024x2048x1024 -o gemm.py      # the kernel of a preset schedule
      nmmc cost --shape 1024x2048x1024                  # the cost model's figures for one schedule
      nmmc explain --shape 1024x2048x1024 --tuned      # passes, loop nest, cost formulas
      nmmc schedules --shape 1024x2048x1024             # presets and schedule parameters
      nmmc targets                                      # the hardware table
      nmmc bench gemm.py --append-csv m.csv             # on a Trainium host: measure a kernel
      nmmc calibrate m.csv -o trn1-cal.json             # fit the cost model; then --target trn1-cal.json
      nmmc export llama-3.2-1b --tokens 1,128 -o pkg/   # the MLP kernels as a package for a torch model
    """


for _command in (compile.emit, compile.cost, compile.tune, compile.explain, compress_dtype.with_dtype(models.compress),
                 verify.verify,
                 compile.schedules, artifacts.regress, artifacts.report, artifacts.cache, calibrate.targets,
                 calibrate.calibrate, verify.bench, opt.opt, export.export):
    main.add_command(_command)

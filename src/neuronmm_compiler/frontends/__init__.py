"""Frontends: what a user asks nmmc to compile, as graph IR. Built-in shapes (GEMM, SVD chain,
gated MLP: :mod:`.shapes`), graph files (:mod:`.graph_file`) and the workloads that hold them
(:mod:`.workloads`); model configs and weights are in :mod:`neuronmm_compiler.compression`."""

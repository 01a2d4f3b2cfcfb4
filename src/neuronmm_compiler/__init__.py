"""nmmc, the NeuronMM compiler: matmul graphs to tuned, verified NKI kernels for AWS Trainium."""

__version__ = "0.1.0"

__all__ = ["__version__"]

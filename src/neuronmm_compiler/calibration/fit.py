"""Fit the cost model's efficiency parameters to measured latencies (``scipy.optimize.least_squares``).

The unknowns are a chosen subset of the hardware table's estimated fields and of
:class:`~neuronmm_compiler.cost_model.params.ModelParams` (:data:`FIT_PARAMETERS`). The model is
the cost model itself: every evaluation builds the candidate target and calls ``estimate`` on the
rebuilt programs of every measured kernel file, so the fit can never drift from what ``nmmc cost``
and ``tune`` predict.

*Objective.* The residual of a measurement is ``log(predicted / measured)``: scale-free (a 5 us and
a 5 ms kernel weigh the same), symmetric in over- and under-prediction, and zero when the
prediction is exact. The fit minimizes the sum of their squares.

*Parametrization.* Each unknown is optimized as ``log(v)``, so steps are relative changes. Its range
is a bound on that coordinate: at most ``log(1) = 0`` for a fraction in (0, 1], and within
``+-LOG_BOUND`` for everything (no trial step can overflow ``exp`` or reach zero).

*Method.* SciPy's trust-region reflective least squares (``method="trf"``, which honours the bounds),
with the Jacobian taken by forward differences (relative step 1e-6 in those coordinates, stepping
away from a bound the coordinate sits on). The model is piecewise smooth (a maximum over engines, DMA
rounds): forward differences take the slope on the side the step goes. ``max_iter`` bounds the
model evaluations at trial points (the finite differences not counted); :attr:`FitResult.iterations`
is how many there were.

*Identifiability.* A parameter no measurement is sensitive to (its Jacobian column is zero: e.g.
``matmul_fp32_factor`` without an fp32 kernel whose TensorEngine time matters) gets no step, keeps
its starting value, and is reported as not determined. Standard errors come from the Gauss-Newton
covariance ``s^2 (J^T J)^-1`` at the solution (``s^2`` the residual variance), when there are more
measurements than determined parameters; in ``log(v)`` they are relative errors of the values.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
from scipy.optimize import least_squares

from ..cost_model import ModelParams, params_of
from ..errors import InputError
from ..targets import FRACTIONS, TARGET_FIELDS, Target
from .kernels import KernelFile


@dataclass(frozen=True)
class FitParameter:
    """An unknown the fit may refit: its name and what it means. Where it lives and its range are
    those a calibrated target file gives it (:mod:`neuronmm_compiler.calibration.target_file`)."""

    name: str
    help: str

    @property
    def owner(self) -> str:
        """"target" (a Target field a calibration may set) or "params" (a ModelParams field)."""
        return "target" if self.name in TARGET_FIELDS else "params"

    @property
    def fraction(self) -> bool:
        """A fraction in (0, 1] (else any positive number)."""
        return self.name in FRACTIONS


FIT_PARAMETERS: dict[str, FitParameter] = {p.name: p for p in (
    FitParameter("dma_fixed_cost_us", "fixed cost of one DMA transfer (us)"),
    FitParameter("dma_transpose_efficiency", "fraction of DMA throughput a transposing load reaches"),
    FitParameter("dma_bandwidth_efficiency", "achieved fraction of the nominal DMA bandwidth"),
    FitParameter("tensor_engine_efficiency", "achieved fraction of the TensorEngine clock"),
    FitParameter("matmul_fp32_factor", "slowdown of fp32 matmuls against bf16"),
    FitParameter("engine_instruction_cycles", "fixed cycles of a Vector/Scalar instruction"),
    FitParameter("engine_access_cycles", "cycles per SBUF/PSUM access of a Vector/Scalar instruction"),
    FitParameter("matmul_min_cycles", "minimum cycles of one nc_matmul"),
    FitParameter("transpose_min_cycles", "minimum cycles of one TensorE transpose"),
    FitParameter("dma_queues_in_flight", "DMA transfers whose fixed costs overlap"),
    FitParameter("launch_overhead_us", "fixed time of one standalone kernel launch (us)"),
    FitParameter("dma_size_scale", "the DMA efficiency curve is read at this times the bytes per partition"),
)}
#: What ``nmmc calibrate`` fits unless told otherwise: the estimated figures that move predictions
#: most. The rest are published per-instruction figures (fit them with --fit when measurements
#: separate them, e.g. engine_access_cycles from engine_instruction_cycles).
DEFAULT_FIT: tuple[str, ...] = ("dma_fixed_cost_us", "dma_transpose_efficiency", "dma_bandwidth_efficiency",
                                "tensor_engine_efficiency", "matmul_fp32_factor", "engine_instruction_cycles")
#: What benchmarks/fidelity.py fits to the published measurements: the figures those kernels identify (a
#: standalone launch, small-transfer DMA efficiency, per-transfer DMA cost, TensorEngine efficiency).
PUBLISHED_FIT: tuple[str, ...] = ("launch_overhead_us", "dma_size_scale", "tensor_engine_efficiency",
                                  "dma_fixed_cost_us")
#: Relative forward-difference step of the Jacobian, in the ``log(v)`` coordinates.
DIFF_STEP = 1e-6
#: Every value stays within exp(+-LOG_BOUND) (a fraction: at most 1).
LOG_BOUND = 60.0


def check_names(names: Sequence[str]) -> tuple[str, ...]:
    """The parameter names, checked (InputError naming the known ones) and without repeats."""
    unknown = [n for n in names if n not in FIT_PARAMETERS]
    if unknown:
        raise InputError(f"unknown parameter(s) to fit: {', '.join(unknown)}; known: {', '.join(FIT_PARAMETERS)}")
    if not names:
        raise InputError("nothing to fit: name at least one parameter")
    return tuple(dict.fromkeys(names))


def value_of(target: Target, name: str) -> float:
    """The current value of a fittable parameter on ``target``."""
    owner = target if FIT_PARAMETERS[name].owner == "target" else params_of(target)
    return float(getattr(owner, name))


def with_values(base: Target, values: dict[str, float]) -> Target:
    """``base`` with the given fittable parameters set (target fields and model parameters)."""
    own = {n: v for n, v in values.items() if FIT_PARAMETERS[n].owner == "target"}
    params: ModelParams = replace(params_of(base), **{n: v for n, v in values.items()
                                                       if FIT_PARAMETERS[n].owner == "params"})
    return replace(base, **own, params=params)


@dataclass
class FitResult:
    """What the fit found (values by parameter name; predictions in row order)."""

    names: tuple[str, ...]
    start: dict[str, float]
    values: dict[str, float]
    undetermined: list[str]
    std_rel: dict[str, float | None]  # standard error of each value, relative to it (None: not estimable)
    predicted_before: list[float]
    predicted_after: list[float]
    iterations: int
    converged: bool
    target: Target = field(repr=False)

    @property
    def determined(self) -> list[str]:
        return [n for n in self.names if n not in self.undetermined]


def rms_rel_error(predicted: Sequence[float], measured: Sequence[float]) -> float:
    """sqrt(mean(((predicted - measured) / measured)^2))."""
    p, m = np.asarray(predicted, dtype=float), np.asarray(measured, dtype=float)
    return float(np.sqrt(np.mean(((p - m) / m) ** 2)))


def fit_parameters(kernels: Sequence[KernelFile], measured: Sequence[float], base: Target,
                   names: Sequence[str], *, max_iter: int = 100) -> FitResult:
    """Fit ``names`` so the cost model's predictions of ``kernels`` match ``measured`` (us), starting
    from ``base``'s values (see the module docstring)."""
    names = check_names(names)
    if len(kernels) != len(measured) or not kernels:
        raise InputError("the fit needs one measured latency per kernel file, and at least one")
    log_measured = np.log(np.asarray(measured, dtype=float))
    start = {n: value_of(base, n) for n in names}

    def predictions(theta: np.ndarray) -> np.ndarray:
        tgt = with_values(base, {n: math.exp(t) for n, t in zip(names, theta, strict=True)})
        return np.array([k.predict_us(tgt) for k in kernels])

    def residuals(theta: np.ndarray) -> np.ndarray:
        return np.log(predictions(theta)) - log_measured

    theta0 = np.log([start[n] for n in names])
    upper = np.array([0.0 if FIT_PARAMETERS[n].fraction else LOG_BOUND for n in names])
    before = predictions(theta0)
    _check_determined(residuals, theta0, names, len(kernels))
    solution = least_squares(residuals, theta0, method="trf", bounds=(-LOG_BOUND, upper), diff_step=DIFF_STEP,
                             max_nfev=max_iter)
    jac = np.atleast_2d(solution.jac)
    norms = np.linalg.norm(jac, axis=0)
    undetermined = [n for n, c in zip(names, norms, strict=True) if c <= 1e-9 * max(float(norms.max()), 1e-30)]
    # an undetermined parameter keeps its exact starting value (trf starts strictly inside the bounds)
    values = {n: start[n] if n in undetermined else math.exp(float(t)) for n, t in zip(names, solution.x, strict=True)}
    std_rel = _standard_errors(jac, solution.fun, names, undetermined)
    fitted = with_values(base, values)
    after = [float(k.predict_us(fitted)) for k in kernels]
    return FitResult(names=names, start=start, values=values, undetermined=undetermined, std_rel=std_rel,
                     predicted_before=[float(x) for x in before], predicted_after=after,
                     iterations=int(solution.nfev), converged=solution.status > 0, target=fitted)


def _check_determined(residuals: Any, theta0: np.ndarray, names: Sequence[str], rows: int) -> None:
    """InputError when the measurements cannot determine the parameters they depend on: the
    Jacobian of the residuals at the start (forward differences) has lower rank than the number of
    parameters with any effect, so some combination of them could drift without bound (one
    measurement of one kernel and several parameters, say). Parameters with no effect at all are
    fine: they are reported as undetermined and keep their values."""
    base = residuals(theta0)
    columns = []
    for i in range(len(names)):
        step = np.zeros_like(theta0)
        step[i] = DIFF_STEP * max(1.0, abs(float(theta0[i])))
        columns.append((residuals(theta0 + step) - base) / step[i])
    jac = np.column_stack(columns)
    norms = np.linalg.norm(jac, axis=0)
    active = [i for i, c in enumerate(norms) if c > 1e-9 * max(float(norms.max()), 1e-30)]
    if not active:
        return
    rank = int(np.linalg.matrix_rank(jac[:, active] / norms[active], tol=1e-6))
    if rank < len(active):
        which = ", ".join(names[i] for i in active)
        raise InputError(f"{rows} measurement{'s' if rows != 1 else ''} cannot determine the {len(active)} parameters "
                         f"they depend on ({which}); they fix at most {rank}: measure more kernels of varied shapes "
                         "and schedules, or fit fewer parameters with --fit")


def _standard_errors(jac: np.ndarray, r: np.ndarray, names: Sequence[str],
                     undetermined: list[str]) -> dict[str, float | None]:
    """Relative standard errors of the determined values (the Gauss-Newton covariance in ``log(v)``)."""
    keep = [i for i, n in enumerate(names) if n not in undetermined]
    out: dict[str, float | None] = dict.fromkeys(names)
    dof = r.size - len(keep)
    if not keep or dof <= 0:
        return out
    j = jac[:, keep]
    cov = float(r @ r) / dof * np.linalg.pinv(j.T @ j)
    for pos, i in enumerate(keep):
        out[names[i]] = math.sqrt(max(float(cov[pos, pos]), 0.0))
    return out

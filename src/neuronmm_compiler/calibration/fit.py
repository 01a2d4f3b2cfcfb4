"""Fit the cost model's efficiency parameters to measured latencies (Levenberg-Marquardt, NumPy only).

The unknowns are a chosen subset of the hardware table's estimated fields and of
:class:`~neuronmm_compiler.cost_model.params.ModelParams` (:data:`FIT_PARAMETERS`). The model is
the cost model itself: every evaluation builds the candidate target and calls ``estimate`` on the
rebuilt programs of every measured kernel file, so the fit can never drift from what ``nmmc cost``
and ``tune`` predict.

*Objective.* The residual of a measurement is ``log(predicted / measured)``: scale-free (a 5 us and
a 5 ms kernel weigh the same), symmetric in over- and under-prediction, and zero when the
prediction is exact. The fit minimizes the sum of their squares.

*Parametrization.* Each unknown is optimized in an unbounded coordinate: ``log(v)`` for positive
values, ``logit(v)`` for fractions in (0, 1). Steps are then relative changes, and no step can
leave the valid range.

*Method.* Levenberg-Marquardt with Marquardt's diagonal scaling: at each iteration the Jacobian is
taken by forward differences (relative step 1e-6 in those coordinates), the damped step solves
``[J; sqrt(lambda D)] d = [-r; 0]`` by least squares, a step that lowers the objective is taken and
lowers lambda, one that does not raises it. The model is piecewise smooth (a maximum over engines,
DMA rounds): forward differences take the slope on the side the step goes, which is what LM needs.

*Identifiability.* A parameter no measurement is sensitive to (its Jacobian column is zero: e.g.
``matmul_fp32_factor`` without an fp32 kernel whose TensorEngine time matters) gets no step, keeps
its starting value, and is reported as not determined. Standard errors come from the Gauss-Newton
covariance ``s^2 (J^T J)^-1`` at the solution (``s^2`` the residual variance), when there are more
measurements than determined parameters.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace

import numpy as np

from ..cost_model import ModelParams, params_of
from ..errors import InputError
from ..targets import FRACTIONS, TARGET_FIELDS, Target
from .kernels import KernelFile


@dataclass(frozen=True)
class FitParameter:
    """An unknown the fit may refit: its name and what it means. Where it lives and its range are
    those a calibrated target file gives it (:mod:`neuronmm_compiler.target_file`)."""

    name: str
    help: str

    @property
    def owner(self) -> str:
        """"target" (a Target field a calibration may set) or "params" (a ModelParams field)."""
        return "target" if self.name in TARGET_FIELDS else "params"

    @property
    def fraction(self) -> bool:
        """A fraction in (0, 1) (else any positive number)."""
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
)}
#: What ``nmmc calibrate`` fits unless told otherwise: the estimated figures that move predictions
#: most. The rest are published per-instruction figures (fit them with --fit when measurements
#: separate them, e.g. engine_access_cycles from engine_instruction_cycles).
DEFAULT_FIT: tuple[str, ...] = ("dma_fixed_cost_us", "dma_transpose_efficiency", "dma_bandwidth_efficiency",
                                "tensor_engine_efficiency", "matmul_fp32_factor", "engine_instruction_cycles")
FRACTION_EPS = 1e-9
STEP = 1e-6
MAX_THETA = 60.0


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


def _encode(name: str, value: float) -> float:
    if FIT_PARAMETERS[name].fraction:
        v = min(max(value, FRACTION_EPS), 1 - FRACTION_EPS)
        return math.log(v / (1 - v))
    return math.log(value)


def _decode(name: str, theta: float) -> float:
    theta = min(max(theta, -MAX_THETA), MAX_THETA)  # a wild trial step must not overflow
    if FIT_PARAMETERS[name].fraction:
        return 1.0 / (1.0 + math.exp(-theta))
    return math.exp(theta)


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

    def target_at(theta: np.ndarray) -> Target:
        return with_values(base, {n: _decode(n, float(t)) for n, t in zip(names, theta, strict=True)})

    def predictions(theta: np.ndarray) -> np.ndarray:
        tgt = target_at(theta)
        return np.array([k.predict_us(tgt) for k in kernels])

    def residuals(theta: np.ndarray) -> np.ndarray:
        return np.log(predictions(theta)) - log_measured

    theta0 = np.array([_encode(n, v) for n, v in start.items()])
    before = predictions(theta0)
    theta, r, iterations, converged, jac = _levenberg_marquardt(residuals, theta0, np.log(before) - log_measured,
                                                                max_iter)
    norms = np.linalg.norm(jac, axis=0)
    undetermined = [n for n, c in zip(names, norms, strict=True) if c <= 1e-9 * max(float(norms.max()), 1e-30)]
    # a coordinate that never moved keeps its exact starting value (no exp(log(v)) round-off)
    values = {n: start[n] if t == t0 else _decode(n, float(t)) for n, t, t0 in zip(names, theta, theta0, strict=True)}
    std_rel = _standard_errors(jac, r, names, values, undetermined)
    fitted = with_values(base, values)
    after = [float(k.predict_us(fitted)) for k in kernels]
    return FitResult(names=names, start=start, values=values, undetermined=undetermined, std_rel=std_rel,
                     predicted_before=[float(x) for x in before], predicted_after=after, iterations=iterations,
                     converged=converged, target=fitted)


def _jacobian(residuals: Callable[[np.ndarray], np.ndarray], theta: np.ndarray, r: np.ndarray) -> np.ndarray:
    jac = np.empty((r.size, theta.size))
    for j in range(theta.size):
        h = STEP * max(1.0, abs(theta[j]))
        shifted = theta.copy()
        shifted[j] += h
        jac[:, j] = (residuals(shifted) - r) / h
    return jac


def _levenberg_marquardt(residuals: Callable[[np.ndarray], np.ndarray], theta: np.ndarray, r: np.ndarray,
                         max_iter: int) -> tuple[np.ndarray, np.ndarray, int, bool, np.ndarray]:
    """(solution, residuals there, iterations, converged, Jacobian at the solution), from ``theta``
    whose residuals are ``r``."""
    cost = float(r @ r)
    lam = 1e-3
    jac = _jacobian(residuals, theta, r)
    for iteration in range(1, max_iter + 1):
        grad = jac.T @ r
        if cost <= 1e-24 or float(np.max(np.abs(grad))) <= 1e-14:
            return theta, r, iteration - 1, True, jac
        diag = np.sum(jac * jac, axis=0)
        diag = np.maximum(diag, 1e-12 * max(float(diag.max()), 1e-30))
        while True:
            lhs = np.vstack([jac, np.diag(np.sqrt(lam * diag))])
            rhs = np.concatenate([-r, np.zeros(theta.size)])
            step = np.linalg.lstsq(lhs, rhs, rcond=None)[0]
            candidate = theta + step
            r_new = residuals(candidate)
            cost_new = float(r_new @ r_new)
            if math.isfinite(cost_new) and cost_new < cost:
                break
            lam *= 4.0
            if lam > 1e12:
                return theta, r, iteration, True, jac  # no step lowers the objective: a (local) minimum
        small_step = float(np.max(np.abs(step))) <= 1e-10
        small_gain = cost - cost_new <= 1e-12 * cost
        theta, r, cost = candidate, r_new, cost_new
        lam = max(lam / 3.0, 1e-12)
        jac = _jacobian(residuals, theta, r)
        if small_step or small_gain:
            return theta, r, iteration, True, jac
    return theta, r, max_iter, False, jac


def _standard_errors(jac: np.ndarray, r: np.ndarray, names: Sequence[str], values: dict[str, float],
                     undetermined: list[str]) -> dict[str, float | None]:
    keep = [i for i, n in enumerate(names) if n not in undetermined]
    out: dict[str, float | None] = dict.fromkeys(names)
    dof = r.size - len(keep)
    if not keep or dof <= 0:
        return out
    j = jac[:, keep]
    s2 = float(r @ r) / dof
    cov = s2 * np.linalg.pinv(j.T @ j)
    for pos, i in enumerate(keep):
        name = names[i]
        std_theta = math.sqrt(max(float(cov[pos, pos]), 0.0))
        # d value / value = d theta for log(v); (1 - v) d theta for logit(v)
        scale = (1.0 - values[name]) if FIT_PARAMETERS[name].fraction else 1.0
        out[name] = std_theta * scale
    return out

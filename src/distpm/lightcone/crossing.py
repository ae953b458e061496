"""When and where a particle's drift crosses the observer's past lightcone.

During a piece of drift from a0 to a1 a particle moves along x(a) = x0 + dx (D(a) - D(a0))
/ (D(a1) - D(a0)) (both integrators drift linearly in the growth factor D), relative to the
observer, while the lightcone shrinks from chi(a0) to chi(a1). The crossing time solves
|x(a)| = chi(a): a secant guess and two Newton steps on D and chi, each a Chebyshev series in
ln a over the piece (:func:`_series`), so that a crossing needs no table lookups. Used by
:mod:`distpm.lightcone.record`, which finds the crossings and paints them.
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np

from distpm import background
from distpm.ops.platform import HIGHEST


def dot(x, y):
    """Row-wise dot products of (..., 3) arrays, written out: XLA's CPU backend reduces over
    a minor axis of 3 several times slower than it adds three columns."""
    return x[..., 0] * y[..., 0] + x[..., 1] * y[..., 1] + x[..., 2] * y[..., 2]


def norm(x):
    """Row-wise lengths of (..., 3) arrays (never 0: safe to divide by)."""
    return jnp.sqrt(dot(x, x) + 1e-30)


DEGREE = 10  # of the Chebyshev series of D and chi over one step (in ln a)
_NODES = np.cos(np.pi * np.arange(DEGREE + 1) / DEGREE)  # Chebyshev-Lobatto, s = 1 .. -1


def _series_matrices():
    """(values at _NODES -> Chebyshev coefficients, coefficients -> those of d/ds), float64."""
    k = np.arange(DEGREE + 1)
    weights = np.where((k == 0) | (k == DEGREE), 0.5, 1.0)
    to_coeffs = (2 / DEGREE) * np.cos(np.pi * np.outer(k, k) / DEGREE) * weights[None, :]
    to_coeffs[[0, DEGREE]] *= 0.5
    derivative = np.zeros((DEGREE + 1, DEGREE + 1))
    for i in range(DEGREE + 1):  # d/ds T_i = sum over j < i, i - j odd, of (2 - [j = 0]) i T_j
        for j in range(i - 1, -1, -2):
            derivative[j, i] = i * (1.0 if j == 0 else 2.0)
    return to_coeffs, derivative


_TO_COEFFS, _DERIVATIVE = _series_matrices()


def _series(shell, tab):
    """Chebyshev coefficients (4, DEGREE + 1) of D, dD/ds, chi, dchi/ds over one step, in
    s = 2 (ln a - ln a0) / (ln a1 - ln a0) - 1: a few table lookups per step, after which a
    crossing needs no table (no gathers, no logarithms) in its Newton steps. Interpolating
    at the Lobatto nodes keeps the ends exact; ten degrees of these smooth functions of ln a
    are exact to float64 round-off on the steps of a run (checked by the tests)."""
    a0, a1 = shell[0], shell[1]
    lna = jnp.log(a0) + 0.5 * (jnp.asarray(_NODES, a0.dtype) + 1) * (jnp.log(a1) - jnp.log(a0))
    a = jnp.exp(lna)
    values = jnp.stack([background.growth(a, tab["growth"])[0],
                        background.comoving_distance(a, tab["dist"])])  # fmt: skip
    coeffs = jnp.matmul(values, jnp.asarray(_TO_COEFFS.T, a0.dtype), precision=HIGHEST)
    slopes = jnp.matmul(coeffs, jnp.asarray(_DERIVATIVE.T, a0.dtype), precision=HIGHEST)
    return jnp.stack([coeffs[0], slopes[0], coeffs[1], slopes[1]])


def _evaluate(series, s):
    """The series (m, DEGREE + 1) at s (n,): (m,) arrays (n,). The Chebyshev polynomials
    T_k(s) = 2 s T_(k-1) - T_(k-2) once for all m series, then one matrix product: the
    compiled program holds a few dozen operations where a recurrence per series (Clenshaw's)
    held m times more, which dominated the lightcone programs' size (and compile time)."""
    t = [jnp.ones_like(s), s]
    for _ in range(DEGREE - 1):
        t.append(2 * s * t[-1] - t[-2])
    values = jnp.matmul(jnp.stack(t, axis=1), series.T, precision=HIGHEST)
    return tuple(values[:, i] for i in range(series.shape[0]))


def crossing(x0, dx, shell, tab):
    """Where and when the trajectories x0 + t dx (relative to the observer) cross the lightcone.

    Returns (hit (n,) bool, a (n,) scale factor at the crossing, r (n, 3)
    position at the crossing relative to the observer [Mpc/h]). The crossing time is
    solved in s, the step's ln a mapped to [-1, 1], by a secant guess and two Newton steps
    on D(s) and chi(s) (their Chebyshev series, :func:`_series`).
    """
    a0, a1, d0, d1, chi0, chi1 = (shell[i] for i in range(6))
    series = _series(shell, tab)
    f0 = norm(x0) - chi0
    f1 = norm(x0 + dx) - chi1
    hit = (f0 < 0) & (f1 >= 0)
    s = 2 * jnp.where(hit, -f0 / jnp.where(hit, f1 - f0, 1.0), 0.5) - 1
    for _ in range(2):
        d, d_s, chi, chi_s = _evaluate(series, s)
        x = x0 + ((d - d0) / (d1 - d0))[:, None] * dx
        r = norm(x)
        drift = dot(x, dx) / r * d_s / (d1 - d0)  # d|x|/ds
        s = jnp.clip(s - (r - chi) / (drift - chi_s), -1, 1)
    (d,) = _evaluate(series[:1], s)
    a = a0 * jnp.exp(0.5 * (s + 1) * jnp.log(a1 / a0))
    return hit, a, x0 + ((d - d0) / (d1 - d0))[:, None] * dx

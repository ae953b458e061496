"""Angular power spectra of convergence maps and their Limber predictions (host, float64).

Limber (no spin-2 factor), for a source plane at chi_s:

    C_ell = 9/4 Omega_m^2 (H0/c)^4 int_0^chi_s dchi g(chi)^2 / a(chi)^2 P((ell + 1/2) / chi, a(chi))

with g = 1 - chi / chi_s, chi [Mpc/h], P [(Mpc/h)^3] and k [h/Mpc].
Flat maps: C_ell from the FFT of the Hann-tapered P x P map, binned in
|ell|, on the gnomonic grid (its distortion, ~1% at the corners of a 10
degree field, is neglected).
"""

from __future__ import annotations

import math

import jax
import numpy as np
from scipy import integrate

from distpm import background


def distance_of_a(cosmo, a):
    """[Mpc/h] comoving distance at scale factors ``a`` (numpy, float64)."""
    with jax.enable_x64(True):
        table = background.distance_table(cosmo, a_min=min(1e-3, 0.5 * float(np.min(a))))
        return np.asarray(background.comoving_distance(np.asarray(a, float), table))


def efficiency(chi, source, cosmo):
    """Lensing efficiency g(chi) (numpy) of a source plane z_s (a float) or a
    :class:`~distpm.lightcone.config.SourceDistribution`."""
    chi = np.asarray(chi, float)
    if isinstance(source, int | float):
        chi_s = float(distance_of_a(cosmo, np.array([1.0 / (1.0 + source)]))[0])
        return np.clip(1.0 - chi / chi_s, 0.0, None)
    z, n = np.asarray(source.z), np.asarray(source.n)
    chi_z = distance_of_a(cosmo, 1.0 / (1.0 + z))
    g = np.clip(1.0 - chi[:, None] / chi_z[None, :], 0.0, None)
    return integrate.trapezoid(g * n, z, axis=1) / integrate.trapezoid(n, z)


def limber(ell, power, cosmo, source, *, other=None, n_chi=1024):
    """Limber C_ell of the convergence for a source plane (z_s) or a source distribution,
    or with ``other`` (another source) the cross-spectrum of the two: the kernel is then
    g(chi) g_other(chi) / a^2.

    power(k, a): P(k, a) [(Mpc/h)^3] for arrays k [h/Mpc] and a of the same shape.
    """
    ell = np.asarray(ell, float)
    other = source if other is None else other
    z_far = max(s if isinstance(s, int | float) else s.z_max for s in (source, other))
    a_grid = np.linspace(1.0 / (1.0 + z_far), 1.0, 4096)
    chi_grid = distance_of_a(cosmo, a_grid)
    chi_far = chi_grid[0]
    chi = np.linspace(chi_far / n_chi, chi_far, n_chi)
    a = np.interp(chi, chi_grid[::-1], a_grid[::-1])
    weight = efficiency(chi, source, cosmo) * efficiency(chi, other, cosmo) / a**2
    k = (ell[:, None] + 0.5) / chi[None, :]
    p = power(k, np.broadcast_to(a, k.shape))
    om = float(cosmo.Omega_m)
    pre = 2.25 * om * om / background.C_OVER_H0**4
    return pre * integrate.simpson(weight * p, x=chi, axis=1)


def bilinear_window(nside, lmax):
    """(lmax + 1,) the factor by which bilinear painting onto a HEALPix map of ``nside``
    lowers C_ell: a flat-sky CIC window of the pixel's side (the square root of its area),
    squared and averaged over the orientation of the mode. Divide a measured C_ell by it.

    A model, not exact for HEALPix's pixels (nor for the aliasing of sampling at their
    centres). It is 0.958 at ell = 255 for nside 512 and 0.989 for nside 1024; with it, the
    mean of two runs at nside 512 follows Limber to 2% from ell = 100 to 400
    (``benchmarks/limber.py``).
    """
    half = np.arange(lmax + 1)[:, None] * math.sqrt(4 * math.pi / (12 * nside * nside)) / 2
    phi = np.linspace(0, math.pi / 2, 65)
    w = (np.sinc(half * np.cos(phi) / np.pi) * np.sinc(half * np.sin(phi) / np.pi)) ** 2
    return np.mean(w * w, axis=1)


def flat_power(kappa, fov_deg, n_bins=12, taper=True, other=None):
    """(ell centres, C_ell, modes per bin) of a flat P x P map of side ``fov_deg``, or with
    ``other`` (a second map) their cross-spectrum.

    The FFT treats the map as periodic; with ``taper`` (default) it is first
    multiplied by a Hann window in each direction (the power divided by the
    window's mean square), so the jumps at its edges do not leak large-scale
    power to high ell. The pixel side is tan(fov / 2) * 2 / P (gnomonic).
    """
    kappa = np.asarray(kappa, float)
    p = kappa.shape[0]
    step = 2 * math.tan(math.radians(fov_deg) / 2) / p
    side = step * p
    window = np.ones(p)
    if taper:
        window = np.hanning(p + 2)[1:-1]
    w2 = np.outer(window, window)
    modes = np.fft.fft2((kappa - kappa.mean()) * w2) * step * step
    if other is not None:
        other = np.asarray(other, float)
        second = np.fft.fft2((other - other.mean()) * w2) * step * step
    else:
        second = modes
    cl2d = (modes * np.conj(second)).real / (side * side * np.mean(w2 * w2))
    freq = np.fft.fftfreq(p, d=step) * 2 * np.pi
    ell = np.hypot(freq[:, None], freq[None, :])
    edges = np.linspace(2 * np.pi / side, np.pi / step, n_bins + 1)
    idx = np.digitize(ell.ravel(), edges) - 1
    good = (idx >= 0) & (idx < n_bins)
    count = np.bincount(idx[good], minlength=n_bins)
    total = np.bincount(idx[good], cl2d.ravel()[good], minlength=n_bins)
    ell_sum = np.bincount(idx[good], ell.ravel()[good], minlength=n_bins)
    filled = count > 0
    return ell_sum[filled] / count[filled], total[filled] / count[filled], count[filled]


def measured_power(k_centres, spectra, a_values):
    """P(k, a) from spectra measured at ``a_values`` (n_a, n_k): linear in a and log k.

    Outside the measured k range the power is 0; outside the a range it is
    held at the nearest measured a. For Limber integrals over a run's own spectra.
    """
    k_centres = np.asarray(k_centres, float)
    spectra = np.asarray(spectra, float)
    a_values = np.asarray(a_values, float)
    logk = np.log(k_centres)

    def power(k, a):
        k, a = np.asarray(k, float), np.asarray(a, float)
        per_a = np.stack(
            [np.interp(np.log(k), logk, s, left=0.0, right=0.0) for s in spectra]
        )  # (n_a, ...)
        i = np.clip(np.searchsorted(a_values, a) - 1, 0, len(a_values) - 2)
        t = np.clip((a - a_values[i]) / (a_values[i + 1] - a_values[i]), 0.0, 1.0)
        lo = np.take_along_axis(per_a, i[None], 0)[0]
        hi = np.take_along_axis(per_a, (i + 1)[None], 0)[0]
        return (1 - t) * lo + t * hi

    return power

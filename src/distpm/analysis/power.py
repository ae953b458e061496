"""Power spectra of mesh fields (auto and cross), binned in |k|.

Estimator: P(k) = V <Re(d1_k d2_k*)> / N_cells^2 over the modes of a bin,
with d_k the unnormalised FFT. Optionally the mass-assignment window is
divided out (compensation). The k = 0 mode is excluded. No shot noise is
subtracted.
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np

from distpm import kernels
from distpm.parallel import Layout


def k_bin_edges(cfg, *, n_bins=None, log=False, k_min=None, k_max=None) -> np.ndarray:
    """[h/Mpc] default bin edges: width k_f (fundamental) from k_f/2 to k_Nyquist.

    With ``log=True``, ``n_bins`` log-spaced bins (default 20) over the same range.
    """
    k_f = 2 * np.pi / max(cfg.box_size)
    k_nyq = min(np.pi * n / b for n, b in zip(cfg.mesh_shape, cfg.box_size, strict=True))
    lo = 0.5 * k_f if k_min is None else k_min
    hi = k_nyq if k_max is None else k_max
    if not 0 < lo < hi:
        raise ValueError(f"need 0 < k_min < k_max, got k_min={lo}, k_max={hi}")
    if log:
        return np.geomspace(lo, hi, (n_bins or 20) + 1)
    if n_bins is None:
        return np.arange(lo, hi + 1e-12 * hi, k_f)
    return np.linspace(lo, hi, n_bins + 1)


def mode_average(values, layout, box_size, edges):
    """Average a k-space quantity over the modes of each |k| bin.

    values: real array on the local rfft block of ``layout``.
    edges: [h/Mpc] bin edges. Modes count with their Hermitian weight (a
    stored mode and its conjugate are two modes); k = 0 is excluded.
    Returns (mean |k| [h/Mpc], mean value, number of modes) per bin; empty
    bins give zeros.
    """
    kmag = np.sqrt(kernels.k_squared(layout.wavenumbers(box_size)))
    weights = np.broadcast_to(layout.hermitian_weights(), kmag.shape)
    edges = np.asarray(edges)
    n_bins = len(edges) - 1
    index = np.digitize(kmag, edges) - 1
    inside = (index >= 0) & (index < n_bins) & (kmag > 0)
    index = np.where(inside, index, n_bins).ravel()  # extra bin, dropped
    weights = np.where(inside, weights, 0.0)
    dtype = values.dtype
    # mode counts and mean |k| are static: compute them on the host
    n_modes = np.bincount(index, weights=weights.ravel(), minlength=n_bins + 1)[:n_bins]
    sum_k = np.bincount(index, weights=(weights * kmag).ravel(), minlength=n_bins + 1)[:n_bins]
    safe = np.maximum(n_modes, 1)
    summed = jax.ops.segment_sum((jnp.asarray(weights, dtype) * values).ravel(), index, n_bins + 1)
    mean = layout.device_sum(summed)[:n_bins] / jnp.asarray(safe, dtype)
    return jnp.asarray(sum_k / safe, dtype), mean, jnp.asarray(n_modes, dtype)


@functools.partial(jax.jit, static_argnames=("cfg", "edges", "compensate"))
def _binned(delta, other, cfg, edges, compensate):
    layout = Layout(cfg.mesh_shape)
    d1 = layout.rfft3d(delta)
    d2 = d1 if other is None else layout.rfft3d(other)
    cross = (d1 * jnp.conj(d2)).real * (math.prod(cfg.box_size) / math.prod(cfg.mesh_shape) ** 2)
    if compensate:
        kvec = layout.wavenumbers(cfg.box_size)
        window = kernels.mass_assignment_window(kvec, cfg.cell_size, cfg.paint_order)
        cross = cross / jnp.asarray(window**2, cross.dtype)
    return mode_average(cross, layout, cfg.box_size, edges)


def power_spectrum(
    delta, cfg, *, other=None, compensate=True, n_bins=None, log=False, k_min=None, k_max=None
):
    """Binned auto (or cross, with ``other``) power spectrum of mesh fields.

    delta, other: density contrasts on the mesh of ``cfg`` (``cfg.mesh_shape``).
    compensate: divide by the squared window of ``cfg.paint`` (CIC/TSC).
    Bins: width k_f from k_f/2 to k_Nyquist by default, or ``n_bins`` linear
    bins, or log-spaced bins with ``log=True``; ``k_min``, ``k_max`` [h/Mpc].
    Returns (k [h/Mpc] mean |k| of the modes in each bin, P [(Mpc/h)^3],
    number of modes). Empty bins have k = P = 0 and zero modes.
    """
    for name, field in (("delta", delta), ("other", other)):
        if field is not None and tuple(field.shape) != cfg.mesh_shape:
            raise ValueError(
                f"{name} has shape {tuple(field.shape)}, expected mesh_shape {cfg.mesh_shape}"
            )
    edges = tuple(k_bin_edges(cfg, n_bins=n_bins, log=log, k_min=k_min, k_max=k_max))
    return _binned(delta, other, cfg, edges, compensate)

"""k-space kernels of the PM solver and of the power spectrum.

Every kernel takes the wavenumbers of the local k-space block [h/Mpc]
(from ``Layout.wavenumbers``), so it is independent of the k-space layout,
and returns an array of their dtype.
"""

from __future__ import annotations

import jax.numpy as jnp


def k_squared(kvec):
    """|k|^2 [(h/Mpc)^2] on the k-space block."""
    kx, ky, kz = kvec
    return kx**2 + ky**2 + kz**2


def inverse_laplacian(kvec):
    """-1/k^2, set to 0 at k = 0 (no NaN in values or in gradients)."""
    k2 = k_squared(kvec)
    positive = k2 > 0
    return jnp.where(positive, -1.0 / jnp.where(positive, k2, 1.0), 0.0)


def gradient_kernel(kvec, cell_size, kind: str):
    """The three k-space factors D_i with d/dx_i <-> i * D_i.

    kind "ik": D = k (spectral), zeroed at the Nyquist frequency, whose
    derivative is not representable in a real field.
    kind "fd": 4th-order central finite difference on the mesh,
    D = (8 sin(k dx) - sin(2 k dx)) / (6 dx); it vanishes at Nyquist.
    """
    out = []
    for k, dx in zip(kvec, cell_size, strict=True):
        if kind == "ik":
            nyquist = jnp.abs(jnp.abs(k) * (dx / jnp.pi) - 1) < 1e-4
            d = jnp.where(nyquist, 0.0, k)
        elif kind == "fd":
            d = (8 * jnp.sin(k * dx) - jnp.sin(2 * k * dx)) / (6 * dx)
        else:
            raise ValueError(f"unknown gradient kernel {kind!r}; use 'fd' or 'ik'")
        out.append(d)
    return out


def mass_assignment_window(kvec, cell_size, order: int):
    """Fourier transform of the mass-assignment kernel, prod_i sinc(k_i dx_i / 2)^order.

    order: 2 for CIC, 3 for TSC. sinc(x) = sin(x) / x.
    """
    w = 1.0
    for k, dx in zip(kvec, cell_size, strict=True):
        w = w * jnp.sinc(k * (dx / (2 * jnp.pi))) ** order
    return w

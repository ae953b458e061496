"""3-D real FFTs of fields and the wavenumbers of their k-space blocks.

Convention (numpy's): forward unnormalised, inverse normalised by 1/N.
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np


def rfft3d(x):
    """Forward real-to-complex FFT over the three axes."""
    return jnp.fft.rfftn(x, axes=(0, 1, 2))


def irfft3d(xk, shape):
    """Complex-to-real inverse of :func:`rfft3d` for a field of ``shape``."""
    return jnp.fft.irfftn(xk, s=shape, axes=(0, 1, 2))


def wavenumbers(shape, box_size) -> list[np.ndarray]:
    """[h/Mpc] (kx, ky, kz) of the rfft layout, each shaped to broadcast.

    The Nyquist frequency of an even axis appears once, with a negative sign
    on the full axes (numpy's fftfreq) and positive on the last (rfftfreq).
    """
    ks = []
    for axis, (n, length) in enumerate(zip(shape, box_size, strict=True)):
        freq = np.fft.rfftfreq(n) if axis == 2 else np.fft.fftfreq(n)
        k = 2 * np.pi * n / length * freq
        ks.append(k.reshape([-1 if i == axis else 1 for i in range(3)]))
    return ks


def hermitian_weights(shape) -> np.ndarray:
    """Number of full-space modes each rfft mode represents, shape (1, 1, Nz//2+1).

    The kz=0 plane and (for even Nz) the kz=Nyquist plane are their own
    mirror images and count once; every other stored mode also stands for
    its complex conjugate and counts twice.
    """
    nz = shape[2]
    w = np.full(nz // 2 + 1, 2.0)
    w[0] = 1.0
    if nz % 2 == 0:
        w[-1] = 1.0
    return w.reshape(1, 1, -1)

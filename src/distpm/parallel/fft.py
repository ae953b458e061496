"""Pencil-decomposed 3-D real FFTs (run inside ``shard_map`` over axes "x", "y").

Convention (numpy's): forward unnormalised, inverse normalised by 1/N.
Trailing axes after the three spatial ones (e.g. vector components) are
transformed independently, in the same collectives.

Real space: device (ix, iy) holds the block x in [ix nx, (ix+1) nx),
y in [iy ny, (iy+1) ny), all Nz cells of z (nx = Nx/px, ny = Ny/py).

Forward transform, with an all-to-all between the 1-D FFTs:

    (nx, ny, Nz)  --rfft z-->  (nx, ny, Kz')      Kz' = Nz/2+1 padded to a multiple of py
                  --all_to_all over "y": gather y, split kz-->  (nx, Ny, Kz'/py)
                  --fft y-->
                  --all_to_all over "x": gather x, split ky-->  (Nx, Ny/px, Kz'/py)
                  --fft x-->

k-space layout: the axes stay in the order (kx, ky, kz); kx is whole, ky is
split over the "x" devices and kz over the "y" devices. The padded kz planes
(index >= Nz/2+1) hold zeros and have Hermitian weight 0. The inverse runs
the same steps backwards. Only a 1x1 grid skips the transposes.
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
from jax import lax


def padded_kz(nz: int, py: int) -> int:
    """Stored kz planes: Nz//2+1 rounded up to a multiple of py."""
    kz = nz // 2 + 1
    return -(-kz // py) * py


def kspace_shape(shape, grid) -> tuple[int, int, int]:
    """Local k-space block shape for a field of global ``shape`` on ``grid``."""
    (nx, ny, nz), (px, py) = shape, grid
    return nx, ny // px, padded_kz(nz, py) // py


def rfft3d(x, shape, grid):
    """Forward real-to-complex FFT of the local block ``x`` (see module doc)."""
    px, py = grid
    if (px, py) == (1, 1):
        return jnp.fft.rfftn(x, axes=(0, 1, 2))
    xk = jnp.fft.rfft(x, axis=2)
    if py > 1:
        pad = padded_kz(shape[2], py) - xk.shape[2]
        xk = jnp.pad(xk, [(0, 0), (0, 0), (0, pad)])
        xk = lax.all_to_all(xk, "y", split_axis=2, concat_axis=1, tiled=True)
    xk = jnp.fft.fft(xk, axis=1)
    if px > 1:
        xk = lax.all_to_all(xk, "x", split_axis=1, concat_axis=0, tiled=True)
    return jnp.fft.fft(xk, axis=0)


def irfft3d(xk, shape, grid):
    """Complex-to-real inverse of :func:`rfft3d` for a field of global ``shape``."""
    px, py = grid
    if (px, py) == (1, 1):
        return jnp.fft.irfftn(xk, s=shape, axes=(0, 1, 2))
    xk = jnp.fft.ifft(xk, axis=0)
    if px > 1:
        xk = lax.all_to_all(xk, "x", split_axis=0, concat_axis=1, tiled=True)
    xk = jnp.fft.ifft(xk, axis=1)
    if py > 1:
        xk = lax.all_to_all(xk, "y", split_axis=1, concat_axis=2, tiled=True)
        xk = xk[:, :, : shape[2] // 2 + 1]
    return jnp.fft.irfft(xk, n=shape[2], axis=2)


def global_wavenumbers(shape, box_size, py: int) -> list[np.ndarray]:
    """[h/Mpc] 1-D kx, ky, kz of the whole k-space (kz padded with zeros to the stored size).

    The Nyquist frequency of an even axis appears once, negative on x and y
    (numpy's fftfreq) and positive on z (rfftfreq).
    """
    nx, ny, nz = shape
    lx, ly, lz = box_size
    kz = 2 * np.pi * nz / lz * np.fft.rfftfreq(nz)
    kz = np.pad(kz, (0, padded_kz(nz, py) - kz.size))
    return [
        2 * np.pi * nx / lx * np.fft.fftfreq(nx),
        2 * np.pi * ny / ly * np.fft.fftfreq(ny),
        kz,
    ]


def global_hermitian_weights(nz: int, py: int) -> np.ndarray:
    """Full-space modes per stored kz plane: 1 for kz=0 (and Nyquist), 2 otherwise, 0 for padding.

    A stored mode other than on the self-conjugate planes also stands for its
    complex conjugate, which the rfft does not store.
    """
    w = np.full(nz // 2 + 1, 2.0)
    w[0] = 1.0
    if nz % 2 == 0:
        w[-1] = 1.0
    return np.pad(w, (0, padded_kz(nz, py) - w.size))

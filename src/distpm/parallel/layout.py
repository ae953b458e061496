"""The layout of fields over devices, bundled with the operations that use it.

Field layout (real space): a field of global shape (Nx, Ny, Nz) is held as
local blocks of shape (Nx/px, Ny/py, Nz) (pencils along z). This module
currently implements the 1x1 device grid; the halo, FFT and reduction
operations keep their signatures when more devices are added.

k-space layout: the local block of ``rfft3d`` has shape (Nx, Ny, Nz//2+1)
with axes (kx, ky, kz). Kernels must not assume this: they take their
wavenumbers from :meth:`Layout.wavenumbers`, which are broadcastable to the
local k-space block.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from distpm.parallel import fft, halo


@dataclasses.dataclass(frozen=True)
class Layout:
    """Where each part of a field and of the particle set lives.

    mesh_shape: global shape of the field this layout describes.
    """

    mesh_shape: tuple[int, int, int]

    @property
    def local_shape(self) -> tuple[int, int, int]:
        """Shape of this device's real-space block (without halo)."""
        return self.mesh_shape

    @property
    def local_origin(self) -> tuple[int, int, int]:
        """Global cell index of this device's block's first cell."""
        return (0, 0, 0)

    # ---- FFTs ---------------------------------------------------------------
    def rfft3d(self, x):
        """Forward real-to-complex 3-D FFT of a local block (unnormalised)."""
        return fft.rfft3d(x)

    def irfft3d(self, xk):
        """Inverse of :meth:`rfft3d` (normalised by 1/N, real output)."""
        return fft.irfft3d(xk, self.mesh_shape)

    def wavenumbers(self, box_size) -> list[np.ndarray]:
        """[h/Mpc] local (kx, ky, kz) of the k-space block, broadcastable to it."""
        return fft.wavenumbers(self.mesh_shape, box_size)

    def hermitian_weights(self) -> np.ndarray:
        """How many full-space modes each stored rfft mode stands for (1 or 2)."""
        return fft.hermitian_weights(self.mesh_shape)

    # ---- halo ---------------------------------------------------------------
    def halo_add(self, padded, width: int):
        """Add the halo of a painted (x, y)-padded block into the owning cells."""
        return halo.fold_periodic(padded, width)

    def halo_fill(self, block, width: int):
        """Pad a block by ``width`` cells in x and y with its neighbours' values."""
        return halo.pad_periodic(block, width)

    # ---- reductions ---------------------------------------------------------
    def device_sum(self, x):
        """Element-wise sum of an array over all devices (identity on 1x1)."""
        return x

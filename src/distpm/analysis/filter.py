"""Fields filtered by a function of |k|: smoothing, scale cuts, preconditioners.

A filter multiplies each Fourier mode of a real field by transfer(|k|). It is
linear, and orthogonal for |transfer| = 1; its Jacobian's log-determinant (a
reparametrisation's density correction) is the sum of log |transfer| over all
modes of the full (not half) Fourier space.
"""

from __future__ import annotations

import jax.numpy as jnp
from jax.sharding import PartitionSpec as P

from distpm import kernels
from distpm.parallel.decomposition import FIELD, Decomposition


def _layout(cfg, shape):
    decomposition = Decomposition.of(cfg)
    for layout in (decomposition.mesh, decomposition.lattice):
        if tuple(shape) == layout.mesh_shape:
            return decomposition, layout
    raise ValueError(
        f"a field of shape {tuple(shape)} is on neither the mesh {cfg.mesh_shape} "
        f"nor the particle grid {cfg.particle_shape}"
    )


def _kmag(layout, cfg, dtype):
    return jnp.sqrt(kernels.k_squared(layout.wavenumbers(cfg.box_size, dtype)))


def filter_field(field, cfg, transfer):
    """The real field whose Fourier modes are those of ``field`` times ``transfer(|k|)``.

    field: a real field on the PM mesh (``cfg.mesh_shape``) or on the Lagrangian
    particle grid (``cfg.particle_shape``, e.g. the white noise), split as pencils
    ``P("x", "y")``. transfer: a JAX function of |k| [h/Mpc] (an array; k = 0 is the
    mean) returning real factors. It may close over traced values: the result is
    differentiable in them and in ``field``. ``transfer = lambda k: 1.0`` returns
    ``field`` to round-off.
    """
    decomposition, layout = _layout(cfg, jnp.shape(field))

    def local(block):
        factor = jnp.asarray(transfer(_kmag(layout, cfg, block.dtype)), block.dtype)
        return layout.irfft3d(layout.rfft3d(block) * factor).astype(block.dtype)

    return decomposition.sharded(local, FIELD, FIELD)(field)


def filter_log_determinant(cfg, transfer, shape=None, dtype=jnp.float32):
    """log |det| of :func:`filter_field`'s map on fields of ``shape`` (default: the particle grid).

    The sum over every mode of the full Fourier space of log |transfer(|k|)|:
    a change of variables ``w = filter_field(u, cfg, transfer)`` multiplies a
    density in ``w`` by exp of this. Differentiable in what ``transfer`` closes over.
    """
    shape = cfg.particle_shape if shape is None else shape
    decomposition, layout = _layout(cfg, shape)

    def local():
        kmag = _kmag(layout, cfg, dtype)
        logs = jnp.log(jnp.abs(jnp.asarray(transfer(kmag), dtype)))
        return layout.device_sum(jnp.sum(layout.hermitian_weights(dtype) * logs))

    return decomposition.sharded(local, (), P())()

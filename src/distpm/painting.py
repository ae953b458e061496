"""Mass assignment (paint) and interpolation (readout) on a local block.

Conventions: mesh node (i, j, l) sits at position (i, j, l) * cell_size;
positions are global [Mpc/h] in [0, box_size). CIC touches the 2 nearest
nodes per axis, TSC the 3 nearest. Painting writes into the local block
padded by a halo of ``order - 1`` cells in x and y (the decomposed axes;
z is periodic within the block) and lets the layout add the halo into the
neighbours; readout first fills the halo from the neighbours. No
collectives here: those live in ``distpm.parallel``.

Paint and readout with the same kernel are adjoint:
``<paint(x, m), f> = <m, readout(f, x)>``.
"""

from __future__ import annotations

import itertools

import jax.numpy as jnp


def _stencil(x, order: int):
    """Node indices (n, order) and weights (n, order) along one axis.

    x: positions in cell units.
    """
    if order == 2:  # cloud in cell
        i0 = jnp.floor(x)
        d = x - i0
        weights = [1 - d, d]
        first = i0
    elif order == 3:  # triangular shaped cloud
        i0 = jnp.floor(x + 0.5)
        d = x - i0
        weights = [0.5 * (0.5 - d) ** 2, 0.75 - d**2, 0.5 * (0.5 + d) ** 2]
        first = i0 - 1
    else:
        raise ValueError(f"paint order must be 2 (cic) or 3 (tsc), got {order}")
    first = first.astype(jnp.int32)
    return [first + j for j in range(order)], weights


def _flat_stencil(pos, layout, cell_size, order: int):
    """Yield (flat index into the padded block, weight) for each stencil node."""
    halo = order - 1
    nx, ny, nz = layout.local_shape
    origin = layout.local_origin
    cells = [pos[:, a] / cell_size[a] - origin[a] for a in range(3)]
    (ix, wx), (iy, wy), (iz, wz) = (_stencil(c, order) for c in cells)
    row = ny + 2 * halo
    for a, b, c in itertools.product(range(order), repeat=3):
        flat = ((ix[a] + halo) * row + (iy[b] + halo)) * nz + iz[c] % nz
        yield flat, wx[a] * wy[b] * wz[c]


def _padded_shape(layout, order: int, extra=()):
    nx, ny, nz = layout.local_shape
    halo = order - 1
    return (nx + 2 * halo, ny + 2 * halo, nz, *extra)


def paint(pos, mass, layout, cell_size, order: int):
    """Assign particle masses to the local mesh block.

    pos: (n, 3) [Mpc/h] positions inside this device's block.
    mass: scalar or (n,) mass per particle (any unit; the mesh holds the
        same unit per cell).
    cell_size: [Mpc/h] 3 numbers. order: 2 (CIC) or 3 (TSC).
    Returns the local block (nx, ny, nz).
    """
    shape = _padded_shape(layout, order)
    mesh = jnp.zeros(shape[0] * shape[1] * shape[2], dtype=pos.dtype)
    mass = jnp.broadcast_to(jnp.asarray(mass, pos.dtype), pos.shape[:1])
    for flat, weight in _flat_stencil(pos, layout, cell_size, order):
        mesh = mesh.at[flat].add(mass * weight, mode="promise_in_bounds")
    return layout.halo_add(mesh.reshape(shape), order - 1)


def readout(field, pos, layout, cell_size, order: int):
    """Interpolate a local field block at particle positions.

    field: (nx, ny, nz) or (nx, ny, nz, c) local block.
    pos: (n, 3) [Mpc/h] positions inside this device's block.
    Returns (n,) or (n, c).
    """
    padded = layout.halo_fill(field, order - 1)
    components = padded.shape[3:]
    flat_field = padded.reshape(-1, *components)
    out = jnp.zeros(pos.shape[:1] + components, dtype=field.dtype)
    for flat, weight in _flat_stencil(pos, layout, cell_size, order):
        out = out + flat_field[flat] * weight.reshape(-1, *([1] * len(components)))
    return out

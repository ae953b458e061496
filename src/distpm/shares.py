"""Particles from arrays held anywhere: an even share per device, then sent to their owners.

For particles read from files (snapshots, checkpoints) and for plain
position arrays given to the analysis (FoF, kNN), which come in no
particular order.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import PartitionSpec as P

from distpm.ops import compact
from distpm.parallel import migrate as parallel_migrate
from distpm.parallel import overflow, runtime
from distpm.parallel.decomposition import SLOTS, Decomposition
from distpm.state import PARTICLES, Particles, linear_ids, wrap


def from_rows(read_rows, total: int, a: float, cfg) -> Particles:
    """Particles on ``cfg``'s device grid from ``total`` rows stored in any order.

    read_rows(start, stop) returns rows [start, stop) as a dict of numpy
    arrays in distpm's units: ``pos`` [Mpc/h] and ``vel`` (n, 3), and ``ids``
    (n, 2) id words. Device b of the grid reads rows [b total / D,
    (b + 1) total / D) (each process reads only its devices' rows); then
    every particle moves to the device that owns its position
    (:func:`redistribute`).
    """
    dec, dtype = Decomposition.of(cfg), cfg.float_dtype
    n_blocks, cap = dec.n_devices, dec.capacity
    sharding = dec.sharding(SLOTS)
    blocks = {}
    for b in runtime.local_block_indices((n_blocks * cap,), sharding):
        rows = read_rows(b * total // n_blocks, (b + 1) * total // n_blocks)
        n = len(rows["ids"])
        block = {
            k: np.pad(np.asarray(v, np.int32 if k == "ids" else dtype), [(0, cap - n), (0, 0)])
            for k, v in rows.items()
        }
        blocks[b] = {**block, "mask": np.arange(cap) < n}
    arrays = {}
    for name in ("pos", "vel", "ids", "mask"):
        parts = {b: block[name] for b, block in blocks.items()}
        shape = (n_blocks * cap,) + next(iter(parts.values())).shape[1:]
        arrays[name] = runtime.from_local_blocks(parts, shape, sharding)
    return redistribute(Particles(**arrays, a=np.asarray(a, dtype)), cfg)


def from_positions(pos, cfg) -> Particles:
    """Particles made of ``cfg.n_particles`` positions (N, 3) [Mpc/h] in any order: zero
    velocities, and ids that are the row indices (as id words, see
    :func:`distpm.state.linear_ids`), so results can be put back in row order."""
    pos = np.asarray(pos)
    if pos.shape != (cfg.n_particles, 3):
        raise ValueError(
            f"pos has shape {pos.shape}, expected {(cfg.n_particles, 3)} for "
            f"{cfg.particle_shape} particles"
        )
    if cfg.n_particles >= 2**31:
        raise ValueError("a plain array needs fewer than 2^31 points; pass Particles")
    _, ny, nz = cfg.particle_shape

    def rows(start, stop):
        index = np.arange(start, stop)
        ids = np.stack([index // (ny * nz), index % (ny * nz)], axis=1)
        return {"pos": pos[start:stop], "vel": np.zeros((stop - start, 3)), "ids": ids}

    return from_rows(rows, cfg.n_particles, cfg.a_stop, cfg)


def in_row_order(particles, values, cfg) -> np.ndarray:
    """Per-slot ``values`` (slots, ...) of :func:`from_positions` particles, as numpy rows
    in the order of the positions (gathered to every process)."""
    mask = runtime.to_host(particles.mask)
    rows = linear_ids(runtime.to_host(particles.ids)[mask], cfg.particle_shape).astype(np.int64)
    values = np.asarray(values)[mask]
    out = np.empty_like(values)
    out[rows] = values
    return out


@functools.partial(jax.jit, static_argnames=("cfg", "bucket", "room"))
def _redistribute(state, cfg, bucket, room):
    dec = Decomposition.of(cfg)

    def local(state):
        layout = dec.mesh
        cap = dec.capacity
        grow = lambda x: jnp.pad(x, [(0, room - cap)] + [(0, 0)] * (x.ndim - 1))  # noqa: E731
        pos = wrap(state.pos, cfg.box_size)
        floats, mask = [grow(x) for x in (pos, state.vel)], grow(state.mask)
        # the needs had nothing been dropped, so that one retry fits (route_needs)
        ix, iy = layout.owner(layout.cell_coordinates(floats[0], cfg.cell_size))
        exact = parallel_migrate.route_needs(mask, ix * layout.grid[1] + iy, layout)
        (pos, vel), (ids,), mask, needs = parallel_migrate.by_position(
            floats, [grow(state.ids)], mask, 0, layout, cfg.cell_size, bucket
        )
        needs = overflow.most(needs, exact)
        # valid slots may lie anywhere in the grown buffers: keep the first cap of them
        keep, held = compact(mask, cap)
        cut = lambda x: jnp.take(x, keep, axis=0, mode="fill", fill_value=0)  # noqa: E731
        state = state.replace(pos=cut(pos), vel=cut(vel), ids=cut(ids))
        needs = {**needs, "held": held}
        return state.replace(mask=cut(mask)), layout.device_max(needs)

    return dec.sharded(local, (PARTICLES,), (PARTICLES, P()))(state)


def redistribute(state: Particles, cfg) -> Particles:
    """Send particles held on any device to the devices that own their positions.

    For particles placed without regard to position (read from files). The
    particles travel along x, then along y; between the two, a device may
    hold more than it ends with, and any device may send many particles to
    one other. So the buffers of this one-off move start at the config's
    sizes and grow to the measured need (temporarily), and it never stops
    on ``capacity_factor`` or ``exchange_factor`` unless a device must end
    with more than its capacity of particles: that raises
    :class:`distpm.CapacityError`.
    """
    run = lambda bucket, room: _redistribute(state, cfg, bucket, room)  # noqa: E731
    dec = Decomposition.of(cfg)
    return parallel_migrate.grown(run, cfg, dec.exchange_size, dec.capacity)

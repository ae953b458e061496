"""Particles read from files: an even share per device, then sent to their owners."""

from __future__ import annotations

import numpy as np

from distpm.parallel import runtime
from distpm.state import Particles


def from_rows(read_rows, total: int, a: float, cfg) -> Particles:
    """Particles on ``cfg``'s device grid from ``total`` rows stored in any order.

    read_rows(start, stop) returns rows [start, stop) as a dict of numpy
    arrays in distpm's units: ``pos`` [Mpc/h] and ``vel`` (n, 3), and ``ids``
    (n, 2) id words. Device b of the grid reads rows [b total / D,
    (b + 1) total / D) (each process reads only its devices' rows); then
    every particle moves to the device that owns its position
    (:func:`distpm.simulation.redistribute`).
    """
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    from distpm.parallel.devices import device_mesh
    from distpm.simulation import redistribute

    n_blocks, cap, dtype = cfg.n_devices, cfg.capacity, cfg.float_dtype
    sharding = NamedSharding(device_mesh(cfg.device_grid), P(("x", "y")))
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
    from distpm.state import linear_ids

    rows = linear_ids(runtime.to_host(particles.ids)[mask], cfg.particle_shape).astype(np.int64)
    values = np.asarray(values)[mask]
    out = np.empty_like(values)
    out[rows] = values
    return out

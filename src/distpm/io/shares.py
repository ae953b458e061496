"""Particles read from files: an even share per device, then sent to their owners."""

from __future__ import annotations

import numpy as np

from distpm.parallel import runtime
from distpm.state import Particles


def from_rows(read_rows, total: int, a: float, cfg) -> Particles:
    """Particles on ``cfg``'s device grid from ``total`` rows stored in any order.

    read_rows(start, stop) returns rows [start, stop) as a dict of numpy
    arrays in distpm's units: ``pos`` [Mpc/h] and ``vel`` (n, 3), ``ids``
    (n, 2) id words, and optionally ``acc`` (n, 3; zero if absent). Device b
    of the grid reads rows [b total / D, (b + 1) total / D) (each process reads
    only its devices' rows); then every particle moves to the device that
    owns its position (:func:`distpm.simulation.redistribute`).
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
        rows.setdefault("acc", np.zeros((n, 3)))
        block = {
            k: np.pad(np.asarray(v, np.int32 if k == "ids" else dtype), [(0, cap - n), (0, 0)])
            for k, v in rows.items()
        }
        blocks[b] = {**block, "mask": np.arange(cap) < n}
    arrays = {}
    for name in ("pos", "vel", "acc", "ids", "mask"):
        parts = {b: block[name] for b, block in blocks.items()}
        shape = (n_blocks * cap,) + next(iter(parts.values())).shape[1:]
        arrays[name] = runtime.from_local_blocks(parts, shape, sharding)
    return redistribute(Particles(**arrays, a=np.asarray(a, dtype)), cfg)

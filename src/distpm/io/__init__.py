"""Files other tools read and write: Gadget-4 HDF5 snapshots, ICs and group catalogues,
and checkpoints.

Units are converted here only; inside distpm positions are in Mpc/h and
velocities are canonical momenta (see :mod:`distpm.state`).
"""

from distpm.io.gadget import read_snapshot, write_snapshot
from distpm.io.groups import write_groups

__all__ = ["read_snapshot", "write_groups", "write_snapshot"]

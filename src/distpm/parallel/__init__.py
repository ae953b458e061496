"""Everything that talks between devices lives here.

Physics modules see one device's local block and call only the named
operations of :class:`Layout` (FFTs, halo exchange, global sums) and of
:mod:`distpm.parallel.migrate` (particle exchange). The device grid is 2-D,
(px, py) with mesh axes ("x", "y"); one device is the 1x1 grid, on which the
FFTs are local and the halo wraps onto the opposite side of the same block.
"""

from distpm.parallel.layout import Layout
from distpm.parallel.overflow import CapacityError

__all__ = ["CapacityError", "Layout"]

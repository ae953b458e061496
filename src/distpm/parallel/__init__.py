"""Everything that talks between devices lives here.

Physics modules see one device's local block and call only the named
operations of :class:`Layout` (FFTs, halo exchange, global sums). On one
device the layout is 1x1: the FFTs are local and the halo exchange wraps the
halo periodically onto the opposite side of the same block.
"""

from distpm.parallel.layout import Layout

__all__ = ["Layout"]

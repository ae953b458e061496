"""Local array operations (no communication): compaction, running sums, sorting, buffers.

Where XLA's CPU and GPU backends want different code for the same operation,
both forms live here and :func:`distpm.ops.platform.by_platform` picks one
when the program is lowered for its device; the tests run both on the CPU.
"""

from distpm.ops.compact import compact
from distpm.ops.scans import running_max, running_sum

__all__ = ["compact", "running_max", "running_sum"]

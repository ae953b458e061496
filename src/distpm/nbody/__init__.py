"""The N-body layer: the time steps (:class:`Schedule`), the one step loop and its
reverse-time adjoint, and what observers of the steps provide."""

from distpm.nbody.schedule import Schedule

__all__ = ["Schedule"]

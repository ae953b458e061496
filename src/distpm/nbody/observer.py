"""What an output made during the steps (the lightcone, P(k) every N steps) provides.

An observer is a pytree: its arrays (e.g. the lightcone's shell tables,
functions of the cosmology) are differentiable inputs of the run, its other
fields static. The one loop (:mod:`distpm.nbody.loop`) gives each observer
a record (a pytree of float arrays on every device), and calls

- ``empty(dtype)``: this device's record before the first step;
- ``observe(record, piece, pos, dx, mask, cosmo, layout)`` for every piece
  of drift: ``piece`` is its index (an int32 scalar, traced in a scan) among
  the intervals between the scale factors of
  :func:`distpm.nbody.schedule.drift_knots` (FastPM's steps; the 2LPT
  integrator's half steps, two per step), ``pos`` [Mpc/h] the positions at its
  start of the particles this device holds (on their owners, but for the 2LPT
  integrator's pieces that start at a step boundary: half a drift away), ``dx``
  [Mpc/h] their drift over it, linear in the growth factor D, ``mask`` the valid
  slots (a piece may be shown again with none valid: it must then add nothing).
  It returns the new record;
- ``finish(record, pos, mask, cosmo, layout)`` once, after the last step,
  with the final positions: the result, the same on every device (sum the
  devices' records with ``layout.device_sum``).

``differentiable``: True if ``observe`` only adds to the record (the new
record is the old one plus a function of the step), which is what the
reverse-time adjoint needs to send the record's cotangent into every step.
"""

from __future__ import annotations

from typing import Protocol


class Observer(Protocol):
    differentiable: bool

    def empty(self, dtype): ...

    def observe(self, record, piece, pos, dx, mask, cosmo, layout): ...

    def finish(self, record, pos, mask, cosmo, layout): ...


def observe_all(observers, records, piece, pos, dx, mask, cosmo, layout) -> tuple:
    """Every observer's record after it observed ``piece`` (see :class:`Observer`)."""
    pairs = zip(observers, records, strict=True)
    return tuple(o.observe(r, piece, pos, dx, mask, cosmo, layout) for o, r in pairs)

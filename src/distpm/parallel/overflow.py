"""Named overflow: what each fixed-size buffer needed, checked against what it has.

A compiled program cannot grow a buffer, so a stage that fills one reports what it needed as
an entry of a dict named for the buffer (``{"capacity": n, "exchange": m}``, int32 per
device). Entries of one name combine by their maximum, over stages (:func:`most`) and over
devices (``layout.device_max`` on each). After the program, :func:`check` compares them
with the :class:`Limit` of each name (the slots the buffer has, the option that sizes it)
and raises one :class:`CapacityError` that names every option to raise and by how much.
Inside a traced computation (a user's ``jax.jit``), :func:`checked` turns an overflow into
NaN results instead: no host callback is ever put into a program.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import jax
import jax.numpy as jnp
import numpy as np


class CapacityError(RuntimeError):
    """A fixed-size buffer was too small; the message says which option to raise.

    least: option -> the least value that holds what the buffers it sizes needed (a lower
    bound where an overflow made later stages send less)."""

    def __init__(self, message: str, least: dict | None = None):
        super().__init__(message)
        self.least = dict(least or {})


@dataclass(frozen=True)
class Limit:
    """What one buffer holds, and how to make it hold more.

    have: its slots (a tuple, elementwise, for a need with one entry per face or pass).
    says: what overflowed, with ``{need}`` and ``{have}`` for the largest need and its slots.
    option: the setting that sizes the buffer, at ``value``; ``per_unit``: the slots it
    gives per unit of the option (so the least value that holds a need is need / per_unit,
    elementwise for tuples), or a function of the need that returns that value.
    Without an option, ``advice`` says what to do instead. Where several buffers share
    an option, every line names the largest of their least values.
    """

    have: int | float | tuple
    says: str
    option: str = ""
    value: float = 0.0
    per_unit: float | tuple | Callable = 1.0
    advice: str = ""

    def says_for(self, need: np.ndarray) -> str:
        """What overflowed, at the entry of ``need`` furthest over its slots."""
        have = np.broadcast_to(np.asarray(self.have), need.shape)
        worst = np.unravel_index(np.argmax(need - have), need.shape)
        return self.says.format(need=need[worst].item(), have=have[worst].item())

    def least(self, need: np.ndarray):
        """The least value of the option that holds ``need``."""
        if callable(self.per_unit):
            return self.per_unit(need)
        return _round_up(float(np.max(need / np.asarray(self.per_unit))))


def _round_up(x: float, digits: int = 3) -> float:
    """``x`` rounded up to ``digits`` significant digits, keeping at least two decimals."""
    if x <= 0:
        return 0.0
    decimals = max(2, digits - 1 - math.floor(math.log10(x)))
    scale = 10**decimals
    return math.ceil(round(x * scale, 6)) / scale


def most(*needs: dict) -> dict:
    """The largest need of each name over ``needs`` (names missing from some are kept)."""
    out = {}
    for need in needs:
        for name, value in need.items():
            out[name] = value if name not in out else jnp.maximum(out[name], value)
    return out


def _require_limits(needs: dict, limits: dict) -> None:
    missing = sorted(set(needs) - set(limits))
    if missing:
        raise KeyError(f"no limit for the needs {missing}")


def check(needs: dict, limits: dict) -> None:
    """Raise :class:`CapacityError` if any need exceeds its limit, with every one that does.

    needs: name -> need (concrete arrays, host or device); limits: name -> :class:`Limit`,
    one for every name of ``needs``.
    """
    _require_limits(needs, limits)
    over = []
    for name, need in sorted(jax.device_get(needs).items()):
        need = np.asarray(need)
        if np.any(need > np.asarray(limits[name].have)):
            over.append((limits[name], need))
    least = {}  # one value per option, the largest that any of its buffers asks for
    for limit, need in over:
        if limit.option:
            value = limit.least(need)
            least[limit.option] = max(least.get(limit.option, value), value)
    lines = []
    for limit, need in over:
        text, option = limit.says_for(need), limit.option
        if option:
            lines.append(
                f"{text} ({option}={limit.value}); raise {option} to at least {least[option]}"
            )
        else:
            lines.append(f"{text}; {limit.advice}")
    if lines:
        raise CapacityError("\n".join(lines), least)


def checked(out, needs: dict, limits: dict):
    """``out``, once ``needs`` are checked against ``limits``.

    Concrete needs (a program has run) are checked now: :func:`check` raises. Traced needs
    (inside ``jax.jit`` or ``jax.grad``) cannot leave the program, and a host callback
    would tie the program to the host (and cannot compile for a GPU without one): there,
    every floating-point array of ``out`` becomes NaN where a need exceeds its slots, so
    an overflow is never a silently wrong result; the same call outside ``jit``, or the
    run's plan, says which buffer and which option to raise.
    """
    if not any(isinstance(v, jax.core.Tracer) for v in jax.tree.leaves(needs)):
        check(needs, limits)
        return out
    _require_limits(needs, limits)
    over = jnp.zeros((), bool)
    for name, need in needs.items():
        over = over | jnp.any(need > jnp.asarray(limits[name].have))

    def poisoned(x):
        if not jnp.issubdtype(x.dtype, jnp.floating):
            return x
        return jnp.where(over, jnp.asarray(jnp.nan, x.dtype), x)

    return jax.tree.map(poisoned, out)

"""What ``distpm run`` checks before it allocates anything: each fault a user can cause that
is knowable before the steps is refused with one line, not found after hours of them.

The memory plan (:func:`distpm.plan.check_fits`) and the output folder's claim
(:class:`distpm.io.folder.Claim`) are checked beside these, by :func:`distpm.pipeline.run`.
"""

from __future__ import annotations

import importlib.util

import numpy as np

from distpm.io import gadget, partial
from distpm.nbody.schedule import Schedule
from distpm.parallel import runtime
from distpm.parallel.decomposition import Decomposition

PLOTS_BYTES = 2e5  # about what the spectra's and density's figures of an output take


def check_run(cfg, cosmo, output, halos, lightcone, resume, ics) -> None:
    """Raise one line for a run that cannot work: its config, cosmology, lightcone, optional
    packages, the one certain halo-catalogue overflow, snapshot format limits, its initial
    conditions' files, and what a resume cannot carry."""
    cfg.check_runnable()
    cosmo.check()
    if resume is not None and ics is not None:
        raise ValueError(
            "give a checkpoint to resume or initial conditions to start from, not both"
        )
    if lightcone is not None:
        lightcone.check(cfg)
    check_packages(cfg, lightcone)
    if halos.enabled and halos.min_members == 1 and halos.group_factor < 1:
        raise ValueError(  # the one overflow of the catalogue that is certain in advance
            "halos.min_members = 1 makes every particle a group: the catalogue then needs a "
            f"record per particle slot, halos.group_factor >= 1 (it is {halos.group_factor})"
        )
    if output.snapshot_format == "gadget4":  # else refused when the first snapshot is written
        gadget.check_cubic(cfg)
    if ics is not None:
        check_ics(ics, cosmo, cfg)
    if resume is not None and (lightcone is not None or output.power_every):
        raise ValueError(
            "a run with a lightcone or power_every cannot resume yet: its checkpoints do not "
            "hold what was recorded before them; run it from the start"
        )


def check_ics(path, cosmo, cfg) -> None:
    """Raise one line if Gadget IC files are not at ``cfg.a_start`` or were made with another
    cosmology (the header's Omega0, OmegaLambda, HubbleParam, where it has them)."""
    head = gadget.header_of(path)
    a = float(head["Time"])
    if abs(a - cfg.a_start) > 1e-6 * cfg.a_start:
        raise ValueError(f"initial conditions {path} are at a={a:.6g} but a_start is {cfg.a_start}")
    ours = {"Omega0": cosmo.Omega_m, "OmegaLambda": cosmo.Omega_de, "HubbleParam": cosmo.h}
    theirs = {k: float(head[k]) for k in ours if k in head}
    differ = [k for k, v in theirs.items() if abs(v - float(ours[k])) > 1e-6 * abs(float(ours[k]))]
    if differ:
        made = ", ".join(f"{k}={theirs[k]:.6g}" for k in differ)
        have = ", ".join(f"{k}={float(ours[k]):.6g}" for k in differ)
        raise ValueError(
            f"initial conditions {path} were made with {made} but this run has {have} "
            "(Omega0 = Omega_m, OmegaLambda = Omega_de, HubbleParam = h); run with their cosmology"
        )


def check_space(out, cfg, output) -> None:
    """Refuse before the steps a run whose particle files (snapshots, the group files'
    ordered copy, the newest checkpoints) and figures would not fit on the disk."""
    n, outputs = cfg.n_particles, len(Schedule.stops_of(cfg))
    per_particle = (52 if output.snapshot_double else 28) if output.snapshot_format != "none" else 0
    needed = outputs * (n * per_particle + PLOTS_BYTES)
    if output.checkpoint_every or output.checkpoint_minutes:  # those kept, and one more
        per_slot = 6 * np.dtype(cfg.float_dtype).itemsize + 9  # pos, vel, ids, mask
        needed += (output.keep_checkpoints + 1) * Decomposition.of(cfg).slots * per_slot
    what = "the run's snapshots, checkpoints and figures"
    runtime.main_decides(lambda: partial.check_space(out, needed, what))


def check_packages(cfg, lightcone) -> None:
    """Raise one line before the run if an optional package it needs is missing (else the
    run would fail inside the initial conditions, or after its steps)."""
    needs = {"camb": cfg.linear_power == "camb", "healpy": lightcone is not None}
    for package in (p for p, needed in needs.items() if needed):
        if importlib.util.find_spec(package) is None:
            why = 'linear_power = "camb"' if package == "camb" else "a [lightcone]"
            raise ValueError(f"{why} needs the {package} package: pip install {package}")

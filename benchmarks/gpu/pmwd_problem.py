"""The benchmark's "standard problem" run with pmwd (eelregit/pmwd, commit 0552bc0), one mode
per process, for a side-by-side comparison with ``distpm_problem.py`` on one GPU.

Problem: periodic box of 256 Mpc/h, N^3 particles, a (mesh_factor*N)^3 mesh, flat LCDM
(Omega_m=0.3111, Omega_b=0.0490, h=0.6766, n_s=0.9665, sigma8=0.8102), pmwd's own linear
P(k) (its default: Eisenstein-Hu fit with wiggles), 2LPT at a=0.1, ``--steps`` leapfrog
(kick-drift-kick) steps linear in a to a=1, one device. Lengths in Mpc/h (pmwd's units).
  forward:  white noise (N^3, real space) -> linear_modes -> lpt -> nbody -> scatter (mesh
            density, mean 1), jitted.
  gradient: jax.grad of sum(density**2) w.r.t. the white noise, jitted (pmwd's own
            time-reversal adjoint for the N-body part).
The cosmology (without its tables) is a traced argument: boltzmann() (transfer, growth
ODE, sigma(R) table) runs inside the timed function. A_s is fixed once from sigma8 with
Cosmology.from_sigma8 before timing.

float32: pmwd (and mcfit) switch ``jax_enable_x64`` on at import; this script switches it
off again right after importing pmwd, before anything is built, and sets
Configuration(cosmo_dtype=float32, float_dtype=float32), so every array and every op is
32-bit (pmwd's own jnp.float64 casts in its scatter/gather index maths become float32).
pmid stays pmwd's int16 default (enough for meshes up to 32767).

Protocol (as benchmarks/timing.py): the first call is compile_s (compilation + first run);
then ``--repeats`` calls, each ended with jax.block_until_ready: times_s, median_s their
median. Outputs are copied to the host outside the timed region (for ``finite`` and
``bitwise_repeats``); peak_rss_mib (ru_maxrss at the end) includes those copies.
peak_gpu_bytes/bytes_limit come from device.memory_stats() (null where it has none).
One JSON line on stdout; everything else goes to stderr.

    PYTHONPATH=<dir with pmwd/ and mcfit/> python benchmarks/gpu/pmwd_problem.py \
        --n 128 --mesh-factor 2 --steps 10 --mode gradient
"""

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from timing import rss_mib  # noqa: E402

BOX = 256.0
A_START, A_STOP = 0.1, 1.0
COSMO = dict(n_s=0.9665, Omega_m=0.3111, Omega_b=0.0490, h=0.6766)
SIGMA8 = 0.8102


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, required=True, help="N^3 particles")
    ap.add_argument("--mesh-factor", type=int, choices=[1, 2], default=1)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--mode", choices=["forward", "gradient"], required=True)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()

    import jax
    import jax.numpy as jnp
    import numpy as np
    import pmwd

    jax.config.update("jax_enable_x64", False)  # undo pmwd's switch: float32 everywhere

    conf = pmwd.Configuration(
        ptcl_spacing=BOX / args.n,
        ptcl_grid_shape=(args.n,) * 3,
        mesh_shape=args.mesh_factor,
        cosmo_dtype=jnp.float32,
        float_dtype=jnp.float32,
        lpt_order=2,
        a_start=A_START,
        a_stop=A_STOP,
        a_nbody_maxstep=(A_STOP - A_START) / args.steps,
    )
    if conf.a_nbody_num != args.steps:
        sys.exit(f"pmwd_problem.py: {conf.a_nbody_num} steps instead of {args.steps}")
    cosmo = pmwd.Cosmology.from_sigma8(conf, SIGMA8, **COSMO)

    def forward(noise, cosmo):
        cosmo = pmwd.boltzmann(cosmo, conf)
        modes = pmwd.linear_modes(noise, cosmo, conf)
        ptcl, _ = pmwd.lpt(modes, cosmo, conf)
        ptcl, _ = pmwd.nbody(ptcl, None, cosmo, conf)
        return pmwd.scatter(ptcl, conf)

    if args.mode == "forward":
        fn = jax.jit(forward)
    else:
        fn = jax.jit(jax.grad(lambda noise, cosmo: jnp.sum(forward(noise, cosmo) ** 2)))
    noise = jax.block_until_ready(pmwd.white_noise(args.seed, conf, real=True))

    t = time.perf_counter()
    out = jax.block_until_ready(fn(noise, cosmo))
    compile_s = time.perf_counter() - t
    host = np.asarray(out)
    del out
    dtypes = {str(host.dtype), str(noise.dtype)}
    finite = bool(np.isfinite(host).all())
    times, first, bitwise = [], None, True
    for _ in range(args.repeats):
        t = time.perf_counter()
        out = jax.block_until_ready(fn(noise, cosmo))
        times.append(time.perf_counter() - t)
        host = np.asarray(out)
        del out
        finite = finite and bool(np.isfinite(host).all())
        if first is None:
            first = host
        else:
            bitwise = bitwise and np.array_equal(first.view(np.uint32), host.view(np.uint32))

    device = jax.devices()[0]
    stats = device.memory_stats()
    print(
        json.dumps(
            {
                "code": "pmwd",
                "version": getattr(pmwd, "__version__", "0552bc0"),
                "n": args.n,
                "mesh_factor": args.mesh_factor,
                "mesh": conf.mesh_shape[0],
                "steps": args.steps,
                "mode": args.mode,
                "compile_s": compile_s,
                "median_s": statistics.median(times) if times else None,
                "times_s": times,
                "bitwise_repeats": bitwise if len(times) > 1 else None,
                "peak_gpu_bytes": stats.get("peak_bytes_in_use") if stats else None,
                "bytes_limit": stats.get("bytes_limit") if stats else None,
                "peak_rss_mib": rss_mib(),
                "device": str(device),
                "jax_version": jax.__version__,
                "finite": finite,
                "dtypes": sorted(dtypes),
                "x64": bool(jax.config.jax_enable_x64),
                "A_s_1e9": float(cosmo.A_s_1e9),
            }
        )
    )


if __name__ == "__main__":
    main()

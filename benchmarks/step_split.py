"""Split of one PM force evaluation into paint / FFTs / readout (distpm, one device).

Each part is jitted alone and timed on the particles of an evolved run
(realistic clustering): paint (CIC mass assignment), ffts (one forward rFFT
and three inverse rFFTs with the k-space kernels), readout (CIC
interpolation of the 3 force components), and the whole force. Median of
``--repeats`` after a warm-up. One JSON line per mesh size on stdout.

    python benchmarks/step_split.py --n 64 128
"""

import argparse
import json

from timing import time_calls


def timed(fn, *args, repeats):
    return time_calls(fn, *args, repeats=repeats)[1]["median_s"]


def split(n, repeats):
    import jax
    import jax.numpy as jnp

    import distpm
    from distpm import kernels
    from distpm.gravity import force, paint_density
    from distpm.painting import readout
    from distpm.parallel.decomposition import Decomposition

    cfg = distpm.SimConfig(box_size=256.0, mesh_shape=n, n_steps=10, parallel=(1, 1))
    cosmo = distpm.Cosmology.planck18()
    state = distpm.simulate(distpm.white_noise(0, cfg), cosmo, cfg)
    pos, mask = state.pos, state.mask
    layout = Decomposition.of(cfg).mesh
    kvec = layout.wavenumbers(cfg.box_size, jnp.float32)
    grads = [
        jnp.asarray(d, jnp.float32) for d in kernels.gradient_kernel(kvec, cfg.cell_size, "fd")
    ]
    green = jnp.asarray(kernels.inverse_laplacian(kvec), jnp.float32)

    paint = jax.jit(lambda p, m: paint_density(p, m, layout, cfg))

    @jax.jit
    def ffts(rho):
        phi_k = layout.rfft3d(rho) * green
        return jnp.stack([layout.irfft3d(-1j * d * phi_k) for d in grads], axis=-1)

    read = jax.jit(lambda f, p, m: readout(f, p, layout, cfg.cell_size, cfg.paint_order, mask=m))
    whole = jax.jit(lambda p, m: force(p, m, cosmo, layout, cfg))
    rho = paint(pos, mask)
    field = ffts(rho)
    result = {
        "mesh": n,
        "paint_s": timed(paint, pos, mask, repeats=repeats),
        "ffts_s": timed(ffts, rho, repeats=repeats),
        "readout_s": timed(read, field, pos, mask, repeats=repeats),
        "force_s": timed(whole, pos, mask, repeats=repeats),
    }
    result["mass_assignment_over_ffts"] = (result["paint_s"] + result["readout_s"]) / result[
        "ffts_s"
    ]
    return result


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, nargs="+", default=[64, 128])
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()
    for n in args.n:
        print(json.dumps(split(n, args.repeats)), flush=True)


if __name__ == "__main__":
    main()

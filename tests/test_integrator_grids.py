"""The 2LPT integrator on device grids: its run and its gradients equal one device's.

In their own module: inside ``test_distributed.py``'s process, after its other
tests, they took its compiled programs past Linux's limit of memory mappings (see
``_few_memory_mappings`` in conftest.py and the CHANGELOG).
"""

import numpy as np
import pytest
from test_distributed import GRAD, SIM, _final_density, _gradients_on, _rel


def test_2lpt_integrator_simulation_equals_one_device_float32():
    reference, ref_state = _final_density(SIM.replace(integrator="2lpt"))
    delta, state = _final_density(SIM.replace(integrator="2lpt").on((4, 2)))
    assert _rel(delta, reference) < 1e-5
    assert np.max(np.abs(state.by_id() - ref_state.by_id())) < 1e-3


@pytest.mark.parametrize("grid", [(2, 2), (4, 2)])
def test_2lpt_integrator_gradients_equal_one_device(grid):
    """The 2LPT integrator's reverse-time adjoint (momenta scaled at each kick, a closing
    drift) on 2x2 and 4x2, float32: the noise gradient to 1e-5."""
    (g_noise, _), (h_noise, _) = _gradients_on(GRAD.replace(integrator="2lpt"), grid)
    assert _rel(h_noise, g_noise) < 1e-5

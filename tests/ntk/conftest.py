"""Fixtures shared by the tests of :mod:`kernels.ntk`."""

from __future__ import annotations

import pytest



@pytest.fixture(scope="module")
def nt_ref():
    """neural-tangents with jax in float64; the previous x64 setting is restored after."""
    nt = pytest.importorskip("neural_tangents", reason="neural-tangents is the reference")
    import jax
    import jax.numpy as jnp
    from neural_tangents import stax

    previous = jax.config.jax_enable_x64
    jax.config.update("jax_enable_x64", True)
    yield {"jax": jax, "jnp": jnp, "nt": nt, "stax": stax}
    jax.config.update("jax_enable_x64", previous)

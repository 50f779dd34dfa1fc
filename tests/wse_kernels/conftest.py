"""Fixtures for the kernel tests; helpers live in kernel_helpers.py."""
from __future__ import annotations

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np
import pytest


@pytest.fixture
def rng() -> np.random.Generator:
    return np.random.default_rng(1234)


HOST_KERNEL_PROVIDERS = ("numpy", "tensorflow")


@pytest.fixture(params=HOST_KERNEL_PROVIDERS)
def host_kernels(request, monkeypatch):
    """Each host-kernel provider in turn, as the one `kernel_helpers.run` hands the kernels: a test that
    uses this fixture runs the dense kernels on numpy/OpenBLAS and on TensorFlow's own kernels. The TF
    provider is imported only here: the kernels themselves need numpy alone."""
    import kernel_helpers

    if request.param == "numpy":
        from cerebras_tf.wse.kernels import NUMPY_HOST_KERNELS as provider
    else:
        from cerebras_tf.run.host_kernels_tf import TENSORFLOW_HOST_KERNELS as provider
    monkeypatch.setattr(kernel_helpers, "HOST_KERNELS", provider)
    return provider


@pytest.fixture(params=["numba", "numpy"])
def jit(request):
    """Each implementation of the memory-bound kernels in turn: their numba loops, then their numpy code
    (cerebras_tf/wse/kernels/_jit.py)."""
    from cerebras_tf.wse.kernels import _jit

    with _jit.use_jit(request.param == "numba"):
        yield request.param

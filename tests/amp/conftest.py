"""Shared fixtures for the amp tests."""
import pytest

from cerebras_tf import amp


@pytest.fixture(autouse=True)
def _reset_half_dtype():
    """Every test starts and ends with the default half dtype (float16)."""
    amp.set_half_dtype("float16")
    yield
    amp.set_half_dtype("float16")

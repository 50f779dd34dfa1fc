"""Fixtures shared by the executor tests."""
from __future__ import annotations

import pytest

from cerebras_tf import amp


@pytest.fixture
def half_dtype(request):
    """The half dtype a test is parametrized with (indirect), set for the test and restored after it."""
    before = amp.get_half_dtype()
    amp.set_half_dtype(request.param)
    yield request.param
    amp.set_half_dtype(before)

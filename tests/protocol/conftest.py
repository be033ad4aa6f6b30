import pytest

from .harness import Net


@pytest.fixture
def net():
    return Net()

"""Fixtures of the integration suite.

``REFERENCE_BROKER=mosquitto pytest tests/integration`` runs every test that uses the shared
``broker`` fixture against the real Mosquitto instead of brokerd: the way the behavioural
reference was checked for the docstrings that cite it (tests needing brokerd flags still start
brokerd).
"""

import itertools
import os

import pytest

from .helpers import MosquittoProcess

_seq = itertools.count()


@pytest.fixture
def topic(request):
    """A topic prefix unique to the test (modules share one broker)."""
    return f"t/{request.node.name[:30].replace('[', '_').replace(']', '_')}/{os.getpid()}-{next(_seq)}"


@pytest.fixture(scope="module")
def mosquitto():
    """The real Mosquitto broker: the behavioural reference where the spec leaves room."""
    m = MosquittoProcess("sys_interval 1").start()
    yield m
    m.stop()


if os.environ.get("REFERENCE_BROKER") == "mosquitto":
    @pytest.fixture(scope="module")
    def broker(mosquitto):
        return mosquitto

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
    m = MosquittoProcess().start()
    yield m
    m.stop()

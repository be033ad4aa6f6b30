import itertools
import os

import pytest

from .procs import BrokerProcess

_ids = itertools.count()


@pytest.fixture(scope="module")
def broker():
    """A brokerd node shared by a test module: anonymous access, mqtt + ws listeners."""
    with BrokerProcess("--sys-interval", "1") as b:
        yield b


@pytest.fixture
def broker_factory():
    """Start brokerd nodes with custom flags: ``broker_factory("--max-inflight", "4")``."""
    started = []

    def start(*args, **kwargs):
        b = BrokerProcess(*args, **kwargs).start()
        started.append(b)
        return b

    yield start
    for b in started:
        b.stop()


@pytest.fixture
def client_id(request):
    """A client id unique to the test (tests share a broker per module)."""
    return f"{request.node.name[:40]}-{os.getpid()}-{next(_ids)}"

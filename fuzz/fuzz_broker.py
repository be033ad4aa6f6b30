"""Coverage-guided fuzzing of brokerd's protocol core with atheris (libFuzzer).

Each input is a client->broker byte stream fed through ``FrameDecoder`` and a
server-side ``Channel`` on a real in-memory ``Broker``; ``fuzz/harness.py``
describes the input format (raw captures, or a mode byte choosing a 3.1.1 / 5.0
prelude, how the stream is cut, a small maximum packet size, a second client
publishing, a reconnect to a persistent session) and the invariants checked.
Any exception is a finding: the transport calls the channel unguarded.

Running it
----------

atheris is not a test dependency (CI replays the corpus without it, see
``tests/protocol/test_fuzz_corpus.py``); install what the ``fuzz`` extra of
pyproject.toml pins (3.1.0 has wheels for Python >= 3.12 only, 3.0.0 for 3.11)::

    .venv/bin/python build/requirements.py fuzz | grep atheris > /tmp/fuzz-req.txt
    .venv/bin/pip install -r /tmp/fuzz-req.txt

then::

    .venv/bin/python fuzz/fuzz_broker.py fuzz/corpus -atheris_runs=200000 -max_len=4096
    .venv/bin/python fuzz/fuzz_broker.py fuzz/corpus -max_total_time=600 -max_len=4096 \
        -artifact_prefix=fuzz/regressions/

The first directory given is the corpus libFuzzer reads and adds new inputs to
(give a scratch directory first, e.g. ``/tmp/fz fuzz/corpus``, to keep the
committed corpus small; merge with ``-merge=1 fuzz/corpus /tmp/fz``). Crash
inputs land in ``-artifact_prefix``; keep the ones worth keeping under
``fuzz/regressions/`` so the replay test guards them. Reproduce one with::

    .venv/bin/python fuzz/fuzz_broker.py fuzz/regressions/crash-...

``fuzz/capture.py`` records new seeds from real clients.
"""

import os
import sys

import atheris

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

with atheris.instrument_imports(include=["brokerd", "harness"]):
    import harness


def TestOneInput(data: bytes) -> None:
    harness.run_one(data)


def main() -> None:
    atheris.Setup(sys.argv, TestOneInput)
    atheris.Fuzz()


if __name__ == "__main__":
    main()

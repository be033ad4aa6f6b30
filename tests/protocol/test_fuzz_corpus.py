"""Replay the fuzz corpus (real paho / mosquitto captures and what atheris kept)
and every crash reproducer through the atheris harness's own target,
``fuzz/harness.py:run_one``, so CI guards them without atheris installed."""

import importlib.util
from pathlib import Path

import pytest

FUZZ = Path(__file__).resolve().parents[2] / "fuzz"


def _harness():
    spec = importlib.util.spec_from_file_location("fuzz_harness", FUZZ / "harness.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


harness = _harness()
CORPUS = sorted((FUZZ / "corpus").glob("*"))
REGRESSIONS = sorted((FUZZ / "regressions").glob("*")) if (FUZZ / "regressions").is_dir() else []


def test_corpus_holds_real_captures():
    names = [p.name for p in CORPUS]
    assert any(n.startswith("paho311-") for n in names)
    assert any(n.startswith("paho5-") for n in names)
    assert any(n.startswith("mosquitto_pub-v5") for n in names)
    assert any(n.startswith("mosquitto_sub-v311") for n in names)


@pytest.mark.parametrize("path", CORPUS + REGRESSIONS, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_replay(path):
    harness.run_one(path.read_bytes())

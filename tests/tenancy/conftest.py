"""The tenancy suite's fixtures: a console database on disk (``tests.controlplane``)."""

import pytest

from ..controlplane import PROVISION, ControlPlane  # noqa: F401  (re-exported)


@pytest.fixture
def control_plane(tmp_path):
    return ControlPlane(tmp_path)

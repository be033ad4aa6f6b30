import pytest

from tenants import services


@pytest.fixture
def tenant(db):
    return services.create_tenant("acme", name="Acme Corp", contact_emails=["ops@acme.test"])


@pytest.fixture
def device(tenant):
    return services.create_device(tenant, "sensor-1")

"""Errors the tenants services raise; their text is meant for users."""


class ServiceError(ValueError):
    """A request the control plane refuses: invalid input or a state conflict."""


class NotFound(ServiceError):
    """An unknown tenant, device, credential or rule."""


class Conflict(ServiceError):
    """A duplicate name, slug or certificate fingerprint."""


class LastAdministrator(ServiceError):
    """A change that would leave a tenant that has administrators without one."""

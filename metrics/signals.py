"""Open live-metrics sockets are asked again about their access as soon as it may have gone.

The consumers (``metrics.consumers``) join a group of their user's; these receivers tell that group,
once the change is committed, when the user signed out, was changed (no longer active or staff, a
new password: the sessions it signed are no longer valid), deleted, or lost a membership. Each socket
then checks its access from the database at once: a member removed from a tenant stops getting its
figures then, not at the next periodic check (``RECHECK_EVERY``, which stays for what no signal
tells: a session that expired, rows changed by ``QuerySet.update``)."""

import logging

from asgiref.sync import async_to_sync
from channels.layers import get_channel_layer
from django.contrib.auth import get_user_model
from django.contrib.auth.signals import user_logged_out
from django.db import transaction
from django.db.models.signals import post_delete, post_save

from tenants.models import Membership

log = logging.getLogger("metrics")

ACCESS_CHANGED = "metrics.access_changed"


def user_group(user_id) -> str:
    """The channel group of a user's open metrics sockets."""
    return f"metrics.user.{user_id}"


def tell(user_id) -> None:
    """Once the change commits, ``user_id``'s open sockets check their access again."""
    if user_id is None:
        return

    def send():
        layer = get_channel_layer()
        if layer is None:
            return
        try:
            async_to_sync(layer.group_send)(user_group(user_id), {"type": ACCESS_CHANGED})
        except Exception as exc:         # (the layer's Redis out of reach: the periodic check stays)
            log.warning("open metrics sockets of user %s not told of an access change: %s", user_id, exc)

    transaction.on_commit(send)


def _membership_deleted(sender, instance, **kwargs):
    tell(instance.user_id)


def _user_saved(sender, instance, created=False, update_fields=None, **kwargs):
    if not created and update_fields != frozenset({"last_login"}):      # (each sign-in writes last_login)
        tell(instance.pk)


def _user_deleted(sender, instance, **kwargs):
    tell(instance.pk)


def _logged_out(sender, request=None, user=None, **kwargs):
    tell(getattr(user, "pk", None))


def connect() -> None:
    User = get_user_model()
    post_delete.connect(_membership_deleted, sender=Membership, dispatch_uid="metrics.membership_deleted")
    post_save.connect(_user_saved, sender=User, dispatch_uid="metrics.user_saved")
    post_delete.connect(_user_deleted, sender=User, dispatch_uid="metrics.user_deleted")
    user_logged_out.connect(_logged_out, dispatch_uid="metrics.logged_out")

"""Open live-metrics sockets are asked again about their access as soon as it may have gone.

The consumers (``metrics.consumers``) join a group of their user's; these receivers tell that group,
once the change is committed, when the user signed out, was changed (no longer active or staff, a
new password: the sessions it signed are no longer valid), deleted, or lost a membership. Each socket
then checks its access from the database at once: a member removed from a tenant stops getting its
figures then, not at the next periodic check (``RECHECK_EVERY``, which stays for what no signal
tells: a session that expired, rows changed by ``QuerySet.update``)."""

import asyncio
import logging
import threading

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


# A committed change waits this long at most for the channel layer to take its messages: with its
# Redis not answering (hung, its host unreachable) each send waited redis-py's 5 s, one after another
# -- a sign-out took 5 s, deleting a tenant with 20 members 100 s. Not told, the sockets find out at
# their periodic check (``RECHECK_EVERY``).
TELL_TIMEOUT = 1.0

_told = threading.local()       # .users: the users to tell once this thread's transaction commits


def tell(user_id) -> None:
    """Once the change commits, ``user_id``'s open sockets check their access again. The users told in
    one transaction (a tenant's deletion: each of its memberships) are told together, each once."""
    if user_id is None:
        return
    users = getattr(_told, "users", None)
    if users is None:
        users = _told.users = set()
    users.add(user_id)
    # one callback per call, the first to run sends for all (a rolled-back change's users, kept in the
    # set, are told with the next commit's: a check more, nothing lost)
    transaction.on_commit(_send)


def _send() -> None:
    users = getattr(_told, "users", None)
    if not users:
        return
    _told.users = set()
    try:
        layer = get_channel_layer()
        if layer is None:
            return

        async def send_all():
            sends = (layer.group_send(user_group(u), {"type": ACCESS_CHANGED}) for u in users)
            await asyncio.wait_for(asyncio.gather(*sends), TELL_TIMEOUT)

        async_to_sync(send_all)()
    except Exception as exc:         # (the layer's Redis out of reach: the periodic check stays)
        log.warning("open metrics sockets of user(s) %s not told of an access change: %s",
                    ", ".join(map(str, sorted(users, key=str))), str(exc) or type(exc).__name__)


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

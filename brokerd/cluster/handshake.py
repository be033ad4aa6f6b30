"""How two nodes prove, at link setup, that both hold the cluster secret (pure).

A challenge-response, so the secret never crosses the wire and a recorded
exchange is worth nothing later:

1. Both sides send ``HELLO(version, nonce, node id)`` as soon as the
   connection is up; each nonce is 32 fresh random bytes.
2. The side that opened the link sends ``AUTH(proof)``: an HMAC-SHA256, keyed
   with the secret, over the sender's and the receiver's node ids and the
   receiver's and the sender's nonces (``proof`` below).
3. The accepting side checks it (and that the claimed node id is a member of
   the cluster, in Redis), and only then answers with its own proof.
4. The opening side checks that one; only then does it send anything else.

The sender's id comes first in what is signed, so a proof can never be
reflected back to the node that made it (it would need the ids the other way
round), and a node refuses a HELLO with its own id. Without a secret (links
on mutual TLS only, ``--cluster-tls-*``) the proof is empty and the
certificate the TLS handshake verified is what admits the peer.
"""

import hashlib
import hmac
import struct

LABEL = b"brokerd cluster link v1"
MIN_SECRET = 16           # bytes: shorter secrets are refused at start-up


def _field(raw: bytes) -> bytes:
    return struct.pack(">H", len(raw)) + raw


def proof(secret: bytes | None, sender: str, receiver: str, receiver_nonce: bytes, sender_nonce: bytes) -> bytes:
    """What ``sender`` sends ``receiver`` to show it holds ``secret``."""
    if secret is None:
        return b""
    msg = b"".join((LABEL, _field(sender.encode()), _field(receiver.encode()), _field(receiver_nonce),
                    _field(sender_nonce)))
    return hmac.new(secret, msg, hashlib.sha256).digest()


def check(secret: bytes | None, got: bytes, sender: str, receiver: str, receiver_nonce: bytes,
          sender_nonce: bytes) -> bool:
    """Whether ``got`` is ``sender``'s proof for this link (constant time)."""
    return hmac.compare_digest(got, proof(secret, sender, receiver, receiver_nonce, sender_nonce))

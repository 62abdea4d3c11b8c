"""The server side of SCRAM-SHA-256 (RFC 5802, RFC 7677) as PostgreSQL speaks it.

Two pure steps: ``first_reply`` answers the client-first message with the server's nonce,
the user's salt and iteration count; ``final_reply`` checks the client's proof and returns
the server signature, or ``None``. Channel binding (SCRAM-SHA-256-PLUS) is not offered.
PostgreSQL ignores the user name inside the SCRAM messages (the startup packet names the
user), and so does this.

>>> from dpsql.server.users import make_verifier
>>> verifier = make_verifier("pencil", salt=b"salt" * 4)
>>> first = "n,,n=,r=rOprNGfwEbeRWgbNEkqO"
>>> state, server_first = first_reply(first, verifier, server_nonce="%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0")
>>> final = client_final_for(first, server_first, "pencil")
>>> final_reply(state, final) is not None, final_reply(state, client_final_for(first, server_first, "x"))
(True, None)
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import secrets
from dataclasses import dataclass

from dpsql.server.users import Verifier, prepare_password


class ScramError(Exception):
    """The client's SCRAM message is malformed (a protocol error, not a wrong password)."""


@dataclass(frozen=True)
class Exchange:
    """What the server remembers between its first and final message."""

    verifier: Verifier
    gs2_header: str
    """The channel-binding header the client opened with; it must come back in ``c=``."""
    client_first_bare: str
    server_first: str
    nonce: str
    """Client nonce followed by server nonce: the client must echo it."""


def first_reply(client_first: str, verifier: Verifier, *, server_nonce: str | None = None) -> tuple[Exchange, str]:
    """(state, server-first message) for a client-first message."""
    parts = client_first.split(",", 2)
    if len(parts) != 3 or parts[0] not in ("n", "y"):
        # 'p=...' asks for channel binding, which the server did not offer.
        raise ScramError("SCRAM channel binding is not supported; connect with channel_binding=disable or prefer")
    bare = parts[2]
    attributes = _attributes(bare)
    client_nonce = attributes.get("r")
    if not client_nonce or "m" in attributes:
        raise ScramError("malformed SCRAM client-first message")
    nonce = client_nonce + (server_nonce or secrets.token_urlsafe(18))
    salt = base64.b64encode(verifier.salt).decode("ascii")
    server_first = f"r={nonce},s={salt},i={verifier.iterations}"
    return Exchange(verifier, f"{parts[0]},{parts[1]},", bare, server_first, nonce), server_first


def final_reply(state: Exchange, client_final: str) -> str | None:
    """The server-final message if the client's proof is right, else ``None``."""
    without_proof, _, proof_part = client_final.rpartition(",p=")
    attributes = _attributes(without_proof)
    expected_binding = base64.b64encode(state.gs2_header.encode("ascii")).decode("ascii")
    if not proof_part or attributes.get("c") != expected_binding or attributes.get("r") != state.nonce:
        raise ScramError("malformed SCRAM client-final message")
    try:
        proof = base64.b64decode(proof_part, validate=True)
    except ValueError:
        raise ScramError("malformed SCRAM proof") from None
    message = f"{state.client_first_bare},{state.server_first},{without_proof}".encode("utf-8")
    signature = hmac.digest(state.verifier.stored_key, message, "sha256")
    if len(proof) != len(signature):
        return None
    client_key = bytes(a ^ b for a, b in zip(proof, signature))
    if not hmac.compare_digest(hashlib.sha256(client_key).digest(), state.verifier.stored_key):
        return None
    server_signature = hmac.digest(state.verifier.server_key, message, "sha256")
    return "v=" + base64.b64encode(server_signature).decode("ascii")


def client_final_for(client_first: str, server_first: str, password: str) -> str:
    """What a client answers to ``server_first`` (tests, and the doctest above)."""
    attributes = _attributes(server_first)
    salted = hashlib.pbkdf2_hmac("sha256", prepare_password(password), base64.b64decode(attributes["s"]),
                                 int(attributes["i"]))
    client_key = hmac.digest(salted, b"Client Key", "sha256")
    header = client_first[: len(client_first) - len(client_first.split(",", 2)[2])]
    without_proof = f"c={base64.b64encode(header.encode()).decode()},r={attributes['r']}"
    message = f"{client_first.split(',', 2)[2]},{server_first},{without_proof}".encode("utf-8")
    signature = hmac.digest(hashlib.sha256(client_key).digest(), message, "sha256")
    proof = bytes(a ^ b for a, b in zip(client_key, signature))
    return f"{without_proof},p={base64.b64encode(proof).decode()}"


def _attributes(text: str) -> dict[str, str]:
    """``a=1,b=2`` as a dict (values may hold '=', never ',')."""
    pairs = {}
    for item in text.split(","):
        key, equals, value = item.partition("=")
        if not equals or len(key) != 1:
            raise ScramError("malformed SCRAM attribute")
        pairs[key] = value
    return pairs

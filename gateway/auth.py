"""Client API keys: stored as SHA-256 digests, compared in constant time."""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Sequence

from gateway.config import ApiKey
from gateway.errors import AuthenticationError


def hash_key(key: str) -> str:
    """The digest to put in ``auth.api_keys[].sha256`` for a client key."""
    return hashlib.sha256(key.encode("utf-8")).hexdigest()


class KeyChecker:
    """Maps a presented bearer token to its tenant name, or refuses it."""

    def __init__(self, keys: Sequence[ApiKey]) -> None:
        self._keys = [(bytes.fromhex(k.sha256), k.name) for k in keys]

    @property
    def enabled(self) -> bool:
        return bool(self._keys)

    def tenant_for(self, authorization: str | None) -> str | None:
        """Tenant name for an ``Authorization`` header value; None when auth is off."""
        if not self._keys:
            return None
        if not authorization or not authorization[:7].lower() == "bearer ":
            raise AuthenticationError("missing API key: send 'Authorization: Bearer <key>'")
        digest = hashlib.sha256(_raw(authorization[7:].strip())).digest()
        tenant: str | None = None
        # Compare against every key (no early exit) so timing does not reveal which one matched.
        for expected, name in self._keys:
            if hmac.compare_digest(digest, expected):
                tenant = name
        if tenant is None:
            raise AuthenticationError("invalid API key")
        return tenant


def _raw(token: str) -> bytes:
    """The bytes the client sent: HTTP header values reach the app decoded as latin-1, so encoding them
    back gives the key's own bytes (its UTF-8, which :func:`hash_key` digests). A str that was never a
    header (characters past U+00FF) is taken as text."""
    try:
        return token.encode("latin-1")
    except UnicodeEncodeError:
        return token.encode("utf-8")

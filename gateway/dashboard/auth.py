"""Who may read the dashboard's data: an operator holding an admin key.

No key configured at all (neither ``auth.api_keys`` nor ``auth.admin_keys``): open, like the rest
of the embedded default. Any key configured: ``Authorization: Bearer <admin key>`` is required;
missing or unknown -> 401, a valid client API key that is not an admin key -> 403. Configuring only
``api_keys`` therefore locks the dashboard until an admin key is added.
"""

from __future__ import annotations

from gateway.auth import KeyChecker
from gateway.config import AuthConfig
from gateway.errors import AuthenticationError, PointsmanError


class AdminRequiredError(PointsmanError):
    """A client API key was presented where an admin key is needed (403)."""

    status = 403
    error_type = "permission_error"
    code = "admin_key_required"


class DashboardAuth:
    """Checks the ``Authorization`` header of a dashboard API request."""

    def __init__(self, auth: AuthConfig) -> None:
        self._admins = KeyChecker(auth.admin_keys)
        self._clients = KeyChecker(auth.api_keys)

    @property
    def enabled(self) -> bool:
        return self._admins.enabled or self._clients.enabled

    def admin_for(self, authorization: str | None) -> str | None:
        """The admin key's name; None when the dashboard is open. Raises 401 or 403."""
        if not self.enabled:
            return None
        if not authorization or authorization[:7].lower() != "bearer ":
            raise AuthenticationError("missing admin key: send 'Authorization: Bearer <admin key>'")
        if self._admins.enabled:
            try:
                return self._admins.tenant_for(authorization)
            except AuthenticationError:
                pass
        if self._clients.enabled:
            try:
                self._clients.tenant_for(authorization)
            except AuthenticationError:
                pass
            else:
                raise AdminRequiredError("this API key is not an admin key (auth.admin_keys)")
        raise AuthenticationError("invalid admin key")

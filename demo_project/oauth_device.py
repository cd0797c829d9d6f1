"""The device flow (RFC 8628) in the OAuth demo: what django-oauth-toolkit 3.4.1 lacks with
oauthlib 4, and the demo's choice of client.

* oauthlib 4's device authorization answer carries `scope`, which DOT 3.4.1's
  `DeviceCodeResponse` does not take (a 500): `DeviceAuthorization` drops it (DOT keeps the
  scope from the request itself), and makes the verification URIs absolute on the URL the
  client asked, so the demo needs no configured origin.
* oauthlib 4 asks the validator's `validate_device_code` for the grant's status, which DOT's
  validator does not define (a 500 on every poll): `DemoValidator` answers it from DOT's
  DeviceGrant (pending, approved, denied, expired), hands the approved grant's user and scopes to
  the token, and spends the grant, so that one approval gives one token.
* DOT ties one grant type to an application; the demo lets its terminal client (`acp-client`,
  an authorization code client) use the device grant too, so that `acp-client login --device`
  needs no other client id. A site can do the same, or register a second application with the
  device grant and have its users pass `--client-id`.
"""

from __future__ import annotations

from typing import Any, Final

from django.http import HttpRequest
from oauth2_provider.models import get_device_grant_model
from oauth2_provider.oauth2_validators import OAuth2Validator
from oauth2_provider.views import DeviceAuthorizationView

DEVICE_CODE_GRANT: Final = "urn:ietf:params:oauth:grant-type:device_code"
#: The demo clients that may use the device grant besides their own (see the module docstring).
DEVICE_CLIENTS: Final = frozenset({"acp-client"})
#: oauthlib's statuses (DeviceCodeGrant.DEVICE_CODE_*), by DOT's DeviceGrant.status.
STATUSES: Final = {"authorization-pending": "authorization_pending", "denied": "access_denied"}


class DemoValidator(OAuth2Validator):  # type: ignore[misc]  # DOT is untyped
    """DOT's validator with the device flow's missing pieces (see the module docstring)."""

    def validate_grant_type(
        self, client_id: str, grant_type: str, client: Any, request: Any, *args: Any, **kwargs: Any
    ) -> bool:
        if grant_type == DEVICE_CODE_GRANT and client is not None and client.client_id in DEVICE_CLIENTS:
            return True
        return bool(super().validate_grant_type(client_id, grant_type, client, request, *args, **kwargs))

    def validate_device_code(self, client_id: str, code: str, request: Any, *args: Any, **kwargs: Any) -> str | None:
        model: Any = get_device_grant_model()
        grant = model.objects.filter(device_code=code, client_id=client_id).first()
        if grant is None:
            return None  # invalid_grant
        if grant.is_expired():
            return "expired_token"
        if grant.status != model.AUTHORIZED:
            return STATUSES.get(grant.status)
        request.user = grant.user
        request.scopes = grant.scope.split()
        # Spent: the device code gives one token (the status DOT has for a grant no longer usable).
        grant.status = model.EXPIRED
        grant.save(update_fields=["status"])
        return "authorized"


class DeviceAuthorization(DeviceAuthorizationView):  # type: ignore[misc]  # DOT is untyped
    """DOT's device authorization endpoint, for oauthlib 4 (see the module docstring)."""

    def create_device_authorization_response(self, request: HttpRequest) -> tuple[Any, Any, int]:
        headers, response, status = super().create_device_authorization_response(request)
        if status == 200 and isinstance(response, dict):
            response.pop("scope", None)
            for name in ("verification_uri", "verification_uri_complete"):
                if isinstance(response.get(name), str):
                    response[name] = request.build_absolute_uri(response[name])
        return headers, response, status

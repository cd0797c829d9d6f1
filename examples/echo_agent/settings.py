# mysite/settings.py: add at the end
import os

INSTALLED_APPS += ["channels", "acp_channels"]
ACP_CHANNELS = {
    "AGENT": "mysite.agent.EchoAgent",  # called once per ACP connection: a new agent each
    # Who may connect: clients send `Authorization: Bearer <ACP_TOKEN>` (docs/authentication.md)
    "AUTHENTICATE": "acp_channels.auth.bearer_token",
    "TOKEN_LOOKUP": "acp_channels.auth.settings_tokens",
    "TOKENS": {os.environ["ACP_TOKEN"]: "me"},  # token -> principal id (the audit log's name)
}

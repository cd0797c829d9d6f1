"""Bearer tokens built in: an optional Django app (`"acp_channels.tokens"` in INSTALLED_APPS).

Per-user, named tokens with an expiry, scopes and the time of their last use, stored as SHA-256
digests only: the secret is shown once, when it is issued (`manage.py acp_token create USER`,
or the admin's add form), and never again. With the app installed and no TOKEN_LOOKUP named,
`acp_channels.auth.bearer_token` looks tokens up here (`acp_channels.tokens._lookup`), and
the credential sweep ends the live connections of a token revoked or expired, or of its user
deactivated or without REQUIRED_PERMISSION, within REVALIDATE_SECONDS on every worker.

Scope names follow the ACP remote security draft and are provisional: `acp:connect` (needed to
open a connection), `acp:session:observe`, `acp:session:control`.
"""

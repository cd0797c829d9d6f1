"""The directory's rules without a server (acp_channels/_directory.py): a principal is asked for
its own connections, a user with SESSIONS_VIEW_ALL_PERMISSION for everyone's; the permission is
a Django user's (a token principal, a missing user or one without it has none); the JSON puts
the most recently active session first and says whether every worker answered."""

from __future__ import annotations

from typing import Any

import pytest

from acp_channels import _directory as directory_module
from acp_channels import auth
from acp_channels._identity import ANONYMOUS, Principal
from acp_channels._inventory import ConnectionInfo, SessionInfo
from tests.auth_fixtures import FakeUser

ALICE = Principal("user", "7", "alice")


class Users:
    """A user model's manager for `user_has_permission`: users by pk."""

    def __init__(self, users: dict[str, FakeUser]) -> None:
        self.users = users
        self._default_manager = self

    def filter(self, pk: str) -> Users:
        self.wanted = pk
        return self

    async def afirst(self) -> FakeUser | None:
        return self.users.get(self.wanted)


@pytest.fixture
def users(monkeypatch: pytest.MonkeyPatch) -> Users:
    model = Users({"7": FakeUser(7, "alice", {"acp.view_all"}), "8": FakeUser(8, "bob")})
    monkeypatch.setattr("django.contrib.auth.get_user_model", lambda: model)
    return model


async def test_the_permission_is_a_django_users(users: Users) -> None:
    assert await auth.user_has_permission(ALICE, "acp.view_all") is True
    assert await auth.user_has_permission(Principal("user", "8", "bob"), "acp.view_all") is False
    assert await auth.user_has_permission(Principal("user", "9", "gone"), "acp.view_all") is False
    assert await auth.user_has_permission(Principal("token", "7", "alice"), "acp.view_all") is False


@pytest.mark.parametrize(("permission", "owner"), [(None, ALICE), ("acp.view_all", None), ("acp.other", ALICE)])
async def test_a_principal_is_asked_for_its_own_unless_it_may_see_all(
    users: Users, settings: Any, monkeypatch: pytest.MonkeyPatch, permission: str | None, owner: Principal | None
) -> None:
    settings.ACP_CHANNELS = {**settings.ACP_CHANNELS, "SESSIONS_VIEW_ALL_PERMISSION": permission}
    asked: list[Principal | None] = []

    async def cluster_connections(wanted: Principal | None = None) -> tuple[list[ConnectionInfo], list[str]]:
        asked.append(wanted)
        return [], ["silent-worker"]

    monkeypatch.setattr(directory_module.gateway, "cluster_connections", cluster_connections)
    body = await directory_module.directory(ALICE)
    assert asked == [owner]
    assert body == {"sessions": [], "connections": [], "complete": False}


def test_the_most_recently_active_session_comes_first() -> None:
    def info(connection_id: str, *sessions: SessionInfo) -> ConnectionInfo:
        return ConnectionInfo(connection_id, "w", "token:alice", "http", 0, 5.0, 1.0, 0, None, activity=sessions)

    older = SessionInfo("s-old", 1000.0, 1001.0, False, 0)
    newer = SessionInfo("s-new", 1000.0, 1002.0, True, 1)
    body = directory_module.render([info("c1", older), info("c2", newer)], complete=True)
    assert [entry["sessionId"] for entry in body["sessions"]] == ["s-new", "s-old"]
    assert body["sessions"][0]["turnRunning"] is True and body["sessions"][0]["pendingPermissions"] == 1
    assert body["sessions"][0]["lastActivity"] == "1970-01-01T00:16:42.000Z"
    assert [entry["connectionId"] for entry in body["connections"]] == ["c1", "c2"]


async def test_an_anonymous_caller_sees_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    """Anonymous clients share one principal: listing its connections would hand every
    anonymous client the ids (all that guards them) of every other's."""
    asked: list[Principal | None] = []

    async def cluster_connections(wanted: Principal | None = None) -> tuple[list[ConnectionInfo], list[str]]:
        asked.append(wanted)
        info = ConnectionInfo("c1", "w", "anonymous", "http", 0, 5.0, 1.0, 0, None)
        return [info], []

    monkeypatch.setattr(directory_module.gateway, "cluster_connections", cluster_connections)
    assert await directory_module.directory(ANONYMOUS) == {"sessions": [], "connections": [], "complete": True}
    assert asked == []


def test_an_attachment_is_listed_as_a_connection_clients_can_read() -> None:
    """Another client of a session: a connection like any (every field a client reads, plus
    `attachedTo`), its session listed once, with the connection hosting it."""
    from acp_channels.client._directory import parse_directory

    session = SessionInfo("s1", 1000.0, 1001.0, True, 0)
    host = ConnectionInfo("c1", "w", "token:alice", "http", 0, 5.0, 1.0, 0, None, attachments=1, activity=(session,))
    attached = ConnectionInfo(
        "c2", "w", "token:alice", "websocket", 0, 2.0, 0.0, 0, None, activity=(session,), attached_to="c1"
    )
    body = directory_module.render([host, attached], complete=True)
    assert [entry["connectionId"] for entry in body["sessions"]] == ["c1"]
    assert [entry.get("attachedTo") for entry in body["connections"]] == [None, "c1"]
    parsed = parse_directory(body)  # an attachment in the list once failed the client's parse
    assert [entry.connection_id for entry in parsed.connections] == ["c1", "c2"]

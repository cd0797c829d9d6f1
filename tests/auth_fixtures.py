"""Authentication fixtures for the tests: a token lookup and a user-like object.

`lookup` is a TOKEN_LOOKUP (async): ALICE, BOB and EVE are principals of kind "token"; CAROL is
a user without the permission "acp.use", DAVE a user with it (users go through
REQUIRED_PERMISSION like Django users do); anything else is None. `sync_lookup` is the same,
synchronous. No database: the users are plain objects.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from acp_channels._identity import Principal

ALICE = "alice-token-0123456789"
BOB = "bob-token-0123456789"
CAROL = "carol-token-0123456789"
DAVE = "dave-token-0123456789"
#: A principal of its own for the quota test (nothing else holds its connections).
EVE = "eve-token-0123456789"
#: A user that is no longer active: not a principal.
INACTIVE = "inactive-token-0123456789"


@dataclass
class FakeUser:
    pk: int
    username: str
    permissions: set[str] = field(default_factory=set)
    is_authenticated: bool = True
    is_active: bool = True

    def get_username(self) -> str:
        return self.username

    async def ahas_perm(self, permission: str) -> bool:
        return permission in self.permissions


def found(token: str) -> Principal | FakeUser | None:
    return {
        ALICE: Principal("token", "alice", "alice"),
        BOB: Principal("token", "bob", "bob"),
        CAROL: FakeUser(3, "carol"),
        DAVE: FakeUser(4, "dave", {"acp.use"}),
        EVE: Principal("token", "eve", "eve"),
        INACTIVE: FakeUser(5, "gone", {"acp.use"}, is_active=False),
    }.get(token)


async def lookup(token: str) -> Principal | FakeUser | None:
    return found(token)


def sync_lookup(token: str) -> Principal | FakeUser | None:
    return found(token)

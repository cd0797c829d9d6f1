"""Where `acp-client login` keeps its tokens: one JSON file per resource (the server's
endpoint as RFC 9728 names it) under `$XDG_STATE_HOME/acp-channels/tokens/`
(`~/.local/state/acp-channels/tokens/`).

The directory is created with mode 0700 and each file with 0600 (never widened and narrowed
after: a secret is written only into a file that already has its final mode), and a file is
replaced atomically (a temporary file in the same directory, then `os.replace`), so a reader
sees the old record or the new one. A lock file beside each record (`flock`) lets the clients
of one user that refresh at once take turns: the second finds the token the first stored.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import stat
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any, Final
from urllib.parse import urlsplit

try:
    import fcntl
except ImportError:  # Windows: no lock; two clients refreshing at once may each refresh
    fcntl = None  # type: ignore[assignment]

__all__ = ["LoginRecord", "TokenStore", "default_token_directory"]

FORMAT_VERSION: Final = 1
DIRECTORY_MODE: Final = 0o700
FILE_MODE: Final = 0o600


def default_token_directory() -> Path:
    """`$XDG_STATE_HOME/acp-channels/tokens` (`~/.local/state/acp-channels/tokens`)."""
    state = os.environ.get("XDG_STATE_HOME") or os.path.join(os.path.expanduser("~"), ".local", "state")
    return Path(state) / "acp-channels" / "tokens"


@dataclass(frozen=True)
class LoginRecord:
    """A signed-in server: the tokens and what renewing them needs."""

    resource: str
    issuer: str
    client_id: str
    token_endpoint: str
    access_token: str
    refresh_token: str | None = None
    #: Seconds since the epoch; None when the server did not say (`expires_in` missing).
    expires_at: float | None = None
    scope: str = ""
    revocation_endpoint: str | None = None
    obtained_at: float = 0.0

    def expires_within(self, seconds: float, now: float | None = None) -> bool:
        return self.expires_at is not None and self.expires_at - seconds <= (time.time() if now is None else now)

    def renewed(
        self, access_token: str, refresh_token: str | None, expires_in: float | None, scope: str | None
    ) -> LoginRecord:
        """This record after a refresh: a new refresh token replaces the old one; without one
        the old one stays (RFC 6749 §6)."""
        now = time.time()
        return replace(
            self,
            access_token=access_token,
            refresh_token=refresh_token or self.refresh_token,
            expires_at=now + expires_in if expires_in is not None else None,
            scope=scope if scope is not None else self.scope,
            obtained_at=now,
        )

    def to_json(self) -> str:
        return json.dumps({"version": FORMAT_VERSION, **asdict(self)}, indent=2) + "\n"

    @classmethod
    def from_json(cls, text: str) -> LoginRecord | None:
        """The record in `text`, or None for anything else (another version, a damaged file)."""
        try:
            document = json.loads(text)
        except ValueError:
            return None
        if not isinstance(document, dict) or document.pop("version", None) != FORMAT_VERSION:
            return None
        try:
            record = cls(**document)
        except TypeError:
            return None
        strings = (record.resource, record.issuer, record.client_id, record.token_endpoint, record.access_token)
        if not all(isinstance(value, str) and value for value in strings):
            return None
        return record


def file_name(resource: str) -> str:
    """A readable name for a resource's record (host, port, path), and a digest of the whole
    identifier so that two resources never share a file (http and https, paths that read the
    same once cleaned)."""
    parts = urlsplit(resource)
    readable = re.sub(r"[^A-Za-z0-9.-]+", "_", f"{parts.hostname or ''}_{parts.port or ''}{parts.path}").strip("_")
    digest = hashlib.sha256(resource.encode("utf-8")).hexdigest()[:16]
    return f"{readable[:80]}-{digest}.json"


class TokenStore:
    """The records of one user, one file per resource (see the module docstring)."""

    def __init__(self, directory: Path | None = None) -> None:
        self.directory = directory if directory is not None else default_token_directory()

    def path(self, resource: str) -> Path:
        return self.directory / file_name(resource)

    def load(self, resource: str) -> LoginRecord | None:
        try:
            text = self.path(resource).read_text(encoding="utf-8")
        except (FileNotFoundError, NotADirectoryError):
            return None
        record = LoginRecord.from_json(text)
        return record if record is not None and record.resource == resource else None

    def save(self, record: LoginRecord) -> Path:
        """Write `record` atomically, as a 0600 file in the 0700 directory."""
        self._ensure_directory()
        target = self.path(record.resource)
        temporary = target.with_name(f".{target.name}.{os.getpid()}.{time.monotonic_ns()}.tmp")
        descriptor = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0), FILE_MODE)
        try:
            with os.fdopen(descriptor, "w", encoding="utf-8") as file:
                file.write(record.to_json())
                file.flush()
                os.fsync(file.fileno())
            os.replace(temporary, target)
        except BaseException:
            with contextlib.suppress(OSError):
                temporary.unlink()
            raise
        return target

    def remove(self, resource: str) -> bool:
        """Forget a resource's record: whether there was one."""
        removed = False
        with contextlib.suppress(FileNotFoundError):
            self.path(resource).unlink()
            removed = True
        with contextlib.suppress(FileNotFoundError):
            self._lock_path(resource).unlink()
        return removed

    @contextlib.contextmanager
    def locked(self, resource: str) -> Iterator[None]:
        """Hold the resource's lock (blocking: call from a thread)."""
        self._ensure_directory()
        flags = os.O_RDWR | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0)
        descriptor = os.open(self._lock_path(resource), flags, FILE_MODE)
        try:
            if fcntl is not None:
                fcntl.flock(descriptor, fcntl.LOCK_EX)
            yield
        finally:
            os.close(descriptor)  # releases the lock

    def _lock_path(self, resource: str) -> Path:
        return self.path(resource).with_suffix(".lock")

    def _ensure_directory(self) -> None:
        """The directory with mode 0700, owned by this user: made so, or narrowed before any
        secret is written into it (one left group- or world-readable by something else)."""
        self.directory.parent.mkdir(parents=True, exist_ok=True)
        try:
            os.mkdir(self.directory, DIRECTORY_MODE)
        except FileExistsError:
            pass
        info = os.lstat(self.directory)
        if not stat.S_ISDIR(info.st_mode):
            raise OSError(f"{self.directory} is not a directory")
        if hasattr(os, "getuid") and info.st_uid != os.getuid():
            raise PermissionError(f"{self.directory} belongs to another user: not keeping tokens there")
        if stat.S_IMODE(info.st_mode) != DIRECTORY_MODE:
            os.chmod(self.directory, DIRECTORY_MODE)


def describe(record: LoginRecord) -> dict[str, Any]:
    """What `acp-client login` may print about a record: no token."""
    return {
        "resource": record.resource,
        "issuer": record.issuer,
        "client_id": record.client_id,
        "scope": record.scope,
        "expires_at": record.expires_at,
        "refreshable": record.refresh_token is not None,
    }

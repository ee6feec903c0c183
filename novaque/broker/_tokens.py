"""The broker's tokens: a TOML file of SHA-256 digests and scopes.

::

    [[token]]
    name = "billing"                     # optional: who holds it
    sha256 = "9f86d081884c7d65..."       # hashlib.sha256(token).hexdigest()
    scopes = ["consume:orders/billing", "publish:audit"]

A scope is ``publish:<topic glob>``, ``consume:<topic glob>/<channel glob>``
or ``admin``; a glob is a name with ``*``, ``?`` and ``[...]`` (``fnmatch``,
case-sensitive). The file never holds a token itself: a request's token is
hashed and its digest compared, in constant time, with every digest of the
file.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import os
import re
import secrets
import sys
import threading
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from fnmatch import fnmatchcase
from pathlib import Path
from typing import Any

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

__all__ = ["Scope", "Token", "Tokens", "hash_token", "new_token", "parse_scope", "token_toml"]

log = logging.getLogger("novaque.broker")

#: What a token starts with (so a secret scanner can recognise one).
PREFIX = "nvq_"
_GLOB = re.compile(r"[A-Za-z0-9._:*?\[\]!-]{1,200}")
_DIGEST = re.compile(r"[0-9a-f]{64}")
#: How often a file is looked at for changes (its modification time).
RELOAD_CHECK_S = 1.0


class TokensError(ValueError):
    """A tokens file that cannot be used (what is wrong, and where)."""


@dataclass(frozen=True)
class Scope:
    """What a token may do: ``kind`` is ``"publish"``, ``"consume"`` or
    ``"admin"``; ``topic`` and ``channel`` are globs (``"*"`` for admin)."""

    kind: str
    topic: str = "*"
    channel: str = "*"

    def __str__(self) -> str:
        if self.kind == "admin":
            return "admin"
        if self.kind == "publish":
            return f"publish:{self.topic}"
        return f"consume:{self.topic}/{self.channel}"

    def allows(self, kind: str, topic: str | None, channel: str | None) -> bool:
        """Whether this scope allows ``kind`` on ``topic`` (and ``channel``)."""
        if self.kind == "admin":
            return True
        if self.kind != kind or topic is None:
            return False
        if not fnmatchcase(topic, self.topic):
            return False
        return kind != "consume" or (channel is not None and fnmatchcase(channel, self.channel))


def parse_scope(text: object) -> Scope:
    """A scope from its text (``publish:orders``, ``consume:orders/*``, ``admin``);
    ``ValueError`` saying what a scope looks like otherwise."""
    if not isinstance(text, str):
        raise ValueError(f"a scope is a string, got {type(text).__name__}")
    kind, sep, rest = text.partition(":")
    if text == "admin":
        return Scope("admin")
    if sep and kind == "publish" and _GLOB.fullmatch(rest):
        return Scope("publish", rest)
    if sep and kind == "consume":
        topic, slash, channel = rest.partition("/")
        if slash and _GLOB.fullmatch(topic) and _GLOB.fullmatch(channel):
            return Scope("consume", topic, channel)
    shown = text if len(text) <= 80 else text[:77] + "..."
    raise ValueError(
        f"scope {shown!r} is none of publish:<topic glob>, consume:<topic glob>/<channel glob> "
        "or admin (globs: names with * ? [...])"
    )


@dataclass(frozen=True)
class Token:
    """One token of the file: its SHA-256 digest (hex), its scopes, its name."""

    sha256: str
    scopes: tuple[Scope, ...]
    name: str = ""

    def allows(self, kind: str, topic: str | None = None, channel: str | None = None) -> bool:
        """Whether one of its scopes allows ``kind`` (``"publish"``,
        ``"consume"``, ``"admin"``) on ``topic``/``channel``."""
        return any(scope.allows(kind, topic, channel) for scope in self.scopes)


def hash_token(token: str) -> str:
    """The SHA-256 digest of ``token`` (hex), as the tokens file holds it."""
    return hashlib.sha256(token.encode("utf-8")).hexdigest()


def new_token() -> str:
    """A fresh random token (256 bits, URL-safe, prefixed ``nvq_``)."""
    return PREFIX + secrets.token_urlsafe(32)


def token_toml(token: str, scopes: Sequence[str], name: str = "") -> str:
    """The ``[[token]]`` entry of ``token`` (its digest, never itself) with ``scopes``."""
    parsed = [str(parse_scope(s)) for s in scopes]
    if not parsed:
        raise ValueError("give a token at least one scope")
    lines = ["[[token]]"]
    if name:
        lines.append(f"name = {_toml_string(name)}")
    lines.append(f'sha256 = "{hash_token(token)}"')
    lines.append("scopes = [" + ", ".join(_toml_string(s) for s in parsed) + "]")
    return "\n".join(lines) + "\n"


def _toml_string(text: str) -> str:
    escaped = text.replace("\\", "\\\\").replace('"', '\\"')
    return '"' + "".join(c if c.isprintable() else f"\\u{ord(c):04x}" for c in escaped) + '"'


def _parse(data: dict[str, Any], where: str) -> tuple[Token, ...]:
    entries = data.get("token", [])
    unknown = sorted(set(data) - {"token"})
    if unknown:
        raise TokensError(f"{where}: unknown key {unknown[0]!r}; the file holds [[token]] entries")
    if not isinstance(entries, list):
        raise TokensError(f"{where}: 'token' must be an array of tables ([[token]])")
    tokens = []
    for n, entry in enumerate(entries, 1):
        at = f"{where}: token {n}"
        if not isinstance(entry, dict):
            raise TokensError(f"{at}: must be a table ([[token]])")
        extra = sorted(set(entry) - {"name", "sha256", "scopes"})
        if extra:
            raise TokensError(f"{at}: unknown key {extra[0]!r} (keys: name, sha256, scopes)")
        digest = entry.get("sha256")
        if not isinstance(digest, str) or not _DIGEST.fullmatch(digest.lower()):
            raise TokensError(
                f"{at}: sha256 must be the token's SHA-256 digest, 64 hex digits "
                "(`novaque token new` prints it)"
            )
        name = entry.get("name", "")
        if not isinstance(name, str):
            raise TokensError(f"{at}: name must be a string")
        scopes = entry.get("scopes")
        if not isinstance(scopes, list) or not scopes:
            raise TokensError(f"{at}: scopes must be a non-empty array of scope strings")
        try:
            parsed = tuple(parse_scope(s) for s in scopes)
        except ValueError as exc:
            raise TokensError(f"{at}: {exc}") from None
        tokens.append(Token(digest.lower(), parsed, name))
    return tuple(tokens)


def _read(path: Path) -> tuple[Token, ...]:
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise TokensError(f"cannot read the tokens file {path}: {exc.strerror or exc}") from None
    try:
        data = tomllib.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise TokensError(f"{path}: not valid TOML: {exc}") from None
    return _parse(data, str(path))


class Tokens:
    """The tokens the broker accepts, from a TOML file (re-read when it changes)
    or given directly.

    ``Tokens.from_file(path)`` reads the file (``TokensError`` if it cannot be
    used); the broker looks at its modification time at most once a second
    and reads it again when it changed, so tokens are added and revoked
    without a restart (a file that became unusable is reported in the log and
    the tokens read before stay). ``Tokens(entries)`` holds fixed
    :class:`Token` entries.
    """

    def __init__(
        self, entries: Iterable[Token] = (), *, path: str | os.PathLike[str] | None = None
    ):
        self._entries = tuple(entries)
        #: The file the tokens are read from (None: fixed entries).
        self.path = None if path is None else Path(path)
        self._mtime: float | None = None
        self._checked = 0.0
        self._lock = threading.Lock()
        #: The last error of a reload (None when the file read well).
        self.reload_error: str | None = None

    @classmethod
    def from_file(cls, path: str | os.PathLike[str]) -> Tokens:
        """The tokens of the TOML file at ``path``."""
        tokens = cls(path=path)
        assert tokens.path is not None
        tokens._mtime = _mtime(tokens.path)
        tokens._entries = _read(tokens.path)
        tokens._checked = time.monotonic()
        return tokens

    @property
    def entries(self) -> tuple[Token, ...]:
        """The tokens accepted now."""
        self._maybe_reload()
        return self._entries

    def _maybe_reload(self) -> None:
        if self.path is None:
            return
        now = time.monotonic()
        if now - self._checked < RELOAD_CHECK_S:
            return
        with self._lock:
            self._checked = now
            mtime = _mtime(self.path)
            if mtime == self._mtime:
                return
            self._mtime = mtime
            try:
                self._entries = _read(self.path)
                self.reload_error = None
            except TokensError as exc:
                self.reload_error = str(exc)
                log.error("broker: tokens file not reloaded, the tokens read before stay: %s", exc)

    def find(self, token: str) -> Token | None:
        """The entry whose digest is ``token``'s, compared in constant time
        with every entry (the time says nothing of which, or how close)."""
        digest = hash_token(token).encode("ascii")
        found = None
        for entry in self.entries:
            if hmac.compare_digest(digest, entry.sha256.encode("ascii")):
                found = entry
        return found


def _mtime(path: Path) -> float | None:
    try:
        return path.stat().st_mtime_ns / 1e9
    except OSError:
        return None

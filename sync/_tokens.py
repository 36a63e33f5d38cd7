"""Access tokens of the hub: claims signed with HMAC-SHA256 by a server secret.

A token is ``base64url(JSON claims) "." base64url(HMAC-SHA256(secret, first part))``, without
padding; every character is URL-safe and an HTTP token character, so it travels as the
``token`` query parameter (what y-websocket's ``params`` option sends) or inside a
WebSocket subprotocol (``crdtstore.token.<token>``). The claims (:class:`TokenClaims`) say
who the agent is and what it may touch; the hub takes the agent identity of every write
from the token, never from the client.

``jti`` is the token's unique id (:func:`new_jti`; ``crdtstore token`` always sets one): the
handle to revoke it by. Tokens minted without one still verify, but can only be stopped by
their expiry or by changing the secret.

**Revocation list.** A plain text file, one revoked ``jti`` per line (anything after the first
whitespace, and lines starting with ``#``, are comments): :func:`append_revoked` adds one
(``crdtstore token revoke``), :func:`read_revoked` reads them; the hub re-reads the file when
it changes (see :mod:`sync._hub`). For a ``sqlite:///path/store.db`` store its default place
is next to the database, ``path/store.db.revoked`` (:func:`default_revoked_file`).
The errors, with their codes and how the hub refuses each: :class:`TokenError`.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import os
import re
import secrets
import time
from collections.abc import Container, Iterable, Mapping
from pathlib import Path
from typing import Annotated, Final, Literal

import pydantic_core
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)

from crdtstore import CrdtStoreError, InvalidValue, UnsupportedURL
from crdtstore.backend import check_name, sqlite_path

from ._errors import CloseCode

__all__ = [
    "MAX_TOKEN_LENGTH",
    "MIN_SECRET_BYTES",
    "SECRET_ENV",
    "TOKEN_SUBPROTOCOL_PREFIX",
    "Forbidden",
    "RevocationFileError",
    "SecretMissing",
    "TokenClaims",
    "TokenError",
    "TokenExpired",
    "TokenInvalid",
    "TokenRevoked",
    "append_revoked",
    "check_jti",
    "default_revoked_file",
    "load_secret",
    "mint",
    "new_jti",
    "read_revoked",
    "verify",
]

SECRET_ENV: Final = "CRDTSTORE_SECRET"
MIN_SECRET_BYTES: Final = 16
MAX_TOKEN_LENGTH: Final = 4096
TOKEN_SUBPROTOCOL_PREFIX: Final = "crdtstore.token."
_JTI_PATTERN: Final = r"^[A-Za-z0-9_-]{1,64}$"
_JTI_RE: Final = re.compile(_JTI_PATTERN)


# -- errors ---------------------------------------------------------------------------------


class TokenError(CrdtStoreError, PermissionError):
    """A token does not grant the connection. ``http_status`` and ``close_code`` say how the
    hub refuses it (at the HTTP upgrade, or on an open connection).

    Errors (under crdtstore's tree, stable codes)::

        CrdtStoreError
        └── TokenError (PermissionError)
            ├── TokenInvalid                    TOKEN_INVALID    (HTTP 401, close 4401)
            │   └── TokenExpired                TOKEN_EXPIRED    (HTTP 401, close 4401)
            ├── Forbidden                       FORBIDDEN        (HTTP 403, close 4403)
            └── TokenRevoked                    TOKEN_REVOKED    (HTTP 403, close 4403)
        SecretMissing (ValueError)              SECRET_MISSING
    """

    code = "TOKEN_ERROR"
    http_status = 401
    close_code = int(CloseCode.UNAUTHORIZED)

    def __init__(self, reason: str) -> None:
        self.reason = reason
        super().__init__(reason)


class TokenInvalid(TokenError):
    """No token, a malformed one, or one whose signature does not match (forged)."""

    code = "TOKEN_INVALID"


class TokenExpired(TokenInvalid):
    """The token's ``exp`` has passed."""

    code = "TOKEN_EXPIRED"

    def __init__(self, exp: int, now: float) -> None:
        self.exp = exp
        self.now = now
        super().__init__(f"token expired at {exp} (now {int(now)})")


class Forbidden(TokenError):
    """The token is valid, but not for this tenant or run (or not for writing, or it lacks
    the right an op needs: ``redact``). As the answer to an op, the connection stays open."""

    code = "FORBIDDEN"
    http_status = 403
    close_code = int(CloseCode.FORBIDDEN)


class TokenRevoked(TokenError):
    """The token is valid, but its ``jti`` was revoked."""

    code = "TOKEN_REVOKED"
    http_status = 403
    close_code = int(CloseCode.FORBIDDEN)

    def __init__(self, jti: str) -> None:
        self.jti = jti
        super().__init__(f"token {jti} was revoked")


class RevocationFileError(CrdtStoreError, OSError):
    """The revocation file cannot be read or written."""

    code = "REVOCATION_FILE"

    def __init__(self, path: str | Path, exc: OSError) -> None:
        self.path = str(path)
        super().__init__(f"revocation file {path}: {exc.strerror or exc}")


class SecretMissing(CrdtStoreError, ValueError):
    """No signing secret was given, or it is too short to be one."""

    code = "SECRET_MISSING"

    def __init__(self, reason: str) -> None:
        self.reason = reason
        super().__init__(reason)


# -- claims ---------------------------------------------------------------------------------


class TokenClaims(BaseModel):
    """What a token grants: ``agent`` may use ``run`` (or runs starting with a prefix ending
    in ``*``) of ``tenant``, reading (``ro``) or reading and writing (``rw``), until ``exp``
    (seconds since the epoch). ``source`` is the provenance source kind of its writes;
    ``jti`` the token's unique id (None in tokens minted without one: those cannot be
    revoked).

    ``redact`` (only with ``rw``) lets the agent redact values of those runs through the hub
    (``store.redact`` on a ``ws://`` store, the op ``run.redact``). Redaction removes what
    other agents wrote, from the record and from the journal's bytes, so it is a right of its
    own that a plain ``rw`` token does not have (a data-protection officer's token, say); a
    token without it is refused with :class:`Forbidden` and nothing changes. Left out of the
    signed claims when false, so tokens without it read as before."""

    model_config = ConfigDict(frozen=True, strict=True, extra="forbid")

    tenant: str
    run: str
    agent: str
    mode: Literal["rw", "ro"]
    exp: Annotated[int, Field(ge=0)]
    source: Literal["tool", "model", "user", "system"] = "model"
    jti: Annotated[str, Field(pattern=_JTI_PATTERN)] | None = None
    redact: bool = False

    @model_validator(mode="after")
    def _redact_needs_rw(self) -> TokenClaims:
        if self.redact and self.mode != "rw":
            raise ValueError("the redact right needs mode 'rw'")
        return self

    @field_validator("tenant")
    @classmethod
    def _tenant(cls, value: str) -> str:
        return _name("tenant", value)

    @field_validator("agent")
    @classmethod
    def _agent(cls, value: str) -> str:
        return _name("agent", value)

    @field_validator("run")
    @classmethod
    def _run(cls, value: str) -> str:
        if value.endswith("*"):
            prefix = value[:-1]
            if prefix:
                _name("run", prefix)
            return value
        return _name("run", value)

    @property
    def read_only(self) -> bool:
        return self.mode == "ro"

    def allows(self, tenant: str, run: str) -> bool:
        """Whether the token covers ``run`` of ``tenant``."""
        if tenant != self.tenant:
            return False
        if self.run.endswith("*"):
            return run.startswith(self.run[:-1])
        return run == self.run

    def check_scope(self, tenant: str, run: str) -> None:
        """Raise :class:`Forbidden` unless the token covers ``run`` of ``tenant``."""
        if not self.allows(tenant, run):
            raise Forbidden(
                f"token of agent {self.agent!r} is for {self.tenant}/{self.run}, not {tenant}/{run}"
            )


def _name(kind: Literal["tenant", "run", "agent"], value: str) -> str:
    try:
        return check_name(kind, value)
    except CrdtStoreError as exc:
        raise ValueError(str(exc)) from None


# -- signing --------------------------------------------------------------------------------


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii")


def _unb64(text: str) -> bytes:
    if not text or any(c not in _B64_ALPHABET for c in text):
        raise TokenInvalid("token is not base64url")
    try:
        data = base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))
    except (binascii.Error, ValueError):
        raise TokenInvalid("token is not base64url") from None
    if _b64(data) != text:  # bits the last character carries past the data: one spelling only
        raise TokenInvalid("token is not canonical base64url")
    return data


_B64_ALPHABET: Final = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_")


def _check_secret(secret: bytes) -> bytes:
    if not isinstance(secret, bytes) or len(secret) < MIN_SECRET_BYTES:
        raise SecretMissing(f"the signing secret must be at least {MIN_SECRET_BYTES} bytes")
    return secret


def _signature(secret: bytes, payload: str) -> bytes:
    return hmac.new(secret, payload.encode("ascii"), hashlib.sha256).digest()


def mint(secret: bytes, claims: TokenClaims) -> str:
    """The token carrying ``claims``, signed with ``secret``.

    Raises:
        SecretMissing: ``secret`` is shorter than :data:`MIN_SECRET_BYTES`.
    """
    _check_secret(secret)
    # (``redact`` only when granted: a token without it is the same bytes as before it existed)
    dumped = claims.model_dump_json(exclude=None if claims.redact else {"redact"})
    payload = _b64(dumped.encode())
    return f"{payload}.{_b64(_signature(secret, payload))}"


def verify(
    secret: bytes,
    token: str | None,
    now: float | None = None,
    *,
    tenant: str | None = None,
    run: str | None = None,
    revoked: Container[str] = frozenset(),
) -> TokenClaims:
    """The claims of ``token`` if it was signed with ``secret``, has not expired at ``now``
    (default: the current time) and its ``jti`` is not in ``revoked``; with ``tenant`` and
    ``run``, also check that it covers them.

    The signature is compared in constant time, before the claims are parsed.

    Raises:
        TokenInvalid: missing, malformed, or not signed with ``secret``.
        TokenExpired: ``exp`` is not after ``now``.
        Forbidden: the token does not cover ``tenant``/``run``.
        TokenRevoked: its ``jti`` is in ``revoked``.
    """
    _check_secret(secret)
    if not token:
        raise TokenInvalid("no token")
    if not isinstance(token, str) or len(token) > MAX_TOKEN_LENGTH:
        raise TokenInvalid("malformed token")
    payload, dot, signature = token.partition(".")
    if not dot or "." in signature:
        raise TokenInvalid("malformed token")
    given = _unb64(signature)
    raw = _unb64(payload)  # (base64url only: the signature is over its ASCII bytes)
    if not hmac.compare_digest(given, _signature(secret, payload)):
        raise TokenInvalid("token signature does not match")
    try:
        claims = TokenClaims.model_validate(pydantic_core.from_json(raw))
    except (ValueError, ValidationError):
        raise TokenInvalid("token claims are not valid") from None
    now = time.time() if now is None else now
    if claims.exp <= now:
        raise TokenExpired(claims.exp, now)
    if claims.jti is not None and claims.jti in revoked:
        raise TokenRevoked(claims.jti)
    if tenant is not None or run is not None:
        claims.check_scope(tenant or "", run or "")
    return claims


def new_jti() -> str:
    """A fresh token id: 16 random bytes, base64url (22 characters)."""
    return secrets.token_urlsafe(16)


# -- revocation list ------------------------------------------------------------------------


def default_revoked_file(store_url: str) -> Path | None:
    """Where the revocation list of the store at ``store_url`` lives by default: next to a
    SQLite database (``sqlite:///path/store.db`` -> ``path/store.db.revoked``); None for
    other stores (give the file explicitly)."""
    try:
        path = sqlite_path(store_url)
    except UnsupportedURL:
        return None
    return path.with_name(path.name + ".revoked")


def read_revoked(path: str | Path) -> frozenset[str]:
    """The token ids listed in the revocation file ``path`` (empty if it does not exist).
    Lines that do not start with a valid ``jti`` are ignored.

    Raises:
        RevocationFileError: it exists but cannot be read.
    """
    try:
        text = Path(path).read_text(encoding="utf-8", errors="replace")
    except FileNotFoundError:
        return frozenset()
    except OSError as exc:
        raise RevocationFileError(path, exc) from None
    return frozenset(_revoked_ids(text.splitlines()))


def check_jti(jti: str) -> str:
    """``jti`` if it is a token id (1-64 base64url characters).

    Raises:
        InvalidValue: it is not.
    """
    if not isinstance(jti, str) or not _JTI_RE.fullmatch(jti):
        raise InvalidValue(f"not a token id: {jti!r}")
    return jti


def _revoked_ids(lines: Iterable[str]) -> Iterable[str]:
    for line in lines:
        fields = line.split(None, 1)
        if fields and _JTI_RE.fullmatch(fields[0]):
            yield fields[0]


def append_revoked(path: str | Path, jti: str, note: str = "") -> None:
    """Add ``jti`` to the revocation file ``path`` (created if missing), with an optional
    one-line ``note``. One ``write`` in append mode, so concurrent writers do not interleave.

    Raises:
        InvalidValue: ``jti`` is not a token id, or ``note`` spans lines.
        RevocationFileError: the file cannot be written.
    """
    check_jti(jti)
    if "\n" in note or "\r" in note:
        raise InvalidValue("the note must be one line")
    line = f"{jti} {note}".rstrip() + "\n"
    try:
        fd = os.open(Path(path), os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, line.encode("utf-8"))
        finally:
            os.close(fd)
    except OSError as exc:
        raise RevocationFileError(path, exc) from None


def load_secret(
    secret_file: str | Path | None = None, environ: Mapping[str, str] | None = None
) -> bytes:
    """The signing secret: the contents of ``secret_file`` if given, else the
    ``CRDTSTORE_SECRET`` environment variable (surrounding whitespace stripped).

    Raises:
        SecretMissing: neither is set, the file cannot be read, or the secret is shorter
            than :data:`MIN_SECRET_BYTES`.
    """
    if secret_file is not None:
        try:
            secret = Path(secret_file).read_bytes().strip()
        except OSError as exc:
            raise SecretMissing(f"cannot read secret file {secret_file}: {exc}") from None
    else:
        env = os.environ if environ is None else environ
        value = env.get(SECRET_ENV, "").strip()
        if not value:
            raise SecretMissing(f"no signing secret: set {SECRET_ENV} or pass --secret-file")
        secret = value.encode()
    return _check_secret(secret)

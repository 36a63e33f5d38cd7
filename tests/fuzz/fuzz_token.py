"""Fuzz target: token parsing (sync._tokens.verify).

The first byte picks the mode: raw (even: the rest, as text, is the token) or signed (odd:
the rest is the claims' JSON, signed with the secret, so that the claims parser is reached
past the signature check). Properties: only ``TokenError`` escapes ``verify``; a token that
verifies carries claims that mint back to a token verifying to the same claims; the same
token under another secret, or with its signature changed, is ``TokenInvalid``; a revoked
``jti`` is ``TokenRevoked``; ``check_scope`` agrees with ``allows``.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from tests.fuzz._harness import instrumented, main

with instrumented():
    from sync._tokens import (
        Forbidden,
        TokenError,
        TokenInvalid,
        TokenRevoked,
        _b64,
        _signature,
        mint,
        verify,
    )

SECRET = b"fuzz-secret-0123456789abcdef"
OTHER = b"another-secret-0123456789abcd"
NOW = 1_700_000_000.0


def check(data: bytes) -> None:
    if not data:
        return
    if data[0] & 1:
        payload = _b64(data[1:])
        token = f"{payload}.{_b64(_signature(SECRET, payload))}"
    else:
        token = data[1:].decode("utf-8", "replace")
    try:
        claims = verify(SECRET, token, NOW)
    except TokenError as exc:
        assert exc.code.startswith("TOKEN_") or exc.code == "FORBIDDEN", exc.code
        return
    again = verify(SECRET, mint(SECRET, claims), NOW)
    assert again == claims, (again, claims)
    for bad in (
        lambda: verify(OTHER, token, NOW),
        lambda: verify(SECRET, token[:-1] + ("A" if token[-1] != "A" else "B"), NOW),
    ):
        try:
            bad()
        except TokenInvalid:
            pass
        else:
            raise AssertionError("a forged token verified")
    if claims.jti is not None:
        try:
            verify(SECRET, token, NOW, revoked={claims.jti})
        except TokenRevoked:
            pass
        else:
            raise AssertionError("a revoked token verified")
    for tenant, run in ((claims.tenant, "r1"), ("other", claims.run.rstrip("*") or "r")):
        try:
            claims.check_scope(tenant, run)
        except Forbidden:
            assert not claims.allows(tenant, run)
        else:
            assert claims.allows(tenant, run)


if __name__ == "__main__":
    main(check)

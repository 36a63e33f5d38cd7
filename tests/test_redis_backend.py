"""The Redis backend against a real ``redis-server`` (tests/_redis.py): the journal and lease
conformance suites, URLs, key names and tenant isolation, ``delete_run`` leaving no key."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

import crdtstore
from crdtstore._backends.redis import RedisJournal, RedisLeases
from crdtstore._backends.redis._keys import Keys, escape, parse_url
from crdtstore.testing import check_journal_backend, check_lease_backend

from ._redis import RedisServer


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    srv = RedisServer(tmp_path_factory.mktemp("redis")).start()
    try:
        yield srv
    finally:
        srv.stop()


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"  # redis-py's client is asyncio only


pytestmark = pytest.mark.anyio


async def test_journal_conformance(server: RedisServer) -> None:
    await check_journal_backend(lambda: RedisJournal(server.url()))


async def test_lease_conformance(server: RedisServer) -> None:
    await check_lease_backend(
        lambda clock, probe: RedisLeases(RedisJournal(server.url()), clock=clock, probe=probe)
    )

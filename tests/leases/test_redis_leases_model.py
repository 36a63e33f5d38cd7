"""The Redis lease backend against the sequential model of ``test_leases_model.py`` (the same
rules and invariants, on a real ``redis-server``), and its indexes against its requests.

One difference of the model: on Redis a dead holder is reaped by ``reap()`` only (the process
probe runs on the caller's machine and must read the granted requests first; a transition
reaps what the server's clock expired), so the model's transitions reap by TTL only.

The Redis scripts keep the lease table in indexes (a holder per resource, a queue per
resource, deadlines, keys) and look only at the requests a change concerns, where the other
backends evaluate the grant rule over the whole table: after every step the indexes must say
exactly what the requests say, and the state must be the model's.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import settings
from hypothesis.stateful import invariant, rule

from crdtstore._backends.redis import RedisJournal, RedisLeases
from crdtstore._backends.redis._keys import Keys
from crdtstore._leases import LeaseBackend
from tests._redis import RedisServer
from tests.leases.test_leases_model import LeaseMachine, Model, T

_SERVER: list[RedisServer] = []


@pytest.fixture(scope="module", autouse=True)
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    srv = RedisServer(Path(tmp_path_factory.mktemp("redis"))).start()
    _SERVER.append(srv)
    try:
        yield srv
    finally:
        _SERVER.remove(srv)
        srv.stop()


class RedisModel(Model):
    """The model, with dead holders reaped only by :meth:`reap_dead` (``reap()``)."""

    def reap(self) -> None:
        now, boot = self.clock.now(), self.clock.boot_id()
        keep = []
        for r in self.reqs:
            if r.boot != boot:
                if r.state == "granted":
                    continue
                r.boot, r.expires = boot, now + r.ttl
            elif r.expires <= now:
                continue
            keep.append(r)
        self.reqs = keep

    def reap_dead(self) -> None:
        self.reap()
        super().reap()


class RedisLeaseMachine(LeaseMachine):
    kind = "redis"

    def __init__(self) -> None:
        super().__init__()
        self.model = RedisModel(self.clock, self.probe)

    @rule()
    def reap(self) -> None:
        self.portal.call(self.backend.reap)
        self.model.reap_dead()
        self.model.grant()

    def _open(self) -> LeaseBackend:
        if not hasattr(self, "url"):
            self.url = _SERVER[0].url()  # one key space per example, kept across restarts
        b = RedisLeases(RedisJournal(self.url), clock=self.clock, probe=self.probe)
        self.portal.call(b.open)
        return b

    def _close(self) -> None:
        self.portal.call(self.backend.aclose)

    @invariant()
    def indexes_match_the_requests(self) -> None:
        keys = Keys(self.url.rsplit("prefix=", 1)[1]).leases(T)
        with _SERVER[0].client() as c:
            reqs = [json.loads(v) for v in c.hvals(keys.requests)]
            holders = {k.decode(): v.decode() for k, v in c.hgetall(keys.holders).items()}
            queues = sorted(m.decode() for m in c.zrange(keys.queues, 0, -1))
            deadlines = {k.decode(): s for k, s in c.zrange(keys.deadlines, 0, -1, withscores=True)}
            by_key = {k.decode(): v.decode() for k, v in c.hgetall(keys.by_key).items()}
        # [rank, id, owner, step, attempt, resources, state, ..., expires] (lua/lease.lua)
        want_holders = {x: a[1] for a in reqs if a[6] == "granted" for x in a[5]}
        want_queues = sorted(
            f"{x}\x00{int(a[0]):020d}\x00{a[1]}" for a in reqs if a[6] != "granted" for x in a[5]
        )
        assert holders == want_holders
        assert queues == want_queues
        assert deadlines == {a[1]: float(a[18]) for a in reqs}
        assert by_key == {f"{a[2]}\x00{a[3]}\x00{a[4]}": a[1] for a in reqs if a[3]}


TestRedisLeaseModel = RedisLeaseMachine.TestCase
TestRedisLeaseModel.settings = settings(settings.default, stateful_step_count=40)

"""Real network partitions (tests/_netns.py): the hub (``python -m sync``) in one network
namespace, each client a real process in its own, joined by a veth pair; links degraded with
``tc`` (netem delay, loss, duplication, reordering; where the kernel has no netem, the same
four made of htb, u32 and mirred), cut mid-stream (the link down at both ends) and healed.

- Two Python ``ws://`` clients (tests/_hub_agent_proc.py ``stream``) and a JavaScript
  y-websocket client (tests/interop/client.mjs) keep writing while their link is cut, and
  every one converges on the same state after healing; every entry a client saw acknowledged
  (``FLUSHED i``) is in the hub's journal.
- A cut longer than the hub's keepalive (``--ping-interval 0.3 --ping-timeout 0.6``): the hub
  drops the connection, the client reconnects after healing, resyncs and converges.
- A lease holder cut off past its TTL loses the lease: the other client is granted it with a
  newer token and writes; after healing the old holder's fenced write is refused with
  ``LEASE_LOST`` and the new holder's write stands.

Where a namespace cannot be created the test fails with the reason (no skip; checked by
running the fixture unprivileged).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from crdtstore import open_store
from tests._netns import Link, Net, Proc, network
from tests._wait import until
from tests.network.test_sync_hub import RUN, SECRET, TENANT, token

pytestmark = pytest.mark.anyio

ROOT = Path(__file__).resolve().parents[2]
AGENT_PROC = ROOT / "tests" / "_hub_agent_proc.py"
JS_CLIENT = ROOT / "tests" / "interop" / "client.mjs"
PORT = 8765
DEADLINE = 30.0
JS_WRITES = 40


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def _env() -> dict[str, str]:
    return {**os.environ, "CRDTSTORE_SECRET": SECRET.decode(), "PYTHONPATH": str(ROOT)}


def start_hub(net: Net, tmp_path: Path, *extra: str) -> tuple[Proc, str]:
    store = f"sqlite:///{tmp_path / 'store.db'}"
    options = ["--store", store, "--host", "0.0.0.0", "--port", str(PORT), "--store-linger", "0"]
    hub = Proc(
        [*net.exec_args(net.hub_ns), sys.executable, "-m", "sync", *options, *extra],
        env=_env(),
        log=tmp_path / "hub.log",
    )
    return hub, store


async def listening(hub: Proc) -> None:
    await until(
        lambda: any("listening on" in ln for ln in hub.err) or hub.proc.poll() is not None,
        "the hub to listen",
        DEADLINE,
    )
    assert hub.proc.poll() is None, hub.describe()


def python_client(link: Link, tmp_path: Path, agent: str, expect: list[str]) -> Proc:
    where = [f"ws://{link.hub_ip}:{PORT}/{TENANT}", RUN, agent, "--token", token(agent)]
    pace = ["--pace", "0.01", "--window", "50", "--flush-every", "0.1", "--max", "100000"]
    pace += ["--deadline", str(DEADLINE)]
    command = [sys.executable, str(AGENT_PROC), "stream", *where, *pace]
    return Proc(
        [*link.net.exec_args(link.client_ns), *command, "--expect", ",".join(expect)],
        env=_env(),
        log=tmp_path / f"{agent}.log",
    )


def js_client(link: Link, tmp_path: Path, agent: str) -> Proc:
    where = ["--server", f"ws://{link.hub_ip}:{PORT}/{TENANT}", "--run", RUN]
    return Proc(
        [
            *link.net.exec_args(link.client_ns),
            "node",
            str(JS_CLIENT),
            *where,
            "--token",
            token(agent),
        ],
        env=_env(),
        log=tmp_path / f"{agent}.log",
    )


def js_replies(js: Proc) -> list[dict[str, Any]]:
    return [json.loads(ln) for ln in list(js.out) if ln.startswith('{"reply"')]


def last_flushed(proc: Proc) -> int:
    flushed = proc.said("FLUSHED")
    return int(flushed[-1].split()[1]) if flushed else -1


def wrote(proc: Proc) -> int:
    lines = proc.said("WROTE")
    return int(lines[-1].split()[1]) if lines else -1


async def test_clients_write_through_a_cut_and_converge_after_healing(tmp_path: Path) -> None:
    started = time.monotonic()
    with network() as net:
        links = [net.client() for _ in range(3)]
        hub, store_url = start_hub(net, tmp_path)
        procs: list[Proc] = [hub]
        try:
            await listening(hub)
            agents = ["py1", "py2", "js"]
            py = [python_client(links[i], tmp_path, agents[i], agents) for i in range(2)]
            js = js_client(links[2], tmp_path, "js")
            procs += [*py, js]
            # a bad network for py2 the whole time
            degraded = links[1].degrade("delay 15ms 10ms loss 3% duplicate 3% reorder 10% 50%")
            print(f"py2's link: {degraded}")
            for p in py:
                await until(lambda p=p: p.said("READY") or p.proc.poll() is not None, "READY")
                assert p.proc.poll() is None, p.describe()
            js.send(json.dumps({"cmd": "wait-for", "synced": True, "timeout": DEADLINE}))
            for i in range(JS_WRITES // 2):
                js.send(json.dumps({"cmd": "map.set", "name": "m", "key": f"js:{i}", "value": i}))
            await until(lambda: all(last_flushed(p) >= 20 for p in py), "flushes", DEADLINE)

            # cut py1 and the JS client mid-stream: they keep writing offline
            links[0].cut()
            links[2].cut()
            before_cut = wrote(py[0])
            flushed_at_cut = last_flushed(py[0])
            for i in range(JS_WRITES // 2, JS_WRITES):
                js.send(json.dumps({"cmd": "map.set", "name": "m", "key": f"js:{i}", "value": i}))
            await until(lambda: wrote(py[0]) >= before_cut + 20, "offline writes", DEADLINE)
            assert last_flushed(py[0]) <= flushed_at_cut + 50  # (the window: no acks while cut)
            links[0].heal()
            links[2].heal()

            # everyone stops; the JS client says how many it wrote; all converge
            await until(lambda: last_flushed(py[0]) > before_cut + 20, "acks after healing")
            js.send(json.dumps({"cmd": "map.set", "name": "done", "key": "js", "value": JS_WRITES}))
            js.send(json.dumps({"cmd": "flush", "timeout": DEADLINE}))
            for p in py:
                p.send("stop")
            for p in py:
                await until(lambda p=p: p.said("OK") or p.proc.poll() is not None, "OK", 60)
                assert p.said("OK"), p.describe()
            results = [json.loads(p.said("OK")[0][3:]) for p in py]
            assert results[0]["state"] == results[1]["state"]
            state = results[0]["state"]
            want = {f"js:{i}": i for i in range(JS_WRITES)}
            assert all(state["m"].get(k) == v for k, v in want.items())
            js.send(json.dumps({"cmd": "wait-for", "contains": {"m": want}, "timeout": DEADLINE}))
            js.send(json.dumps({"cmd": "dump"}))
            await until(
                lambda: any(r["reply"] == "dump" for r in js_replies(js)), "the JS dump", DEADLINE
            )
            replies = js_replies(js)
            assert all(r["ok"] for r in replies), replies
            dump = next(r for r in replies if r["reply"] == "dump")
            assert dump["state"]["m"] == state["m"], "the JS client did not converge"

            # nothing acknowledged is lost: the journal holds every flushed entry
            async with open_store(store_url, tenant=TENANT) as store:
                rec = store.open_record(RUN, "checker", "tool")
                async with rec:
                    m = rec.map("m")
                    for p, agent in zip(py, agents, strict=False):
                        acked = last_flushed(p)
                        assert acked >= 0
                        missing = [i for i in range(acked + 1) if m.get(f"{agent}:{i}") != i]
                        assert not missing, f"{agent}: acknowledged and lost: {missing[:10]}"
                    assert all(m.get(k) == v for k, v in want.items())
        finally:
            for p in reversed(procs):
                p.stop()
    assert time.monotonic() - started < 60


LEASE_PROC = ROOT / "tests" / "_partition_lease_proc.py"
TTL = 1.5
RESOURCE = "src/app.py"


def lease_holder(link: Link, tmp_path: Path, agent: str) -> Proc:
    url = f"ws://{link.hub_ip}:{PORT}/{TENANT}"
    command = [sys.executable, str(LEASE_PROC), url, RUN, agent, token(agent), RESOURCE, str(TTL)]
    return Proc(
        [*link.net.exec_args(link.client_ns), *command], env=_env(), log=tmp_path / f"{agent}.log"
    )


async def test_a_holder_cut_off_past_its_ttl_loses_the_lease(tmp_path: Path) -> None:
    """The holder's link is cut for longer than its TTL: the lease lapses, the other client is
    granted it (a newer fencing token) and writes; after healing, the old holder's fenced
    write is refused with LEASE_LOST and the new holder's write stands."""
    with network() as net:
        links = [net.client(), net.client()]
        hub, store_url = start_hub(net, tmp_path)
        procs: list[Proc] = [hub]
        try:
            await listening(hub)
            old = lease_holder(links[0], tmp_path, "old")
            procs.append(old)
            await until(lambda: old.said("GRANT") or old.proc.poll() is not None, "grant", 20)
            assert old.said("GRANT"), old.describe()
            old_token = int(old.said("GRANT")[0].split()[1])
            old.send("write before-the-cut")
            await until(lambda: old.said("WROTE"), "the first fenced write", 20)

            links[0].cut()
            new = lease_holder(links[1], tmp_path, "new")
            procs.append(new)
            await until(lambda: new.said("GRANT") or new.proc.poll() is not None, "grant", 20)
            assert new.said("GRANT"), new.describe()
            assert int(new.said("GRANT")[0].split()[1]) > old_token
            new.send("write by-the-new-holder")
            await until(lambda: new.said("WROTE") or new.said("REFUSED"), "new write", 20)
            assert new.said("WROTE"), new.describe()

            links[0].heal()
            old.send("write by-the-old-holder-after-healing")
            await until(lambda: old.said("REFUSED") or len(old.said("WROTE")) > 1, "answer", 40)
            assert old.said("REFUSED") == ["REFUSED LEASE_LOST"], old.describe()
            new.send("exit")
            old.send("exit")
            await until(lambda: new.proc.poll() is not None, "the new holder to exit", 20)

            async with open_store(store_url, tenant=TENANT) as store:
                async with store.open_record(RUN, "checker", "tool") as rec:
                    assert rec.map("files").get(RESOURCE) == "by-the-new-holder"
                    history = await store.history(RUN, "files", RESOURCE)
                    writers = [h.provenance.agent for h in history]
                    assert writers[-1] == "new" and "old" in writers  # (old: before the cut)
        finally:
            for p in reversed(procs):
                p.stop()


def test_without_the_privilege_the_fixture_fails_with_the_reason() -> None:
    """An unprivileged process (uid 65534, no capabilities) cannot make a namespace: the
    fixture fails the test, naming what is missing (it never skips)."""
    code = "from tests._netns import network\nwith network():\n    pass\n"
    unprivileged = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"]
    done = subprocess.run(
        [*unprivileged, "env", f"PYTHONPATH={ROOT}", sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode != 0
    assert "Failed: cannot create a network namespace" in done.stderr, done.stderr
    assert "Skipped" not in done.stderr


METRICS = "127.0.0.1:9100"


def scrape_in(net: Net) -> dict[str, float]:
    """The hub's metrics, fetched from inside its namespace (its --metrics-address)."""
    code = (
        "import urllib.request; "
        f"print(urllib.request.urlopen('http://{METRICS}/-/metrics', timeout=10).read().decode())"
    )
    done = subprocess.run(
        [*net.exec_args(net.hub_ns), sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert done.returncode == 0, done.stderr
    from tests.network.test_hub_metrics import samples

    return samples(done.stdout)


async def test_a_cut_longer_than_the_keepalive_drops_and_reconnects(tmp_path: Path) -> None:
    """The hub pings every 0.3 s and drops a connection whose pong is 0.6 s late: a 2.5 s cut
    ends the connections of a Python client and of the JS client on the hub's side; they go
    on writing offline, and after healing they reconnect (the hub counts new connections),
    resync and converge, with every acknowledged entry journaled."""
    with network() as net:
        links = [net.client(), net.client(), net.client()]
        hub, store_url = start_hub(
            net,
            tmp_path,
            "--ping-interval",
            "0.3",
            "--ping-timeout",
            "0.6",
            "--metrics-address",
            METRICS,
        )
        procs: list[Proc] = [hub]
        try:
            await listening(hub)
            agents = ["py1", "py2", "js"]
            py = [python_client(links[i], tmp_path, agents[i], agents) for i in range(2)]
            js = js_client(links[2], tmp_path, "js")
            procs += [*py, js]
            js.send(json.dumps({"cmd": "wait-for", "synced": True, "timeout": DEADLINE}))
            for i in range(JS_WRITES // 2):
                js.send(json.dumps({"cmd": "map.set", "name": "m", "key": f"js:{i}", "value": i}))
            for p in py:
                await until(lambda p=p: p.said("READY") or p.proc.poll() is not None, "READY")
                assert p.proc.poll() is None, p.describe()
            await until(lambda: all(last_flushed(p) >= 20 for p in py), "flushes", DEADLINE)
            accepted = len([ln for ln in hub.err if "connected (rw)" in ln])
            links[0].cut()
            links[2].cut()
            before_cut = wrote(py[0])
            for i in range(JS_WRITES // 2, JS_WRITES):
                js.send(json.dumps({"cmd": "map.set", "name": "m", "key": f"js:{i}", "value": i}))
            await until(
                lambda: all(
                    any(f"{a}@t1/r1>: disconnected" in ln for ln in hub.err) for a in ("py1", "js")
                ),
                "the hub to drop py1's connection (keepalive)",
                DEADLINE,
            )
            await until(lambda: wrote(py[0]) >= before_cut + 20, "offline writes", DEADLINE)
            links[0].heal()
            links[2].heal()
            await until(lambda: last_flushed(py[0]) > before_cut + 20, "acks after healing")
            reconnected = len([ln for ln in hub.err if "connected (rw)" in ln])
            assert reconnected > accepted, "py1 did not open a new connection"
            scraped = scrape_in(net)
            assert scraped["crdtstore_hub_connections_total"] >= reconnected
            js.send(json.dumps({"cmd": "map.set", "name": "done", "key": "js", "value": JS_WRITES}))
            js.send(json.dumps({"cmd": "flush", "timeout": DEADLINE}))
            for p in py:
                p.send("stop")
            for p in py:
                await until(lambda p=p: p.said("OK") or p.proc.poll() is not None, "OK", 60)
                assert p.said("OK"), p.describe()
            results = [json.loads(p.said("OK")[0][3:]) for p in py]
            assert results[0]["state"] == results[1]["state"]
            want = {f"js:{i}": i for i in range(JS_WRITES)}
            assert all(results[0]["state"]["m"].get(k) == v for k, v in want.items())
            js.send(json.dumps({"cmd": "dump"}))
            await until(lambda: any(r["reply"] == "dump" for r in js_replies(js)), "dump")
            replies = js_replies(js)
            assert all(r["ok"] for r in replies), replies
            dump = next(r for r in replies if r["reply"] == "dump")
            assert dump["state"]["m"] == results[0]["state"]["m"], "the JS client diverged"
            scraped = scrape_in(net)
            assert scraped["crdtstore_hub_connections_total"] >= len(agents) + 2  # 2 reconnects
            async with open_store(store_url, tenant=TENANT) as store:
                async with store.open_record(RUN, "checker", "tool") as rec:
                    m = rec.map("m")
                    for p, agent in zip(py, agents, strict=False):
                        acked = last_flushed(p)
                        missing = [i for i in range(acked + 1) if m.get(f"{agent}:{i}") != i]
                        assert not missing, f"{agent}: acknowledged and lost: {missing[:10]}"
        finally:
            for p in reversed(procs):
                p.stop()


_UDP_PEER = """
import socket, sys, time
n = 400
if sys.argv[1] == "recv":
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.bind((sys.argv[2], 9999))
    s.settimeout(1.5)
    print("READY", flush=True)
    got = []
    try:
        while True:
            got.append(int(s.recv(1000)))
    except socket.timeout:
        pass
    print(len(got), len(set(got)), sum(1 for a, b in zip(got, got[1:]) if b < a), flush=True)
else:
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    for i in range(n):
        s.sendto(str(i).encode().ljust(500), (sys.argv[2], 9999))  # (int() strips it)
        time.sleep(0.001)
"""


def test_a_degraded_link_loses_duplicates_and_reorders(tmp_path: Path) -> None:
    """What ``Link.degrade`` applies really impairs the link (netem, or its emulation on a
    kernel without ``sch_netem``): 400 datagrams of 500 bytes from the client's namespace to
    the hub's arrive with some lost, some duplicated and some out of order; before, all in
    order."""
    script = tmp_path / "udp_peer.py"
    script.write_text(_UDP_PEER)

    def send_and_count(net: Net, link: Link) -> tuple[int, int, int]:
        recv = subprocess.Popen(
            [*net.exec_args(net.hub_ns), sys.executable, str(script), "recv", link.hub_ip],
            stdout=subprocess.PIPE,
            text=True,
        )
        assert recv.stdout is not None and recv.stdout.readline().startswith("READY")
        subprocess.run(
            [*net.exec_args(link.client_ns), sys.executable, str(script), "send", link.hub_ip],
            check=True,
            timeout=60,
        )
        out, _ = recv.communicate(timeout=60)
        received, distinct, out_of_order = map(int, out.split())
        return received, distinct, out_of_order

    with network() as net:
        link = net.client()
        assert send_and_count(net, link) == (400, 400, 0)
        applied = link.degrade("delay 5ms loss 10% duplicate 10% reorder 20% 50%")
        received, distinct, out_of_order = send_and_count(net, link)
        print(applied, received, distinct, out_of_order)
        assert distinct < 400, f"nothing lost ({applied})"
        assert received > distinct, f"nothing duplicated ({applied})"
        assert out_of_order > 0, f"nothing reordered ({applied})"

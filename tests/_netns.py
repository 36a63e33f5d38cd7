"""Network namespaces for the partition tests (tests/network/test_partition.py): the hub in one
namespace, every client in its own, each client joined to the hub's by a veth pair, so that a
link can be cut (``ip link set down`` at both ends), degraded (``tc netem``: delay, loss,
duplication, reordering; where the kernel has no ``sch_netem``, the same four made of
``htb``, ``u32`` and ``mirred``: see :meth:`Link._emulate`) and healed while real processes
talk over it.

Names are unique per test (the pid and a counter: interface names stay under 16 bytes);
everything is deleted when the test ends, failed or not (deleting a namespace deletes its veth
ends and kills nothing: the processes are the test's to stop, and it does first). Where
namespaces cannot be made (no privilege, no ``ip``), the test fails with the reason: it never
skips.
"""

from __future__ import annotations

import itertools
import os
import shutil
import subprocess
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import pytest

_COUNTER = itertools.count()


def _ip() -> str:
    found = shutil.which("ip") or ("/usr/sbin/ip" if os.path.exists("/usr/sbin/ip") else None)
    if found is None:
        pytest.fail("iproute2 is not installed: the partition tests need `ip` and `tc`")
    return found


def sh(*args: str) -> str:
    """Run a command; fail the test with its stderr if it fails."""
    done = subprocess.run(args, capture_output=True, text=True, timeout=30)
    if done.returncode != 0:
        pytest.fail(f"{' '.join(args)} failed ({done.returncode}): {done.stderr.strip()}")
    return done.stdout


@dataclass
class Link:
    """A veth pair between the hub's namespace and a client's: ``hub_ip`` is the hub's address
    as that client sees it."""

    net: Net
    client_ns: str
    hub_dev: str
    client_dev: str
    hub_ip: str
    client_ip: str

    def degrade(self, netem: str) -> str:
        """Degrade both directions of the link with ``tc qdisc ... netem <netem>`` (delay, loss,
        duplication, reordering). On a kernel without ``sch_netem`` ("qdisc kind is unknown")
        each impairment ``netem`` names is made of what the kernel has (:meth:`_emulate`).
        Returns what was applied (``"netem ..."`` or ``"emulated ..."``)."""
        for ns, dev in ((self.net.hub_ns, self.hub_dev), (self.client_ns, self.client_dev)):
            base = ["ip", "netns", "exec", ns, "tc", "qdisc", "replace", "dev", dev, "root"]
            done = subprocess.run(
                [*base, "netem", *netem.split()], capture_output=True, text=True, timeout=30
            )
            if done.returncode != 0:
                if "kind is unknown" not in done.stderr:
                    pytest.fail(f"tc netem {netem} failed: {done.stderr.strip()}")
                return "emulated " + ", ".join(
                    self._emulate(ns, dev, netem.split())
                    for ns, dev in (
                        (self.net.hub_ns, self.hub_dev),
                        (self.client_ns, self.client_dev),
                    )
                )
        return f"netem {netem}"

    @staticmethod
    def _emulate(ns: str, dev: str, words: list[str]) -> str:
        """netem's impairments without ``sch_netem``, on one end's egress, from ``htb``, the
        ``u32`` classifier and the ``mirred`` action (what this machine's kernel has; the
        choice of packet is by the low 3 bits of the IPv4 id, which counts up per packet:
        one packet in 8, deterministically, not by chance):

        - delay: every packet through an ``htb`` class of 2 mbit/s (its queueing delay);
        - reorder: one packet in 8 through a class of 128 kbit/s, so later ones overtake it;
        - loss: one packet in 8 redirected to the namespace's loopback (gone from the link);
        - duplicate: one packet in 8 mirrored back onto the link (sent again, up to the
          kernel's mirred nesting limit: several copies).
        """
        tc = ["ip", "netns", "exec", ns, "tc"]
        done = []
        sh(*tc, "qdisc", "replace", "dev", dev, "root", "handle", "1:", "htb", "default", "10")
        rate = "2mbit" if "delay" in words else "1gbit"
        sh(*tc, "class", "add", "dev", dev, "parent", "1:", "classid", "1:10", "htb",
           "rate", rate, "quantum", "60000")  # fmt: skip
        if "delay" in words:
            done.append("delay (htb 2mbit)")
        if "reorder" in words:
            sh(*tc, "class", "add", "dev", dev, "parent", "1:", "classid", "1:20", "htb",
               "rate", "128kbit", "ceil", "128kbit", "burst", "100b", "cburst", "100b",
               "quantum", "1514")  # fmt: skip
            sh(*tc, "filter", "add", "dev", dev, "parent", "1:", "protocol", "ip", "u32",
               "match", "u16", "0x0001", "0x0007", "at", "4", "flowid", "1:20")  # fmt: skip
            done.append("reorder 1/8 (htb 128kbit)")
        if "loss" in words or "duplicate" in words:
            sh(*tc, "qdisc", "replace", "dev", dev, "clsact")
        if "loss" in words:
            sh(*tc, "filter", "add", "dev", dev, "egress", "protocol", "ip", "u32",
               "match", "u16", "0x0002", "0x0007", "at", "4",
               "action", "mirred", "egress", "redirect", "dev", "lo")  # fmt: skip
            done.append("loss 1/8 (mirred redirect to lo)")
        if "duplicate" in words:
            sh(*tc, "filter", "add", "dev", dev, "egress", "protocol", "ip", "u32",
               "match", "u16", "0x0003", "0x0007", "at", "4",
               "action", "mirred", "egress", "mirror", "dev", dev)  # fmt: skip
            done.append("duplicate 1/8 (mirred mirror)")
        return f"{dev}: " + "; ".join(done)

    def cut(self) -> None:
        """Take the link down at both ends: nothing passes, the TCP connections stay (their
        peers are not told), the processes go on."""
        sh("ip", "-n", self.net.hub_ns, "link", "set", self.hub_dev, "down")
        sh("ip", "-n", self.client_ns, "link", "set", self.client_dev, "down")

    def heal(self) -> None:
        """Bring the link back up (addresses and routes come back with it)."""
        sh("ip", "-n", self.net.hub_ns, "link", "set", self.hub_dev, "up")
        sh("ip", "-n", self.client_ns, "link", "set", self.client_dev, "up")


@dataclass
class Net:
    """The namespaces of one test: ``hub_ns`` and one per :meth:`client`."""

    tag: str
    hub_ns: str
    namespaces: list[str] = field(default_factory=list)
    links: list[Link] = field(default_factory=list)

    def client(self) -> Link:
        i = len(self.links) + 1
        ns = f"{self.tag}c{i}"
        sh("ip", "netns", "add", ns)
        self.namespaces.append(ns)
        hub_dev, client_dev = f"{self.tag}h{i}", f"{self.tag}v{i}"
        sh("ip", "link", "add", hub_dev, "type", "veth", "peer", "name", client_dev)
        sh("ip", "link", "set", hub_dev, "netns", self.hub_ns)
        sh("ip", "link", "set", client_dev, "netns", ns)
        hub_ip, client_ip = f"10.18.{i}.1", f"10.18.{i}.2"
        sh("ip", "-n", self.hub_ns, "addr", "add", f"{hub_ip}/30", "dev", hub_dev)
        sh("ip", "-n", ns, "addr", "add", f"{client_ip}/30", "dev", client_dev)
        sh("ip", "-n", self.hub_ns, "link", "set", hub_dev, "up")
        sh("ip", "-n", ns, "link", "set", client_dev, "up")
        sh("ip", "-n", ns, "link", "set", "lo", "up")
        link = Link(self, ns, hub_dev, client_dev, hub_ip, client_ip)
        self.links.append(link)
        return link

    def exec_args(self, ns: str) -> list[str]:
        return ["ip", "netns", "exec", ns]


@contextmanager
def network() -> Iterator[Net]:
    """A hub namespace (its loopback up); :meth:`Net.client` adds client namespaces. All of
    them are deleted on the way out."""
    _ip()
    tag = f"p{os.getpid() % 100000}{next(_COUNTER)}"[:9]
    hub_ns = f"{tag}hub"
    done = subprocess.run(["ip", "netns", "add", hub_ns], capture_output=True, text=True)
    if done.returncode != 0:
        pytest.fail(
            "cannot create a network namespace (the partition tests need root or "
            f"CAP_NET_ADMIN, and iproute2): {done.stderr.strip()}"
        )
    net = Net(tag, hub_ns, [hub_ns])
    try:
        sh("ip", "-n", hub_ns, "link", "set", "lo", "up")
        yield net
    finally:
        for ns in reversed(net.namespaces):
            subprocess.run(["ip", "netns", "del", ns], capture_output=True, timeout=30)


class Proc:
    """A process (in a namespace) whose stdout and stderr lines are collected by threads."""

    def __init__(self, args: list[str], *, env: dict[str, str], log: Path) -> None:
        self.args = args
        self.log = log
        self.proc = subprocess.Popen(
            args,
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        self.out: list[str] = []
        self.err: list[str] = []
        self._threads = [
            threading.Thread(target=self._read, args=(self.proc.stdout, self.out), daemon=True),
            threading.Thread(target=self._read, args=(self.proc.stderr, self.err), daemon=True),
        ]
        for t in self._threads:
            t.start()

    @staticmethod
    def _read(stream: object, into: list[str]) -> None:
        for line in stream:  # type: ignore[attr-defined]
            into.append(line.rstrip("\n"))

    def send(self, line: str) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(line + "\n")
        self.proc.stdin.flush()

    def said(self, prefix: str) -> list[str]:
        return [ln for ln in list(self.out) if ln.startswith(prefix)]

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)
        for t in self._threads:
            t.join(timeout=10)
        for stream in (self.proc.stdin, self.proc.stdout, self.proc.stderr):
            if stream is not None:
                stream.close()
        self.log.write_text("\n".join(["$ " + " ".join(self.args), *self.out, "--", *self.err]))

    def describe(self) -> str:
        return f"{' '.join(self.args[-6:])}: out={self.out[-5:]} err={self.err[-10:]}"

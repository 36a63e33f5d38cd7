"""The simulated network: links with delay, loss, duplication and reordering, partitions,
retransmission, all on simulated time and driven by one ``random.Random``.

Pure: no I/O, no clock. The simulator asks it to transmit a message and pops the next event
(an arrival or a retransmission) in (time, sequence) order, so the same seed gives the same
schedule.
"""

from __future__ import annotations

import heapq
import random
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class LinkSpec:
    """How one directed link behaves.

    Args:
        delay: (min, max) ticks a copy takes to arrive, drawn uniformly.
        loss: probability that a transmission is lost (the sender retransmits it
            ``NetworkConfig.retransmit_after`` ticks later, until it gets through).
        duplicate: probability that a transmission also arrives a second time (with its own
            delay).
        reorder: probability that a copy is held up ``reorder_delay`` more ticks, so that
            later messages overtake it.
        reorder_delay: the extra ticks of a reordered copy.
    """

    delay: tuple[int, int] = (1, 3)
    loss: float = 0.0
    duplicate: float = 0.0
    reorder: float = 0.0
    reorder_delay: int = 5

    def __post_init__(self) -> None:
        lo, hi = self.delay
        if not 0 <= lo <= hi:
            raise ValueError(f"delay must be (min, max) with 0 <= min <= max, not {self.delay}")
        for name in ("loss", "duplicate", "reorder"):
            p = getattr(self, name)
            if not 0.0 <= p <= 1.0 or (name == "loss" and p == 1.0):
                raise ValueError(f"{name} must be a probability (loss < 1), not {p}")
        if self.reorder_delay < 0:
            raise ValueError("reorder_delay must be >= 0")

    def to_json(self) -> dict[str, Any]:
        return {
            "delay": list(self.delay),
            "loss": self.loss,
            "duplicate": self.duplicate,
            "reorder": self.reorder,
            "reorder_delay": self.reorder_delay,
        }


@dataclass(frozen=True)
class NetworkConfig:
    """The network between agents: every link behaves as ``link`` unless ``links`` names it
    (``(sender, receiver)`` agent indices); a lost message is retransmitted after
    ``retransmit_after`` ticks."""

    link: LinkSpec = field(default_factory=LinkSpec)
    links: dict[tuple[int, int], LinkSpec] = field(default_factory=dict)
    retransmit_after: int = 4

    def __post_init__(self) -> None:
        if self.retransmit_after < 1:
            raise ValueError("retransmit_after must be >= 1")

    def spec(self, src: int, dst: int) -> LinkSpec:
        return self.links.get((src, dst), self.link)

    def to_json(self) -> dict[str, Any]:
        return {
            "link": self.link.to_json(),
            "links": {f"{s}->{d}": spec.to_json() for (s, d), spec in sorted(self.links.items())},
            "retransmit_after": self.retransmit_after,
        }


@dataclass
class Message:
    """One agent's write on its way to one other agent: the update bytes of the journal
    entries the write made, with what the receiver needs to deliver it in causal order."""

    id: int
    src: int
    dst: int
    write: int  # the write's id
    index: int  # the write's number among its author's writes (1, 2, ...)
    deps: tuple[int, ...]  # writes of each agent the author had integrated before it
    updates: list[bytes]
    attempts: int = 0
    dropped: bool = False


@dataclass(order=True)
class Event:
    """A scheduled network event: ``arrive`` (a copy reaches its receiver) or ``retry`` (the
    sender retransmits a lost message)."""

    time: int
    seq: int
    kind: str = field(compare=False)
    msg: Message = field(compare=False)
    primary: bool = field(compare=False, default=True)  # False for a duplicate copy


Emit = Callable[[dict[str, Any]], None]


def _base(now: int, msg: Message) -> dict[str, Any]:
    return {
        "t": now,
        "msg": msg.id,
        "write": msg.write,
        "src": msg.src,
        "dst": msg.dst,
        "attempt": msg.attempts,
    }


class Network:
    """Links, partitions and the event queue."""

    def __init__(self, config: NetworkConfig, rng: random.Random, emit: Emit) -> None:
        self.config = config
        self.rng = rng
        self._emit = emit
        self._queue: list[Event] = []
        self._seq = 0
        self._group: dict[int, int] | None = None  # agent -> group, while partitioned
        self.drop_message: int | None = None  # test-only, see SimConfig.drop_delivery

    # -- partitions --

    def partition(self, groups: tuple[tuple[int, ...], ...], agents: int) -> None:
        group = {a: i for i, members in enumerate(groups) for a in members}
        for a in range(agents):
            group.setdefault(a, len(groups))
        self._group = group

    def heal(self) -> None:
        self._group = None

    @property
    def partitioned(self) -> bool:
        return self._group is not None

    def connected(self, src: int, dst: int) -> bool:
        return self._group is None or self._group[src] == self._group[dst]

    # -- the queue --

    def _schedule(self, time: int, kind: str, msg: Message, primary: bool = True) -> None:
        self._seq += 1
        heapq.heappush(self._queue, Event(time, self._seq, kind, msg, primary))

    def __bool__(self) -> bool:
        return bool(self._queue)

    def next_time(self) -> int | None:
        return self._queue[0].time if self._queue else None

    def blocked(self) -> bool:
        """Whether every queued event is a retransmission across a cut link (nothing can get
        through before a heal)."""
        return self._group is not None and all(
            e.kind == "retry" and not self.connected(e.msg.src, e.msg.dst) for e in self._queue
        )

    def pop(self) -> Event:
        return heapq.heappop(self._queue)

    # -- transmission --

    def transmit(self, now: int, msg: Message) -> None:
        """Send ``msg`` (again): schedule its arrival(s), or its retransmission if lost."""
        msg.attempts += 1
        base = _base(now, msg)
        if msg.id == self.drop_message:
            msg.dropped = True
            self._emit({**base, "ev": "dropped", "reason": "test hook: dropped permanently"})
            return
        spec = self.config.spec(msg.src, msg.dst)
        if not self.connected(msg.src, msg.dst) or self.rng.random() < spec.loss:
            retry = now + self.config.retransmit_after
            reason = "partition" if not self.connected(msg.src, msg.dst) else "loss"
            self._emit({**base, "ev": "lost", "reason": reason, "retry": retry})
            self._schedule(retry, "retry", msg)
            return
        arrive = now + self._delay(spec)
        self._emit({**base, "ev": "send", "arrive": arrive})
        self._schedule(arrive, "arrive", msg)
        if self.rng.random() < spec.duplicate:
            again = now + self._delay(spec)
            self._emit({**base, "ev": "duplicate", "arrive": again})
            self._schedule(again, "arrive", msg, primary=False)

    def _delay(self, spec: LinkSpec) -> int:
        delay = self.rng.randint(*spec.delay)
        if spec.reorder and self.rng.random() < spec.reorder:
            delay += spec.reorder_delay
        return delay

    def arrival(self, now: int, event: Event) -> bool:
        """A copy reached its receiver's side of the link: True to deliver it; False if a
        partition cut the link meanwhile (the primary copy is retransmitted, a duplicate
        copy is gone)."""
        msg = event.msg
        if self.connected(msg.src, msg.dst):
            return True
        base = _base(now, msg)
        if event.primary:
            retry = now + self.config.retransmit_after
            self._emit({**base, "ev": "lost", "reason": "partition", "retry": retry})
            self._schedule(retry, "retry", msg)
        else:
            self._emit({**base, "ev": "lost", "reason": "partition", "retry": None})
        return False

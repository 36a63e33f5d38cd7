"""Time and process identity for leases.

Expiry must not jump when someone sets the wall clock, so deadlines are kept on the boot
clock (``CLOCK_BOOTTIME``: monotonic, shared by every process of one boot, and it keeps counting
through suspend, so a laptop lid does not extend a lease). A boot clock reading means nothing
in another boot, so every stored deadline carries its boot id; grants from another boot are
expired.

A holder is *provably dead* when it ran on this host in this boot and its pid is gone, is a
zombie, or belongs to a process with another start time (the pid was reused). Anything else
(another host, no ``/proc``, no permission) is "not provably dead": only the TTL reaps it.
"""

from __future__ import annotations

import functools
import os
import socket
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import NamedTuple, Protocol

__all__ = ["Clock", "FakeClock", "Proc", "ProcessProbe", "SystemClock", "SystemProbe", "this_proc"]


class Clock(Protocol):
    """Where lease deadlines are measured."""

    def now(self) -> float:
        """Seconds on a clock that never jumps within one boot."""
        ...

    def boot_id(self) -> str:
        """Identifies the boot in which :meth:`now` readings are comparable."""
        ...


def _read_boot_id() -> str:
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        # No boot id to read: make one per process start. Deadlines from a process that
        # cannot prove it shares our boot are then treated as expired, which is safe.
        return f"unknown-{uuid.uuid4().hex}"


_BOOT_ID = _read_boot_id()
_CLOCK_ID = getattr(time, "CLOCK_BOOTTIME", None)
_HOST = socket.gethostname()


def _boot_id_of_this_process() -> str:  # pragma: no cover - not Linux
    return f"{_BOOT_ID}-{os.getpid()}"


# C callables rather than methods: every lease transition reads both (the boot id: str() of a
# str is that str)
_now: Callable[[], float] = (
    functools.partial(time.clock_gettime, _CLOCK_ID) if _CLOCK_ID is not None else time.monotonic
)
_boot_id: Callable[[], str] = (
    functools.partial(str, _BOOT_ID) if _CLOCK_ID is not None else _boot_id_of_this_process
)


class SystemClock:
    """``CLOCK_BOOTTIME`` where the platform has it, else ``time.monotonic``."""

    now = staticmethod(_now)
    boot_id = staticmethod(_boot_id)


class FakeClock:
    """A clock that moves only when told to (tests); ``reboot`` starts a new boot at zero."""

    def __init__(self, start: float = 1000.0, boot: str = "boot-0") -> None:
        self.t = start
        self.boot = boot
        self._boots = 0

    def now(self) -> float:
        return self.t

    def boot_id(self) -> str:
        return self.boot

    def advance(self, seconds: float) -> None:
        self.t += seconds

    def reboot(self) -> None:
        self._boots += 1
        self.boot = f"boot-{self._boots}"
        self.t = 0.0


class Proc(NamedTuple):
    """The process a request is attached to."""

    host: str
    boot: str
    pid: int
    start: int  # start time in clock ticks after boot (``/proc/PID/stat`` field 22), or 0


def _stat(pid: int) -> tuple[str, int] | None:
    """(state, start time) of ``pid`` from ``/proc``; None when there is no such process.

    Raises:
        OSError: ``/proc`` cannot be read for another reason.
    """
    try:
        raw = Path(f"/proc/{pid}/stat").read_bytes()
    except (FileNotFoundError, ProcessLookupError):
        return None
    # the command name (field 2) may contain spaces and parentheses: split after the last ")"
    fields = raw[raw.rindex(b")") + 2 :].split()
    return fields[0].decode(), int(fields[19])


_THIS: Proc | None = None


def _forget_this_proc() -> None:
    global _THIS
    _THIS = None


# A forked child forgets the parent's identity in a fork hook rather than by comparing
# os.getpid() on every call: the lease path asks several times per transition, and getpid is
# a system call.
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_this_proc)


def this_proc() -> Proc:
    """The identity of the calling process (cached; a forked child reads its own)."""
    global _THIS
    p = _THIS
    if p is None:
        p = _THIS = _read_this_proc()
    return p


def _read_this_proc() -> Proc:
    pid = os.getpid()
    try:
        st = _stat(pid)
        start = st[1] if st is not None else 0
    except (OSError, ValueError, IndexError):
        start = 0
    return Proc(_HOST, SystemClock().boot_id(), pid, start)


class ProcessProbe(Protocol):
    def is_dead(self, proc: Proc) -> bool:
        """True only when ``proc`` is provably dead."""
        ...


class SystemProbe:
    """Reads ``/proc`` (falls back to ``psutil`` when installed, else to ``kill(pid, 0)``)."""

    def __init__(self) -> None:
        self._proc_fs = Path("/proc/self/stat").exists()

    def is_dead(self, proc: Proc) -> bool:
        if proc is _THIS and proc is not None:
            return False  # this process, asking (the common case: its own grant)
        me = this_proc()
        if proc.host != me.host or proc.boot != me.boot:
            return False
        if proc.pid == me.pid:
            return proc.start != me.start and proc.start != 0
        if self._proc_fs:
            try:
                st = _stat(proc.pid)
            except (OSError, ValueError, IndexError):
                return False
            if st is None:
                return True
            state, start = st
            return state in ("Z", "X", "x") or (proc.start != 0 and start != proc.start)
        return _dead_without_proc_fs(proc.pid)


def _dead_without_proc_fs(pid: int) -> bool:  # pragma: no cover - not Linux
    try:
        import psutil  # type: ignore[import-untyped,unused-ignore]
    except ImportError:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        except OSError:
            return False
        return False
    try:
        return bool(psutil.Process(pid).status() == psutil.STATUS_ZOMBIE)
    except psutil.NoSuchProcess:
        return True
    except psutil.Error:
        return False

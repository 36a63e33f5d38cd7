"""A lease-holding process for the lease scenario and stress tests.

``python tests/_lease_proc.py hold URL OWNER RES[,RES...] [--ttl T] [--key STEP]``
    takes the lease (waiting if needed), prints ``GRANT rank token pid``, then holds it until a
    line arrives on stdin (or stdin closes), releases and prints ``RELEASED``.

``python tests/_lease_proc.py worker URL EXT_DB OWNER [--ttl T] [--no-fence] [--seed N]``
    loops until stdin closes: takes 1 to 3 of the files ``f0..f5``, prints ``GRANT rank token
    files``, and does a slow read-modify-write of each file's counter in the *external system*
    (the SQLite file ``EXT_DB``, standing for any system that checks fencing tokens): a fenced
    read (refused when a newer token touched the file), a pause, a fenced write of read + 1.

Every line is one ``write()``, flushed at once, so a line the test reads whole was written
whole before any kill.
"""

from __future__ import annotations

import argparse
import random
import sqlite3
import sys
import time

import anyio
import anyio.to_thread

import crdtstore
from crdtstore import LeaseLost

FILES = [f"f{i}" for i in range(6)]


def say(*parts: object) -> None:
    sys.stdout.write(" ".join(str(p) for p in parts) + "\n")
    sys.stdout.flush()


async def hold(args: argparse.Namespace) -> None:
    key = (args.key, 1) if args.key else None
    async with crdtstore.open_store(args.url) as store:
        lease = store.lease(args.resources.split(","), ttl=args.ttl, owner=args.owner, key=key)
        async with lease:
            say("GRANT", lease.rank, lease.token, time.time())
            await anyio.to_thread.run_sync(sys.stdin.readline, abandon_on_cancel=True)
        say("RELEASED")


class External:
    """The external system: per-file counters that accept a token only if no newer token
    touched the file (``fence``), and a log of every write attempt."""

    def __init__(self, path: str, fence: bool) -> None:
        self.db = sqlite3.connect(path, isolation_level=None, timeout=30, check_same_thread=False)
        self.db.execute("PRAGMA journal_mode=WAL")
        self.fence = fence

    def _tx(self, file: str, token: int, owner: str, value: int | None) -> int | None:
        db = self.db
        db.execute("BEGIN IMMEDIATE")
        try:
            row = db.execute(
                "SELECT counter, max_token FROM ext WHERE file = ?", (file,)
            ).fetchone()
            counter, max_token = row if row is not None else (0, 0)
            ok = not self.fence or token >= max_token
            if value is None:  # a read
                if ok:
                    db.execute(
                        "INSERT OR REPLACE INTO ext (file, counter, max_token) VALUES (?, ?, ?)",
                        (file, counter, max(token, max_token)),
                    )
                db.execute("COMMIT")
                return int(counter) if ok else None
            db.execute(
                "INSERT INTO log (file, token, owner, accepted, value) VALUES (?, ?, ?, ?, ?)",
                (file, token, owner, int(ok), value),
            )
            if ok:
                db.execute(
                    "INSERT OR REPLACE INTO ext (file, counter, max_token) VALUES (?, ?, ?)",
                    (file, value, max(token, max_token)),
                )
            db.execute("COMMIT")
            return value if ok else None
        except BaseException:
            db.execute("ROLLBACK")
            raise

    def read(self, file: str, token: int, owner: str) -> int | None:
        return self._tx(file, token, owner, None)

    def write(self, file: str, token: int, owner: str, value: int) -> bool:
        return self._tx(file, token, owner, value) is not None


async def worker(args: argparse.Namespace) -> None:
    rnd = random.Random(args.seed)
    ext = External(args.ext, fence=not args.no_fence)
    stop = anyio.Event()

    async def watch_stdin() -> None:
        await anyio.to_thread.run_sync(sys.stdin.read, abandon_on_cancel=True)
        stop.set()

    async with crdtstore.open_store(args.url) as store, anyio.create_task_group() as tg:
        tg.start_soon(watch_stdin)
        say("READY")
        while not stop.is_set():
            files = rnd.sample(FILES, rnd.randint(1, 3))
            try:
                async with store.lease(files, ttl=args.ttl, owner=args.owner) as lease:
                    tok = lease.token
                    say("GRANT", lease.rank, tok, ",".join(lease.resources))
                    for f in lease.resources:
                        value = await anyio.to_thread.run_sync(ext.read, f, tok, args.owner)
                        if value is None:
                            say("REFUSED", f, tok)
                            continue
                        say("READ", f, tok)
                        await anyio.sleep(rnd.uniform(0.005, 0.03))  # the slow part
                        ok = await anyio.to_thread.run_sync(
                            ext.write, f, tok, args.owner, value + 1
                        )
                        say("WROTE" if ok else "REFUSED", f, tok)
            except LeaseLost:
                say("LOST")
        tg.cancel_scope.cancel()
    say("DONE")


def main() -> None:
    p = argparse.ArgumentParser()
    sub = p.add_subparsers(dest="cmd", required=True)
    h = sub.add_parser("hold")
    h.add_argument("url")
    h.add_argument("owner")
    h.add_argument("resources")
    h.add_argument("--ttl", type=float, default=30.0)
    h.add_argument("--key", default=None)
    w = sub.add_parser("worker")
    w.add_argument("url")
    w.add_argument("ext")
    w.add_argument("owner")
    w.add_argument("--ttl", type=float, default=0.3)
    w.add_argument("--no-fence", action="store_true")
    w.add_argument("--seed", type=int, default=0)
    args = p.parse_args()
    anyio.run(hold if args.cmd == "hold" else worker, args)


if __name__ == "__main__":
    main()

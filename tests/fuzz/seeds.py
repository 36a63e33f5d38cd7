"""The seed corpus of every target, made from real updates, frames, tokens and specs
(``python -m tests.fuzz seed`` writes it to ``tests/fuzz/corpus/<target>/``, one file per
input named by its hash; the corpus is committed). Deterministic: fixed client ids."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pycrdt import Array, Doc, Map, Text

from tests.fuzz._harness import CORPUS_DIR, join_frames


def _docs() -> list[bytes]:
    """Real v1 updates: map sets, overwrites and deletes, nested maps, lists, texts (with
    non-ASCII), and an incremental update after edits."""
    out: list[bytes] = [b"\x00\x00"]
    doc: Doc[Any] = Doc(client_id=11)
    m = doc.get("notes", type=Map)
    m["a"] = 1
    out.append(bytes(doc.get_update()))
    m["b"] = "é€😀"
    m["c"] = {"x": [1, None, True, 2.5]}
    out.append(bytes(doc.get_update()))
    state = doc.get_state()
    m["a"] = 2
    del m["b"]
    out.append(bytes(doc.get_update(state)))
    arr = doc.get("log", type=Array)
    arr.extend(["one", "two", 3])
    del arr[1]
    txt = doc.get("body", type=Text)
    txt += "hello wörld"
    del txt[0:2]
    m["nested"] = Map({"k": "v"})
    out.append(bytes(doc.get_update()))
    other: Doc[Any] = Doc(client_id=2**40 + 5)
    other.get("notes", type=Map)["z"] = b"bin"
    out.append(bytes(other.get_update()))
    out.append(bytes(doc.get_state()))
    return out


def v1_update() -> list[bytes]:
    out = [b"\x00" + u for u in _docs()]
    out += [b"\x00" + x for x in (b"\x7d\x2a", b"\x77\x03abc", b"\x76\x01\x01k\x78", b"\x05")]
    out += [bytes([1, i, 0, 65, 66, 2, 5, 9, 4, 1, 67, 6, 3, 68]) for i in range(3)]
    return out


def _session_frames() -> list[bytes]:
    from sync._messages import (
        Awareness,
        AwarenessEntry,
        PermissionDenied,
        Push,
        QueryAwareness,
        Request,
        Response,
        SyncStep1,
        SyncStep2,
        Update,
        encode,
        encode_awareness_update,
    )

    updates = _docs()
    aw = encode_awareness_update(
        [AwarenessEntry(5, 1, '{"user": {"name": "a"}}'), AwarenessEntry(6, 2, "null")]
    )
    return [
        encode(SyncStep1(b"\x00")),
        encode(SyncStep1(updates[-1])),
        encode(SyncStep2(updates[1])),
        *(encode(Update(u)) for u in updates[:-1]),
        encode(Awareness(aw)),
        encode(QueryAwareness()),
        encode(PermissionDenied("read-only")),
        encode(Request(id=1, op="flush")),
        encode(Request(id="x", op="journal.read", params={"after": 0, "limit": 5})),
        encode(Response(id=1, result={"ok": True})),
        encode(Push(push="head", seq=3)),
    ]


def session(side: int) -> list[bytes]:
    frames = _session_frames()
    out = [bytes([side]) + join_frames([f]) for f in frames]
    out.append(bytes([side]) + join_frames(frames[:6]))
    out.append(bytes([side | 2]) + join_frames(frames))  # read-only (server side)
    return out


def session_server() -> list[bytes]:
    return session(0)


def session_client() -> list[bytes]:
    return session(0)


def extension() -> list[bytes]:
    texts = [
        {"id": 1, "op": "flush"},
        {"id": "r-1", "op": "lease.acquire", "params": {"resources": ["a/b"], "ttl": 5}},
        {"id": 2, "op": "journal.append", "params": {"entries": [["AAA=", 5, ""]]}},
        {"id": 3, "result": [1, 2, {"x": None}]},
        {"id": 4, "error": {"code": "LEASE_LOST", "message": "gone", "holder": "b"}},
        {"push": "head", "seq": 7, "rows": [[1, "a"]]},
        {"push": "leases"},
    ]
    return [bytes([i % 3]) + json.dumps(t).encode() for i, t in enumerate(texts)] + [
        b"\x00" + json.dumps(texts[0]).encode(),
        b"\x01" + json.dumps(texts[3]).encode(),
        b"\x01" + json.dumps(texts[4]).encode(),
        b"\x02" + json.dumps(texts[5]).encode(),
    ]


def foreign_update() -> list[bytes]:
    out = [b"\x00" + u for u in _docs()[:-1]]
    out += [bytes([1, 0, i, 65, 1, 66, 3, 1, 4, 2, 0, 5, 1]) for i in range(6)]
    return out


def token() -> list[bytes]:
    from sync._tokens import TokenClaims, mint

    secret = b"fuzz-secret-0123456789abcdef"
    claims = [
        TokenClaims(tenant="acme", run="r1", agent="planner", mode="rw", exp=1_800_000_000),
        TokenClaims(
            tenant="acme",
            run="nightly-*",
            agent="a",
            mode="ro",
            exp=1_800_000_000,
            jti="5kqB0eYc3hV1yXw8ZsGq9A",
            source="tool",
        ),
        TokenClaims(tenant="t", run="*", agent="b", mode="rw", exp=1),
    ]
    out = [b"\x01" + c.model_dump_json().encode() for c in claims]
    out += [b"\x00" + mint(secret, c).encode() for c in claims]
    out.append(b"\x01" + b'{"tenant": "acme", "run": "r", "agent": "x", "mode": "rw", "exp": 9}')
    return out


def flow_spec() -> list[bytes]:
    yaml_specs = [
        "name: w\nsteps:\n- {id: a, kind: python, call: 'asyncio:sleep'}\n",
        "name: build\nagent: builder\nsteps:\n"
        "- id: lint\n  kind: script\n  run: ruff check .\n  owned_files: [src/a.py]\n"
        "  retries: 2\n  timeout: 5\n"
        "- id: test\n  needs: [lint]\n  executor: {kind: script, run: [pytest, -q]}\n"
        "  view: ['findings/*', log]\n",
        "name: fan\nsteps:\n- id: p\n  kind: parallel\n  join: {at_least: 1}\n"
        "  max_concurrency: 2\n  branches:\n  - {id: x, kind: script, run: 'true'}\n"
        "  - {id: y, kind: agent, call: 'asyncio:sleep', tools: [t], tools_format: mcp}\n",
        "name: nest\nsteps:\n- id: n\n  kind: workflow\n  steps:\n"
        "  - {id: a, kind: script, run: x, env: {A: b}, cwd: /tmp, tail: 3}\n"
        "  - {id: b, kind: script, run: y, needs: [a], inputs: {k: [1, 2]}}\n",
        "name: cyc\nsteps:\n- {id: a, kind: script, run: x, needs: [b]}\n"
        "- {id: b, kind: script, run: y, needs: [a]}\n",
    ]
    out = [b"\x00" + s.encode() for s in yaml_specs]
    import yaml  # type: ignore[import-untyped]

    out += [b"\x01" + json.dumps(yaml.safe_load(s)).encode() for s in yaml_specs]
    return out


TARGETS: dict[str, Callable[[], list[bytes]]] = {
    "v1_update": v1_update,
    "session_server": session_server,
    "session_client": session_client,
    "extension": extension,
    "foreign_update": foreign_update,
    "token": token,
    "flow_spec": flow_spec,
}


def write(target: str, inputs: list[bytes], root: Path = CORPUS_DIR) -> int:
    """Write ``inputs`` to the target's corpus directory (new files only): how many."""
    folder = root / target
    folder.mkdir(parents=True, exist_ok=True)
    added = 0
    for data in inputs:
        path = folder / hashlib.sha1(data).hexdigest()[:16]
        if not path.exists():
            path.write_bytes(data)
            added += 1
    return added

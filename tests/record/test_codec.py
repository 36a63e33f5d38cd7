"""The lib0 / Yjs v1 codec (``crdtstore.codec``): golden bytes, round trips, strictness, and
that every decoder the codec replaced reads every input it read identically.

Before the codec had one home there were six readers of these bytes: ``crdtstore/_v1.py``
(a lenient reader and an inline var-uint reader with a cache of long ones),
``crdtstore/_replica.py:_varuint`` and ``_check_counts``, ``sync/_encoding.py`` (the strict
lib0 decoder), ``sync/_messages.py:decode_state_vector``, ``sync/_document.py:_check_counts`` and
``crdtstore/sim/_sim.py:decode_state_vector``. Their code is kept below, as it was, as the
oracles of :func:`test_former_var_uint_readers_agree` and the tests after it.
"""

from __future__ import annotations

from typing import Any

import pycrdt
import pytest
from hypothesis import given
from hypothesis import strategies as st

from crdtstore import InvalidUpdate, PayloadTooLarge
from crdtstore.codec import (
    MAX_SAFE_INTEGER,
    CodecError,
    Decoder,
    Encoder,
    check_update_counts,
    decode_delete_set,
    decode_state_vector,
    decode_update,
    decode_var_uint,
    encode_state_vector,
    encode_var_uint,
    read_var_uint_at,
    root_kinds,
)

texts = st.text(st.characters(codec="utf-8"), max_size=40)
var_uints = st.one_of(
    st.integers(0, 300), st.integers(0, MAX_SAFE_INTEGER), st.just(MAX_SAFE_INTEGER)
)
blobs = st.binary(max_size=300)


# -- lib0: golden bytes, round trips, strictness ----------------------------------------------


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (0, b"\x00"),
        (1, b"\x01"),
        (127, b"\x7f"),
        (128, b"\x80\x01"),
        (300, b"\xac\x02"),
        (2**14, b"\x80\x80\x01"),
        (2**32, b"\x80\x80\x80\x80\x10"),
        (MAX_SAFE_INTEGER, b"\xff\xff\xff\xff\xff\xff\xff\x0f"),
    ],
)
def test_var_uint_golden(value: int, expected: bytes) -> None:
    assert encode_var_uint(value) == expected
    assert decode_var_uint(expected) == value


@pytest.mark.parametrize(
    ("value", "expected"),
    [(0, b"\x00"), (1, b"\x01"), (-1, b"\x41"), (63, b"\x3f"), (64, b"\x80\x01"),
     (-64, b"\xc0\x01"), (-8192, b"\xc0\x80\x01")],
)  # fmt: skip
def test_var_int_golden(value: int, expected: bytes) -> None:
    enc = Encoder()
    enc.write_var_int(value)
    assert enc.to_bytes() == expected
    dec = Decoder(expected)
    assert dec.read_var_int() == value
    dec.end()


def test_var_string_prefix_counts_utf8_bytes() -> None:
    enc = Encoder()
    enc.write_var_string("é日🙂")  # 3 characters, 2 + 3 + 4 bytes
    assert enc.to_bytes() == b"\x09" + "é日🙂".encode()
    assert Decoder(enc.to_bytes()).read_var_string() == "é日🙂"


@given(st.lists(st.one_of(var_uints, st.integers(-MAX_SAFE_INTEGER, MAX_SAFE_INTEGER),
                          blobs, texts), max_size=8))  # fmt: skip
def test_encoder_decoder_round_trip(values: list[Any]) -> None:
    enc = Encoder()
    kinds = []
    for i, value in enumerate(values):
        if isinstance(value, bytes):
            enc.write_var_uint8array(value)
            kinds.append("bytes")
        elif isinstance(value, str):
            enc.write_var_string(value)
            kinds.append("str")
        elif value >= 0 and i % 2 == 0:
            enc.write_var_uint(value)
            kinds.append("uint")
        else:
            enc.write_var_int(value)
            kinds.append("int")
    dec = Decoder(enc.to_bytes())
    readers: dict[str, Any] = {
        "bytes": dec.read_var_uint8array,
        "str": dec.read_var_string,
        "uint": dec.read_var_uint,
        "int": dec.read_var_int,
    }
    assert [readers[k]() for k in kinds] == values
    dec.end()


@pytest.mark.parametrize(
    ("data", "reader"),
    [
        (b"", "read_var_uint"),
        (b"\x80", "read_var_uint"),  # truncated
        (b"\x80\x00", "read_var_uint"),  # over-long
        (b"\xff" * 8 + b"\x7f", "read_var_uint"),  # too long
        (b"\x80\x80\x80\x80\x80\x80\x80\x10", "read_var_uint"),  # 2**53: not a safe integer
        (b"", "read_var_int"),
        (b"\xc0", "read_var_int"),
        (b"\x80\x00", "read_var_int"),
        (b"\x40", "read_var_int"),  # negative zero
        (b"\x05ab", "read_var_uint8array"),  # length past the end
        (b"\x02\xc3\x28", "read_var_string"),  # invalid UTF-8
        (b"\x01\xed", "read_var_string"),
    ],
)
def test_decoder_refuses_bad_input(data: bytes, reader: str) -> None:
    dec = Decoder(data)
    with pytest.raises(CodecError):
        getattr(dec, reader)()
    assert dec.pos == 0  # nothing consumed by a failed read


def test_decoder_length_limit() -> None:
    data = b"\x05hello"
    with pytest.raises(PayloadTooLarge) as info:
        Decoder(data, max_length=4).read_var_uint8array()
    assert (info.value.size, info.value.limit) == (5, 4)
    assert Decoder(data, max_length=5).read_var_uint8array() == b"hello"


@pytest.mark.parametrize("bad", [-1, 2**53, 1.5, True, "1"])
def test_encoder_refuses_out_of_range(bad: Any) -> None:
    with pytest.raises(CodecError):
        Encoder().write_var_uint(bad)


def test_encoder_refuses_lone_surrogate() -> None:
    with pytest.raises(CodecError):
        Encoder().write_var_string("\ud800")


def test_codec_errors_are_invalid_updates() -> None:
    with pytest.raises(InvalidUpdate) as info:
        decode_var_uint(b"\x80")
    assert isinstance(info.value, ValueError) and info.value.code == "INVALID_UPDATE"
    assert str(info.value) == info.value.reason == "truncated varUint"


# -- the former decoders, as they were (the oracles) --------------------------------------------


class _Refused(Exception):
    pass


def _old_replica_varuint(data: bytes, pos: int) -> tuple[int, int]:
    # crdtstore/_replica.py:_varuint
    value = shift = 0
    while True:
        if pos >= len(data) or shift > 63:
            raise _Refused("truncated variable-length integer")
        byte = data[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value, pos
        shift += 7


def _old_v1_uint(data: bytes, pos: int) -> tuple[int, int]:
    # crdtstore/_v1.py:_Reader.uint
    if pos < len(data) and data[pos] < 0x80:
        return data[pos], pos + 1
    n = shift = 0
    while True:
        if pos >= len(data):
            raise _Refused("unexpected end of update")
        b = data[pos]
        pos += 1
        n |= (b & 0x7F) << shift
        if b < 0x80:
            return n, pos
        shift += 7
        if shift > 70:
            raise _Refused("var-uint too long")


def _old_v1_inline(data: bytes, pos: int) -> tuple[int, int]:
    # crdtstore/_v1.py: the inline read of decode_update and _delete_set, with _more (its
    # cache of long var-uints left out: it only ever returned what the loop computes)
    try:
        b = data[pos]
        pos += 1
        if b < 0x80:
            return b, pos
        c = data[pos]
        if c < 0x80:
            return (b & 0x7F) | (c << 7), pos + 1
        n, shift = b & 0x7F, 7
        while True:
            b = data[pos]
            pos += 1
            n |= (b & 0x7F) << shift
            if b < 0x80:
                return n, pos
            shift += 7
            if shift > 70:
                raise _Refused("var-uint too long")
    except IndexError:
        raise _Refused("unexpected end of update") from None


def _old_sync_strict(data: bytes, pos: int) -> tuple[int, int]:
    # sync/_encoding.py:Decoder.read_var_uint
    end = len(data)
    value = shift = 0
    for count in range(1, 9):
        if pos >= end:
            raise _Refused("truncated varUint")
        byte = data[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            if byte == 0 and count > 1:
                raise _Refused("over-long varUint")
            if value > MAX_SAFE_INTEGER:
                raise _Refused("exceeds")
            return value, pos
        shift += 7
    raise _Refused("varUint longer than 8 bytes")


_OLD_LENIENT = (_old_replica_varuint, _old_v1_uint, _old_v1_inline)


def _new_decoder(data: bytes, pos: int) -> tuple[int, int]:
    dec = Decoder(data)
    dec.pos = pos
    try:
        return dec.read_var_uint(), dec.pos
    except CodecError as exc:
        assert dec.pos == pos  # a failed read consumes nothing
        raise _Refused(exc.reason) from None


def _new_at(data: bytes, pos: int) -> tuple[int, int]:
    try:
        return read_var_uint_at(data, pos)
    except CodecError as exc:
        raise _Refused(exc.reason) from None


def _outcome(read: Any, data: bytes, pos: int) -> tuple[int, int] | None:
    try:
        return read(data, pos)  # type: ignore[no-any-return]
    except _Refused:
        return None


def _old_state_vector(read: Any, sv: bytes) -> dict[int, int]:
    # crdtstore/_v1.py:read_state_vector (on _Reader.uint), crdtstore/sim/_sim.py:
    # decode_state_vector (on the replica's loop): count, then client/clock pairs
    out = {}
    count, pos = read(sv, 0)
    for _ in range(count):
        client, pos = read(sv, pos)
        out[client], pos = read(sv, pos)
    return out


def _old_sync_state_vector(sv: bytes) -> dict[int, int]:
    # sync/_messages.py:decode_state_vector
    count, pos = _old_sync_strict(sv, 0)
    if count > (len(sv) - pos) // 2:
        raise _Refused("claims")
    out: dict[int, int] = {}
    for _ in range(count):
        client, pos = _old_sync_strict(sv, pos)
        clock, pos = _old_sync_strict(sv, pos)
        if client in out:
            raise _Refused("twice")
        out[client] = clock
    if pos != len(sv):
        raise _Refused("trailing")
    return out


def _old_check_counts(update: bytes) -> str | None:
    # crdtstore/_replica.py:_check_counts (sync/_document.py:_check_counts: the same checks on
    # the strict decoder); None: accepted, else the reason
    try:
        clients, pos = _old_replica_varuint(update, 0)
        if clients > len(update) - pos:
            return f"claims {clients} clients in {len(update)} bytes"
        if clients:
            structs, pos = _old_replica_varuint(update, pos)
            if structs > len(update) - pos:
                return f"claims {structs} structs in {len(update)} bytes"
    except _Refused as exc:
        return str(exc)
    return None


# -- every former decoder's inputs decode identically -------------------------------------------


def _pycrdt_bytes() -> list[bytes]:
    """State vectors, updates and delete sets as pycrdt writes them: several clients (one of
    them with a long id), maps, lists, text with non-ASCII, deletions."""
    docs = [pycrdt.Doc(), pycrdt.Doc(client_id=2**53 - 1), pycrdt.Doc(client_id=300)]
    out: list[bytes] = []
    for i, doc in enumerate(docs):
        m = doc.get("m", type=pycrdt.Map)
        t = doc.get("t", type=pycrdt.Text)
        a = doc.get("a", type=pycrdt.Array)
        for j in range(150):
            m[f"k{j % 7}"] = j * 1000 + i
            t += "é日🙂x"[j % 4]
            a.append(j)
        del m["k1"]
        del t[0:3]
        a.pop()
        out.append(doc.get_update())
    for doc in docs[1:]:
        for update in out[:3]:
            doc.apply_update(update)
    for doc in docs:
        out.append(doc.get_state())
        out.append(doc.get_update())
        out.append(doc.get_update(docs[0].get_state()))
    return out


PYCRDT_BYTES = _pycrdt_bytes()


def test_former_var_uint_readers_agree_on_pycrdt_bytes() -> None:
    """At every position of real update and state-vector bytes, every former reader and the
    codec read the same value, or (the strict reader and the codec) refuse alike."""
    for data in PYCRDT_BYTES:
        for pos in range(len(data)):
            new = _outcome(_new_decoder, data, pos)
            assert _outcome(_new_at, data, pos) == new
            assert _outcome(_old_sync_strict, data, pos) == new
            if new is not None:
                for old in _OLD_LENIENT:
                    assert _outcome(old, data, pos) == new


@given(var_uints)
def test_former_var_uint_readers_agree_on_every_value(value: int) -> None:
    data = encode_var_uint(value) + b"\x01"
    for read in (_new_decoder, _new_at, _old_sync_strict, *_OLD_LENIENT):
        assert read(data, 0) == (value, len(data) - 1)


@given(st.binary(max_size=12), st.integers(0, 3))
def test_former_var_uint_readers_agree_on_any_bytes(data: bytes, pos: int) -> None:
    """Any bytes: the codec reads what the strict former decoder read and refuses what it
    refused; what it reads, the lenient ones read alike (they also took non-canonical and
    over-range encodings, which no encoder writes: the codec refuses those)."""
    new = _outcome(_new_decoder, data, pos)
    assert _outcome(_new_at, data, pos) == new
    assert _outcome(_new_at, data, pos) == new  # (again: through the cache of long ones)
    assert _outcome(_old_sync_strict, data, pos) == new
    if new is not None:
        for old in _OLD_LENIENT:
            assert _outcome(old, data, pos) == new


@given(st.dictionaries(var_uints, var_uints, max_size=6))
def test_state_vector_round_trip_and_former_decoders(sv: dict[int, int]) -> None:
    data = encode_state_vector(sv)
    assert decode_state_vector(data) == sv
    assert _old_sync_state_vector(data) == sv
    for read in _OLD_LENIENT:
        assert _old_state_vector(read, data) == sv


def test_state_vectors_of_pycrdt_decode_identically() -> None:
    for data in PYCRDT_BYTES:
        try:
            old = _old_sync_state_vector(data)
        except _Refused:
            continue  # (an update, not a state vector)
        assert decode_state_vector(data) == old
        assert encode_state_vector(old) == data
        for read in _OLD_LENIENT:
            assert _old_state_vector(read, data) == old


@given(st.binary(max_size=24))
def test_state_vector_refusals_match_the_strict_former_decoder(data: bytes) -> None:
    try:
        old: dict[int, int] | None = _old_sync_state_vector(data)
    except _Refused:
        old = None
    try:
        new: dict[int, int] | None = decode_state_vector(data)
    except CodecError:
        new = None
    assert new == old


def _canonical_counts(update: bytes) -> bool:
    """Whether the counts the former check read are canonical var-uints (what it read
    leniently: the codec refuses the others)."""
    try:
        clients, pos = _old_sync_strict(update, 0)
        if clients and clients <= len(update) - pos:
            _old_sync_strict(update, pos)
    except _Refused:
        return False
    return True


@given(st.one_of(st.binary(max_size=16), st.sampled_from(PYCRDT_BYTES)))
def test_update_counts_checked_as_before(update: bytes) -> None:
    old = _old_check_counts(update)
    try:
        check_update_counts(update)
        new = None
    except CodecError as exc:
        new = exc.reason
    if _canonical_counts(update):
        assert new == old
    else:
        assert new is not None  # (the former check read them leniently)


def test_update_structs_of_pycrdt_decode() -> None:
    """The struct readers (moved as they were onto the codec's primitives) read real bytes."""
    for data in PYCRDT_BYTES:
        try:
            decode_state_vector(data)
            continue
        except CodecError:
            pass
        decoded = decode_update(data)
        kinds = root_kinds(data)
        assert set(kinds) <= {"m", "t", "a"}
        assert all(k.key is None or k.key.startswith("k") for k in decoded.entries)
        # the delete set is the update's tail: re-encoded alone it decodes the same
        enc = Encoder()
        by_client: dict[int, list[tuple[int, int]]] = {}
        for client, clock, length in decoded.deletes:
            by_client.setdefault(client, []).append((clock, length))
        enc.write_var_uint(len(by_client))
        for client, ranges in by_client.items():
            enc.write_var_uint(client)
            enc.write_var_uint(len(ranges))
            for clock, length in ranges:
                enc.write_var_uint(clock)
                enc.write_var_uint(length)
        assert decode_delete_set(enc.to_bytes()) == decoded.deletes
        assert data.endswith(enc.to_bytes())

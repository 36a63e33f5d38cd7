"""What the fuzz targets (tests/fuzz/) found, one test each, written before the fix.

Each test names its target and the input it found (as bytes or the smallest form of it); the
inputs themselves are also in ``tests/fuzz/corpus/<target>/`` so the target replays them.
"""

from __future__ import annotations

from typing import Any

import pytest

from crdtstore.codec import CodecError, Decoder


@pytest.mark.parametrize("data", [b"\x07", b"\x7d", b"\x7b\x00", b"\x76\x01\x01", b"\x75\x01"])
@pytest.mark.parametrize("method", ["read_any", "skip_any"])
def test_a_failed_any_read_leaves_the_position(data: bytes, method: str) -> None:
    """fuzz_v1_update: ``read_any``/``skip_any`` of an unknown tag (``b"\\x07"``) or a
    truncated value raised CodecError with the position moved past the tag, though the
    decoder promises that a failed read leaves the position where it was."""
    dec = Decoder(b"\x00" + data)
    dec.read_byte()
    with pytest.raises(CodecError):
        getattr(dec, method)()
    assert dec.pos == 1


def test_a_token_with_a_non_ascii_payload_is_token_invalid() -> None:
    """fuzz_token: a token whose first part holds a non-ASCII character (``"\\x00\\x00\\ufffd.t1"``)
    made ``verify`` raise UnicodeEncodeError while signing the payload, not TokenInvalid."""
    from sync._tokens import TokenInvalid, verify

    with pytest.raises(TokenInvalid):
        verify(b"fuzz-secret-0123456789abcdef", "\x00\x00\ufffd.t1", 1.0)
    with pytest.raises(TokenInvalid):
        verify(b"fuzz-secret-0123456789abcdef", "é.AAAA", 1.0)


def test_a_token_with_a_changed_padding_bit_is_token_invalid() -> None:
    """fuzz_token: the last base64url character of a signature (or of the claims) carries
    bits that decoding drops; changing them (``A`` to ``B`` at the end of a 43-character
    signature) gave another string that verified as the same token. Only the canonical
    encoding verifies now."""
    from sync._tokens import TokenClaims, TokenInvalid, mint, verify

    secret = b"fuzz-secret-0123456789abcdef"
    claims = TokenClaims(tenant="acme", run="r1", agent="a", mode="rw", exp=10)
    token = mint(secret, claims)
    assert verify(secret, token, 1.0) == claims
    alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_"
    last = alphabet.index(token[-1])
    for twin in {alphabet[(last & ~3) | bits] for bits in range(4)} - {token[-1]}:
        with pytest.raises(TokenInvalid):
            verify(secret, token[:-1] + twin, 1.0)


def _base_replica() -> Any:
    from pycrdt import Map

    from crdtstore import Replica

    seed = Replica()
    seed.doc.get("notes", type=Map)["seed"] = "v"
    replica = Replica()
    replica.apply_update(bytes(seed.doc.get_update()))
    return replica


_CLIENT_11 = [  # updates the replica accepts, then the one it refuses (client 11's)
    "01010b002801056e6f7465730161017c3f80000000",
    "01030b002801056e6f7465730161017c3f8000002801056e6f7465730162017709c3a9e282acf09f9880"
    "2801056e327465730163017601017875047c3f8000007e787c4020000000",
    "01010b03a80b00017c40000000010b010002",
]
_REFUSED_11 = (
    "010b0b002101056e6f7465730161052101056e6f7465730162012801056e6f7465730163017601017875047c"
    "3f8000007e787c40200000a80b00017c400000000801036c6f670177036f6e65810b0401880b05017c40400000"
    "010104626f647902840b080a6c6c6f2077c3b6726c642701056e6f746573066e65737465640128000b12016b"
    "01770176010b03000205010702"
)


def test_a_refused_update_leaves_the_replica_unchanged() -> None:
    """fuzz_session_client: after three updates of client 11, a fourth that pycrdt refuses
    half way (``Cannot apply update: block parent <11#18> must be deleted or shared ref
    type``) was refused with InvalidUpdate, but the document had changed. An update naming a
    nested type as a parent is now tried on a copy first."""
    from crdtstore import InvalidUpdate

    replica = _base_replica()
    for update in _CLIENT_11:
        replica.apply_update(bytes.fromhex(update))
    before = bytes(replica.doc.get_update())
    with pytest.raises(InvalidUpdate):
        replica.apply_update(bytes.fromhex(_REFUSED_11))
    assert bytes(replica.doc.get_update()) == before


@pytest.mark.parametrize(
    "data", [b"\x77\x03\xfdbc", b"\x76\x01\x01\xff\x7e", b"\x75\x01\x77\x01\xc3"]
)
def test_skip_any_refuses_what_read_any_refuses(data: bytes) -> None:
    """fuzz_v1_update: ``skip_any`` moved past a string value (or an object key) that is not
    valid UTF-8 (``77 03 fd 62 63``), which ``read_any`` refuses: the update decoder skips
    every value of a map entry but its first, so it accepted what it would refuse one
    value earlier."""
    with pytest.raises(CodecError):
        Decoder(data).read_any()
    with pytest.raises(CodecError):
        Decoder(data).skip_any()


@pytest.mark.parametrize("call", [".'asyencio:sleep", ".:f", "..x:y"])
def test_a_relative_module_in_a_spec_is_spec_invalid(call: str) -> None:
    """fuzz_flow_spec: ``call: .'asyencio:sleep`` made the loader's ``import_module`` raise
    TypeError (a relative import needs a package), not SpecInvalid."""
    from crdtstore.flow._errors import SpecInvalid
    from crdtstore.flow._spec import parse_spec

    spec = {"name": "r", "steps": [{"id": "a", "kind": "python", "call": call}]}
    with pytest.raises(SpecInvalid) as info:
        parse_spec(spec)
    assert info.value.field == "steps[0].executor.call"


@pytest.mark.parametrize(
    "update",
    [
        "01010b01000000002801056e6f7465730161017c3f",  # fuzz_session_server
        "010101010000000000001873001800021501010b00",  # fuzz_session_client
        "01010b01000000",  # the smallest form: a GC struct of length 0 after a clock gap
    ],
)
def test_a_gc_struct_of_length_0_is_refused(update: str) -> None:
    """fuzz_session_server, fuzz_session_client: pycrdt took an update holding a GC struct of
    length 0 after a clock gap, and every later ``get_update`` of the document panicked
    (``attempt to divide by zero``): one frame of a hostile peer made the run unsyncable.
    The strict decode of ``check_update`` refuses it before pycrdt sees it."""
    from crdtstore import InvalidUpdate

    replica = _base_replica()
    before = bytes(replica.doc.get_update())
    with pytest.raises(InvalidUpdate, match="length 0"):
        replica.apply_update(bytes.fromhex(update))
    assert bytes(replica.doc.get_update()) == before

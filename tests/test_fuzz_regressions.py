"""What the fuzz targets (tests/fuzz/) found, one test each, written before the fix.

Each test names its target and the input it found (as bytes or the smallest form of it); the
inputs themselves are also in ``tests/fuzz/corpus/<target>/`` so the target replays them.
"""

from __future__ import annotations

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

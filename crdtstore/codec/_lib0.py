"""lib0's encodings, the bytes of Yjs v1 updates and of y-protocols messages. No I/O.

- ``varUint(n)``: 7 bits at a time, least significant group first; the high bit of a byte
  says another byte follows. Values up to ``2**53 - 1`` (JavaScript's safe integers, what
  lib0 can read), so at most 8 bytes.
- ``varInt(n)``: the first byte carries a continuation bit, a sign bit and 6 bits of the
  magnitude; further bytes carry 7 bits each, as ``varUint``.
- ``varUint8Array(b) := varUint(len(b)) • b``; ``varString(s) := varUint8Array(utf8(s))``: the
  prefix is the UTF-8 *byte* length (pycrdt's ``Encoder.write_var_string`` writes the
  character count, which is wrong for non-ASCII).
- ``any``: lib0's tagged values (JSON-like, plus ``undefined``, bigint and binary).

The decoder is strict where lib0 is lenient, so that ``encode(decode(b)) == b`` whenever
decoding succeeds: it refuses over-long (non-canonical) integers, negative zero, invalid UTF-8,
lengths past the end of the buffer, and (through :meth:`Decoder.end`) trailing bytes. Every
failure is a :class:`CodecError`; a failed read leaves the position where it was.
"""

from __future__ import annotations

import struct
from typing import Any

from .._errors import InvalidUpdate, PayloadTooLarge

__all__ = [
    "MAX_SAFE_INTEGER",
    "CodecError",
    "Decoder",
    "Encoder",
    "decode_var_uint",
    "encode_var_uint",
    "read_var_uint_at",
]

MAX_SAFE_INTEGER = 2**53 - 1
# 53 bits take 8 groups of 7 bits: a longer varUint cannot be in range.
_MAX_VAR_UINT_BYTES = 8
_MAX_DEPTH = 256  # nesting of ``any`` values
_F64, _F32, _I64 = struct.Struct(">d"), struct.Struct(">f"), struct.Struct(">q")


class CodecError(InvalidUpdate):
    """Bytes that are not the lib0 / Yjs v1 encoding the codec reads, or a value it cannot
    write. An :class:`~crdtstore.InvalidUpdate` (code ``INVALID_UPDATE``), hence a
    ``ValueError``; ``reason`` says what is wrong. ``sync`` turns it into its
    ``ProtocolError`` at the protocol boundary."""

    def __init__(self, reason: str) -> None:
        self.reason = reason
        Exception.__init__(self, reason)


class Encoder:
    """Builds a byte string from lib0 values."""

    __slots__ = ("_buf",)

    def __init__(self) -> None:
        self._buf = bytearray()

    def to_bytes(self) -> bytes:
        return bytes(self._buf)

    def __len__(self) -> int:
        return len(self._buf)

    def write_var_uint(self, value: int) -> None:
        """Append ``value`` as a varUint.

        Raises:
            CodecError: ``value`` is not an int in ``0 .. 2**53 - 1``.
        """
        if (
            not isinstance(value, int)
            or isinstance(value, bool)
            or not 0 <= value <= MAX_SAFE_INTEGER
        ):
            raise CodecError(f"varUint out of range: {value!r}")
        buf = self._buf
        while value > 0x7F:
            buf.append(0x80 | (value & 0x7F))
            value >>= 7
        buf.append(value)

    def write_var_int(self, value: int) -> None:
        """Append ``value`` as a varInt (sign and magnitude).

        Raises:
            CodecError: ``value`` is not an int with ``abs(value) <= 2**53 - 1``.
        """
        if (
            not isinstance(value, int)
            or isinstance(value, bool)
            or not -MAX_SAFE_INTEGER <= value <= MAX_SAFE_INTEGER
        ):
            raise CodecError(f"varInt out of range: {value!r}")
        sign = 0x40 if value < 0 else 0
        magnitude = -value if value < 0 else value
        more = 0x80 if magnitude > 0x3F else 0
        self._buf.append(more | sign | (magnitude & 0x3F))
        magnitude >>= 6
        while magnitude > 0:
            self._buf.append((0x80 if magnitude > 0x7F else 0) | (magnitude & 0x7F))
            magnitude >>= 7

    def write_var_uint8array(self, data: bytes) -> None:
        """Append ``data`` prefixed with its length.

        Raises:
            CodecError: ``data`` is not bytes.
        """
        if not isinstance(data, (bytes, bytearray, memoryview)):
            raise CodecError(f"expected bytes, got {type(data).__name__}")
        self.write_var_uint(len(data))
        self._buf += data

    def write_var_string(self, text: str) -> None:
        """Append ``text`` as UTF-8, prefixed with its length in bytes.

        Raises:
            CodecError: ``text`` is not a str, or holds a lone surrogate (no UTF-8 form).
        """
        if not isinstance(text, str):
            raise CodecError(f"expected str, got {type(text).__name__}")
        try:
            data = text.encode("utf-8")
        except UnicodeEncodeError:
            raise CodecError("string is not encodable as UTF-8 (lone surrogate)") from None
        self.write_var_uint8array(data)


class Decoder:
    """Reads lib0 values from a byte string, never past its end.

    Args:
        data: the bytes to read.
        max_length: the largest length prefix (of a byte array or string) accepted.
    """

    __slots__ = ("_data", "_max_length", "pos")

    def __init__(self, data: bytes, *, max_length: int | None = None) -> None:
        if not isinstance(data, (bytes, bytearray, memoryview)):
            raise CodecError(f"expected bytes, got {type(data).__name__}")
        self._data = bytes(data)
        self._max_length = max_length
        self.pos = 0

    @property
    def remaining(self) -> int:
        return len(self._data) - self.pos

    def at_end(self) -> bool:
        return self.pos >= len(self._data)

    def end(self, what: str = "message") -> None:
        """Check that every byte was read.

        Raises:
            CodecError: bytes are left over.
        """
        if self.pos != len(self._data):
            raise CodecError(f"{self.remaining} trailing bytes after the {what}")

    def read_byte(self) -> int:
        """Read one byte.

        Raises:
            CodecError: at the end.
        """
        pos = self.pos
        if pos >= len(self._data):
            raise CodecError("unexpected end of the bytes")
        self.pos = pos + 1
        return self._data[pos]

    def skip(self, n: int) -> None:
        """Move ``n`` bytes on.

        Raises:
            CodecError: fewer than ``n`` bytes are left.
        """
        if n < 0 or self.pos + n > len(self._data):
            raise CodecError("unexpected end of the bytes")
        self.pos += n

    def read_var_uint(self, max_value: int = MAX_SAFE_INTEGER) -> int:
        """Read a varUint.

        Raises:
            CodecError: truncated, over-long (a needless zero group), or above ``max_value``.
        """
        data, pos = self._data, self.pos
        if pos < len(data):
            b = data[pos]
            if b < 0x80 and b <= max_value:
                self.pos = pos + 1  # the usual case: one byte
                return b
        value, pos = read_var_uint_at(data, pos)
        if value > max_value:
            raise CodecError(f"varUint {value} exceeds {max_value}")
        self.pos = pos
        return value

    def read_var_int(self) -> int:
        """Read a varInt.

        Raises:
            CodecError: truncated, over-long, negative zero, or beyond ``±(2**53 - 1)``.
        """
        data, pos, end = self._data, self.pos, len(self._data)
        if pos >= end:
            raise CodecError("truncated varInt")
        byte = data[pos]
        pos += 1
        negative = bool(byte & 0x40)
        magnitude = byte & 0x3F
        shift = 6
        more = byte & 0x80
        while more:
            if pos >= end:
                raise CodecError("truncated varInt")
            if shift >= 6 + 7 * (_MAX_VAR_UINT_BYTES - 1):
                raise CodecError("varInt too long")
            byte = data[pos]
            pos += 1
            magnitude |= (byte & 0x7F) << shift
            shift += 7
            more = byte & 0x80
            if not more and byte == 0:
                raise CodecError("over-long varInt")
        if magnitude > MAX_SAFE_INTEGER:
            raise CodecError(f"varInt magnitude {magnitude} exceeds {MAX_SAFE_INTEGER}")
        if negative and magnitude == 0:
            # lib0 writes -0 for JavaScript's negative zero; Python ints have none.
            raise CodecError("varInt negative zero")
        self.pos = pos
        return -magnitude if negative else magnitude

    def read_var_uint8array(self, max_length: int | None = None) -> bytes:
        """Read a length-prefixed byte array.

        Raises:
            CodecError: the length runs past the end of the buffer.
            PayloadTooLarge: the length exceeds ``max_length`` (or the decoder's limit).
        """
        data, pos = self._data, self.pos
        b = data[pos] if pos < len(data) else 0x80
        length, pos = (b, pos + 1) if b < 0x80 else read_var_uint_at(data, pos)
        limit = max_length if max_length is not None else self._max_length
        if limit is not None and length > limit:
            raise PayloadTooLarge("byte array", length, limit)
        end = pos + length
        if end > len(data):
            raise CodecError(f"byte array of {length} bytes runs past the end of the frame")
        self.pos = end
        return data[pos:end]

    def read_var_string(self, max_length: int | None = None) -> str:
        """Read a length-prefixed UTF-8 string (the length counts bytes).

        Raises:
            CodecError: truncated, or not valid UTF-8.
            PayloadTooLarge: the byte length exceeds ``max_length`` (or the decoder's limit).
        """
        data, pos = self._data, self.pos
        b = data[pos] if pos < len(data) else 0x80
        length, pos = (b, pos + 1) if b < 0x80 else read_var_uint_at(data, pos)
        limit = max_length if max_length is not None else self._max_length
        if limit is not None and length > limit:
            raise PayloadTooLarge("byte array", length, limit)
        end = pos + length
        if end > len(data):
            raise CodecError(f"byte array of {length} bytes runs past the end of the frame")
        try:
            text = data[pos:end].decode("utf-8")
        except UnicodeDecodeError:
            raise CodecError("string is not valid UTF-8") from None
        self.pos = end
        return text

    def skip_var_string(self) -> None:
        """Move past a length-prefixed string or byte array without decoding it.

        Raises:
            CodecError: truncated.
        """
        data, pos = self._data, self.pos
        b = data[pos] if pos < len(data) else 0x80
        n, pos = (b, pos + 1) if b < 0x80 else read_var_uint_at(data, pos)
        if pos + n > len(data):
            raise CodecError(f"byte array of {n} bytes runs past the end of the frame")
        self.pos = pos + n

    def skip_any(self) -> None:
        """Move past a lib0 ``any`` value without building it (its strings are checked to
        be UTF-8: it refuses what :meth:`read_any` refuses).

        Raises:
            CodecError: truncated, an unknown tag, or nested deeper than 256 (the position
                is left where it was).
        """
        start = self.pos
        try:
            self._skip_any(0)
        except CodecError:
            self.pos = start
            raise

    def _skip_any(self, depth: int) -> None:
        if depth > _MAX_DEPTH:
            raise CodecError("value nested too deep")
        tag = self.read_byte()
        if tag in (127, 126, 121, 120):  # undefined, null, false, true
            return
        if tag == 125:
            self.read_var_int()
        elif tag == 124:
            self.skip(4)
        elif tag in (123, 122):  # float64, bigint64
            self.skip(8)
        elif tag == 119:  # string: checked as read_any checks it (valid UTF-8)
            self.read_var_string()
        elif tag == 116:  # Uint8Array
            self.skip_var_string()
        elif tag == 118:  # object
            for _ in range(self.read_var_uint()):
                self.read_var_string()
                self._skip_any(depth + 1)
        elif tag == 117:  # array
            for _ in range(self.read_var_uint()):
                self._skip_any(depth + 1)
        else:
            raise CodecError(f"unknown value tag {tag}")

    def read_any(self) -> Any:
        """Read a lib0 ``any`` value as pycrdt shows it: numbers as floats (but bigints),
        ``undefined`` as None, binary as a ``bytearray``.

        Raises:
            CodecError: truncated, an unknown tag, or nested deeper than 256 (the position
                is left where it was).
        """
        start = self.pos
        try:
            return self._read_any(0)
        except CodecError:
            self.pos = start
            raise

    def _read_any(self, depth: int) -> Any:
        if depth > _MAX_DEPTH:
            raise CodecError("value nested too deep")
        tag = self.read_byte()
        if tag == 119:
            return self.read_var_string()
        if tag == 125:  # signed var-int (pycrdt shows it as a float)
            return float(self.read_var_int())
        if tag in (127, 126):
            return None
        if tag == 121:
            return False
        if tag == 120:
            return True
        data = self._data
        if tag == 123:
            start = self.pos
            self.skip(8)
            return float(_F64.unpack_from(data, start)[0])
        if tag == 124:
            start = self.pos
            self.skip(4)
            return float(_F32.unpack_from(data, start)[0])
        if tag == 122:
            start = self.pos
            self.skip(8)
            return int(_I64.unpack_from(data, start)[0])
        if tag == 118:
            out: dict[str, Any] = {}
            for _ in range(self.read_var_uint()):
                k = self.read_var_string()
                out[k] = self._read_any(depth + 1)
            return out
        if tag == 117:
            return [self._read_any(depth + 1) for _ in range(self.read_var_uint())]
        if tag == 116:
            return bytearray(self.read_var_uint8array())
        raise CodecError(f"unknown value tag {tag}")


_LONG: dict[bytes, int] = {}  # see read_var_uint_at


def read_var_uint_at(data: bytes, pos: int) -> tuple[int, int]:
    """The varUint at ``data[pos]`` and the position after it: ``(value, next_pos)``.

    The primitive every reader of the codec uses (inlined for one-byte values on hot paths:
    ``b = data[pos]; (b, pos + 1) if b < 0x80 else read_var_uint_at(data, pos)``). Long
    varUints are mostly client ids (8 bytes for most of pycrdt's, 5 for most of Yjs'), the
    same few again and again: their values are kept by their bytes (bounded). A varUint is
    prefix-free, so the 8 (or 5) bytes at ``pos``, when they are one known varUint, are the
    one here.

    Raises:
        CodecError: truncated, over-long, or longer than 8 bytes.
    """
    end = len(data)
    if pos >= end:
        raise CodecError("truncated varUint")
    b = data[pos]
    if b < 0x80:
        return b, pos + 1
    if pos + 1 < end:
        c = data[pos + 1]
        if c < 0x80:  # two bytes
            if c == 0:
                raise CodecError("over-long varUint")
            return (b & 0x7F) | (c << 7), pos + 2
        # (a slice at the end of the bytes is shorter: it must not match a shorter key)
        known = _LONG.get(data[pos : pos + 8]) if pos + 8 <= end else None
        if known is not None:
            return known, pos + 8
        known = _LONG.get(data[pos : pos + 5]) if pos + 5 <= end else None
        if known is not None:
            return known, pos + 5
    start = pos
    n = shift = 0
    for _ in range(_MAX_VAR_UINT_BYTES):
        if pos >= end:
            raise CodecError("truncated varUint")
        b = data[pos]
        pos += 1
        n |= (b & 0x7F) << shift
        if b < 0x80:
            if b == 0:
                raise CodecError("over-long varUint")
            if n > MAX_SAFE_INTEGER:
                raise CodecError(f"varUint {n} exceeds {MAX_SAFE_INTEGER}")
            if pos - start in (5, 8):
                if len(_LONG) >= 4096:
                    _LONG.clear()
                _LONG[bytes(data[start:pos])] = n
            return n, pos
        shift += 7
    raise CodecError("varUint longer than 8 bytes")


def encode_var_uint(value: int) -> bytes:
    """``value`` as a varUint (see :meth:`Encoder.write_var_uint`)."""
    enc = Encoder()
    enc.write_var_uint(value)
    return enc.to_bytes()


def decode_var_uint(data: bytes) -> int:
    """The varUint that ``data`` holds, exactly (no trailing bytes).

    Raises:
        CodecError: see :meth:`Decoder.read_var_uint`; or trailing bytes.
    """
    dec = Decoder(data)
    value = dec.read_var_uint()
    dec.end("varUint")
    return value

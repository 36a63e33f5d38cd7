"""lib0's variable-length encodings, as y-protocols uses them. No I/O.

- ``varUint(n)``: 7 bits at a time, least significant group first; the high bit of a byte
  says another byte follows. Values up to ``2**53 - 1`` (JavaScript's safe integers, what
  lib0 can read).
- ``varInt(n)``: the first byte carries a continuation bit, a sign bit and 6 bits of the
  magnitude; further bytes carry 7 bits each, as ``varUint``.
- ``varUint8Array(b) := varUint(len(b)) • b``.
- ``varString(s) := varUint8Array(utf8(s))``: the prefix is the UTF-8 *byte* length (pycrdt's
  ``Encoder.write_var_string`` writes the character count, which is wrong for non-ASCII).

The decoder is strict where lib0 is lenient, so that ``encode(decode(b)) == b`` whenever
decoding succeeds: it refuses over-long (non-canonical) integers, negative zero, invalid
UTF-8, lengths past the end of the buffer or past a limit, and (through :meth:`Decoder.end`)
trailing bytes. Every failure is a :class:`~sync.ProtocolError`; nothing is read past the
buffer.
"""

from __future__ import annotations

from ._errors import MessageTooLarge, ProtocolError

__all__ = [
    "MAX_SAFE_INTEGER",
    "Decoder",
    "Encoder",
    "decode_var_uint",
    "encode_var_uint",
]

MAX_SAFE_INTEGER = 2**53 - 1
# 53 bits take 8 groups of 7 bits: a longer varUint cannot be in range.
_MAX_VAR_UINT_BYTES = 8


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
            ProtocolError: ``value`` is not an int in ``0 .. 2**53 - 1``.
        """
        if (
            not isinstance(value, int)
            or isinstance(value, bool)
            or not 0 <= value <= MAX_SAFE_INTEGER
        ):
            raise ProtocolError(f"varUint out of range: {value!r}")
        buf = self._buf
        while value > 0x7F:
            buf.append(0x80 | (value & 0x7F))
            value >>= 7
        buf.append(value)

    def write_var_int(self, value: int) -> None:
        """Append ``value`` as a varInt (sign and magnitude).

        Raises:
            ProtocolError: ``value`` is not an int with ``abs(value) <= 2**53 - 1``.
        """
        if (
            not isinstance(value, int)
            or isinstance(value, bool)
            or not -MAX_SAFE_INTEGER <= value <= MAX_SAFE_INTEGER
        ):
            raise ProtocolError(f"varInt out of range: {value!r}")
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
            ProtocolError: ``data`` is not bytes.
        """
        if not isinstance(data, (bytes, bytearray, memoryview)):
            raise ProtocolError(f"expected bytes, got {type(data).__name__}")
        self.write_var_uint(len(data))
        self._buf += data

    def write_var_string(self, text: str) -> None:
        """Append ``text`` as UTF-8, prefixed with its length in bytes.

        Raises:
            ProtocolError: ``text`` is not a str, or holds a lone surrogate (no UTF-8 form).
        """
        if not isinstance(text, str):
            raise ProtocolError(f"expected str, got {type(text).__name__}")
        try:
            data = text.encode("utf-8")
        except UnicodeEncodeError:
            raise ProtocolError("string is not encodable as UTF-8 (lone surrogate)") from None
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
            raise ProtocolError(f"expected bytes, got {type(data).__name__}")
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
            ProtocolError: bytes are left over.
        """
        if self.pos != len(self._data):
            raise ProtocolError(f"{self.remaining} trailing bytes after the {what}")

    def read_var_uint(self, max_value: int = MAX_SAFE_INTEGER) -> int:
        """Read a varUint.

        Raises:
            ProtocolError: truncated, over-long (a needless zero group), or above ``max_value``.
        """
        data, pos, end = self._data, self.pos, len(self._data)
        value = shift = 0
        for count in range(1, _MAX_VAR_UINT_BYTES + 1):
            if pos >= end:
                raise ProtocolError("truncated varUint")
            byte = data[pos]
            pos += 1
            value |= (byte & 0x7F) << shift
            if byte < 0x80:
                if byte == 0 and count > 1:
                    raise ProtocolError("over-long varUint")
                if value > max_value:
                    raise ProtocolError(f"varUint {value} exceeds {max_value}")
                self.pos = pos
                return value
            shift += 7
        raise ProtocolError("varUint longer than 8 bytes")

    def read_var_int(self) -> int:
        """Read a varInt.

        Raises:
            ProtocolError: truncated, over-long, negative zero, or beyond ``±(2**53 - 1)``.
        """
        data, pos, end = self._data, self.pos, len(self._data)
        if pos >= end:
            raise ProtocolError("truncated varInt")
        byte = data[pos]
        pos += 1
        negative = bool(byte & 0x40)
        magnitude = byte & 0x3F
        shift = 6
        more = byte & 0x80
        while more:
            if pos >= end:
                raise ProtocolError("truncated varInt")
            if shift >= 6 + 7 * (_MAX_VAR_UINT_BYTES - 1):
                raise ProtocolError("varInt too long")
            byte = data[pos]
            pos += 1
            magnitude |= (byte & 0x7F) << shift
            shift += 7
            more = byte & 0x80
            if not more and byte == 0:
                raise ProtocolError("over-long varInt")
        if magnitude > MAX_SAFE_INTEGER:
            raise ProtocolError(f"varInt magnitude {magnitude} exceeds {MAX_SAFE_INTEGER}")
        if negative and magnitude == 0:
            # lib0 writes -0 for JavaScript's negative zero; Python ints have none.
            raise ProtocolError("varInt negative zero")
        self.pos = pos
        return -magnitude if negative else magnitude

    def read_var_uint8array(self, max_length: int | None = None) -> bytes:
        """Read a length-prefixed byte array.

        Raises:
            ProtocolError: the length runs past the end of the buffer.
            MessageTooLarge: the length exceeds ``max_length`` (or the decoder's limit).
        """
        start = self.pos
        length = self.read_var_uint()
        limit = max_length if max_length is not None else self._max_length
        if limit is not None and length > limit:
            self.pos = start
            raise MessageTooLarge("byte array", length, limit)
        if length > len(self._data) - self.pos:
            self.pos = start
            raise ProtocolError(f"byte array of {length} bytes runs past the end of the frame")
        out = self._data[self.pos : self.pos + length]
        self.pos += length
        return out

    def read_var_string(self, max_length: int | None = None) -> str:
        """Read a length-prefixed UTF-8 string (the length counts bytes).

        Raises:
            ProtocolError: truncated, or not valid UTF-8.
            MessageTooLarge: the byte length exceeds ``max_length`` (or the decoder's limit).
        """
        start = self.pos
        raw = self.read_var_uint8array(max_length)
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError:
            self.pos = start
            raise ProtocolError("string is not valid UTF-8") from None


def encode_var_uint(value: int) -> bytes:
    """``value`` as a varUint (see :meth:`Encoder.write_var_uint`)."""
    enc = Encoder()
    enc.write_var_uint(value)
    return enc.to_bytes()


def decode_var_uint(data: bytes) -> int:
    """The varUint that ``data`` holds, exactly (no trailing bytes).

    Raises:
        ProtocolError: see :meth:`Decoder.read_var_uint`; or trailing bytes.
    """
    dec = Decoder(data)
    value = dec.read_var_uint()
    dec.end("varUint")
    return value

"""The lib0 / Yjs v1 codec: the one reader and writer of the bytes pycrdt and Yjs exchange,
for crdtstore and for ``sync`` (a documented extension point: ``sync`` builds its y-protocols
messages on it). No I/O, no pycrdt.

- :mod:`._lib0`: varUint, varInt, varUint8Array, varString (UTF-8 byte length), ``any``
  values: :class:`Encoder`, :class:`Decoder`, :func:`read_var_uint_at`.
- :mod:`._v1`: state vectors, delete sets, update structs (:func:`root_kinds`,
  :func:`decode_update`), and :func:`check_update_counts` before pycrdt sees untrusted bytes.
- :mod:`._keys`: :class:`KeyIndex`, which map entry an item id is.
- :mod:`._redact`: :func:`blank_items`, an update with chosen items' content replaced by
  ``ContentDeleted`` (same clocks): the rewriter of redaction.

Layering: ``_keys``, ``_redact`` -> ``_v1`` -> ``_lib0`` -> ``crdtstore._errors``. Decoding is
strict (canonical varUints up to ``2**53 - 1``, no trailing bytes, valid UTF-8) and every failure
is a :class:`CodecError`, an :class:`~crdtstore.InvalidUpdate` (so a ``ValueError``), except
a length over a :class:`Decoder`'s ``max_length``: :class:`~crdtstore.PayloadTooLarge`.
"""

from ._keys import KeyIndex as KeyIndex
from ._lib0 import MAX_SAFE_INTEGER as MAX_SAFE_INTEGER
from ._lib0 import CodecError as CodecError
from ._lib0 import Decoder as Decoder
from ._lib0 import Encoder as Encoder
from ._lib0 import decode_var_uint as decode_var_uint
from ._lib0 import encode_var_uint as encode_var_uint
from ._lib0 import read_var_uint_at as read_var_uint_at
from ._redact import blank_items as blank_items
from ._v1 import CONTENT_ANY as CONTENT_ANY
from ._v1 import CONTENT_DELETED as CONTENT_DELETED
from ._v1 import CONTENT_TYPE as CONTENT_TYPE
from ._v1 import TYPE_REFS as TYPE_REFS
from ._v1 import Decoded as Decoded
from ._v1 import MapItem as MapItem
from ._v1 import check_update_counts as check_update_counts
from ._v1 import decode_delete_set as decode_delete_set
from ._v1 import decode_state_vector as decode_state_vector
from ._v1 import decode_update as decode_update
from ._v1 import encode_state_vector as encode_state_vector
from ._v1 import names_nested_parent as names_nested_parent
from ._v1 import root_kinds as root_kinds

__all__ = [
    "CONTENT_ANY",
    "CONTENT_DELETED",
    "CONTENT_TYPE",
    "MAX_SAFE_INTEGER",
    "TYPE_REFS",
    "CodecError",
    "Decoded",
    "Decoder",
    "Encoder",
    "KeyIndex",
    "MapItem",
    "blank_items",
    "check_update_counts",
    "decode_delete_set",
    "decode_state_vector",
    "decode_update",
    "decode_var_uint",
    "encode_state_vector",
    "encode_var_uint",
    "names_nested_parent",
    "read_var_uint_at",
    "root_kinds",
]

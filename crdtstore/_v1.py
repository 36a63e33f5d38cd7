"""The names the record imported from here before the codec got its package: kept so that
``crdtstore._replica`` (and whatever moved from it) keeps working. New code imports
:mod:`crdtstore.codec`."""

from .codec import CONTENT_ANY as CONTENT_ANY
from .codec import CONTENT_DELETED as CONTENT_DELETED
from .codec import CONTENT_TYPE as CONTENT_TYPE
from .codec import TYPE_REFS as TYPE_REFS
from .codec import CodecError as UpdateDecodeError
from .codec import Decoded as Decoded
from .codec import KeyIndex as KeyIndex
from .codec import MapItem as MapItem
from .codec import decode_delete_set as read_delete_set
from .codec import decode_state_vector as read_state_vector
from .codec import decode_update as decode_update
from .codec import encode_state_vector as write_state_vector
from .codec import root_kinds as root_kinds
from .codec._keys import Ref as Ref

__all__ = [
    "Decoded",
    "KeyIndex",
    "MapItem",
    "UpdateDecodeError",
    "decode_update",
    "read_delete_set",
    "read_state_vector",
    "root_kinds",
    "write_state_vector",
]

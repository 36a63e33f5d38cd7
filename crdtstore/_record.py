"""Exists only for sync/ and tests until they import from :mod:`crdtstore.record` (issue 15).

The record lives in ``crdtstore/record/`` (``_record.py`` and the modules it names).
"""

from .record._changes import ChangeStream as ChangeStream
from .record._changes import _Subscriber as _Subscriber
from .record._foreign import _DUPLICATE_WINDOW as _DUPLICATE_WINDOW
from .record._foreign import _FastAppend as _FastAppend
from .record._guarded import Claim as Claim
from .record._journal_link import LOAD_CHUNK as LOAD_CHUNK
from .record._pipeline import _ATTR as _ATTR
from .record._pipeline import _TXN as _TXN
from .record._pipeline import _Attributed as _Attributed
from .record._pipeline import _Transaction as _Transaction
from .record._record import Record as Record
from .record._state import READ_CHUNK as READ_CHUNK

"""Exists only for sync/ and tests until they import from :mod:`crdtstore.record` (issue 15).

The replica lives in ``crdtstore/record/`` (``_replica.py`` and the modules it names).
"""

from .record._document import _EMPTY_UPDATES as _EMPTY_UPDATES
from .record._document import DEFAULT_MAX_UPDATE as DEFAULT_MAX_UPDATE
from .record._document import KINDS as KINDS
from .record._document import REGISTRY as REGISTRY
from .record._effects import _EMPTY_OF as _EMPTY_OF
from .record._effects import _EVENT_SIGNATURE as _EVENT_SIGNATURE
from .record._effects import _chars_in as _chars_in
from .record._effects import _collection_name as _collection_name
from .record._effects import _list_effect as _list_effect
from .record._effects import _map_effect as _map_effect
from .record._effects import _plain as _plain
from .record._effects import _signed as _signed
from .record._effects import _text_effect as _text_effect
from .record._effects import _within as _within
from .record._effects import policed as policed
from .record._provenance import _SETTLE_MIN as _SETTLE_MIN
from .record._provenance import Meta as Meta
from .record._provenance import _EntryTable as _EntryTable
from .record._provenance import _increasing as _increasing
from .record._provenance import _pack as _pack
from .record._provenance import _Settled as _Settled
from .record._provenance import _unpack as _unpack
from .record._provenance import now as now
from .record._pycrdt import _json_number as _json_number
from .record._pycrdt import list_values as list_values
from .record._replay import _APPLY_GROUP as _APPLY_GROUP
from .record._replay import _BULK_GROUP as _BULK_GROUP
from .record._replay import _BULK_PENDING_KEYS as _BULK_PENDING_KEYS
from .record._replay import _DELETES as _DELETES
from .record._replay import BulkLoad as BulkLoad
from .record._replay import _OneByOne as _OneByOne
from .record._replay import _Write as _Write
from .record._replay import tree_merge as tree_merge
from .record._replica import Replica as Replica
from .record._textdiff import _CHAR_DIFF_LIMIT as _CHAR_DIFF_LIMIT
from .record._textdiff import _common_prefix as _common_prefix
from .record._textdiff import _common_suffix as _common_suffix
from .record._textdiff import apply_text_edits as apply_text_edits
from .record._textdiff import text_diff as text_diff

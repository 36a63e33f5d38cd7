"""The SQLite backend (``sqlite:///path/store.db``): the journal, its schema and the leases,
all in one file that several processes of one machine share.

Modules: ``_journal`` (:class:`SQLiteJournal`: runs, entries, snapshots, config), ``_schema``
(tables and migrations), ``_rows`` (entries in and out), ``_inline`` (the loop connection's
fast paths), ``_authority`` (the exclusive transaction of guarded writes), ``_guarded``
(guards decided with the append), ``_leases`` (:class:`SQLiteLeases`, the lease table in the
same file, and :func:`check_fence`).
"""

from ._authority import _SQLiteAuthority as _SQLiteAuthority
from ._journal import SQLiteJournal as SQLiteJournal
from ._leases import SQLiteLeases as SQLiteLeases
from ._leases import check_fence as check_fence
from ._schema import sqlite_path as sqlite_path

__all__ = ["SQLiteJournal", "SQLiteLeases", "check_fence", "sqlite_path"]

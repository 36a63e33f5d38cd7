"""The journal and lease backends that ship with crdtstore, one package per backend.

``memory`` (one process), ``sqlite`` (one machine: journal, leases and schema in one store
file) and ``redis`` (many machines). The store knows memory and SQLite directly; Redis, which
needs the optional redis-py, is found through the ``crdtstore.backends`` entry-point group
like any other package's backend, so it is imported only when a ``redis://`` store is used.
"""

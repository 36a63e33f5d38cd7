"""sync: the Yjs sync protocol (y-protocols) for crdtstore records.

This package holds the pure protocol layer: the y-protocols messages (on lib0, from
:mod:`crdtstore.codec`) plus crdtstore's extension message (type 100, JSON requests and
responses), and the server and client session state machines (bytes in, messages and bytes
out, no I/O); the hub (:class:`Hub`, a WebSocket server sharing each run's record,
``crdtstore serve`` or ``python -m sync``) with its signed access tokens (:func:`mint`,
:func:`verify`); and the ``ws://`` store. ``crdtstore`` never imports ``sync``: ``sync`` adds
its ``ws://`` backend (``crdtstore.backends``) and its ``serve`` and ``token`` commands
(``crdtstore.commands``) through entry points.
"""

from ._document import Document as Document
from ._document import PycrdtDocument as PycrdtDocument
from ._document import ReplicaDocument as ReplicaDocument
from ._errors import CloseCode as CloseCode
from ._errors import MessageTooLarge as MessageTooLarge
from ._errors import ProtocolError as ProtocolError
from ._hub import Hub as Hub
from ._hub import HubLimits as HubLimits
from ._messages import DEFAULT_MAX_MESSAGE_SIZE as DEFAULT_MAX_MESSAGE_SIZE
from ._messages import EXTENSION_MESSAGE_TYPE as EXTENSION_MESSAGE_TYPE
from ._messages import Awareness as Awareness
from ._messages import AwarenessEntry as AwarenessEntry
from ._messages import ErrorInfo as ErrorInfo
from ._messages import Message as Message
from ._messages import MessageType as MessageType
from ._messages import PermissionDenied as PermissionDenied
from ._messages import Push as Push
from ._messages import QueryAwareness as QueryAwareness
from ._messages import Request as Request
from ._messages import Response as Response
from ._messages import SyncStep1 as SyncStep1
from ._messages import SyncStep2 as SyncStep2
from ._messages import SyncType as SyncType
from ._messages import Update as Update
from ._messages import decode as decode
from ._messages import decode_awareness_update as decode_awareness_update
from ._messages import decode_state_vector as decode_state_vector
from ._messages import encode as encode
from ._messages import encode_awareness_update as encode_awareness_update
from ._session import ClientSession as ClientSession
from ._session import Received as Received
from ._session import ServerSession as ServerSession
from ._tokens import Forbidden as Forbidden
from ._tokens import SecretMissing as SecretMissing
from ._tokens import TokenClaims as TokenClaims
from ._tokens import TokenError as TokenError
from ._tokens import TokenExpired as TokenExpired
from ._tokens import TokenInvalid as TokenInvalid
from ._tokens import load_secret as load_secret
from ._tokens import mint as mint
from ._tokens import verify as verify

__all__ = [
    "DEFAULT_MAX_MESSAGE_SIZE",
    "EXTENSION_MESSAGE_TYPE",
    "Awareness",
    "AwarenessEntry",
    "ClientSession",
    "CloseCode",
    "Document",
    "ErrorInfo",
    "Forbidden",
    "Hub",
    "HubLimits",
    "Message",
    "MessageTooLarge",
    "MessageType",
    "PermissionDenied",
    "Push",
    "ProtocolError",
    "PycrdtDocument",
    "QueryAwareness",
    "Received",
    "ReplicaDocument",
    "Request",
    "Response",
    "SecretMissing",
    "ServerSession",
    "SyncStep1",
    "SyncStep2",
    "SyncType",
    "TokenClaims",
    "TokenError",
    "TokenExpired",
    "TokenInvalid",
    "Update",
    "decode",
    "decode_awareness_update",
    "decode_state_vector",
    "encode",
    "encode_awareness_update",
    "load_secret",
    "mint",
    "verify",
]

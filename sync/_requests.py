"""The JSON messages of crdtstore's extension (message type 100): :class:`Request`, its
:class:`Response` (a result or an :class:`ErrorInfo`) and the hub's unasked :class:`Push`.

They are pydantic models, validated strictly on decoding (:func:`sync._messages.decode`),
unlike the binary messages: they are not on the path of every update. A module of their own
so that the binary append frame (:mod:`sync._frames`), a :class:`Request` and a
:class:`Response` too, can build on them below :mod:`sync._messages`, which encodes them all.
"""

from __future__ import annotations

from typing import Annotated, Any, Final

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    JsonValue,
    StrictInt,
    StrictStr,
    ValidationError,
    model_validator,
)

from crdtstore import CrdtStoreError
from crdtstore.codec import MAX_SAFE_INTEGER

__all__ = [
    "ERROR_CODE_PATTERN",
    "OP_PATTERN",
    "ErrorInfo",
    "Push",
    "Request",
    "RequestId",
    "Response",
]

_MODEL_CONFIG = ConfigDict(frozen=True, strict=True, extra="forbid", allow_inf_nan=False)

RequestId = (
    Annotated[StrictInt, Field(ge=0, le=MAX_SAFE_INTEGER)]
    | Annotated[StrictStr, Field(min_length=1, max_length=128)]
)
"""A request id: a safe non-negative integer or a short string, chosen by the client."""

OP_PATTERN: Final = r"^[a-z][a-z0-9_]*(\.[a-z][a-z0-9_]*)*$"
ERROR_CODE_PATTERN: Final = r"^[A-Z][A-Z0-9_]*$"


class Request(BaseModel):
    """A request to the hub: ``op`` names what to do (``"lease.acquire"``, ``"put_guarded"``,
    ``"flush"``, ...), ``params`` its JSON arguments. The set of ops is the hub's."""

    model_config = _MODEL_CONFIG

    id: RequestId
    op: Annotated[str, Field(max_length=64, pattern=OP_PATTERN)]
    params: dict[str, JsonValue] = Field(default_factory=dict)


class ErrorInfo(BaseModel):
    """A failed request's error: crdtstore's stable ``code``, a message, and the error's
    fields (``current_version``, ``holder``, ...) as extra JSON keys (see
    ``CrdtStoreError.to_dict``)."""

    model_config = ConfigDict(frozen=True, strict=True, extra="allow", allow_inf_nan=False)
    __pydantic_extra__: dict[str, JsonValue] = Field(init=False)

    code: Annotated[str, Field(max_length=64, pattern=ERROR_CODE_PATTERN)]
    message: Annotated[str, Field(max_length=4096)]

    @classmethod
    def from_exception(cls, exc: CrdtStoreError) -> ErrorInfo:
        """The error info of a crdtstore error (its fields that are JSON, else code and message)."""
        data = exc.to_dict()
        data["message"] = str(data.get("message", ""))[:4096]
        try:
            return cls.model_validate(data)
        except ValidationError:
            return cls(code=exc.code, message=str(data["message"]))

    @property
    def details(self) -> dict[str, JsonValue]:
        """The fields besides ``code`` and ``message``."""
        return dict(self.__pydantic_extra__ or {})


class Response(BaseModel):
    """The answer to the request with the same ``id``: a ``result`` or an ``error``, not both.

    On the wire a success is ``{"id": .., "result": ..}`` and a failure
    ``{"id": .., "error": {"code": .., "message": .., ...}}``.
    """

    model_config = _MODEL_CONFIG

    id: RequestId
    result: JsonValue = None
    error: ErrorInfo | None = None

    @model_validator(mode="before")
    @classmethod
    def _result_xor_error(cls, data: Any) -> Any:
        if isinstance(data, dict) and data.get("error") is not None and "result" in data:
            raise ValueError("a response carries a result or an error, not both")
        return data

    @property
    def ok(self) -> bool:
        return self.error is None

    @classmethod
    def success(cls, request_id: int | str, result: JsonValue = None) -> Response:
        return cls(id=request_id, result=result)

    @classmethod
    def failure(cls, request_id: int | str, exc: CrdtStoreError | ErrorInfo) -> Response:
        info = exc if isinstance(exc, ErrorInfo) else ErrorInfo.from_exception(exc)
        return cls(id=request_id, error=info)


class Push(BaseModel):
    """An unasked notice from the hub to a crdtstore client: ``push`` says what (``head``:
    the run's journal head moved to ``seq``; ``leases``: the tenant's leases changed).

    A head push may carry ``rows``: the newest journal entries up to ``seq``, contiguous,
    each as ``journal.read`` gives it (see ``sync._ops_journal``); left out of the JSON when
    absent."""

    model_config = _MODEL_CONFIG

    push: Annotated[str, Field(max_length=64, pattern=OP_PATTERN)]
    seq: Annotated[StrictInt, Field(ge=0, le=MAX_SAFE_INTEGER)] = 0
    rows: list[JsonValue] | None = Field(default=None, exclude_if=lambda v: v is None)

from google.protobuf import duration_pb2 as _duration_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from typing import ClassVar as _ClassVar, Iterable as _Iterable, Mapping as _Mapping, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor
ERROR_CODE_AUTH: ErrorCode
ERROR_CODE_BUDGET_EXHAUSTED: ErrorCode
ERROR_CODE_CANCELLED: ErrorCode
ERROR_CODE_CONTENT_FILTERED: ErrorCode
ERROR_CODE_CONTEXT_OVERFLOW: ErrorCode
ERROR_CODE_DEADLINE_EXCEEDED: ErrorCode
ERROR_CODE_INTERNAL: ErrorCode
ERROR_CODE_INVALID_REQUEST: ErrorCode
ERROR_CODE_LIMIT_EXCEEDED: ErrorCode
ERROR_CODE_NETWORK: ErrorCode
ERROR_CODE_NOT_FOUND: ErrorCode
ERROR_CODE_OUTPUT_INVALID: ErrorCode
ERROR_CODE_OVERLOADED: ErrorCode
ERROR_CODE_PERMISSION_DENIED: ErrorCode
ERROR_CODE_QUOTA_EXHAUSTED: ErrorCode
ERROR_CODE_RATE_LIMITED: ErrorCode
ERROR_CODE_REQUEST_TOO_LARGE: ErrorCode
ERROR_CODE_SERVER_ERROR: ErrorCode
ERROR_CODE_STORE_FULL: ErrorCode
ERROR_CODE_STREAM_INTERRUPTED: ErrorCode
ERROR_CODE_TIMEOUT: ErrorCode
ERROR_CODE_TOOLS_UNSAFE: ErrorCode
ERROR_CODE_TURN_ID_REUSED: ErrorCode
ERROR_CODE_UNAUTHENTICATED: ErrorCode
ERROR_CODE_UNAVAILABLE: ErrorCode
ERROR_CODE_UNSPECIFIED: ErrorCode

class Error(_message.Message):
    __slots__ = ["attempts", "code", "message", "model", "retry_after", "retryable"]
    ATTEMPTS_FIELD_NUMBER: _ClassVar[int]
    CODE_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    RETRYABLE_FIELD_NUMBER: _ClassVar[int]
    RETRY_AFTER_FIELD_NUMBER: _ClassVar[int]
    attempts: _containers.RepeatedCompositeFieldContainer[ModelAttempts]
    code: ErrorCode
    message: str
    model: str
    retry_after: _duration_pb2.Duration
    retryable: bool
    def __init__(self, code: _Optional[_Union[ErrorCode, str]] = ..., message: _Optional[str] = ..., retryable: bool = ..., retry_after: _Optional[_Union[_duration_pb2.Duration, _Mapping]] = ..., model: _Optional[str] = ..., attempts: _Optional[_Iterable[_Union[ModelAttempts, _Mapping]]] = ...) -> None: ...

class ModelAttempts(_message.Message):
    __slots__ = ["attempts", "last_code", "model"]
    ATTEMPTS_FIELD_NUMBER: _ClassVar[int]
    LAST_CODE_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    attempts: int
    last_code: ErrorCode
    model: str
    def __init__(self, model: _Optional[str] = ..., attempts: _Optional[int] = ..., last_code: _Optional[_Union[ErrorCode, str]] = ...) -> None: ...

class ErrorCode(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = []

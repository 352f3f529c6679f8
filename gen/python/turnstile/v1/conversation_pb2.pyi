from google.protobuf import struct_pb2 as _struct_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from typing import ClassVar as _ClassVar, Iterable as _Iterable, Mapping as _Mapping, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor
ROLE_ASSISTANT: Role
ROLE_TOOL: Role
ROLE_UNSPECIFIED: Role
ROLE_USER: Role

class Cost(_message.Message):
    __slots__ = ["currency", "nanos", "units"]
    CURRENCY_FIELD_NUMBER: _ClassVar[int]
    NANOS_FIELD_NUMBER: _ClassVar[int]
    UNITS_FIELD_NUMBER: _ClassVar[int]
    currency: str
    nanos: int
    units: int
    def __init__(self, currency: _Optional[str] = ..., units: _Optional[int] = ..., nanos: _Optional[int] = ...) -> None: ...

class Media(_message.Message):
    __slots__ = ["data", "mime_type", "name", "uri"]
    DATA_FIELD_NUMBER: _ClassVar[int]
    MIME_TYPE_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    URI_FIELD_NUMBER: _ClassVar[int]
    data: bytes
    mime_type: str
    name: str
    uri: str
    def __init__(self, mime_type: _Optional[str] = ..., data: _Optional[bytes] = ..., uri: _Optional[str] = ..., name: _Optional[str] = ...) -> None: ...

class Message(_message.Message):
    __slots__ = ["parts", "role"]
    PARTS_FIELD_NUMBER: _ClassVar[int]
    ROLE_FIELD_NUMBER: _ClassVar[int]
    parts: _containers.RepeatedCompositeFieldContainer[Part]
    role: Role
    def __init__(self, role: _Optional[_Union[Role, str]] = ..., parts: _Optional[_Iterable[_Union[Part, _Mapping]]] = ...) -> None: ...

class Part(_message.Message):
    __slots__ = ["media", "text", "thinking", "tool_call", "tool_result"]
    MEDIA_FIELD_NUMBER: _ClassVar[int]
    TEXT_FIELD_NUMBER: _ClassVar[int]
    THINKING_FIELD_NUMBER: _ClassVar[int]
    TOOL_CALL_FIELD_NUMBER: _ClassVar[int]
    TOOL_RESULT_FIELD_NUMBER: _ClassVar[int]
    media: Media
    text: str
    thinking: Thinking
    tool_call: ToolCall
    tool_result: ToolResult
    def __init__(self, text: _Optional[str] = ..., thinking: _Optional[_Union[Thinking, _Mapping]] = ..., tool_call: _Optional[_Union[ToolCall, _Mapping]] = ..., tool_result: _Optional[_Union[ToolResult, _Mapping]] = ..., media: _Optional[_Union[Media, _Mapping]] = ...) -> None: ...

class Thinking(_message.Message):
    __slots__ = ["signature", "signer", "text"]
    SIGNATURE_FIELD_NUMBER: _ClassVar[int]
    SIGNER_FIELD_NUMBER: _ClassVar[int]
    TEXT_FIELD_NUMBER: _ClassVar[int]
    signature: str
    signer: str
    text: str
    def __init__(self, text: _Optional[str] = ..., signature: _Optional[str] = ..., signer: _Optional[str] = ...) -> None: ...

class ToolCall(_message.Message):
    __slots__ = ["arguments", "id", "name"]
    ARGUMENTS_FIELD_NUMBER: _ClassVar[int]
    ID_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    arguments: str
    id: str
    name: str
    def __init__(self, id: _Optional[str] = ..., name: _Optional[str] = ..., arguments: _Optional[str] = ...) -> None: ...

class ToolDefinition(_message.Message):
    __slots__ = ["description", "input_schema", "name"]
    DESCRIPTION_FIELD_NUMBER: _ClassVar[int]
    INPUT_SCHEMA_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    description: str
    input_schema: _struct_pb2.Struct
    name: str
    def __init__(self, name: _Optional[str] = ..., description: _Optional[str] = ..., input_schema: _Optional[_Union[_struct_pb2.Struct, _Mapping]] = ...) -> None: ...

class ToolResult(_message.Message):
    __slots__ = ["call_id", "content", "is_error", "media", "name"]
    CALL_ID_FIELD_NUMBER: _ClassVar[int]
    CONTENT_FIELD_NUMBER: _ClassVar[int]
    IS_ERROR_FIELD_NUMBER: _ClassVar[int]
    MEDIA_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    call_id: str
    content: str
    is_error: bool
    media: _containers.RepeatedCompositeFieldContainer[Media]
    name: str
    def __init__(self, call_id: _Optional[str] = ..., content: _Optional[str] = ..., is_error: bool = ..., name: _Optional[str] = ..., media: _Optional[_Iterable[_Union[Media, _Mapping]]] = ...) -> None: ...

class Usage(_message.Message):
    __slots__ = ["cache_read_tokens", "cache_write_tokens", "cost", "cost_partial", "input_tokens", "output_tokens"]
    CACHE_READ_TOKENS_FIELD_NUMBER: _ClassVar[int]
    CACHE_WRITE_TOKENS_FIELD_NUMBER: _ClassVar[int]
    COST_FIELD_NUMBER: _ClassVar[int]
    COST_PARTIAL_FIELD_NUMBER: _ClassVar[int]
    INPUT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    OUTPUT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    cache_read_tokens: int
    cache_write_tokens: int
    cost: Cost
    cost_partial: bool
    input_tokens: int
    output_tokens: int
    def __init__(self, input_tokens: _Optional[int] = ..., output_tokens: _Optional[int] = ..., cache_read_tokens: _Optional[int] = ..., cache_write_tokens: _Optional[int] = ..., cost: _Optional[_Union[Cost, _Mapping]] = ..., cost_partial: bool = ...) -> None: ...

class Role(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = []

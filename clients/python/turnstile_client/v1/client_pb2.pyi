from google.protobuf import duration_pb2 as _duration_pb2
from turnstile_client.v1 import agent_pb2 as _agent_pb2
from turnstile_client.v1 import conversation_pb2 as _conversation_pb2
from turnstile_client.v1 import errors_pb2 as _errors_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from typing import ClassVar as _ClassVar, Iterable as _Iterable, Mapping as _Mapping, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class ClientEvent(_message.Message):
    __slots__ = ["agent", "attempt", "step_retry", "turn_id"]
    AGENT_FIELD_NUMBER: _ClassVar[int]
    ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    STEP_RETRY_FIELD_NUMBER: _ClassVar[int]
    TURN_ID_FIELD_NUMBER: _ClassVar[int]
    agent: _agent_pb2.AgentEvent
    attempt: int
    step_retry: StepRetry
    turn_id: str
    def __init__(self, attempt: _Optional[int] = ..., turn_id: _Optional[str] = ..., agent: _Optional[_Union[_agent_pb2.AgentEvent, _Mapping]] = ..., step_retry: _Optional[_Union[StepRetry, _Mapping]] = ...) -> None: ...

class StepRetry(_message.Message):
    __slots__ = ["attempt", "delay", "discard_partial", "error", "max_attempts", "messages"]
    ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    DELAY_FIELD_NUMBER: _ClassVar[int]
    DISCARD_PARTIAL_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    MAX_ATTEMPTS_FIELD_NUMBER: _ClassVar[int]
    MESSAGES_FIELD_NUMBER: _ClassVar[int]
    attempt: int
    delay: _duration_pb2.Duration
    discard_partial: bool
    error: _errors_pb2.Error
    max_attempts: int
    messages: _containers.RepeatedCompositeFieldContainer[_conversation_pb2.Message]
    def __init__(self, attempt: _Optional[int] = ..., max_attempts: _Optional[int] = ..., delay: _Optional[_Union[_duration_pb2.Duration, _Mapping]] = ..., error: _Optional[_Union[_errors_pb2.Error, _Mapping]] = ..., discard_partial: bool = ..., messages: _Optional[_Iterable[_Union[_conversation_pb2.Message, _Mapping]]] = ...) -> None: ...

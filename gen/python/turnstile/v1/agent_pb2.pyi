from google.protobuf import duration_pb2 as _duration_pb2
from google.protobuf import struct_pb2 as _struct_pb2
from google.protobuf import timestamp_pb2 as _timestamp_pb2
from turnstile.v1 import conversation_pb2 as _conversation_pb2
from turnstile.v1 import errors_pb2 as _errors_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from typing import ClassVar as _ClassVar, Iterable as _Iterable, Mapping as _Mapping, Optional as _Optional, Union as _Union

COMPACTION_TRIGGER_NEAR_WINDOW: CompactionTrigger
COMPACTION_TRIGGER_OVERFLOW: CompactionTrigger
COMPACTION_TRIGGER_UNSPECIFIED: CompactionTrigger
DESCRIPTOR: _descriptor.FileDescriptor
END_REASON_END_TURN: EndReason
END_REASON_MAX_MODEL_CALLS: EndReason
END_REASON_MAX_TOKENS: EndReason
END_REASON_REFUSAL: EndReason
END_REASON_STOP_SEQUENCE: EndReason
END_REASON_TOOL_CALLS_REQUIRED: EndReason
END_REASON_TOOL_ENDED_TURN: EndReason
END_REASON_UNSPECIFIED: EndReason
REASONING_EFFORT_HIGH: ReasoningEffort
REASONING_EFFORT_LOW: ReasoningEffort
REASONING_EFFORT_MEDIUM: ReasoningEffort
REASONING_EFFORT_UNSPECIFIED: ReasoningEffort
STOP_REASON_END_TURN: StopReason
STOP_REASON_MAX_TOKENS: StopReason
STOP_REASON_PAUSE_TURN: StopReason
STOP_REASON_REFUSAL: StopReason
STOP_REASON_STOP_SEQUENCE: StopReason
STOP_REASON_TOOL_USE: StopReason
STOP_REASON_UNSPECIFIED: StopReason
TOOL_CHOICE_MODE_AUTO: ToolChoiceMode
TOOL_CHOICE_MODE_NONE: ToolChoiceMode
TOOL_CHOICE_MODE_REQUIRED: ToolChoiceMode
TOOL_CHOICE_MODE_TOOL: ToolChoiceMode
TOOL_CHOICE_MODE_UNSPECIFIED: ToolChoiceMode

class AgentEvent(_message.Message):
    __slots__ = ["attempt", "compaction", "error", "fallback", "hedge", "llm_call_finished", "llm_call_started", "message_completed", "retry", "seq", "steered", "takeover", "text_delta", "thinking_delta", "time", "tool_approval_decided", "tool_approval_requested", "tool_call_delta", "tool_finished", "tool_progress", "tool_started", "turn_completed", "turn_id", "turn_started", "usage"]
    ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    COMPACTION_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    FALLBACK_FIELD_NUMBER: _ClassVar[int]
    HEDGE_FIELD_NUMBER: _ClassVar[int]
    LLM_CALL_FINISHED_FIELD_NUMBER: _ClassVar[int]
    LLM_CALL_STARTED_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_COMPLETED_FIELD_NUMBER: _ClassVar[int]
    RETRY_FIELD_NUMBER: _ClassVar[int]
    SEQ_FIELD_NUMBER: _ClassVar[int]
    STEERED_FIELD_NUMBER: _ClassVar[int]
    TAKEOVER_FIELD_NUMBER: _ClassVar[int]
    TEXT_DELTA_FIELD_NUMBER: _ClassVar[int]
    THINKING_DELTA_FIELD_NUMBER: _ClassVar[int]
    TIME_FIELD_NUMBER: _ClassVar[int]
    TOOL_APPROVAL_DECIDED_FIELD_NUMBER: _ClassVar[int]
    TOOL_APPROVAL_REQUESTED_FIELD_NUMBER: _ClassVar[int]
    TOOL_CALL_DELTA_FIELD_NUMBER: _ClassVar[int]
    TOOL_FINISHED_FIELD_NUMBER: _ClassVar[int]
    TOOL_PROGRESS_FIELD_NUMBER: _ClassVar[int]
    TOOL_STARTED_FIELD_NUMBER: _ClassVar[int]
    TURN_COMPLETED_FIELD_NUMBER: _ClassVar[int]
    TURN_ID_FIELD_NUMBER: _ClassVar[int]
    TURN_STARTED_FIELD_NUMBER: _ClassVar[int]
    USAGE_FIELD_NUMBER: _ClassVar[int]
    attempt: int
    compaction: Compaction
    error: _errors_pb2.Error
    fallback: Fallback
    hedge: Hedge
    llm_call_finished: LlmCallFinished
    llm_call_started: LlmCallStarted
    message_completed: MessageCompleted
    retry: Retry
    seq: int
    steered: Steered
    takeover: int
    text_delta: TextDelta
    thinking_delta: ThinkingDelta
    time: _timestamp_pb2.Timestamp
    tool_approval_decided: ToolApprovalDecided
    tool_approval_requested: ToolApprovalRequested
    tool_call_delta: ToolCallDelta
    tool_finished: ToolFinished
    tool_progress: ToolProgress
    tool_started: ToolStarted
    turn_completed: TurnCompleted
    turn_id: str
    turn_started: TurnStarted
    usage: _conversation_pb2.Usage
    def __init__(self, seq: _Optional[int] = ..., time: _Optional[_Union[_timestamp_pb2.Timestamp, _Mapping]] = ..., turn_id: _Optional[str] = ..., attempt: _Optional[int] = ..., takeover: _Optional[int] = ..., turn_started: _Optional[_Union[TurnStarted, _Mapping]] = ..., llm_call_started: _Optional[_Union[LlmCallStarted, _Mapping]] = ..., text_delta: _Optional[_Union[TextDelta, _Mapping]] = ..., thinking_delta: _Optional[_Union[ThinkingDelta, _Mapping]] = ..., tool_call_delta: _Optional[_Union[ToolCallDelta, _Mapping]] = ..., message_completed: _Optional[_Union[MessageCompleted, _Mapping]] = ..., tool_started: _Optional[_Union[ToolStarted, _Mapping]] = ..., tool_progress: _Optional[_Union[ToolProgress, _Mapping]] = ..., tool_finished: _Optional[_Union[ToolFinished, _Mapping]] = ..., llm_call_finished: _Optional[_Union[LlmCallFinished, _Mapping]] = ..., retry: _Optional[_Union[Retry, _Mapping]] = ..., fallback: _Optional[_Union[Fallback, _Mapping]] = ..., compaction: _Optional[_Union[Compaction, _Mapping]] = ..., usage: _Optional[_Union[_conversation_pb2.Usage, _Mapping]] = ..., error: _Optional[_Union[_errors_pb2.Error, _Mapping]] = ..., turn_completed: _Optional[_Union[TurnCompleted, _Mapping]] = ..., hedge: _Optional[_Union[Hedge, _Mapping]] = ..., tool_approval_requested: _Optional[_Union[ToolApprovalRequested, _Mapping]] = ..., tool_approval_decided: _Optional[_Union[ToolApprovalDecided, _Mapping]] = ..., steered: _Optional[_Union[Steered, _Mapping]] = ...) -> None: ...

class ApproveToolCallRequest(_message.Message):
    __slots__ = ["approved", "attempt", "call_id", "reason", "turn_id"]
    APPROVED_FIELD_NUMBER: _ClassVar[int]
    ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    CALL_ID_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    TURN_ID_FIELD_NUMBER: _ClassVar[int]
    approved: bool
    attempt: int
    call_id: str
    reason: str
    turn_id: str
    def __init__(self, turn_id: _Optional[str] = ..., attempt: _Optional[int] = ..., call_id: _Optional[str] = ..., approved: bool = ..., reason: _Optional[str] = ...) -> None: ...

class ApproveToolCallResponse(_message.Message):
    __slots__ = ["applied", "approved", "attempt", "seq"]
    APPLIED_FIELD_NUMBER: _ClassVar[int]
    APPROVED_FIELD_NUMBER: _ClassVar[int]
    ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    SEQ_FIELD_NUMBER: _ClassVar[int]
    applied: bool
    approved: bool
    attempt: int
    seq: int
    def __init__(self, attempt: _Optional[int] = ..., applied: bool = ..., approved: bool = ..., seq: _Optional[int] = ...) -> None: ...

class CancelTurnRequest(_message.Message):
    __slots__ = ["attempt", "turn_id"]
    ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    TURN_ID_FIELD_NUMBER: _ClassVar[int]
    attempt: int
    turn_id: str
    def __init__(self, turn_id: _Optional[str] = ..., attempt: _Optional[int] = ...) -> None: ...

class CancelTurnResponse(_message.Message):
    __slots__ = ["attempt", "cancelled", "last_seq"]
    ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    CANCELLED_FIELD_NUMBER: _ClassVar[int]
    LAST_SEQ_FIELD_NUMBER: _ClassVar[int]
    attempt: int
    cancelled: bool
    last_seq: int
    def __init__(self, cancelled: bool = ..., attempt: _Optional[int] = ..., last_seq: _Optional[int] = ...) -> None: ...

class Compaction(_message.Message):
    __slots__ = ["bytes_after", "bytes_before", "estimated_tokens", "messages_after", "messages_before", "replaced_count", "replaced_from", "replacement", "replacement_omitted", "strategy", "summary_error", "trigger"]
    BYTES_AFTER_FIELD_NUMBER: _ClassVar[int]
    BYTES_BEFORE_FIELD_NUMBER: _ClassVar[int]
    ESTIMATED_TOKENS_FIELD_NUMBER: _ClassVar[int]
    MESSAGES_AFTER_FIELD_NUMBER: _ClassVar[int]
    MESSAGES_BEFORE_FIELD_NUMBER: _ClassVar[int]
    REPLACED_COUNT_FIELD_NUMBER: _ClassVar[int]
    REPLACED_FROM_FIELD_NUMBER: _ClassVar[int]
    REPLACEMENT_FIELD_NUMBER: _ClassVar[int]
    REPLACEMENT_OMITTED_FIELD_NUMBER: _ClassVar[int]
    STRATEGY_FIELD_NUMBER: _ClassVar[int]
    SUMMARY_ERROR_FIELD_NUMBER: _ClassVar[int]
    TRIGGER_FIELD_NUMBER: _ClassVar[int]
    bytes_after: int
    bytes_before: int
    estimated_tokens: int
    messages_after: int
    messages_before: int
    replaced_count: int
    replaced_from: int
    replacement: _containers.RepeatedCompositeFieldContainer[_conversation_pb2.Message]
    replacement_omitted: bool
    strategy: str
    summary_error: str
    trigger: CompactionTrigger
    def __init__(self, strategy: _Optional[str] = ..., messages_before: _Optional[int] = ..., messages_after: _Optional[int] = ..., bytes_before: _Optional[int] = ..., bytes_after: _Optional[int] = ..., replaced_from: _Optional[int] = ..., replaced_count: _Optional[int] = ..., replacement: _Optional[_Iterable[_Union[_conversation_pb2.Message, _Mapping]]] = ..., trigger: _Optional[_Union[CompactionTrigger, str]] = ..., summary_error: _Optional[str] = ..., replacement_omitted: bool = ..., estimated_tokens: _Optional[int] = ...) -> None: ...

class Fallback(_message.Message):
    __slots__ = ["discard_from_seq", "discard_partial", "from_model", "message", "reason", "to_model"]
    DISCARD_FROM_SEQ_FIELD_NUMBER: _ClassVar[int]
    DISCARD_PARTIAL_FIELD_NUMBER: _ClassVar[int]
    FROM_MODEL_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    TO_MODEL_FIELD_NUMBER: _ClassVar[int]
    discard_from_seq: int
    discard_partial: bool
    from_model: str
    message: str
    reason: _errors_pb2.ErrorCode
    to_model: str
    def __init__(self, from_model: _Optional[str] = ..., to_model: _Optional[str] = ..., reason: _Optional[_Union[_errors_pb2.ErrorCode, str]] = ..., message: _Optional[str] = ..., discard_partial: bool = ..., discard_from_seq: _Optional[int] = ...) -> None: ...

class GenerationOptions(_message.Message):
    __slots__ = ["max_output_tokens", "output_schema", "reasoning", "stop_sequences", "temperature", "tool_choice", "top_p"]
    MAX_OUTPUT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    OUTPUT_SCHEMA_FIELD_NUMBER: _ClassVar[int]
    REASONING_FIELD_NUMBER: _ClassVar[int]
    STOP_SEQUENCES_FIELD_NUMBER: _ClassVar[int]
    TEMPERATURE_FIELD_NUMBER: _ClassVar[int]
    TOOL_CHOICE_FIELD_NUMBER: _ClassVar[int]
    TOP_P_FIELD_NUMBER: _ClassVar[int]
    max_output_tokens: int
    output_schema: OutputSchema
    reasoning: Reasoning
    stop_sequences: _containers.RepeatedScalarFieldContainer[str]
    temperature: float
    tool_choice: ToolChoice
    top_p: float
    def __init__(self, max_output_tokens: _Optional[int] = ..., temperature: _Optional[float] = ..., stop_sequences: _Optional[_Iterable[str]] = ..., output_schema: _Optional[_Union[OutputSchema, _Mapping]] = ..., tool_choice: _Optional[_Union[ToolChoice, _Mapping]] = ..., reasoning: _Optional[_Union[Reasoning, _Mapping]] = ..., top_p: _Optional[float] = ...) -> None: ...

class Hedge(_message.Message):
    __slots__ = ["after", "from_model", "to_deployment", "to_model"]
    AFTER_FIELD_NUMBER: _ClassVar[int]
    FROM_MODEL_FIELD_NUMBER: _ClassVar[int]
    TO_DEPLOYMENT_FIELD_NUMBER: _ClassVar[int]
    TO_MODEL_FIELD_NUMBER: _ClassVar[int]
    after: _duration_pb2.Duration
    from_model: str
    to_deployment: str
    to_model: str
    def __init__(self, from_model: _Optional[str] = ..., to_model: _Optional[str] = ..., after: _Optional[_Union[_duration_pb2.Duration, _Mapping]] = ..., to_deployment: _Optional[str] = ...) -> None: ...

class LlmCallFinished(_message.Message):
    __slots__ = ["attempt", "duration", "error", "model", "stop_reason", "time_to_first_chunk", "usage"]
    ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    DURATION_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    STOP_REASON_FIELD_NUMBER: _ClassVar[int]
    TIME_TO_FIRST_CHUNK_FIELD_NUMBER: _ClassVar[int]
    USAGE_FIELD_NUMBER: _ClassVar[int]
    attempt: int
    duration: _duration_pb2.Duration
    error: _errors_pb2.Error
    model: str
    stop_reason: StopReason
    time_to_first_chunk: _duration_pb2.Duration
    usage: _conversation_pb2.Usage
    def __init__(self, model: _Optional[str] = ..., attempt: _Optional[int] = ..., usage: _Optional[_Union[_conversation_pb2.Usage, _Mapping]] = ..., stop_reason: _Optional[_Union[StopReason, str]] = ..., error: _Optional[_Union[_errors_pb2.Error, _Mapping]] = ..., duration: _Optional[_Union[_duration_pb2.Duration, _Mapping]] = ..., time_to_first_chunk: _Optional[_Union[_duration_pb2.Duration, _Mapping]] = ...) -> None: ...

class LlmCallStarted(_message.Message):
    __slots__ = ["attempt", "call", "deployment", "model", "provider", "provider_model"]
    ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    CALL_FIELD_NUMBER: _ClassVar[int]
    DEPLOYMENT_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    PROVIDER_FIELD_NUMBER: _ClassVar[int]
    PROVIDER_MODEL_FIELD_NUMBER: _ClassVar[int]
    attempt: int
    call: int
    deployment: str
    model: str
    provider: str
    provider_model: str
    def __init__(self, model: _Optional[str] = ..., provider: _Optional[str] = ..., provider_model: _Optional[str] = ..., attempt: _Optional[int] = ..., call: _Optional[int] = ..., deployment: _Optional[str] = ...) -> None: ...

class MessageCompleted(_message.Message):
    __slots__ = ["message"]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    message: _conversation_pb2.Message
    def __init__(self, message: _Optional[_Union[_conversation_pb2.Message, _Mapping]] = ...) -> None: ...

class OutputSchema(_message.Message):
    __slots__ = ["name", "schema", "strict"]
    NAME_FIELD_NUMBER: _ClassVar[int]
    SCHEMA_FIELD_NUMBER: _ClassVar[int]
    STRICT_FIELD_NUMBER: _ClassVar[int]
    name: str
    schema: _struct_pb2.Struct
    strict: bool
    def __init__(self, name: _Optional[str] = ..., schema: _Optional[_Union[_struct_pb2.Struct, _Mapping]] = ..., strict: bool = ...) -> None: ...

class Reasoning(_message.Message):
    __slots__ = ["budget_tokens", "effort"]
    BUDGET_TOKENS_FIELD_NUMBER: _ClassVar[int]
    EFFORT_FIELD_NUMBER: _ClassVar[int]
    budget_tokens: int
    effort: ReasoningEffort
    def __init__(self, effort: _Optional[_Union[ReasoningEffort, str]] = ..., budget_tokens: _Optional[int] = ...) -> None: ...

class Retry(_message.Message):
    __slots__ = ["attempt", "delay", "discard_from_seq", "discard_partial", "max_attempts", "message", "model", "reason", "to_deployment"]
    ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    DELAY_FIELD_NUMBER: _ClassVar[int]
    DISCARD_FROM_SEQ_FIELD_NUMBER: _ClassVar[int]
    DISCARD_PARTIAL_FIELD_NUMBER: _ClassVar[int]
    MAX_ATTEMPTS_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    TO_DEPLOYMENT_FIELD_NUMBER: _ClassVar[int]
    attempt: int
    delay: _duration_pb2.Duration
    discard_from_seq: int
    discard_partial: bool
    max_attempts: int
    message: str
    model: str
    reason: _errors_pb2.ErrorCode
    to_deployment: str
    def __init__(self, attempt: _Optional[int] = ..., max_attempts: _Optional[int] = ..., model: _Optional[str] = ..., delay: _Optional[_Union[_duration_pb2.Duration, _Mapping]] = ..., reason: _Optional[_Union[_errors_pb2.ErrorCode, str]] = ..., message: _Optional[str] = ..., discard_partial: bool = ..., discard_from_seq: _Optional[int] = ..., to_deployment: _Optional[str] = ...) -> None: ...

class RunTurnRequest(_message.Message):
    __slots__ = ["attempt", "generation", "limits", "messages", "metadata", "model", "system", "tools", "turn_id"]
    class MetadataEntry(_message.Message):
        __slots__ = ["key", "value"]
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    GENERATION_FIELD_NUMBER: _ClassVar[int]
    LIMITS_FIELD_NUMBER: _ClassVar[int]
    MESSAGES_FIELD_NUMBER: _ClassVar[int]
    METADATA_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    SYSTEM_FIELD_NUMBER: _ClassVar[int]
    TOOLS_FIELD_NUMBER: _ClassVar[int]
    TURN_ID_FIELD_NUMBER: _ClassVar[int]
    attempt: int
    generation: GenerationOptions
    limits: TurnLimits
    messages: _containers.RepeatedCompositeFieldContainer[_conversation_pb2.Message]
    metadata: _containers.ScalarMap[str, str]
    model: str
    system: str
    tools: _containers.RepeatedCompositeFieldContainer[_conversation_pb2.ToolDefinition]
    turn_id: str
    def __init__(self, turn_id: _Optional[str] = ..., model: _Optional[str] = ..., system: _Optional[str] = ..., messages: _Optional[_Iterable[_Union[_conversation_pb2.Message, _Mapping]]] = ..., tools: _Optional[_Iterable[_Union[_conversation_pb2.ToolDefinition, _Mapping]]] = ..., generation: _Optional[_Union[GenerationOptions, _Mapping]] = ..., limits: _Optional[_Union[TurnLimits, _Mapping]] = ..., attempt: _Optional[int] = ..., metadata: _Optional[_Mapping[str, str]] = ...) -> None: ...

class RunTurnResponse(_message.Message):
    __slots__ = ["event"]
    EVENT_FIELD_NUMBER: _ClassVar[int]
    event: AgentEvent
    def __init__(self, event: _Optional[_Union[AgentEvent, _Mapping]] = ...) -> None: ...

class SteerTurnRequest(_message.Message):
    __slots__ = ["attempt", "message", "request_id", "turn_id"]
    ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    TURN_ID_FIELD_NUMBER: _ClassVar[int]
    attempt: int
    message: _conversation_pb2.Message
    request_id: str
    turn_id: str
    def __init__(self, turn_id: _Optional[str] = ..., attempt: _Optional[int] = ..., message: _Optional[_Union[_conversation_pb2.Message, _Mapping]] = ..., request_id: _Optional[str] = ...) -> None: ...

class SteerTurnResponse(_message.Message):
    __slots__ = ["attempt", "duplicate", "seq"]
    ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    DUPLICATE_FIELD_NUMBER: _ClassVar[int]
    SEQ_FIELD_NUMBER: _ClassVar[int]
    attempt: int
    duplicate: bool
    seq: int
    def __init__(self, attempt: _Optional[int] = ..., seq: _Optional[int] = ..., duplicate: bool = ...) -> None: ...

class Steered(_message.Message):
    __slots__ = ["message", "request_id"]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    message: _conversation_pb2.Message
    request_id: str
    def __init__(self, message: _Optional[_Union[_conversation_pb2.Message, _Mapping]] = ..., request_id: _Optional[str] = ...) -> None: ...

class TextDelta(_message.Message):
    __slots__ = ["text"]
    TEXT_FIELD_NUMBER: _ClassVar[int]
    text: str
    def __init__(self, text: _Optional[str] = ...) -> None: ...

class ThinkingDelta(_message.Message):
    __slots__ = ["signature", "text"]
    SIGNATURE_FIELD_NUMBER: _ClassVar[int]
    TEXT_FIELD_NUMBER: _ClassVar[int]
    signature: str
    text: str
    def __init__(self, text: _Optional[str] = ..., signature: _Optional[str] = ...) -> None: ...

class ToolApprovalDecided(_message.Message):
    __slots__ = ["approved", "call_id", "decided_by", "name", "reason", "timed_out"]
    APPROVED_FIELD_NUMBER: _ClassVar[int]
    CALL_ID_FIELD_NUMBER: _ClassVar[int]
    DECIDED_BY_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    TIMED_OUT_FIELD_NUMBER: _ClassVar[int]
    approved: bool
    call_id: str
    decided_by: str
    name: str
    reason: str
    timed_out: bool
    def __init__(self, call_id: _Optional[str] = ..., name: _Optional[str] = ..., approved: bool = ..., reason: _Optional[str] = ..., timed_out: bool = ..., decided_by: _Optional[str] = ...) -> None: ...

class ToolApprovalRequested(_message.Message):
    __slots__ = ["arguments", "call_id", "deadline", "name", "preview"]
    ARGUMENTS_FIELD_NUMBER: _ClassVar[int]
    CALL_ID_FIELD_NUMBER: _ClassVar[int]
    DEADLINE_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    PREVIEW_FIELD_NUMBER: _ClassVar[int]
    arguments: str
    call_id: str
    deadline: _timestamp_pb2.Timestamp
    name: str
    preview: str
    def __init__(self, call_id: _Optional[str] = ..., name: _Optional[str] = ..., arguments: _Optional[str] = ..., preview: _Optional[str] = ..., deadline: _Optional[_Union[_timestamp_pb2.Timestamp, _Mapping]] = ...) -> None: ...

class ToolCallDelta(_message.Message):
    __slots__ = ["arguments_delta", "call_id", "index", "name"]
    ARGUMENTS_DELTA_FIELD_NUMBER: _ClassVar[int]
    CALL_ID_FIELD_NUMBER: _ClassVar[int]
    INDEX_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    arguments_delta: str
    call_id: str
    index: int
    name: str
    def __init__(self, index: _Optional[int] = ..., call_id: _Optional[str] = ..., name: _Optional[str] = ..., arguments_delta: _Optional[str] = ...) -> None: ...

class ToolChoice(_message.Message):
    __slots__ = ["mode", "tool_name"]
    MODE_FIELD_NUMBER: _ClassVar[int]
    TOOL_NAME_FIELD_NUMBER: _ClassVar[int]
    mode: ToolChoiceMode
    tool_name: str
    def __init__(self, mode: _Optional[_Union[ToolChoiceMode, str]] = ..., tool_name: _Optional[str] = ...) -> None: ...

class ToolFinished(_message.Message):
    __slots__ = ["call_id", "content", "duration", "is_error", "name"]
    CALL_ID_FIELD_NUMBER: _ClassVar[int]
    CONTENT_FIELD_NUMBER: _ClassVar[int]
    DURATION_FIELD_NUMBER: _ClassVar[int]
    IS_ERROR_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    call_id: str
    content: str
    duration: _duration_pb2.Duration
    is_error: bool
    name: str
    def __init__(self, call_id: _Optional[str] = ..., name: _Optional[str] = ..., content: _Optional[str] = ..., is_error: bool = ..., duration: _Optional[_Union[_duration_pb2.Duration, _Mapping]] = ...) -> None: ...

class ToolProgress(_message.Message):
    __slots__ = ["call_id", "message", "name", "progress", "total"]
    CALL_ID_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    PROGRESS_FIELD_NUMBER: _ClassVar[int]
    TOTAL_FIELD_NUMBER: _ClassVar[int]
    call_id: str
    message: str
    name: str
    progress: float
    total: float
    def __init__(self, call_id: _Optional[str] = ..., name: _Optional[str] = ..., message: _Optional[str] = ..., progress: _Optional[float] = ..., total: _Optional[float] = ...) -> None: ...

class ToolStarted(_message.Message):
    __slots__ = ["arguments", "call_id", "name"]
    ARGUMENTS_FIELD_NUMBER: _ClassVar[int]
    CALL_ID_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    arguments: str
    call_id: str
    name: str
    def __init__(self, call_id: _Optional[str] = ..., name: _Optional[str] = ..., arguments: _Optional[str] = ...) -> None: ...

class TurnCompleted(_message.Message):
    __slots__ = ["counters", "end_reason", "messages", "messages_omitted", "usage"]
    COUNTERS_FIELD_NUMBER: _ClassVar[int]
    END_REASON_FIELD_NUMBER: _ClassVar[int]
    MESSAGES_FIELD_NUMBER: _ClassVar[int]
    MESSAGES_OMITTED_FIELD_NUMBER: _ClassVar[int]
    USAGE_FIELD_NUMBER: _ClassVar[int]
    counters: TurnCounters
    end_reason: EndReason
    messages: _containers.RepeatedCompositeFieldContainer[_conversation_pb2.Message]
    messages_omitted: bool
    usage: _conversation_pb2.Usage
    def __init__(self, end_reason: _Optional[_Union[EndReason, str]] = ..., messages: _Optional[_Iterable[_Union[_conversation_pb2.Message, _Mapping]]] = ..., usage: _Optional[_Union[_conversation_pb2.Usage, _Mapping]] = ..., counters: _Optional[_Union[TurnCounters, _Mapping]] = ..., messages_omitted: bool = ...) -> None: ...

class TurnCounters(_message.Message):
    __slots__ = ["approvals_denied", "approvals_requested", "compactions", "fallbacks", "hedges", "model_calls", "retries", "steered", "tool_calls", "tool_errors"]
    APPROVALS_DENIED_FIELD_NUMBER: _ClassVar[int]
    APPROVALS_REQUESTED_FIELD_NUMBER: _ClassVar[int]
    COMPACTIONS_FIELD_NUMBER: _ClassVar[int]
    FALLBACKS_FIELD_NUMBER: _ClassVar[int]
    HEDGES_FIELD_NUMBER: _ClassVar[int]
    MODEL_CALLS_FIELD_NUMBER: _ClassVar[int]
    RETRIES_FIELD_NUMBER: _ClassVar[int]
    STEERED_FIELD_NUMBER: _ClassVar[int]
    TOOL_CALLS_FIELD_NUMBER: _ClassVar[int]
    TOOL_ERRORS_FIELD_NUMBER: _ClassVar[int]
    approvals_denied: int
    approvals_requested: int
    compactions: int
    fallbacks: int
    hedges: int
    model_calls: int
    retries: int
    steered: int
    tool_calls: int
    tool_errors: int
    def __init__(self, model_calls: _Optional[int] = ..., retries: _Optional[int] = ..., fallbacks: _Optional[int] = ..., tool_calls: _Optional[int] = ..., tool_errors: _Optional[int] = ..., compactions: _Optional[int] = ..., hedges: _Optional[int] = ..., approvals_requested: _Optional[int] = ..., approvals_denied: _Optional[int] = ..., steered: _Optional[int] = ...) -> None: ...

class TurnLimits(_message.Message):
    __slots__ = ["max_model_calls"]
    MAX_MODEL_CALLS_FIELD_NUMBER: _ClassVar[int]
    max_model_calls: int
    def __init__(self, max_model_calls: _Optional[int] = ...) -> None: ...

class TurnStarted(_message.Message):
    __slots__ = ["model"]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    model: str
    def __init__(self, model: _Optional[str] = ...) -> None: ...

class WatchTurnRequest(_message.Message):
    __slots__ = ["after_seq", "attempt", "turn_id"]
    AFTER_SEQ_FIELD_NUMBER: _ClassVar[int]
    ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    TURN_ID_FIELD_NUMBER: _ClassVar[int]
    after_seq: int
    attempt: int
    turn_id: str
    def __init__(self, turn_id: _Optional[str] = ..., attempt: _Optional[int] = ..., after_seq: _Optional[int] = ...) -> None: ...

class WatchTurnResponse(_message.Message):
    __slots__ = ["event"]
    EVENT_FIELD_NUMBER: _ClassVar[int]
    event: AgentEvent
    def __init__(self, event: _Optional[_Union[AgentEvent, _Mapping]] = ...) -> None: ...

class ToolChoiceMode(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = []

class ReasoningEffort(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = []

class StopReason(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = []

class CompactionTrigger(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = []

class EndReason(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = []

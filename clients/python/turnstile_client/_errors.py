"""TurnError and the reading of a failed attempt: error events and statuses."""

from __future__ import annotations

from dataclasses import dataclass
from typing import List, Optional

import grpc
import grpc.aio
from .rpc import error_details_pb2, status_pb2
from .v1 import conversation_pb2, errors_pb2

#: The google.rpc.ErrorInfo domain of turnstile's errors.
ERROR_DOMAIN = "turnstile"

_STATUS_DETAILS_KEY = "grpc-status-details-bin"


def code_name(code: int) -> str:
    """Returns an ErrorCode without its ERROR_CODE_ prefix, e.g. "RATE_LIMITED"."""
    try:
        return errors_pb2.ErrorCode.Name(code).removeprefix("ERROR_CODE_")
    except ValueError:
        return str(code)


class TurnError(Exception):
    """The failure of a turn after the client's last attempt.

    Turn.events() raises it after the last event; Turn.wait() raises it.
    """

    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        #: The turn's id, shared by every attempt.
        self.turn_id = ""
        #: The class of the failure, a turnstile.v1.ErrorCode value.
        self.code = code
        #: What went wrong, fit to show a person.
        self.message = message
        #: True when the turn may succeed if run again later (the server
        #: advised it, or the transport failed); false when the server advised
        #: against it or gave no advice.
        self.retryable = False
        #: How long to wait before running the turn again, in seconds; 0 when unknown.
        self.retry_after = 0.0
        #: The model alias the failure concerns, when one does.
        self.model = ""
        #: The number of attempts the client made, the first included.
        self.attempts = 0
        #: The number of times the client re-attached to a run whose stream
        #: broke (WatchTurn calls), across every attempt.
        self.reattaches = 0
        #: The attempts the server made per model during the last attempt.
        self.model_attempts: List[errors_pb2.ModelAttempts] = []
        #: The messages the turn committed that stand: to run the turn again
        #: later, re-send them after the request's own, with the same turn id.
        self.messages: List[conversation_pb2.Message] = []
        #: The conversation to send to continue: the request's messages and
        #: messages, with the compactions the server made applied (see
        #: Result.conversation).
        self.conversation: List[conversation_pb2.Message] = []
        #: The RPC's final status code; None when the turn never got the server's answer.
        self.status_code: Optional[grpc.StatusCode] = None
        #: The RPC's status details (google.rpc.Status), when it sent any.
        self.status: Optional[status_pb2.Status] = None

    def __str__(self) -> str:
        s = "turnstile: turn"
        if self.turn_id:
            s += " " + self.turn_id
        s += " failed"
        if self.attempts > 1:
            s += f" after {self.attempts} attempts"
        return f"{s}: {code_name(self.code)}: {self.message}"


@dataclass
class Failure:
    """One attempt's failure, with the client's verdict on it."""

    err: TurnError
    #: The step may be run again.
    retry: bool
    #: The stream broke without a terminal event.
    transport: bool = False


def from_error_event(e: errors_pb2.Error) -> Failure:
    """Reads the terminal error event of an attempt."""
    err = TurnError(e.code, e.message)
    advised = e.HasField("retryable")
    err.retryable = advised and e.retryable
    err.model = e.model
    err.model_attempts = list(e.attempts)
    if e.HasField("retry_after"):
        err.retry_after = e.retry_after.ToTimedelta().total_seconds()
    # Unset advice is no advice: do not retry.
    return Failure(err=err, retry=err.retryable)


def has_status(e: object) -> bool:
    """Reports whether e is a call's end with a status: a grpc.Call (sync) or a grpc.aio.AioRpcError (asyncio)."""
    return isinstance(e, (grpc.Call, grpc.aio.AioRpcError))


def status_details(call: object) -> Optional[status_pb2.Status]:
    """Returns the google.rpc.Status a call ended with, from its trailers."""
    try:
        trailers = call.trailing_metadata() or ()  # type: ignore[attr-defined]
    except Exception:  # a call that never reached the server has none
        return None
    for key, value in trailers:
        if key == _STATUS_DETAILS_KEY:
            return status_pb2.Status.FromString(value)
    return None


def from_status(e: grpc.RpcError) -> Failure:
    """Reads an attempt that ended with a non-OK status and no terminal event.

    A turnstile ErrorInfo says the server classified the failure: it is
    retryable when a RetryInfo comes with it. Without one the failure is the
    transport's (or a proxy's): UNAVAILABLE, a replica gone or a connection
    reset, is retried.
    """
    code = e.code() if has_status(e) else grpc.StatusCode.UNKNOWN  # type: ignore[attr-defined]
    message = (e.details() if has_status(e) else str(e)) or ""  # type: ignore[attr-defined]
    err = TurnError(errors_pb2.ERROR_CODE_INTERNAL, message)
    err.__cause__ = e
    err.status_code = code
    info = retry = None
    st = status_details(e) if has_status(e) else None
    err.status = st
    for d in st.details if st else ():
        if d.Is(error_details_pb2.ErrorInfo.DESCRIPTOR):
            i = error_details_pb2.ErrorInfo()
            d.Unpack(i)
            if i.domain == ERROR_DOMAIN and info is None:
                info = i
        elif d.Is(error_details_pb2.RetryInfo.DESCRIPTOR):
            retry = error_details_pb2.RetryInfo()
            d.Unpack(retry)
    if info is not None:
        err.code = code_from_reason(info.reason)
        err.model = info.metadata.get("model", "")
        if retry is not None:
            err.retryable = True
            err.retry_after = retry.retry_delay.ToTimedelta().total_seconds()
        return Failure(err=err, retry=err.retryable)
    err.code = code_from_status(code)
    if retry is not None and code != grpc.StatusCode.INVALID_ARGUMENT:
        err.retryable = True
        err.retry_after = retry.retry_delay.ToTimedelta().total_seconds()
    if code == grpc.StatusCode.UNAVAILABLE:
        err.retryable = True
        return Failure(err=err, retry=True, transport=True)
    return Failure(err=err, retry=err.retryable)


# The starts of grpc-core's messages for a call that found no connection to
# send it on: it never reached the server. The first is pick_first's, the
# second round_robin's (the client's default policy).
_NOT_CONNECTED = ("failed to connect to all addresses", "connections to all backends failing", "DNS resolution failed")


def never_connected(e: grpc.RpcError) -> bool:
    """Reports whether a call failed because the channel could not connect, so it never reached the server.

    grpc-core tells it only in the status message, UNAVAILABLE with no
    details from a server; a stream that broke after it was sent says
    "Socket closed", "Connection reset by peer" or the like instead.
    """
    if not has_status(e) or e.code() != grpc.StatusCode.UNAVAILABLE or status_details(e) is not None:  # type: ignore[attr-defined]
        return False
    return (e.details() or "").startswith(_NOT_CONNECTED)  # type: ignore[attr-defined]


def code_from_reason(reason: str) -> int:
    """Maps an ErrorInfo reason to its error code."""
    try:
        v = errors_pb2.ErrorCode.Value("ERROR_CODE_" + reason)
    except ValueError:
        return errors_pb2.ERROR_CODE_INTERNAL
    return v if v != errors_pb2.ERROR_CODE_UNSPECIFIED else errors_pb2.ERROR_CODE_INTERNAL


_FROM_STATUS = {
    grpc.StatusCode.UNAVAILABLE: errors_pb2.ERROR_CODE_UNAVAILABLE,
    grpc.StatusCode.CANCELLED: errors_pb2.ERROR_CODE_CANCELLED,
    grpc.StatusCode.DEADLINE_EXCEEDED: errors_pb2.ERROR_CODE_DEADLINE_EXCEEDED,
    grpc.StatusCode.INVALID_ARGUMENT: errors_pb2.ERROR_CODE_INVALID_REQUEST,
    grpc.StatusCode.OUT_OF_RANGE: errors_pb2.ERROR_CODE_INVALID_REQUEST,
    grpc.StatusCode.UNAUTHENTICATED: errors_pb2.ERROR_CODE_AUTH,
    grpc.StatusCode.PERMISSION_DENIED: errors_pb2.ERROR_CODE_AUTH,
    grpc.StatusCode.NOT_FOUND: errors_pb2.ERROR_CODE_NOT_FOUND,
    grpc.StatusCode.UNIMPLEMENTED: errors_pb2.ERROR_CODE_NOT_FOUND,
    grpc.StatusCode.ABORTED: errors_pb2.ERROR_CODE_TOOLS_UNSAFE,
}


def code_from_status(code: grpc.StatusCode) -> int:
    """Maps a status code that came without an ErrorInfo."""
    return _FROM_STATUS.get(code, errors_pb2.ERROR_CODE_INTERNAL)

"""The Python client of turnstile.v1.AgentService.

A Client runs agent turns with run_turn and streams every step of them from
the generator Turn.events(). When the stream of a turn breaks (a connection
reset, a replica that went away), the client re-attaches to the same run
with WatchTurn from the last event it received, on a server with a turn
store, and the turn goes on. When a turn fails in a way the server says is
worth retrying (an error event with retryable set to true), or its stream
breaks and cannot be re-attached, the client runs the failed step again: it
resumes the turn as a new attempt, re-sending the conversation plus every
message the failed attempt committed, under the same turn id, so a
server-side tool that already ran is never run twice. It follows the Go
client's protocol (github.com/turnstile-dev/turnstile/client) step for step.
Turn.cancel(), a KeyboardInterrupt and leaving a ``with turn:`` block cancel
the turn on the server (CancelTurn); closing the generator alone only leaves
it, as a process that dies does.

AsyncClient is the same client for asyncio (grpc.aio): AsyncTurn.events() is
an async generator, and cancelling the task that iterates it, or leaving an
``async with turn:`` block early, cancels the turn on the server.

The messages and the service stub are in turnstile_client.v1 (turnstile.v1 as
buf generates it, copied under the package's name by copy_gen.py); google.rpc's
Status and error details, in turnstile_client.rpc.
"""

from . import rpc, v1
from ._aio import AsyncClient, AsyncTurn
from ._client import Client, Turn
from ._protocol import (
    ATTEMPT_HEADER,
    CANCEL_TIMEOUT,
    LOGGER,
    REATTACH_BACKOFF,
    REATTACH_TIMEOUT,
    ApprovalHandler,
    Backoff,
    Decision,
    Event,
    NotStartedError,
    Result,
    StepRetry,
    apply_compaction,
    standing,
)
from ._errors import ERROR_DOMAIN, TurnError, code_name
from ._media import media_file_part, media_part, media_type, media_uri_part

__all__ = [
    "rpc",
    "v1",
    "ATTEMPT_HEADER",
    "AsyncClient",
    "ApprovalHandler",
    "AsyncTurn",
    "Backoff",
    "Decision",
    "NotStartedError",
    "CANCEL_TIMEOUT",
    "Client",
    "ERROR_DOMAIN",
    "LOGGER",
    "REATTACH_BACKOFF",
    "REATTACH_TIMEOUT",
    "Event",
    "Result",
    "StepRetry",
    "Turn",
    "TurnError",
    "apply_compaction",
    "code_name",
    "media_file_part",
    "media_part",
    "media_type",
    "media_uri_part",
    "standing",
]

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

The generated code it uses (packages turnstile.v1 and google.rpc) is in the
repository's gen/python, which must be on the import path beside this
package; grpcio and protobuf come from Debian's python3-grpcio and
python3-protobuf (or any grpcio >= 1.51 and protobuf >= 4.21).
"""

from ._client import (
    ATTEMPT_HEADER,
    CANCEL_TIMEOUT,
    LOGGER,
    REATTACH_BACKOFF,
    REATTACH_TIMEOUT,
    Backoff,
    Client,
    Event,
    Result,
    StepRetry,
    Turn,
    standing,
)
from ._errors import ERROR_DOMAIN, TurnError, code_name

__all__ = [
    "ATTEMPT_HEADER",
    "Backoff",
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
    "code_name",
    "standing",
]

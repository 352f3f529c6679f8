"""The protocol of a turn, shared by the client (Client) and the asyncio client (AsyncClient).

What is not transport lives here: the options and their defaults, the events
and results, the reading of an attempt's events, and the decisions a turn
makes when a stream ends (re-attach to the run, or end the attempt) and when
an attempt ends (complete, run the step again, or fail). _client.py and
_aio.py only move bytes, wait and cancel, each in its own way.
"""

from __future__ import annotations

import logging
import random
import secrets
import time
from dataclasses import dataclass, field
from typing import Any, Callable, List, Optional, Sequence, Set, Tuple

import grpc

from ._errors import Failure, TurnError, code_name, from_error_event, from_status, has_status, never_connected
from .v1 import agent_pb2, conversation_pb2, errors_pb2

#: The request metadata key in which the client numbers its attempts at one
#: turn id, from 1, for servers that predate RunTurnRequest.attempt (the
#: client sends both).
ATTEMPT_HEADER = "turnstile-attempt"

#: The logger the client writes to unless given another: one record at INFO
#: per re-attach ("turnstile: re-attaching to the turn ...") and one at
#: WARNING per step retry ("turnstile: retrying turn step ..."), with the Go
#: client's fields as attributes of the record (turn_id, attempt, ...; the
#: step retry's message is error_message, as LogRecord has a message).
LOGGER = logging.getLogger("turnstile_client")
LOGGER.addHandler(logging.NullHandler())


@dataclass(frozen=True)
class Backoff:
    """Jittered exponential delays between step retries when the server gives none.

    Retry n (from 1) waits initial × multiplier^(n-1) seconds, capped at
    maximum, then spread uniformly by ± jitter (a fraction).
    """

    initial: float = 1.0
    maximum: float = 30.0
    multiplier: float = 2.0
    jitter: float = 0.2

    def delay(self, n: int, u: float) -> float:
        """Returns the wait before retry n (n >= 1) for the jitter draw u in [0, 1)."""
        d = self.initial
        for _ in range(1, n):
            d *= max(self.multiplier, 1.0)
            if self.maximum > 0 and d >= self.maximum:
                break
        if self.maximum > 0:
            d = min(d, self.maximum)
        d *= 1 + self.jitter * (2 * u - 1)
        return max(d, 0.0)


#: The default delays before re-attaching to a broken stream: 50 ms doubling up
#: to 1 s, spread by ±20%.
REATTACH_BACKOFF = Backoff(initial=0.05, maximum=1.0, multiplier=2.0, jitter=0.2)

#: How long, by default, the client keeps re-attaching to a run whose stream
#: broke, in seconds: longer than a server process takes to restart plus the
#: store's lease TTL (2 s) with margin, and as long as the server keeps a turn
#: nobody watches (turn.detach_grace, 30 s).
REATTACH_TIMEOUT = 30.0

#: How long, by default, a turn whose caller cancels it waits for the server to
#: stop it, in seconds.
CANCEL_TIMEOUT = 2.0


@dataclass(frozen=True)
class Decision:
    """Answers a tool call that waits for approval."""

    #: True runs the tool; False denies it.
    approved: bool
    #: Why, at most 4 KiB; a denial's reason is shown to the model in the
    #: call's error result.
    reason: str = ""


#: The approval handler of a turn (run_turn's on_approval): it decides the
#: tool call of a tool_approval_requested event (call id, tool name, JSON
#: arguments, preview). AsyncClient's may also be a coroutine function.
ApprovalHandler = Callable[[agent_pb2.ToolApprovalRequested], Any]


def approve_request(turn_id: str, attempt: int, call_id: str, decision: Decision) -> agent_pb2.ApproveToolCallRequest:
    """The ApproveToolCall of decision for call_id of the attempt numbered attempt on the wire."""
    return agent_pb2.ApproveToolCallRequest(
        turn_id=turn_id, attempt=attempt, call_id=call_id, approved=decision.approved, reason=decision.reason
    )


def steer_request(turn_id: str, attempt: int, text: str, request_id: str = "") -> agent_pb2.SteerTurnRequest:
    """The SteerTurn that gives text as a user message to the attempt numbered attempt on the wire, named request_id."""
    return agent_pb2.SteerTurnRequest(
        turn_id=turn_id,
        attempt=attempt,
        message=conversation_pb2.Message(role=conversation_pb2.ROLE_USER, parts=[conversation_pb2.Part(text=text)]),
        request_id=request_id,
    )


#: The codes after which a steering message may or may not have been
#: taken: Turn.steer sends it again with the same request id.
STEER_RETRY_CODES = (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED)


def new_request_id() -> str:
    """A fresh random request id for a steering message."""
    return secrets.token_hex(16)


class NotStartedError(RuntimeError):
    """Turn.steer or Turn.approve was called before the turn's first event: its run may not be stored yet."""


@dataclass
class StepRetry:
    """The client's signal that it resumes a failed turn with a new attempt."""

    #: The number of the attempt about to start, from 2.
    attempt: int
    #: The most attempts the client makes at the turn.
    max_attempts: int
    #: How long the client waits before the attempt, in seconds.
    delay: float
    #: The failure of the attempt that ended.
    error: TurnError
    #: Output was streamed since the last message that stands (the last of
    #: messages, or the turn's start): text, thinking and tool call deltas, and
    #: any message committed after it, were never committed and every consumer
    #: must drop them. The new attempt streams that step afresh.
    discard_partial: bool
    #: The messages the turn committed so far that stand; the new attempt
    #: re-sends them after the request's own, so the work they hold (tool
    #: results above all) is not done again.
    messages: List[conversation_pb2.Message]
    #: What the new attempt sends: the request's messages and messages, with
    #: the compactions the server made applied (see Result.conversation).
    conversation: List[conversation_pb2.Message] = field(default_factory=list)


@dataclass
class Event:
    """One step of a turn as the client sees it.

    Either an event the server sent (agent) or a signal of the client's own
    (step_retry); exactly one of the two is set.
    """

    #: The client's attempt at the turn that the event belongs to, from 1. The
    #: server numbers the events of each attempt (AgentEvent.seq) from 1 again.
    attempt: int
    #: An event sent by the server. An error event ends an attempt, not
    #: necessarily the turn: a step_retry event or the turn's error follows it.
    agent: Optional[agent_pb2.AgentEvent] = None
    #: The attempt failed and the client runs the failed step again once
    #: step_retry.delay has passed.
    step_retry: Optional[StepRetry] = None


@dataclass
class Result:
    """The outcome of a turn that completed."""

    turn_id: str
    #: Why the turn ended, a turnstile.v1.EndReason value.
    end_reason: int
    #: The messages the turn added, across every attempt, in order: append
    #: them to the conversation. With END_REASON_TOOL_CALLS_REQUIRED the last
    #: one holds the tool calls the caller must run.
    messages: List[conversation_pb2.Message]
    #: The tokens used by every attempt, failed ones included.
    usage: conversation_pb2.Usage
    #: What happened in every attempt.
    counters: agent_pb2.TurnCounters
    #: The number of attempts the client made.
    attempts: int
    #: The number of times the client re-attached to a run whose stream
    #: broke (WatchTurn calls), across every attempt.
    reattaches: int = 0
    #: The conversation to send in the next turn (followed by its new
    #: messages): the request's messages and messages, with each compaction
    #: the server made applied (compaction events: what replaces what). When
    #: the server compacted the conversation, messages appended to the
    #: caller's history would send the whole history again, to be compacted
    #: again; conversation is compacted once.
    conversation: List[conversation_pb2.Message] = field(default_factory=list)


@dataclass
class Outcome:
    """What one attempt left behind."""

    completed: Optional[agent_pb2.TurnCompleted] = None
    fail: Optional[Failure] = None
    committed: List[conversation_pb2.Message] = field(default_factory=list)
    #: The messages committed and the compactions, in the order they came,
    #: to replay on the conversation the attempt sent (see replay).
    changes: List[object] = field(default_factory=list)
    partial: bool = False
    tools_running: List[str] = field(default_factory=list)
    usage: Optional[conversation_pb2.Usage] = None
    counters: Optional[agent_pb2.TurnCounters] = field(default_factory=agent_pb2.TurnCounters)
    #: The attempt received an event: the server stored its run.
    started: bool = False
    #: The call ids whose approval was requested: a request a takeover
    #: emitted again counts once.
    asked: Set[str] = field(default_factory=set)

#: END marks a stream that ended without an error status.
END = object()


def worth_watching(err: object) -> bool:
    """Reports whether a stream that ended with err before its last event may be resumed by watching the run.

    The transport broke (UNAVAILABLE, or an end without a status), or the
    server said the log or the run's replica is unavailable for now.
    """
    if err is END:
        return True
    if not isinstance(err, grpc.RpcError):
        return False
    f = from_status(err)
    return f.transport or (f.retry and f.err.code == errors_pb2.ERROR_CODE_UNAVAILABLE)


def no_run(err: object) -> bool:
    """Reports whether a WatchTurn failed because there is no run to watch.

    The server keeps no log (FAILED_PRECONDITION), predates WatchTurn
    (UNIMPLEMENTED), or never stored the run (NOT_FOUND).
    """
    return has_status(err) and err.code() in (  # type: ignore[attr-defined]
        grpc.StatusCode.FAILED_PRECONDITION,
        grpc.StatusCode.UNIMPLEMENTED,
        grpc.StatusCode.NOT_FOUND,
    )


def observe(ev: agent_pb2.AgentEvent, out: Outcome) -> Optional[errors_pb2.Error]:
    """Updates an attempt's outcome with one of its events; returns its error event, if it is one."""
    kind = ev.WhichOneof("payload")
    counters = out.counters
    if kind in ("text_delta", "thinking_delta", "tool_call_delta"):
        out.partial = True
    elif kind == "message_completed":
        out.committed.append(ev.message_completed.message)
        out.changes.append(ev.message_completed.message)
        out.partial, out.tools_running = False, []
    elif kind == "tool_started":
        out.tools_running.append(ev.tool_started.name)
    elif kind == "tool_finished" and counters is not None:
        counters.tool_calls += 1
        if ev.tool_finished.is_error:
            counters.tool_errors += 1
    elif kind == "llm_call_started" and counters is not None:
        counters.model_calls += 1
    elif kind == "retry" and counters is not None:
        counters.retries += 1
        if ev.retry.discard_partial:
            out.partial = False  # the server told consumers to drop it
    elif kind == "fallback" and counters is not None:
        counters.fallbacks += 1
        if ev.fallback.discard_partial:
            out.partial = False
    elif kind == "compaction":
        out.changes.append(ev.compaction)
        if counters is not None:
            counters.compactions += 1
    elif kind == "hedge" and counters is not None:
        counters.hedges += 1
    elif kind == "tool_approval_requested" and counters is not None:
        if ev.tool_approval_requested.call_id not in out.asked:
            counters.approvals_requested += 1
        out.asked.add(ev.tool_approval_requested.call_id)
    elif kind == "tool_approval_decided" and counters is not None:
        if not ev.tool_approval_decided.approved:
            counters.approvals_denied += 1
    elif kind == "steered" and counters is not None:
        counters.steered += 1
    elif kind == "usage":
        out.usage = ev.usage
    elif kind == "error":
        return ev.error
    elif kind == "turn_completed":
        out.completed = ev.turn_completed
        # The final attempt's own counters are in TurnCompleted.
        out.usage, out.counters = None, None
    return None


def apply_compaction(
    conv: Sequence[conversation_pb2.Message], c: agent_pb2.Compaction
) -> Optional[List[conversation_pb2.Message]]:
    """Applies a compaction event to conv, the conversation it indexes.

    conv is the request's messages followed by the messages the turn
    committed before the event, as earlier compactions left it: the
    replaced_count messages from replaced_from are replaced by replacement.
    It returns the new conversation (conv is not changed), or None when the
    event cannot be applied (its replacement was omitted for its size, or its
    range is outside conv); the turn's later compactions cannot be applied
    then either. A turn applies them already (Result.conversation); this is
    for callers that follow a turn's events themselves (WatchTurn).
    """
    end = c.replaced_from + c.replaced_count
    if c.replacement_omitted or end > len(conv):
        return None
    return list(conv[: c.replaced_from]) + list(c.replacement) + list(conv[end:])


def replay(conv: Sequence[conversation_pb2.Message], changes: Sequence[object]) -> List[conversation_pb2.Message]:
    """Returns conv followed by the messages an attempt committed, with its compactions applied.

    A compaction that cannot be applied stops the compactions: the later
    ones index a conversation this one does not have.
    """
    out, frozen = list(conv), False
    for ch in changes:
        if isinstance(ch, agent_pb2.Compaction):
            applied = None if frozen else apply_compaction(out, ch)
            if applied is None:
                frozen = True
            else:
                out = applied
        else:
            out.append(ch)  # type: ignore[arg-type]
    return out


def standing(msgs: List[conversation_pb2.Message]) -> List[conversation_pb2.Message]:
    """Returns the prefix of the committed messages a new attempt can resume from.

    A trailing assistant message whose tool calls have no results is
    dropped, since the step that runs them has to be made again.
    """
    if not msgs:
        return msgs
    last = msgs[-1]
    if last.role != conversation_pb2.ROLE_ASSISTANT:
        return msgs
    if any(p.WhichOneof("kind") == "tool_call" for p in last.parts):
        return msgs[:-1]
    return msgs


def _used(u: conversation_pb2.Usage) -> bool:
    return bool(u.input_tokens or u.output_tokens or u.cache_read_tokens or u.cache_write_tokens)


def add_usage(dst: conversation_pb2.Usage, u: Optional[conversation_pb2.Usage]) -> None:
    if u is None:
        return
    # Costs add up exactly; tokens of unknown cost beside a known cost make
    # the sum partial, and without any known cost there is none.
    unpriced_before = not dst.HasField("cost") and _used(dst)
    unpriced_now = not u.HasField("cost") and _used(u)
    dst.input_tokens += u.input_tokens
    dst.output_tokens += u.output_tokens
    dst.cache_read_tokens += u.cache_read_tokens
    dst.cache_write_tokens += u.cache_write_tokens
    if u.HasField("cost"):
        if not dst.HasField("cost"):
            dst.cost.currency = u.cost.currency
        nanos = dst.cost.nanos + u.cost.nanos
        dst.cost.units += u.cost.units + nanos // 1_000_000_000
        dst.cost.nanos = nanos % 1_000_000_000
        dst.cost_partial = dst.cost_partial or u.cost_partial or unpriced_before
    elif unpriced_now and dst.HasField("cost"):
        dst.cost_partial = True


def add_counters(dst: agent_pb2.TurnCounters, c: Optional[agent_pb2.TurnCounters]) -> None:
    if c is None:
        return
    dst.model_calls += c.model_calls
    dst.retries += c.retries
    dst.fallbacks += c.fallbacks
    dst.tool_calls += c.tool_calls
    dst.tool_errors += c.tool_errors
    dst.compactions += c.compactions
    dst.hedges += c.hedges
    dst.approvals_requested += c.approvals_requested
    dst.approvals_denied += c.approvals_denied
    dst.steered += c.steered




class ClientBase:
    """The options of a client and their checks, common to Client and AsyncClient."""

    def __init__(
        self,
        *,
        max_step_retries: int,
        backoff: Backoff,
        max_retry_delay: float,
        reattach_timeout: float,
        max_reattaches: Optional[int],
        reattach_backoff: Backoff,
        cancel_timeout: float,
        metadata: Sequence[Tuple[str, str]],
        logger: Optional[logging.Logger],
        load_balancing_policy: str,
    ) -> None:
        if load_balancing_policy not in ("round_robin", "pick_first"):
            raise ValueError("turnstile: load_balancing_policy must be round_robin or pick_first")
        if max_step_retries < 0:
            raise ValueError("turnstile: max_step_retries must not be negative")
        if max_reattaches is not None and max_reattaches < 0:
            raise ValueError("turnstile: max_reattaches must not be negative")
        if reattach_timeout < 0:
            raise ValueError("turnstile: reattach_timeout must not be negative")
        if cancel_timeout < 0:
            raise ValueError("turnstile: cancel_timeout must not be negative")
        for b in (backoff, reattach_backoff):
            if b.initial < 0 or b.maximum < 0 or not 0 <= b.jitter <= 1:
                raise ValueError("turnstile: invalid backoff")
        #: The gRPC channel options of a channel the client makes. No transport
        #: retry: it would stack on the client's step retry.
        self._channel_options = [("grpc.enable_retries", 0), ("grpc.lb_policy_name", load_balancing_policy)]
        self.max_step_retries = max_step_retries
        self.backoff = backoff
        self.max_retry_delay = max_retry_delay
        #: How long the client keeps re-attaching to a run whose stream broke,
        #: in seconds from the break; the time starts again with every event
        #: received, and when a re-attached stream that stayed open for at
        #: least the timeout breaks (it was attached to a quiet run, such as a
        #: turn waiting for approval); no re-attach starts once its delay
        #: would end past it (0: never re-attaches).
        self.reattach_timeout = reattach_timeout
        #: Deprecated: a count of tries is no measure of an outage, which is
        #: what the client must outlast; use reattach_timeout. When set, it
        #: still caps how many times in a row the client re-attaches, within
        #: reattach_timeout (None: no cap; 0: never re-attaches).
        self.max_reattaches = max_reattaches
        self.reattach_backoff = reattach_backoff
        #: How long the client spends cancelling a turn on the server once its
        #: caller cancels it, in seconds: the CancelTurn call and the events
        #: the server sends until its CANCELLED error (0: the client does not
        #: call CancelTurn and only drops the stream, which a server with a
        #: turn store takes for a detach).
        self.cancel_timeout = cancel_timeout
        self.logger = logger if logger is not None else LOGGER
        self._metadata = tuple(metadata)
        #: The jitter draw; replaceable in tests.
        self.random: Callable[[], float] = random.random


class Attempt:
    """One attempt at a turn as its streams come and go: the RunTurn, then any WatchTurn re-attaching to its run.

    The transport feeds it every response (accept), and the way each stream
    ended (unreached, ended); it says whether to re-attach and, once the
    attempt is over, what the attempt left behind (finish, then out).
    """

    def __init__(self, n: int, wire: int, out: Outcome) -> None:
        #: The attempt's number, from 1.
        self.n = n
        #: The attempt's number on the wire (see TurnBase._wire).
        self.wire = wire
        #: What the attempt left behind, filled in as it goes.
        self.out = out
        #: The seq of the last event received, for WatchTurn's after_seq.
        self.last_seq = 0
        #: The re-attaches in a row since the last event received.
        self.reattaches = 0
        self._err_event: Optional[errors_pb2.Error] = None
        self._broken: object = None  # the break that the current re-attach follows
        self._broke_at = 0.0  # when it happened, time.monotonic()
        self._watched_at = 0.0  # when the current re-attach's WatchTurn began
        self._watchable = True
        self._err: object = END

    def accept(self, resp: agent_pb2.RunTurnResponse) -> Optional[agent_pb2.AgentEvent]:
        """Reads one response of a stream; returns its event unless it is none or one already received."""
        ev = resp.event
        if not resp.HasField("event") or (self.last_seq > 0 and ev.seq <= self.last_seq):
            return None
        self.last_seq, self._broken, self.reattaches, self.out.started = ev.seq, None, 0, True
        self._err_event = observe(ev, self.out) or self._err_event
        return ev

    def unreached(self, err: grpc.RpcError) -> bool:
        """Ends the attempt if its RunTurn failed with err without reaching the server; reports whether it did.

        As the Go client's RunTurn that fails before its stream: no re-attach.
        """
        if self._broken is None and self.last_seq == 0 and never_connected(err):
            self.out.fail = from_status(err)
            return True
        return False

    def ended(self, err: object, client: ClientBase, stopping: bool) -> Optional[float]:
        """Takes the end of a stream (err, or END); returns the delay before re-attaching, or None when the attempt is over.

        stopping: the caller cancelled the turn or its deadline passed. A
        stream that broke before the attempt's last event is re-attached
        while the server may hold the run, for up to the client's
        reattach_timeout from the break.
        """
        out = self.out
        if self._broken is not None and no_run(err):
            # The server keeps no log, or never stored the run: the break stands.
            self._watchable, err = False, self._broken
        if out.completed is None and self._err_event is None and self._watchable and not stopping and worth_watching(err):
            if self._broken is not None and time.monotonic() - self._watched_at >= client.reattach_timeout:
                # The re-attached stream stayed open longer than any failing
                # call lasts: it was attached to a quiet run (a turn waiting
                # for approval, a long tool), and this is a break of its own.
                self._broken, self.reattaches = None, 0
            if self._broken is None:
                self._broken, self._broke_at = err, time.monotonic()
            delay = client.reattach_backoff.delay(self.reattaches + 1, client.random())
            if (
                client.reattach_timeout <= 0
                or time.monotonic() - self._broke_at + delay > client.reattach_timeout
                or (client.max_reattaches is not None and self.reattaches >= client.max_reattaches)
            ):
                err = self._broken
            else:
                self.reattaches += 1
                self._err = err
                return delay
        if (
            self._broken is not None
            and has_status(err)
            and err.code() == grpc.StatusCode.UNAVAILABLE  # type: ignore[attr-defined]
            and out.completed is None
            and self._err_event is None
        ):
            # Re-attaching kept failing: report the first break.
            err = self._broken
        self._err = err
        return None

    def give_up(self) -> None:
        """The re-attach ended() asked for was not made (the turn was cancelled or its deadline passed)."""
        self._err = self._broken

    def finish(self) -> Outcome:
        """Concludes the attempt from how its last stream ended; returns what it left behind."""
        out, err = self.out, self._err
        if out.completed is not None:
            return out
        if self._err_event is not None:
            out.fail = from_error_event(self._err_event)
            if isinstance(err, grpc.RpcError):
                st = from_status(err)
                out.fail.err.status_code, out.fail.err.status = st.err.status_code, st.err.status
                out.fail.err.__cause__ = err
        elif err is END:
            te = TurnError(errors_pb2.ERROR_CODE_UNAVAILABLE, "the stream ended without a terminal event")
            te.retryable = True
            out.fail = Failure(err=te, retry=True, transport=True)
        else:
            assert isinstance(err, grpc.RpcError)
            out.fail = from_status(err)
            if self._broken is not None:
                # The run was not finished when its stream broke.
                out.fail.transport = True
        return out

    def reattach_request(self, turn_id: str) -> agent_pb2.WatchTurnRequest:
        """The WatchTurn that resumes the attempt's run after its last event received; the caller makes it now."""
        self._watched_at = time.monotonic()
        return agent_pb2.WatchTurnRequest(turn_id=turn_id, attempt=self.wire, after_seq=self.last_seq)


class TurnBase:
    """The protocol state of a turn, common to Turn and AsyncTurn.

    It keeps what the attempts committed, used and did, builds each
    attempt's request, and decides between attempts (settle). The
    subclasses run the attempts, wait and cancel.
    """

    def __init__(
        self,
        client: ClientBase,
        request: agent_pb2.RunTurnRequest,
        timeout: Optional[float],
        on_approval: Optional[ApprovalHandler] = None,
    ) -> None:
        self._cb = client
        self._req = request
        self._on_approval = on_approval
        #: The approval requests answered or seen decided, as (wire, call id).
        self._answered: Set[Tuple[int, str]] = set()
        #: The attempt on the wire whose events the turn yields; 0 before its first event.
        self._running = 0
        #: Why the client cancelled the turn itself (an approval that failed).
        self._cause: Optional[BaseException] = None
        self._deadline = None if timeout is None else time.monotonic() + timeout
        #: Why the turn is being stopped: "cancelled" or "deadline"; None while it is not.
        self._reason: Optional[str] = None
        #: The WatchTurn calls made to resume broken streams, every attempt's.
        self._reattached = 0
        #: The number the next attempt has on the wire: a server with a turn
        #: store runs attempt n only after attempt n-1, so an attempt refused
        #: before any event (a limit, a server draining) stored nothing and
        #: is sent again under its number, the same request, which the
        #: server runs or attaches to.
        self._wire = 1
        #: The messages the attempts so far committed that stand.
        self._carried: List[conversation_pb2.Message] = []
        #: What the next attempt sends: the request's messages and those
        #: carried, compacted as the server said.
        self._conv: List[conversation_pb2.Message] = list(request.messages)
        self._usage = conversation_pb2.Usage()
        self._counters = agent_pb2.TurnCounters()
        self._ended = False
        self._started = False
        #: The turn's outcome once the iteration ended; None while it runs or when it failed.
        self.result: Optional[Result] = None
        #: The turn's failure once the iteration ended; None on success or while it runs.
        self.error: Optional[TurnError] = None

    @property
    def id(self) -> str:
        """The turn's id, the caller's or the one the client made."""
        return self._req.turn_id

    def _stopping(self) -> bool:
        """Reports whether the caller cancelled the turn or its deadline passed."""
        return self._reason is not None or self._expired()

    def _expired(self) -> bool:
        return self._deadline is not None and time.monotonic() >= self._deadline

    def _remaining(self) -> Optional[float]:
        """The seconds left before the turn's deadline; None without one."""
        return None if self._deadline is None else max(self._deadline - time.monotonic(), 0.0)

    def _call_timeout(self) -> Optional[float]:
        """The timeout of a stream of the turn: its deadline plus cancel_timeout, so the events the server sends as it stops the run arrive."""
        r = self._remaining()
        return None if r is None else r + self._cb.cancel_timeout

    def _attempt_request(self, n: int) -> agent_pb2.RunTurnRequest:
        """The request of the attempt numbered n on the wire: the turn's, with the conversation compacted and what the failed attempts committed."""
        req = agent_pb2.RunTurnRequest()
        req.CopyFrom(self._req)
        req.attempt = n
        del req.messages[:]
        req.messages.extend(self._conv)
        return req

    def _metadata(self, n: int) -> Tuple[Tuple[str, str], ...]:
        # The header is for servers that predate the attempt field.
        return self._cb._metadata + ((ATTEMPT_HEADER, str(n)),)

    def _stopped(self, n: int, carried: List[conversation_pb2.Message]) -> TurnError:
        if self._reason == "deadline" or (self._reason is None and self._expired()):
            te = TurnError(errors_pb2.ERROR_CODE_DEADLINE_EXCEEDED, "the turn's deadline passed")
        else:
            te = TurnError(errors_pb2.ERROR_CODE_CANCELLED, "the turn was cancelled")
            te.__cause__ = self._cause
        return self._stamp(te, n, carried)

    def _approval_due(self, wire: int, ev: agent_pb2.AgentEvent) -> Optional[agent_pb2.ToolApprovalRequested]:
        """Notes an event of the attempt numbered wire; returns the approval request the handler must answer, if it is one.

        Once per call id and attempt: not for a request the server emits
        again, nor for one whose decision was received.
        """
        self._running = wire
        kind = ev.WhichOneof("payload")
        if kind == "tool_approval_decided":
            self._answered.add((wire, ev.tool_approval_decided.call_id))
        if kind != "tool_approval_requested" or self._on_approval is None:
            return None
        key = (wire, ev.tool_approval_requested.call_id)
        if key in self._answered:
            return None
        self._answered.add(key)
        return ev.tool_approval_requested

    def _approval_failed(self, wire: int, req: agent_pb2.ToolApprovalRequested, err: BaseException) -> None:
        """Logs an approval that failed and notes it as the cause of the turn's cancellation, which the caller starts."""
        self._cb.logger.warning(
            "turnstile: cancelling the turn: its approval failed: turn %s, attempt %d, call %s (%s)",
            self.id, wire, req.call_id, err,
            extra={"turn_id": self.id, "attempt": wire, "call_id": req.call_id, "cause": str(err)},
        )
        self._cause = err

    def _running_attempt(self) -> int:
        """The attempt on the wire whose events the turn yields; raises NotStartedError before its first event."""
        if self._running == 0:
            raise NotStartedError("turnstile: the turn has not started")
        return self._running

    def _stamp(self, te: TurnError, n: int, carried: List[conversation_pb2.Message]) -> TurnError:
        te.turn_id, te.attempts, te.messages = self.id, n, list(carried)
        te.conversation = list(self._conv)
        te.reattaches = self._reattached
        return te

    def _log_reattach(self, a: Attempt, delay: float, err: object) -> float:
        """Counts and logs the re-attach a.ended() asked for; returns how long to wait before it."""
        self._reattached += 1
        c = self._cb
        cause = "the stream ended without a terminal event" if err is END else err.details()  # type: ignore[attr-defined]
        c.logger.info(
            "turnstile: re-attaching to the turn %s: attempt %d after seq %d, re-attach %d in %.3fs (%s)",
            self.id, a.wire, a.last_seq, a.reattaches, delay, cause,
            extra={
                "turn_id": self.id, "attempt": a.wire, "after_seq": a.last_seq,
                "reattach": a.reattaches, "delay": delay, "cause": cause,
            },
        )
        r = self._remaining()
        return delay if r is None else min(delay, r)

    def _settle(self, n: int, out: Outcome) -> Optional[Event]:
        """Folds attempt n's outcome into the turn and decides what follows it.

        It returns None when the turn completed (result is set); raises the
        turn's TurnError when the turn ends failed; else it logs a step retry
        and returns its Event, which the caller yields before waiting
        step_retry.delay (unless the turn is cancelled meanwhile) and making
        attempt n + 1.
        """
        c = self._cb
        if out.started:
            self._wire += 1
        add_usage(self._usage, out.usage)
        add_counters(self._counters, out.counters)
        if out.completed is not None:
            tc = out.completed
            add_usage(self._usage, tc.usage)
            add_counters(self._counters, tc.counters)
            self.result = Result(
                turn_id=self.id,
                end_reason=tc.end_reason,
                # Too large for one event, they came in message_completed only.
                messages=self._carried + (list(out.committed) if tc.messages_omitted else list(tc.messages)),
                usage=self._usage,
                counters=self._counters,
                attempts=n,
                reattaches=self._reattached,
                conversation=replay(self._conv, out.changes),
            )
            return None
        fail = out.fail
        assert fail is not None
        carried = self._carried + out.committed
        kept = standing(carried)
        discard = out.partial or len(kept) < len(carried)
        conv = replay(self._conv, out.changes)
        # A dropped trailing message is the conversation's last too: compactions keep it.
        self._conv = conv[:-1] if len(kept) < len(carried) else conv
        self._carried = carried = kept
        self._stamp(fail.err, n, carried)
        if self._stopping():
            # The caller cancelled the turn: the messages the server
            # committed as it stopped it stand, for the next turn.
            te = self._stopped(n, carried)
            te.status_code, te.status = fail.err.status_code, fail.err.status
            raise te
        if fail.transport and out.tools_running:
            # The server may have run them: resuming could run them again.
            fail.err.code = errors_pb2.ERROR_CODE_TOOLS_UNSAFE
            fail.err.message += (
                f"; the connection broke while the tools {', '.join(out.tools_running)} were running,"
                " check their effects before running the turn again"
            )
            fail.err.args = (fail.err.message,)
            fail.err.retryable = fail.retry = False
        if not fail.retry or n > c.max_step_retries:
            raise fail.err
        delay = fail.err.retry_after
        if delay <= 0:
            delay = c.backoff.delay(n, c.random())
        if delay > c.max_retry_delay:
            raise fail.err
        if self._deadline is not None and self._deadline - time.monotonic() <= delay:
            raise fail.err
        fields = {
            "turn_id": self.id,
            "attempt": n + 1,
            "code": code_name(fail.err.code),
            "delay": delay,
            "transport": fail.transport,
            "messages_carried": len(carried),
            "error_message": fail.err.message,
        }
        c.logger.warning(
            "turnstile: retrying turn step: turn %s, attempt %d in %.3fs after %s: %s",
            self.id, n + 1, delay, fields["code"], fail.err.message, extra=fields,
        )
        return Event(
            attempt=n,
            step_retry=StepRetry(
                attempt=n + 1,
                max_attempts=c.max_step_retries + 1,
                delay=delay,
                error=fail.err,
                discard_partial=discard,
                messages=list(carried),
                conversation=list(self._conv),
            ),
        )

"""The client and its turns: events, discard signalling, step retries."""

from __future__ import annotations

import logging
import random
import secrets
import threading
import time
from dataclasses import dataclass, field
from typing import Callable, Iterator, List, Optional, Sequence, Tuple

import grpc
from turnstile.v1 import agent_pb2, agent_pb2_grpc, conversation_pb2, errors_pb2

from ._errors import Failure, TurnError, code_name, from_error_event, from_status, never_connected

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


@dataclass
class _Outcome:
    """What one attempt left behind."""

    completed: Optional[agent_pb2.TurnCompleted] = None
    fail: Optional[Failure] = None
    committed: List[conversation_pb2.Message] = field(default_factory=list)
    partial: bool = False
    tools_running: List[str] = field(default_factory=list)
    usage: Optional[conversation_pb2.Usage] = None
    counters: Optional[agent_pb2.TurnCounters] = field(default_factory=agent_pb2.TurnCounters)
    #: The attempt received an event: the server stored its run.
    started: bool = False


class Client:
    """Runs turns on a turnstile server. Safe for use from several threads.

    target is a gRPC target such as "127.0.0.1:7700" or
    "dns:///turnstile.internal:7700". Without credentials the channel is
    plaintext; pass grpc.ssl_channel_credentials() for TLS, or a channel of
    your own. Close the client (or use it as a context manager) when done.

    load_balancing_policy is gRPC's policy over the addresses the target
    resolves to: "round_robin" (the default, as the Go client does: with
    "dns:///" and a headless Service, turns spread over every replica) or
    "pick_first" (one connection).
    """

    def __init__(
        self,
        target: str = "",
        *,
        channel: Optional[grpc.Channel] = None,
        credentials: Optional[grpc.ChannelCredentials] = None,
        max_step_retries: int = 1,
        backoff: Backoff = Backoff(),
        max_retry_delay: float = 60.0,
        reattach_timeout: float = REATTACH_TIMEOUT,
        max_reattaches: Optional[int] = None,
        reattach_backoff: Backoff = REATTACH_BACKOFF,
        cancel_timeout: float = CANCEL_TIMEOUT,
        metadata: Sequence[Tuple[str, str]] = (),
        logger: Optional[logging.Logger] = None,
        load_balancing_policy: str = "round_robin",
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
        if channel is None:
            if not target:
                raise ValueError("turnstile: empty target")
            # No transport retry: it would stack on the client's step retry.
            options = [("grpc.enable_retries", 0), ("grpc.lb_policy_name", load_balancing_policy)]
            if credentials is not None:
                channel = grpc.secure_channel(target, credentials, options=options)
            else:
                channel = grpc.insecure_channel(target, options=options)
            self._owned = True
        else:
            self._owned = False
        self._channel = channel
        self._stub = agent_pb2_grpc.AgentServiceStub(channel)
        self.max_step_retries = max_step_retries
        self.backoff = backoff
        self.max_retry_delay = max_retry_delay
        #: How long the client keeps re-attaching to a run whose stream broke,
        #: in seconds from the break; the time starts again with every event
        #: received, and no re-attach starts once its delay would end past it
        #: (0: never re-attaches).
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

    def close(self) -> None:
        """Closes the channel the client made; turns still running fail CANCELLED."""
        if self._owned:
            self._channel.close()

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def run_turn(self, request: agent_pb2.RunTurnRequest, *, timeout: Optional[float] = None) -> "Turn":
        """Prepares one turn of request; it runs as the caller iterates over Turn.events().

        When request has no turn_id the client makes one, so every attempt
        shares it. Each attempt is a run of its own on the server, named by the
        turn id and its number (RunTurnRequest.attempt, and the
        turnstile-attempt metadata for older servers).

        A stream that breaks before the attempt's last event (a connection
        reset, a replica that went away) is first resumed, not retried: the
        client re-attaches to the same run with WatchTurn from the seq of the
        last event it received, for up to reattach_timeout (30 s) from the
        break, and the iteration goes on with the next event; nothing is run
        again and no event is repeated: a server restarting, or a replica
        taking the turn over, is outlasted. This needs a server with a turn store; a server
        without one (WatchTurn answers FAILED_PRECONDITION), or one that never
        stored the run (NOT_FOUND), makes the break stand. A call that never
        reached the server (it could not connect) is not re-attached.

        An attempt that ends with an error event whose retryable is true, or
        whose break stands with UNAVAILABLE, is followed by a StepRetry event
        and a new attempt, up to max_step_retries, after the server's retry
        delay or else the client's jittered backoff. The new attempt resumes
        the turn: its request carries the request's messages plus the messages
        the failed attempts committed (message_completed events). An error
        whose retryable is false or unset is raised at once; so is a break that
        stands while server-side tools were running, as they may have had
        effects. timeout (seconds) bounds the whole turn, retries and
        re-attaches included. request is not modified.

        Cancelling and leaving differ. Turn.cancel() (from any thread), a
        KeyboardInterrupt while the client waits for the server, leaving a
        ``with turn:`` block before the turn's end, and the timeout passing
        cancel the turn on the server: the client calls CancelTurn for the
        running attempt, bounded by cancel_timeout (2 s). After cancel() the
        iteration goes on with the events the server sends as it stops the
        turn: message_completed events for what the turn had (the partial
        reply, a "cancelled by the user" result for every tool call that did
        not run, an interruption note), then its CANCELLED error; it then
        raises TurnError CANCELLED (DEADLINE_EXCEEDED for the timeout) whose
        messages hold every message the turn committed: append them to the
        conversation and the next turn continues from it. After a
        KeyboardInterrupt, which propagates, turn.error holds that TurnError.
        A server without a turn store answers CancelTurn FAILED_PRECONDITION;
        there dropping the stream is what cancels the turn. Closing the
        generator (breaking out of a for loop) outside a ``with turn:``
        block only drops the stream: a server with a turn store keeps
        running the turn for turn.detach_grace (30 s), as it does when the
        process dies.
        """
        req = agent_pb2.RunTurnRequest()
        req.CopyFrom(request)
        if not req.turn_id:
            req.turn_id = secrets.token_hex(16)
        return Turn(self, req, timeout)


class Turn:
    """A turn started by Client.run_turn.

    Iterate over events() once to run it, then read result (or error).
    cancel() may be called from any thread. Used as a context manager
    (``with client.run_turn(req) as turn:``), a turn left before its end is
    cancelled on the server (see Client.run_turn).
    """

    def __init__(self, client: Client, request: agent_pb2.RunTurnRequest, timeout: Optional[float]) -> None:
        self._c = client
        self._req = request
        self._deadline = None if timeout is None else time.monotonic() + timeout
        self._cancelled = threading.Event()
        #: Why _cancelled is set: "cancelled" or "deadline".
        self._reason: Optional[str] = None
        self._lock = threading.Lock()
        self._call: Optional[grpc.Call] = None
        #: The attempt whose run may go on on the server (its stream open, or
        #: left when the caller closed the generator); 0 otherwise.
        self._live = 0
        #: Timers that drop a cancelled attempt's stream once cancel_timeout
        #: is over.
        self._timers: List[threading.Timer] = []
        self._ended = False
        self._started = False
        #: The WatchTurn calls made to resume broken streams, every attempt's.
        self._reattached = 0
        #: The turn's outcome once the iteration ended; None while it runs or when it failed.
        self.result: Optional[Result] = None
        #: The turn's failure once the iteration ended; None on success or while it runs.
        self.error: Optional[TurnError] = None

    @property
    def id(self) -> str:
        """The turn's id, the caller's or the one the client made."""
        return self._req.turn_id

    def cancel(self) -> None:
        """Cancels the turn on the server, and any retry delay; it returns at once.

        The client calls CancelTurn from a thread of its own; the iteration
        goes on with the events the server sends as it stops the turn (its
        committed messages, its CANCELLED error), for at most the client's
        cancel_timeout, then raises TurnError CANCELLED.
        """
        self._stop("cancelled")

    def close(self) -> None:
        """Cancels the turn on the server if it has not ended, and waits for the answer.

        Bounded by the client's cancel_timeout; it drops the turn's stream
        without reading the events that follow. Nothing after the turn's end.
        ``with turn:`` calls it on leaving the block.
        """
        with self._lock:
            if self._ended:
                return
            if self._reason is None:
                self._reason = "cancelled"
            self._cancelled.set()
            call, n = self._call, self._live
            self._live = 0
        if n and self._c.cancel_timeout > 0:
            self._cancel_on_server(n, self._c.cancel_timeout, None)
        if call is not None:
            call.cancel()

    def __enter__(self) -> "Turn":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _stop(self, reason: str) -> None:
        """Marks the turn cancelled for reason and cancels its running attempt on the server."""
        with self._lock:
            if self._cancelled.is_set():
                return
            self._reason = reason
            self._cancelled.set()
            call, n = self._call, self._live
        if call is not None and n:
            self._cancel_run(call, n)

    def _cancel_run(self, call: grpc.Call, n: int) -> None:
        """Cancels attempt n's run on the server from a thread of its own.

        The stream (call) goes on, so the iteration reads the events the
        server sends as it stops the run; it is dropped when the server keeps
        no turn log (leaving is then what cancels the turn), when the call
        fails, or once cancel_timeout is over.
        """
        wait = self._c.cancel_timeout
        if wait <= 0:
            call.cancel()
            return
        timer = threading.Timer(wait, call.cancel)
        timer.daemon = True
        with self._lock:
            self._timers.append(timer)
        timer.start()

        def run() -> None:
            if not self._cancel_on_server(n, wait, call.is_active):
                call.cancel()

        threading.Thread(target=run, name="turnstile-cancel", daemon=True).start()

    def _cancel_on_server(self, n: int, wait: float, is_open: Optional[Callable[[], bool]]) -> bool:
        """Calls CancelTurn for attempt n for at most wait seconds; reports whether the server holds the run.

        A run not found yet, or a server out of reach, is asked again while
        is_open() holds (the server may not have stored the run yet). False
        when the server keeps no turn log (FAILED_PRECONDITION), has no such
        run, or could not be asked.
        """
        c = self._c
        end = time.monotonic() + wait
        req = agent_pb2.CancelTurnRequest(turn_id=self.id, attempt=n)
        while True:
            try:
                c._stub.CancelTurn(req, timeout=max(end - time.monotonic(), 0.001), metadata=c._metadata)
                return True
            except grpc.RpcError as e:
                code = e.code() if isinstance(e, grpc.Call) else None
                if code in (grpc.StatusCode.FAILED_PRECONDITION, grpc.StatusCode.UNIMPLEMENTED):
                    return False
                if (
                    code in (grpc.StatusCode.NOT_FOUND, grpc.StatusCode.UNAVAILABLE)
                    and is_open is not None
                    and is_open()
                    and time.monotonic() + 0.05 < end
                ):
                    time.sleep(0.05)
                    continue
                if code != grpc.StatusCode.NOT_FOUND:
                    cause = e.details() if isinstance(e, grpc.Call) else str(e)
                    c.logger.info(
                        "turnstile: could not cancel the turn on the server: turn %s, attempt %d (%s)",
                        self.id, n, cause, extra={"turn_id": self.id, "attempt": n, "cause": cause},
                    )
                return False

    def wait(self) -> Result:
        """Runs the turn to its end, dropping its events, and returns its result."""
        for _ in self.events():
            pass
        assert self.result is not None
        return self.result

    def events(self) -> Iterator[Event]:
        """Yields the turn's events as they happen; raises TurnError when the turn fails.

        Closing the generator (breaking out of a for loop) drops the stream
        at once, which leaves the run rather than cancelling it, unless the
        turn is used as a context manager (see Client.run_turn). It may be
        iterated only once.
        """
        if self._started:
            raise RuntimeError("turnstile: the events of a turn can be iterated only once")
        self._started = True
        deadline: Optional[threading.Timer] = None
        if self._deadline is not None:
            deadline = threading.Timer(max(self._deadline - time.monotonic(), 0), self._stop, args=("deadline",))
            deadline.daemon = True
            deadline.start()
        try:
            yield from self._run()
            with self._lock:
                self._ended = True
        except TurnError as e:
            with self._lock:
                self._ended = True
            self.error = e
            raise
        finally:
            if deadline is not None:
                deadline.cancel()
            # A caller that stopped early leaves the run here.
            with self._lock:
                call = self._call
                timers, self._timers = self._timers, []
            for t in timers:
                t.cancel()
            if call is not None:
                call.cancel()

    def _stopped(self, n: int, carried: List[conversation_pb2.Message]) -> TurnError:
        if self._reason == "cancelled":
            te = TurnError(errors_pb2.ERROR_CODE_CANCELLED, "the turn was cancelled")
        else:
            te = TurnError(errors_pb2.ERROR_CODE_DEADLINE_EXCEEDED, "the turn's deadline passed")
        return self._stamp(te, n, carried)

    def _expired(self) -> bool:
        return self._deadline is not None and time.monotonic() >= self._deadline

    def _stamp(self, te: TurnError, n: int, carried: List[conversation_pb2.Message]) -> TurnError:
        te.turn_id, te.attempts, te.messages = self.id, n, list(carried)
        te.reattaches = self._reattached
        return te

    def _run(self) -> Iterator[Event]:
        c = self._c
        carried: List[conversation_pb2.Message] = []
        usage, counters = conversation_pb2.Usage(), agent_pb2.TurnCounters()
        n = 0
        # wire numbers the attempts on the wire: a server with a turn store
        # runs attempt n only after attempt n-1, so an attempt refused before
        # any event (a limit, a server draining) is sent again under its
        # number, the same request, which the server runs or attaches to.
        wire = 1
        while True:
            n += 1
            out = _Outcome()
            # Each attempt's events are yielded as they arrive.
            yield from self._attempt(n, wire, carried, out)
            if out.started:
                wire += 1
            _add_usage(usage, out.usage)
            _add_counters(counters, out.counters)
            if out.completed is not None:
                tc = out.completed
                _add_usage(usage, tc.usage)
                _add_counters(counters, tc.counters)
                self.result = Result(
                    turn_id=self.id,
                    end_reason=tc.end_reason,
                    # Too large for one event, they came in message_completed only.
                    messages=carried + (list(out.committed) if tc.messages_omitted else list(tc.messages)),
                    usage=usage,
                    counters=counters,
                    attempts=n,
                    reattaches=self._reattached,
                )
                return
            fail = out.fail
            assert fail is not None
            carried = carried + out.committed
            kept = standing(carried)
            discard = out.partial or len(kept) < len(carried)
            carried = kept
            self._stamp(fail.err, n, carried)
            if self._cancelled.is_set() or self._expired():
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
            yield Event(
                attempt=n,
                step_retry=StepRetry(
                    attempt=n + 1,
                    max_attempts=c.max_step_retries + 1,
                    delay=delay,
                    error=fail.err,
                    discard_partial=discard,
                    messages=list(carried),
                ),
            )
            if self._cancelled.wait(delay):
                raise self._stopped(n, carried)

    def _start(self, rpc: Callable[..., grpc.Call], request: object, n: int) -> grpc.Call:
        """Starts a streaming call of attempt n that turn.cancel() cancels on the server.

        The call outlives the turn's deadline by cancel_timeout, so the
        events the server sends as it stops the run arrive.
        """
        timeout = None
        if self._deadline is not None:
            timeout = max(self._deadline - time.monotonic(), 0) + self._c.cancel_timeout
        # The header is for servers that predate the attempt field.
        call = rpc(request, timeout=timeout, metadata=self._c._metadata + ((ATTEMPT_HEADER, str(n)),))
        with self._lock:
            self._call, self._live = call, n
            cancelled = self._cancelled.is_set()
        if cancelled:
            self._cancel_run(call, n)
        return call

    def _interrupted(
        self, call: grpc.Call, n: int, wire: int, last_seq: int, carried: List[conversation_pb2.Message], out: _Outcome
    ) -> None:
        """Cancels attempt n (numbered wire on the wire) on the server after a KeyboardInterrupt, and notes the turn's error.

        The interrupted call cannot be read on (grpcio leaves its receive
        pending): it is dropped, and the events the server stored as it
        stopped the run are read with WatchTurn from last_seq, within
        cancel_timeout, without yielding them; turn.error gets the messages
        the turn committed.
        """
        with self._lock:
            self._reason = self._reason or "cancelled"
            self._cancelled.set()
            self._live = 0
        c = self._c
        wait = c.cancel_timeout
        end = time.monotonic() + wait
        held = wait > 0 and self._cancel_on_server(wire, wait, None)
        call.cancel()
        if held:
            watch = agent_pb2.WatchTurnRequest(turn_id=self.id, attempt=wire, after_seq=last_seq)
            try:
                for resp in c._stub.WatchTurn(watch, timeout=max(end - time.monotonic(), 0.001), metadata=c._metadata):
                    if resp.HasField("event"):
                        _observe(resp.event, out)
            except grpc.RpcError:
                pass  # the run's status after its events, or the time is over
        self.error = self._stopped(n, standing(carried + out.committed))
        with self._lock:
            self._ended = True

    def _reattach_wait(self, n: int, last_seq: int, reattach: int, delay: float, err: object) -> bool:
        """Logs re-attach number reattach and waits its delay; reports whether to re-attach now."""
        c = self._c
        cause = "the stream ended without a terminal event" if err is _END else err.details()  # type: ignore[union-attr]
        c.logger.info(
            "turnstile: re-attaching to the turn %s: attempt %d after seq %d, re-attach %d in %.3fs (%s)",
            self.id, n, last_seq, reattach, delay, cause,
            extra={
                "turn_id": self.id, "attempt": n, "after_seq": last_seq,
                "reattach": reattach, "delay": delay, "cause": cause,
            },
        )
        if self._deadline is not None:
            delay = max(min(delay, self._deadline - time.monotonic()), 0)
        return not self._cancelled.wait(delay) and not self._expired()

    def _attempt(self, n: int, wire: int, carried: List[conversation_pb2.Message], out: _Outcome) -> Iterator[Event]:
        """Makes attempt number n, numbered wire on the wire, re-sending carried after the request's messages.

        When the stream breaks before the attempt's last event, it re-attaches
        to the same run with WatchTurn from the last seq received, so the run
        goes on without loss or duplicates; only when that is impossible (the
        server keeps no turn log, or never stored the run) or keeps failing
        does the attempt end with the break.
        """
        c = self._c
        req = agent_pb2.RunTurnRequest()
        req.CopyFrom(self._req)
        req.attempt = wire
        req.messages.extend(carried)
        err_event: Optional[errors_pb2.Error] = None
        last_seq = 0
        broken: object = None  # the break that the current re-attach follows
        broke_at = 0.0  # when it happened, time.monotonic()
        reattaches = 0  # re-attaches since the last event received
        watchable = True
        call = self._start(c._stub.RunTurn, req, wire)
        try:
            while True:
                err: object = _END
                try:
                    try:
                        for resp in call:
                            ev = resp.event
                            if not resp.HasField("event") or (last_seq > 0 and ev.seq <= last_seq):
                                continue
                            last_seq, broken, reattaches, out.started = ev.seq, None, 0, True
                            err_event = _observe(ev, out) or err_event
                            yield Event(attempt=n, agent=ev)
                    except KeyboardInterrupt:
                        self._interrupted(call, n, wire, last_seq, carried, out)
                        raise
                except grpc.RpcError as e:
                    err = e
                    if broken is None and last_seq == 0 and never_connected(e):
                        # The RunTurn never reached the server (as the Go
                        # client's RunTurn that fails before its stream).
                        out.fail = from_status(e)
                        return
                if broken is not None and _no_run(err):
                    # The server keeps no log, or never stored the run: the break stands.
                    watchable, err = False, broken
                if (
                    out.completed is None
                    and err_event is None
                    and watchable
                    and not self._cancelled.is_set()
                    and not self._expired()
                    and _worth_watching(err)
                ):
                    if broken is None:
                        broken, broke_at = err, time.monotonic()
                    delay = c.reattach_backoff.delay(reattaches + 1, c.random())
                    if (
                        c.reattach_timeout <= 0
                        or time.monotonic() - broke_at + delay > c.reattach_timeout
                        or (c.max_reattaches is not None and reattaches >= c.max_reattaches)
                    ):
                        err = broken
                    else:
                        reattaches += 1
                        self._reattached += 1
                        if self._reattach_wait(wire, last_seq, reattaches, delay, err):
                            watch = agent_pb2.WatchTurnRequest(turn_id=self.id, attempt=wire, after_seq=last_seq)
                            call.cancel()
                            call = self._start(c._stub.WatchTurn, watch, wire)
                            continue
                        err = broken
                if (
                    broken is not None
                    and err is not _END
                    and isinstance(err, grpc.Call)
                    and err.code() == grpc.StatusCode.UNAVAILABLE
                    and out.completed is None
                    and err_event is None
                ):
                    # Re-attaching kept failing: report the first break.
                    err = broken
                if out.completed is not None:
                    return
                if err_event is not None:
                    out.fail = from_error_event(err_event)
                    if isinstance(err, grpc.RpcError):
                        st = from_status(err)
                        out.fail.err.status_code, out.fail.err.status = st.err.status_code, st.err.status
                        out.fail.err.__cause__ = err
                elif err is _END:
                    te = TurnError(errors_pb2.ERROR_CODE_UNAVAILABLE, "the stream ended without a terminal event")
                    te.retryable = True
                    out.fail = Failure(err=te, retry=True, transport=True)
                else:
                    assert isinstance(err, grpc.RpcError)
                    out.fail = from_status(err)
                    if broken is not None:
                        # The run was not finished when its stream broke.
                        out.fail.transport = True
                return
        finally:
            with self._lock:
                self._call = None
                if out.completed is not None or out.fail is not None:
                    self._live = 0  # else the caller left the run: close() cancels it
            call.cancel()


#: _END marks a stream that ended without an error status.
_END = object()


def _worth_watching(err: object) -> bool:
    """Reports whether a stream that ended with err before its last event may be resumed by watching the run.

    The transport broke (UNAVAILABLE, or an end without a status), or the
    server said the log or the run's replica is unavailable for now.
    """
    if err is _END:
        return True
    if not isinstance(err, grpc.RpcError):
        return False
    f = from_status(err)
    return f.transport or (f.retry and f.err.code == errors_pb2.ERROR_CODE_UNAVAILABLE)


def _no_run(err: object) -> bool:
    """Reports whether a WatchTurn failed because there is no run to watch.

    The server keeps no log (FAILED_PRECONDITION), predates WatchTurn
    (UNIMPLEMENTED), or never stored the run (NOT_FOUND).
    """
    return isinstance(err, grpc.Call) and err.code() in (
        grpc.StatusCode.FAILED_PRECONDITION,
        grpc.StatusCode.UNIMPLEMENTED,
        grpc.StatusCode.NOT_FOUND,
    )


def _observe(ev: agent_pb2.AgentEvent, out: _Outcome) -> Optional[errors_pb2.Error]:
    """Updates an attempt's outcome with one of its events; returns its error event, if it is one."""
    kind = ev.WhichOneof("payload")
    counters = out.counters
    if kind in ("text_delta", "thinking_delta", "tool_call_delta"):
        out.partial = True
    elif kind == "message_completed":
        out.committed.append(ev.message_completed.message)
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
    elif kind == "compaction" and counters is not None:
        counters.compactions += 1
    elif kind == "hedge" and counters is not None:
        counters.hedges += 1
    elif kind == "usage":
        out.usage = ev.usage
    elif kind == "error":
        return ev.error
    elif kind == "turn_completed":
        out.completed = ev.turn_completed
        # The final attempt's own counters are in TurnCompleted.
        out.usage, out.counters = None, None
    return None


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


def _add_usage(dst: conversation_pb2.Usage, u: Optional[conversation_pb2.Usage]) -> None:
    if u is None:
        return
    dst.input_tokens += u.input_tokens
    dst.output_tokens += u.output_tokens
    dst.cache_read_tokens += u.cache_read_tokens
    dst.cache_write_tokens += u.cache_write_tokens


def _add_counters(dst: agent_pb2.TurnCounters, c: Optional[agent_pb2.TurnCounters]) -> None:
    if c is None:
        return
    dst.model_calls += c.model_calls
    dst.retries += c.retries
    dst.fallbacks += c.fallbacks
    dst.tool_calls += c.tool_calls
    dst.tool_errors += c.tool_errors
    dst.compactions += c.compactions
    dst.hedges += c.hedges


__all__ = [
    "ATTEMPT_HEADER",
    "CANCEL_TIMEOUT",
    "LOGGER",
    "REATTACH_BACKOFF",
    "REATTACH_TIMEOUT",
    "Backoff",
    "Client",
    "Event",
    "Result",
    "StepRetry",
    "Turn",
    "standing",
    "code_name",
]

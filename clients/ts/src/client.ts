import { clone, create, type MessageInitShape } from "@bufbuild/protobuf";
import { Code, ConnectError, createClient, type Client as RpcClient, type Transport } from "@connectrpc/connect";
import { createGrpcTransport } from "@connectrpc/connect-node";
import { randomBytes } from "node:crypto";

import {
  AgentService,
  type AgentEvent,
  ApproveToolCallRequestSchema,
  type ApproveToolCallResponse,
  type CancelTurnRequest,
  type Compaction,
  CancelTurnRequestSchema,
  type WatchTurnRequest,
  WatchTurnRequestSchema,
  type EndReason,
  type RunTurnRequest,
  RunTurnRequestSchema,
  SteerTurnRequestSchema,
  type SteerTurnResponse,
  type ToolApprovalRequested,
  type TurnCompleted,
  type TurnCounters,
  TurnCountersSchema,
} from "./gen/turnstile/v1/agent_pb.js";
import { CostSchema, type Message, Role, type Usage, UsageSchema } from "./gen/turnstile/v1/conversation_pb.js";
import { ErrorCode, type Error as ErrorEvent } from "./gen/turnstile/v1/errors_pb.js";
import { type Failure, TurnError, codeName, fromErrorEvent, fromStatus, transportBreak } from "./errors.js";
import { type LoadBalancing, balancedTransport, parseTarget } from "./balance.js";

/**
 * The request metadata key in which the client numbers its attempts at one
 * turn id, from 1, for servers that predate RunTurnRequest.attempt (the
 * client sends both).
 */
export const ATTEMPT_HEADER = "turnstile-attempt";

/**
 * Backoff describes the jittered exponential delays between step retries
 * when the server gives no delay: retry n (from 1) waits
 * initialMs × multiplier^(n-1), capped at maxMs, then spread uniformly by
 * ± jitter (a fraction).
 */
export interface Backoff {
  initialMs: number;
  maxMs: number;
  multiplier: number;
  jitter: number;
}

/** The default backoff: 1s doubling up to 30s, spread by ±20%. */
export const DEFAULT_BACKOFF: Readonly<Backoff> = { initialMs: 1000, maxMs: 30000, multiplier: 2, jitter: 0.2 };

/** backoffDelay returns the wait before retry n (n >= 1) for the jitter draw u in [0, 1). */
export function backoffDelay(b: Backoff, n: number, u: number): number {
  let d = b.initialMs;
  for (let i = 1; i < n; i++) {
    d *= Math.max(b.multiplier, 1);
    if (b.maxMs > 0 && d >= b.maxMs) break;
  }
  if (b.maxMs > 0) d = Math.min(d, b.maxMs);
  d *= 1 + b.jitter * (2 * u - 1);
  return Math.max(d, 0);
}

/** The default delays before re-attaching to a broken stream: 50 ms doubling up to 1 s, spread by ±20%. */
export const DEFAULT_REATTACH_BACKOFF: Readonly<Backoff> = { initialMs: 50, maxMs: 1000, multiplier: 2, jitter: 0.2 };

/**
 * How long, by default, the client keeps re-attaching to a run whose stream
 * broke: longer than a server process takes to restart plus the store's
 * lease TTL (2 s) with margin, and as long as the server keeps a turn nobody
 * watches (turn.detach_grace, 30 s).
 */
export const DEFAULT_REATTACH_TIMEOUT_MS = 30_000;

/** How long, by default, a turn whose caller aborts it waits for the server to stop it. */
export const DEFAULT_CANCEL_TIMEOUT_MS = 2_000;

/**
 * Logger receives the client's structured log lines: one at info per
 * re-attach ("turnstile: re-attaching to the turn") and one at warn per step
 * retry ("turnstile: retrying turn step"), with the same fields as the Go
 * client's. Node's console is one.
 */
export interface Logger {
  info(message: string, fields: Record<string, unknown>): void;
  warn(message: string, fields: Record<string, unknown>): void;
}

const discardLogger: Logger = { info() {}, warn() {} };

/** Options configure a Client. */
export interface ClientOptions {
  /** How many times a failed step of a turn is run again (default 1; 0 disables step retries). */
  maxStepRetries?: number;
  /**
   * How long the client keeps re-attaching to a run whose stream broke, with
   * WatchTurn from the last seq received, before it gives the attempt up, in
   * ms (default DEFAULT_REATTACH_TIMEOUT_MS, 30 s; 0 never re-attaches). The
   * time counts from the break and starts again with every event received,
   * and when a re-attached stream that stayed open for at least the timeout
   * breaks (it was attached to a quiet run, such as a turn waiting for
   * approval); no re-attach starts once its delay would end past it.
   */
  reattachTimeoutMs?: number;
  /**
   * Also caps how many times in a row the client re-attaches, within
   * reattachTimeoutMs (default: no cap; 0 never re-attaches). The count
   * starts again with every event received.
   *
   * @deprecated A count of tries is no measure of an outage, which is what
   * the client must outlast: use reattachTimeoutMs. maxReattaches still
   * works, as a cap on top of it.
   */
  maxReattaches?: number;
  /**
   * How long the client spends cancelling a turn on the server once its
   * caller aborts it (TurnOptions.signal, or timeoutMs): the CancelTurn call
   * and the events the server sends until its CANCELLED error, the messages
   * the turn committed among them, in ms (default DEFAULT_CANCEL_TIMEOUT_MS,
   * 2 s). With 0 the client does not call CancelTurn: it only drops the
   * stream, which a server with a turn store takes for a detach and goes on
   * running the turn for turn.detach_grace.
   */
  cancelTimeoutMs?: number;
  /** The delays before re-attaching to a broken stream (default DEFAULT_REATTACH_BACKOFF). */
  reattachBackoff?: Backoff;
  /** Receives one line per re-attach and per step retry (default: none). */
  logger?: Logger;
  /** The delays between step retries when the server gives none (default DEFAULT_BACKOFF). */
  backoff?: Backoff;
  /**
   * The longest delay the client waits before a step retry (default 60000 ms).
   * When the server advises a longer wait, the error is thrown at once, with
   * its retryAfterMs, for the caller to decide.
   */
  maxRetryDelayMs?: number;
  /** Headers sent with every RPC, for example an authorization bearer token. */
  headers?: Record<string, string>;
  /**
   * The transport to use instead of the default gRPC-over-HTTP/2 one made
   * from the base URL (for TLS options, interceptors...).
   */
  transport?: Transport;
  /**
   * How calls spread over the addresses the target names (see
   * LoadBalancing): "round_robin" by default for a dns:/// target or a list
   * of addresses, "pick_first" (one connection) for one http(s) URL.
   * "round_robin" on "https://name:port" resolves name to every address.
   */
  loadBalancing?: LoadBalancing;
}

/**
 * Event is one step of a turn as the client sees it: either an event the
 * server sent (agent) or a signal of the client's own (stepRetry). Exactly
 * one of the two is set.
 */
export interface Event {
  /**
   * The client's attempt at the turn that the event belongs to, from 1. The
   * server numbers the events of each attempt (AgentEvent.seq) from 1 again.
   */
  attempt: number;
  /**
   * An event sent by the server. An error event ends an attempt, not
   * necessarily the turn: a stepRetry event or the turn's error follows it.
   */
  agent?: AgentEvent;
  /** The attempt failed and the client runs the failed step again once delayMs has passed. */
  stepRetry?: StepRetry;
}

/** StepRetry is the client's signal that it resumes a failed turn with a new attempt. */
export interface StepRetry {
  /** The number of the attempt about to start, from 2. */
  attempt: number;
  /** The most attempts the client makes at the turn. */
  maxAttempts: number;
  /** How long the client waits before the attempt, in ms. */
  delayMs: number;
  /** The failure of the attempt that ended. */
  error: TurnError;
  /**
   * Output was streamed since the last message that stands (the last of
   * messages, or the turn's start): text, thinking and tool call deltas, and
   * any message committed after it, were never committed and every consumer
   * must drop them. The new attempt streams that step afresh.
   */
  discardPartial: boolean;
  /**
   * The messages the turn committed so far that stand; the new attempt
   * re-sends them after the request's own, so the work they hold (tool
   * results above all) is not done again.
   */
  messages: Message[];
  /**
   * What the new attempt sends: the request's messages and messages, with
   * the compactions the server made applied (see Result.conversation).
   */
  conversation: Message[];
}

/** Result is the outcome of a turn that completed. */
export interface Result {
  turnId: string;
  /** Why the turn ended. */
  endReason: EndReason;
  /**
   * The messages the turn added, across every attempt, in order: append
   * them to the conversation. With TOOL_CALLS_REQUIRED the last one holds
   * the tool calls the caller must run.
   */
  messages: Message[];
  /**
   * The conversation to send in the next turn (followed by its new
   * messages): the request's messages and messages, with each compaction the
   * server made applied (compaction events: what replaces what). When the
   * server compacted the conversation, messages appended to the caller's
   * history would send the whole history again, to be compacted again;
   * conversation is compacted once.
   */
  conversation: Message[];
  /** The tokens used by every attempt, failed ones included. */
  usage: Usage;
  /** What happened in every attempt. */
  counters: TurnCounters;
  /** The number of attempts the client made. */
  attempts: number;
  /**
   * The number of times the client re-attached to a run whose stream broke
   * (WatchTurn calls), across every attempt.
   */
  reattaches: number;
}

/** Decision answers a tool call that waits for approval. */
export interface Decision {
  /** True runs the tool; false denies it. */
  approved: boolean;
  /**
   * Why, at most 4 KiB; a denial's reason is shown to the model in the
   * call's error result.
   */
  reason?: string;
}

/**
 * ApprovalHandler decides a tool call that waits for approval: req is the
 * tool_approval_requested event's payload (call id, tool name, JSON
 * arguments, preview). signal aborts when the turn is cancelled.
 */
export type ApprovalHandler = (req: ToolApprovalRequested, signal: AbortSignal) => Decision | Promise<Decision>;

/** Options of one turn. */
export interface TurnOptions {
  /** Aborting it cancels the turn, retries and their delays included. */
  signal?: AbortSignal;
  /** A deadline for the whole turn, retries included, in ms. */
  timeoutMs?: number;
  /**
   * Answers every tool_approval_requested event of the turn: the client
   * calls it after yielding the event and sends its decision with
   * ApproveToolCall (default: none; answer with Turn.approve or
   * Client.approveToolCall, or the server's approval timeout denies the
   * call). It is called once per call id and attempt: not for a request the
   * server emits again (after a replica took the turn over) nor for one
   * whose tool_approval_decided event was already received. The turn waits
   * while it runs. When it throws, or the decision cannot be delivered (any
   * error but FAILED_PRECONDITION, which says the run has ended), the client
   * cancels the turn: it fails CANCELLED with that error as its cause.
   */
  onApproval?: ApprovalHandler;
}

/** Options of a single call (approveToolCall, steerTurn). */
export interface CallOptions {
  /** Aborting it abandons the call. */
  signal?: AbortSignal;
}

/**
 * Client runs turns on a turnstile server over gRPC. baseUrl is
 * "http://host:port" for plaintext (h2c) or "https://host:port" for TLS;
 * "dns:///host:port" is TLS to every address host resolves to, round robin
 * (as the Go client's target; see parseTarget).
 */
export class Client {
  private readonly rpc: RpcClient<typeof AgentService>;
  readonly maxStepRetries: number;
  readonly backoff: Backoff;
  readonly maxRetryDelayMs: number;
  readonly reattachTimeoutMs: number;
  /** @deprecated See ClientOptions.maxReattaches. */
  readonly maxReattaches: number;
  readonly reattachBackoff: Backoff;
  readonly cancelTimeoutMs: number;
  /** @internal */
  readonly logger: Logger;
  private readonly headers: Record<string, string>;
  /** The jitter draw; replaceable in tests. */
  random: () => number = Math.random;

  constructor(baseUrl: string, options: ClientOptions = {}) {
    this.maxStepRetries = options.maxStepRetries ?? 1;
    this.backoff = options.backoff ?? { ...DEFAULT_BACKOFF };
    this.maxRetryDelayMs = options.maxRetryDelayMs ?? 60_000;
    this.reattachTimeoutMs = options.reattachTimeoutMs ?? DEFAULT_REATTACH_TIMEOUT_MS;
    this.maxReattaches = options.maxReattaches ?? Infinity;
    this.cancelTimeoutMs = options.cancelTimeoutMs ?? DEFAULT_CANCEL_TIMEOUT_MS;
    this.reattachBackoff = options.reattachBackoff ?? { ...DEFAULT_REATTACH_BACKOFF };
    this.logger = options.logger ?? discardLogger;
    this.headers = { ...options.headers };
    if (!Number.isInteger(this.maxStepRetries) || this.maxStepRetries < 0) {
      throw new RangeError("turnstile: maxStepRetries must be a non-negative integer");
    }
    if (options.maxReattaches !== undefined && (!Number.isInteger(this.maxReattaches) || this.maxReattaches < 0)) {
      throw new RangeError("turnstile: maxReattaches must be a non-negative integer");
    }
    for (const [name, v] of [
      ["reattachTimeoutMs", this.reattachTimeoutMs],
      ["cancelTimeoutMs", this.cancelTimeoutMs],
    ] as const) {
      if (!Number.isFinite(v) || v < 0) throw new RangeError(`turnstile: ${name} must be a non-negative number`);
    }
    for (const b of [this.backoff, this.reattachBackoff]) {
      if (b.initialMs < 0 || b.maxMs < 0 || b.jitter < 0 || b.jitter > 1) {
        throw new RangeError("turnstile: invalid backoff");
      }
    }
    let transport = options.transport;
    if (!transport) {
      const target = parseTarget(baseUrl);
      const balancing = options.loadBalancing ?? target.balancing;
      if (balancing !== "pick_first" && balancing !== "round_robin") {
        throw new RangeError("turnstile: loadBalancing must be pick_first or round_robin");
      }
      if (balancing === "pick_first" && target.hosts.length > 1) {
        throw new RangeError("turnstile: pick_first takes one address; a list of them needs round_robin");
      }
      transport =
        balancing === "round_robin" || baseUrl.startsWith("dns:")
          ? balancedTransport({ ...target, balancing })
          : createGrpcTransport({ baseUrl });
    }
    this.rpc = createClient(AgentService, transport);
  }

  /**
   * runTurn prepares one turn of req; it runs as the caller iterates over
   * Turn.events() (or awaits Turn.wait()).
   *
   * When req has no turnId the client makes one, so every attempt shares it.
   * Each attempt is a run of its own on the server, named by the turn id and
   * its number (RunTurnRequest.attempt, and the turnstile-attempt metadata
   * for older servers).
   *
   * A stream that breaks before the attempt's last event (a connection
   * reset, a replica that went away) is first resumed, not retried: the
   * client re-attaches to the same run with WatchTurn from the seq of the
   * last event it received, for up to reattachTimeoutMs (30 s) from the
   * break, and the iteration goes on with the next event; nothing is run
   * again and no event is repeated: a server restarting, or a replica taking
   * the turn over, is outlasted. This needs a server with a turn store; a server without one
   * (WatchTurn answers FAILED_PRECONDITION), or one that never stored the run
   * (NOT_FOUND), makes the break stand. A call that never reached the server
   * (it could not connect) is not re-attached.
   *
   * An attempt that ends with an error event whose retryable is true, or
   * whose break stands with UNAVAILABLE, is followed by a stepRetry event
   * and a new attempt, up to maxStepRetries, after the server's retry delay
   * or else the client's jittered backoff. The new attempt resumes the turn:
   * its request carries req's messages plus the messages the failed attempts
   * committed (message_completed events). An error whose retryable is false
   * or unset is thrown at once; so is a break that stands while server-side
   * tools were running, as they may have had effects. req is not modified.
   *
   * Cancelling and leaving differ. Aborting options.signal (or reaching
   * options.timeoutMs) cancels the turn on the server: the client calls
   * CancelTurn for the running attempt and keeps reading its stream until
   * the server's CANCELLED error event, for at most cancelTimeoutMs (2 s);
   * the server stops the model call and tools and sends, before that event,
   * message_completed events for what the turn had (the partial reply, a
   * "cancelled by the user" result for every tool call that did not run, an
   * interruption note). The iteration yields them, then throws a TurnError
   * with code CANCELLED (or DEADLINE_EXCEEDED) whose messages hold every
   * message the turn committed: append them to the conversation and the next
   * turn continues from it. A server without a turn store answers CancelTurn
   * FAILED_PRECONDITION; there dropping the stream is what cancels the turn.
   * Breaking out of the loop without aborting only drops the stream: a
   * server with a turn store keeps running the turn for turn.detach_grace
   * (30 s), as it does when the process dies. To stop a turn and leave the
   * loop, abort the signal, then break.
   */
  runTurn(req: MessageInitShape<typeof RunTurnRequestSchema>, options: TurnOptions = {}): Turn {
    const r = clone(RunTurnRequestSchema, create(RunTurnRequestSchema, req));
    if (!r.turnId) r.turnId = randomBytes(16).toString("hex");
    return new Turn(this, r, options);
  }

  /** @internal */
  stream(req: RunTurnRequest, signal: AbortSignal): AsyncIterable<{ event?: AgentEvent }> {
    // The header is for servers that predate the attempt field.
    return this.rpc.runTurn(req, { signal, headers: { ...this.headers, [ATTEMPT_HEADER]: String(req.attempt) } });
  }

  /** @internal */
  watch(req: WatchTurnRequest, signal: AbortSignal): AsyncIterable<{ event?: AgentEvent }> {
    return this.rpc.watchTurn(req, { signal, headers: this.headers });
  }

  /** @internal */
  async cancel(req: CancelTurnRequest, signal: AbortSignal): Promise<void> {
    await this.rpc.cancelTurn(req, { signal, headers: this.headers });
  }

  /**
   * approveToolCall decides a tool call that waits for approval (a
   * tool_approval_requested event of the turn req.turnId, attempt
   * req.attempt, 0 meaning the latest). It may be called from anywhere, on
   * any replica: the decision is stored in the turn's log before the call
   * returns. Deciding a call already decided changes nothing: the
   * response's applied is false and approved gives the decision that
   * stands. A call the transport failed (UNAVAILABLE, or a connection cut
   * under it, whose answer may have been lost after the decision was
   * stored) is made again, as a decision may be sent twice, with the
   * re-attach backoff for up to
   * reattachTimeoutMs. Other errors are thrown as ConnectError:
   * INVALID_ARGUMENT, NOT_FOUND (no such run, or it never asked about the
   * call), FAILED_PRECONDITION (the run ended first), PERMISSION_DENIED
   * (another client key's turn).
   */
  async approveToolCall(
    req: MessageInitShape<typeof ApproveToolCallRequestSchema>,
    options: CallOptions = {},
  ): Promise<ApproveToolCallResponse> {
    const r = create(ApproveToolCallRequestSchema, req);
    const signal = options.signal ?? new AbortController().signal;
    const start = Date.now();
    for (let n = 1; ; n++) {
      try {
        return await this.rpc.approveToolCall(r, { signal, headers: this.headers });
      } catch (e) {
        // A connection cut under the call is UNAVAILABLE (transportBreak):
        // the decision may have been stored, and sending it again is safe.
        const code = transportBreak(e, signal) ? Code.Unavailable : ConnectError.from(e).code;
        if (code !== Code.Unavailable || signal.aborted) throw e;
        const delay = backoffDelay(this.reattachBackoff, n, this.random());
        if (Date.now() - start + delay > this.reattachTimeoutMs || !(await sleep(delay, signal))) throw e;
      }
    }
  }

  /**
   * steerTurn gives a running turn a user message (role user or unset, text
   * parts only), which the turn takes at its next step boundary: see
   * AgentService.SteerTurn. The request goes as it is, once: after
   * UNAVAILABLE or DEADLINE_EXCEEDED the message may or may not have been
   * queued. Send it again with the same req.requestId to have it taken once
   * (the response's duplicate says it was taken already), or use
   * Turn.steer, which does so. Errors are thrown as ConnectError:
   * INVALID_ARGUMENT, NOT_FOUND (no such run),
   * FAILED_PRECONDITION (the run has ended), RESOURCE_EXHAUSTED (too many
   * messages queued).
   */
  async steerTurn(req: MessageInitShape<typeof SteerTurnRequestSchema>, options: CallOptions = {}): Promise<SteerTurnResponse> {
    return await this.rpc.steerTurn(create(SteerTurnRequestSchema, req), { signal: options.signal, headers: this.headers });
  }
}

/** What one attempt left behind. */
interface AttemptOutcome {
  completed?: TurnCompleted;
  fail?: Failure;
  /** The messages the attempt committed, in order. */
  committed: Message[];
  /**
   * The conversation the attempt sent, followed by the messages it
   * committed, with its compactions applied.
   */
  conv: Message[];
  /** A compaction could not be applied (its replacement was omitted): the later ones are not either. */
  frozen: boolean;
  /** Output streamed since the last commit. */
  partial: boolean;
  /** Server-side tools started since the last commit. */
  toolsRunning: string[];
  usage?: Usage;
  counters?: TurnCounters;
  /** The attempt received an event: the server stored its run. */
  started: boolean;
  /** The call ids whose approval was requested: a request a takeover emitted again counts once. */
  asked?: Set<string>;
}

/**
 * Turn is a turn started by Client.runTurn. Iterate over events() once to
 * run it, then read result or error.
 */
export class Turn {
  /** The turn's outcome once the iteration ended; undefined while it runs or when it failed. */
  result?: Result;
  /** The turn's failure once the iteration ended; undefined on success or while it runs. */
  error?: TurnError;
  private started = false;
  /** The WatchTurn calls made to resume broken streams, every attempt's. */
  private reattached = 0;
  /** The attempt on the wire whose events the turn yields; 0 before its first event. */
  private wire = 0;
  /** The approval requests answered or seen decided, as "wire/callId". */
  private readonly answered = new Set<string>();
  /** Cancels the turn while it runs. */
  private turnCtl?: AbortController;
  /** What the next attempt sends: the request's messages and those carried, compacted as the server said. */
  private conv: Message[] = [];

  /** @internal */
  constructor(
    private readonly client: Client,
    private readonly req: RunTurnRequest,
    private readonly options: TurnOptions,
  ) {}

  /** The turn's id, the caller's or the one the client made. */
  get id(): string {
    return this.req.turnId;
  }

  /**
   * steer sends text to the running turn as a user message, with
   * Client.steerTurn, for the attempt whose events the turn yields, and has
   * the turn take it once: the request carries a fresh random requestId,
   * and a call that fails with UNAVAILABLE (a connection cut, the turn's
   * replica gone and another taking it over) or DEADLINE_EXCEEDED is made
   * again with the same id, with the re-attach backoff for up to
   * reattachTimeoutMs, until options.signal aborts. Before the turn's first
   * event it throws: its run may not be stored yet.
   */
  async steer(text: string, options: CallOptions = {}): Promise<SteerTurnResponse> {
    if (this.wire === 0) throw new Error("turnstile: the turn has not started");
    const req = {
      turnId: this.id,
      attempt: this.wire,
      message: { role: Role.USER, parts: [{ kind: { case: "text" as const, value: text } }] },
      requestId: randomBytes(16).toString("hex"),
    };
    const signal = options.signal ?? new AbortController().signal;
    const c = this.client;
    const start = Date.now();
    for (let n = 1; ; n++) {
      try {
        return await c.steerTurn(req, { signal });
      } catch (e) {
        // A connection cut under the call is UNAVAILABLE (transportBreak).
        const code = transportBreak(e, signal) ? Code.Unavailable : ConnectError.from(e).code;
        if ((code !== Code.Unavailable && code !== Code.DeadlineExceeded) || signal.aborted) throw e;
        const delay = backoffDelay(c.reattachBackoff, n, c.random());
        if (Date.now() - start + delay > c.reattachTimeoutMs || !(await sleep(delay, signal))) throw e;
      }
    }
  }

  /**
   * approve decides the tool call callId of the attempt whose events the
   * turn yields, with Client.approveToolCall, and returns whether this
   * decision was taken (false: the call had been decided already).
   */
  async approve(callId: string, decision: Decision, options: CallOptions = {}): Promise<boolean> {
    if (this.wire === 0) throw new Error("turnstile: the turn has not started");
    const resp = await this.client.approveToolCall(
      { turnId: this.id, attempt: this.wire, callId, approved: decision.approved, reason: decision.reason ?? "" },
      options,
    );
    return resp.applied;
  }

  /**
   * answerApproval calls the turn's approval handler for a request of
   * attempt wire not answered or seen decided, and sends its decision; a
   * failure cancels the turn with the failure as its cause.
   */
  private async answerApproval(wire: number, req: ToolApprovalRequested, signal: AbortSignal): Promise<void> {
    const handler = this.options.onApproval;
    const key = `${wire}/${req.callId}`;
    if (!handler || this.answered.has(key)) return;
    this.answered.add(key);
    try {
      const d = await handler(req, signal);
      try {
        await this.client.approveToolCall(
          { turnId: this.id, attempt: wire, callId: req.callId, approved: d.approved, reason: d.reason ?? "" },
          { signal },
        );
      } catch (e) {
        // FAILED_PRECONDITION: the run ended first; its stream says how.
        if (ConnectError.from(e).code !== Code.FailedPrecondition) throw e;
      }
    } catch (e) {
      if (signal.aborted) return;
      this.client.logger.warn("turnstile: cancelling the turn: its approval failed", {
        turn_id: this.id,
        attempt: wire,
        call_id: req.callId,
        cause: e instanceof Error ? e.message : String(e),
      });
      this.turnCtl?.abort(e);
    }
  }

  /**
   * events yields the turn's events as they happen and throws a TurnError
   * when the turn fails. Breaking out of the loop drops the stream at once,
   * which leaves the run rather than cancelling it (see Client.runTurn).
   * It may be iterated only once.
   */
  async *events(): AsyncGenerator<Event, Result, undefined> {
    if (this.started) throw new Error("turnstile: the events of a turn can be iterated only once");
    this.started = true;
    const turnCtl = new AbortController();
    this.turnCtl = turnCtl;
    const onAbort = () => turnCtl.abort(this.options.signal?.reason);
    this.options.signal?.addEventListener("abort", onAbort, { once: true });
    if (this.options.signal?.aborted) onAbort();
    let deadline: ReturnType<typeof setTimeout> | undefined;
    let timedOut = false;
    const deadlineAt = this.options.timeoutMs !== undefined ? Date.now() + this.options.timeoutMs : undefined;
    if (this.options.timeoutMs !== undefined) {
      deadline = setTimeout(() => {
        timedOut = true;
        turnCtl.abort(new Error("deadline"));
      }, this.options.timeoutMs);
    }
    const cancelled = (n: number, carried: Message[]): TurnError => {
      const te = timedOut
        ? new TurnError(ErrorCode.DEADLINE_EXCEEDED, "the turn's deadline passed")
        : new TurnError(ErrorCode.CANCELLED, "the turn was cancelled", { cause: turnCtl.signal.reason });
      return this.stamp(te, n, carried);
    };
    try {
      const c = this.client;
      let carried: Message[] = [];
      this.conv = [...this.req.messages];
      const usage = create(UsageSchema);
      const counters = create(TurnCountersSchema);
      // wire numbers the attempts on the wire: a server with a turn store
      // runs attempt n only after attempt n-1, so an attempt refused before
      // any event (a limit, a server draining) is sent again under its
      // number, the same request, which the server runs or attaches to.
      let wire = 1;
      for (let n = 1; ; n++) {
        const out: AttemptOutcome = { committed: [], conv: [...this.conv], frozen: false, partial: false, toolsRunning: [], started: false };
        // Each attempt's events are yielded as they arrive.
        yield* this.attempt(n, wire, turnCtl.signal, out);
        if (out.started) wire++;
        addUsage(usage, out.usage);
        addCounters(counters, out.counters);
        if (out.completed) {
          const tc = out.completed;
          addUsage(usage, tc.usage);
          addCounters(counters, tc.counters);
          this.result = {
            turnId: this.id,
            endReason: tc.endReason,
            // Too large for one event, they came in message_completed only.
            messages: [...carried, ...(tc.messagesOmitted ? out.committed : tc.messages)],
            conversation: out.conv,
            usage,
            counters,
            attempts: n,
            reattaches: this.reattached,
          };
          return this.result;
        }
        const fail = out.fail!;
        carried = [...carried, ...out.committed];
        const kept = standing(carried);
        const discard = out.partial || kept.length < carried.length;
        // A dropped trailing message is the conversation's last too: compactions keep it.
        this.conv = kept.length < carried.length ? out.conv.slice(0, -1) : out.conv;
        carried = kept;
        this.stamp(fail.err, n, carried);
        if (turnCtl.signal.aborted) {
          // The caller cancelled the turn: the messages the server committed
          // as it stopped it stand, for the next turn.
          const te = cancelled(n, carried);
          te.status = fail.err.status;
          throw te;
        }
        if (fail.transport && out.toolsRunning.length > 0) {
          // The server may have run them: resuming could run them again.
          fail.err.code = ErrorCode.TOOLS_UNSAFE;
          fail.err.message = `${fail.err.message}; the connection broke while the tools ${out.toolsRunning.join(", ")} were running, check their effects before running the turn again`;
          fail.err.retryable = false;
          fail.retry = false;
        }
        if (!fail.retry || n > c.maxStepRetries) throw fail.err;
        let delay = fail.err.retryAfterMs;
        if (delay <= 0) delay = backoffDelay(c.backoff, n, c.random());
        if (delay > c.maxRetryDelayMs) throw fail.err;
        if (deadlineAt !== undefined && deadlineAt - Date.now() <= delay) throw fail.err;
        c.logger.warn("turnstile: retrying turn step", {
          turn_id: this.id,
          attempt: n + 1,
          code: codeName(fail.err.code),
          delay_ms: delay,
          transport: fail.transport,
          messages_carried: carried.length,
          message: fail.err.message,
        });
        yield {
          attempt: n,
          stepRetry: {
            attempt: n + 1,
            maxAttempts: c.maxStepRetries + 1,
            delayMs: delay,
            error: fail.err,
            discardPartial: discard,
            messages: [...carried],
            conversation: [...this.conv],
          },
        };
        if (!(await sleep(delay, turnCtl.signal))) throw cancelled(n, carried);
      }
    } catch (e) {
      if (e instanceof TurnError) this.error = e;
      throw e;
    } finally {
      clearTimeout(deadline);
      this.options.signal?.removeEventListener("abort", onAbort);
      // A caller that broke out of the loop leaves the run here.
      turnCtl.abort(new Error("iteration stopped before the turn ended"));
    }
  }

  /** wait runs the turn to its end, dropping its events, and returns its result. */
  async wait(): Promise<Result> {
    for await (const _ of this.events()) {
      // Dropped.
    }
    return this.result!;
  }

  private stamp(te: TurnError, n: number, carried: Message[]): TurnError {
    te.turnId = this.id;
    te.attempts = n;
    te.reattaches = this.reattached;
    te.messages = [...carried];
    te.conversation = [...this.conv];
    return te;
  }

  /**
   * attempt makes attempt number n at the turn, sending out.conv (the
   * request's messages and those earlier attempts committed, compacted),
   * yields its events and fills out. When the stream
   * breaks before the attempt's last event, it re-attaches to the same run
   * with WatchTurn from the last seq received, so the run goes on without
   * loss or duplicates; only when that is impossible (the server keeps no
   * turn log, or never stored the run) or keeps failing does the attempt end
   * with the break. wire is the attempt's number on the wire.
   */
  private async *attempt(n: number, wire: number, turnSignal: AbortSignal, out: AttemptOutcome): AsyncGenerator<Event> {
    const c = this.client;
    // The stream outlives turnSignal by up to cancelTimeoutMs: once the
    // caller cancels, the client asks the server to stop the run and reads
    // the events it sends as it does, then drops the stream.
    const ctl = new AbortController();
    let cancelling: Promise<void> | undefined;
    let dropTimer: ReturnType<typeof setTimeout> | undefined;
    const onAbort = () => {
      if (c.cancelTimeoutMs <= 0) {
        ctl.abort(turnSignal.reason);
        return;
      }
      dropTimer = setTimeout(() => ctl.abort(turnSignal.reason), c.cancelTimeoutMs);
      cancelling = this.cancelOnServer(wire, ctl, turnSignal.reason);
    };
    turnSignal.addEventListener("abort", onAbort, { once: true });
    if (turnSignal.aborted) {
      // Cancelled before it began: no run to start, none to cancel.
      turnSignal.removeEventListener("abort", onAbort);
      out.fail = fromStatus(new ConnectError("the turn was cancelled", Code.Canceled));
      return;
    }
    const req = clone(RunTurnRequestSchema, this.req);
    req.attempt = wire;
    req.messages = [...out.conv];
    out.counters = create(TurnCountersSchema);
    let errEvent: ErrorEvent | undefined;
    let lastSeq = 0n;
    let broken: unknown; // the break that the current re-attach follows
    let brokeAt = 0; // when it happened, in ms since the epoch
    let watchedAt = 0; // when the current re-attach's WatchTurn began
    let reattaches = 0; // re-attaches since the last event received
    let watchable = true;
    let stream = c.stream(req, ctl.signal);
    try {
      for (;;) {
        let err: unknown = END;
        try {
          for await (const resp of stream) {
            const ev = resp.event;
            if (!ev || (lastSeq > 0n && ev.seq <= lastSeq)) continue;
            lastSeq = ev.seq;
            out.started = true;
            this.wire = wire;
            broken = undefined;
            reattaches = 0;
            observe(ev, out, (e) => (errEvent = e));
            if (ev.payload.case === "toolApprovalDecided") this.answered.add(`${wire}/${ev.payload.value.callId}`);
            yield { attempt: n, agent: ev };
            if (ev.payload.case === "toolApprovalRequested") await this.answerApproval(wire, ev.payload.value, turnSignal);
          }
        } catch (e) {
          const b = transportBreak(e, ctl.signal);
          err = b?.err ?? e;
          if (b && !b.connected && broken === undefined && lastSeq === 0n) {
            // The RunTurn never reached the server (as the Go client's
            // RunTurn that fails before its stream): nothing to watch.
            out.fail = fromStatus(err);
            return;
          }
        }
        if (broken !== undefined && noRun(err)) {
          // The server keeps no log, or never stored the run: the break stands.
          watchable = false;
          err = broken;
        }
        if (!out.completed && !errEvent && watchable && !turnSignal.aborted && !ctl.signal.aborted && worthWatching(err)) {
          if (broken !== undefined && Date.now() - watchedAt >= c.reattachTimeoutMs) {
            // The re-attached stream stayed open longer than any failing
            // call lasts: it was attached to a quiet run (a turn waiting for
            // approval, a long tool), and this is a break of its own.
            broken = undefined;
            reattaches = 0;
          }
          if (broken === undefined) {
            broken = err;
            brokeAt = Date.now();
          }
          const delay = backoffDelay(c.reattachBackoff, reattaches + 1, c.random());
          if (c.reattachTimeoutMs > 0 && Date.now() - brokeAt + delay <= c.reattachTimeoutMs && reattaches < c.maxReattaches) {
            reattaches++;
            this.reattached++;
            c.logger.info("turnstile: re-attaching to the turn", {
              turn_id: this.id,
              attempt: wire,
              after_seq: lastSeq,
              reattach: reattaches,
              delay_ms: delay,
              cause: err === END ? "the stream ended without a terminal event" : ConnectError.from(err).rawMessage,
            });
            if (await sleep(delay, turnSignal)) {
              watchedAt = Date.now();
              const w = create(WatchTurnRequestSchema, { turnId: this.id, attempt: wire, afterSeq: lastSeq });
              stream = c.watch(w, ctl.signal);
              continue;
            }
          }
          err = broken;
        }
        if (broken !== undefined && err !== END && !out.completed && !errEvent && ConnectError.from(err).code === Code.Unavailable) {
          // Re-attaching kept failing: report the first break.
          err = broken;
        }
        if (out.completed) return;
        if (errEvent) {
          out.fail = fromErrorEvent(errEvent);
          if (err !== END) {
            const st = fromStatus(err);
            out.fail.err.status = st.err.status;
            out.fail.err.cause = err;
          }
        } else if (err === END) {
          out.fail = {
            retry: true,
            transport: true,
            err: Object.assign(new TurnError(ErrorCode.UNAVAILABLE, "the stream ended without a terminal event"), {
              retryable: true,
            }),
          };
        } else {
          out.fail = fromStatus(err);
          // The run was not finished when its stream broke.
          if (broken !== undefined) out.fail.transport = true;
        }
        return;
      }
    } finally {
      turnSignal.removeEventListener("abort", onAbort);
      ctl.abort();
      await cancelling;
      clearTimeout(dropTimer);
    }
  }

  /**
   * cancelOnServer calls CancelTurn for attempt n, within cancelTimeoutMs,
   * asking again while the run is not found yet (the server may not have
   * stored it) or the server is unreachable, until the stream ctl governs
   * ends. When the server keeps no turn log (FAILED_PRECONDITION), or the
   * call fails, it drops the stream: leaving is then what cancels the turn.
   * When the server cancelled the run, or found it ended, the stream brings
   * its last events.
   */
  private async cancelOnServer(n: number, ctl: AbortController, reason: unknown): Promise<void> {
    const c = this.client;
    const deadline = AbortSignal.timeout(c.cancelTimeoutMs);
    const req = create(CancelTurnRequestSchema, { turnId: this.id, attempt: n });
    for (;;) {
      try {
        await c.cancel(req, deadline);
        return;
      } catch (e) {
        const code = ConnectError.from(e).code;
        if ((code === Code.NotFound || code === Code.Unavailable) && !ctl.signal.aborted && (await sleep(50, deadline))) continue;
        if (code !== Code.FailedPrecondition && code !== Code.Unimplemented && code !== Code.NotFound) {
          c.logger.info("turnstile: could not cancel the turn on the server", {
            turn_id: this.id,
            attempt: n,
            cause: ConnectError.from(e).rawMessage,
          });
        }
        ctl.abort(reason);
        return;
      }
    }
  }
}

/** END marks a stream that ended without an error status. */
const END = Symbol("end of stream");

/**
 * worthWatching reports whether a stream that ended with err before its
 * last event may be resumed by watching the run: the transport broke
 * (UNAVAILABLE, or an end without a status), or the server said the log or
 * the run's replica is unavailable for now.
 */
function worthWatching(err: unknown): boolean {
  if (err === END) return true;
  const f = fromStatus(err);
  return f.transport || (f.retry && f.err.code === ErrorCode.UNAVAILABLE);
}

/**
 * noRun reports whether a WatchTurn failed because there is no run to
 * watch: the server keeps no log (FAILED_PRECONDITION), predates WatchTurn
 * (UNIMPLEMENTED), or never stored the run (NOT_FOUND).
 */
function noRun(err: unknown): boolean {
  if (err === END) return false;
  const code = ConnectError.from(err).code;
  return code === Code.FailedPrecondition || code === Code.Unimplemented || code === Code.NotFound;
}

/** observe updates an attempt's outcome with one of its events. */
function observe(ev: AgentEvent, out: AttemptOutcome, onError: (e: ErrorEvent) => void): void {
  const p = ev.payload;
  switch (p.case) {
    case "textDelta":
    case "thinkingDelta":
    case "toolCallDelta":
      out.partial = true;
      break;
    case "messageCompleted":
      if (p.value.message) {
        out.committed.push(p.value.message);
        out.conv.push(p.value.message);
      }
      out.partial = false;
      out.toolsRunning = [];
      break;
    case "toolStarted":
      out.toolsRunning.push(p.value.name);
      break;
    case "toolFinished":
      out.counters!.toolCalls++;
      if (p.value.isError) out.counters!.toolErrors++;
      break;
    case "llmCallStarted":
      out.counters!.modelCalls++;
      break;
    case "retry":
      out.counters!.retries++;
      if (p.value.discardPartial) out.partial = false; // the server told consumers to drop it
      break;
    case "fallback":
      out.counters!.fallbacks++;
      if (p.value.discardPartial) out.partial = false;
      break;
    case "compaction":
      out.counters!.compactions++;
      if (!out.frozen) {
        const applied = applyCompaction(out.conv, p.value);
        if (applied) out.conv = applied;
        else out.frozen = true;
      }
      break;
    case "hedge":
      out.counters!.hedges++;
      break;
    case "toolApprovalRequested":
      out.asked ??= new Set();
      if (!out.asked.has(p.value.callId)) out.counters!.approvalsRequested++;
      out.asked.add(p.value.callId);
      break;
    case "toolApprovalDecided":
      if (!p.value.approved) out.counters!.approvalsDenied++;
      break;
    case "steered":
      out.counters!.steered++;
      break;
    case "usage":
      out.usage = p.value;
      break;
    case "error":
      onError(p.value);
      break;
    case "turnCompleted":
      out.completed = p.value;
      // The final attempt's own counters are in TurnCompleted.
      out.usage = undefined;
      out.counters = undefined;
      break;
  }
}

/**
 * applyCompaction applies a compaction event to conv, the conversation it
 * indexes (the request's messages followed by the messages the turn
 * committed before the event, as earlier compactions left it): the
 * replacedCount messages from replacedFrom are replaced by replacement. It
 * returns the new conversation (conv is not changed), or undefined when the
 * event cannot be applied (its replacement was omitted for its size, or its
 * range is outside conv); the turn's later compactions cannot be applied
 * then either. A Turn applies them already (Result.conversation); this is
 * for callers that follow a turn's events themselves (WatchTurn).
 */
export function applyCompaction(conv: Message[], c: Compaction): Message[] | undefined {
  const from = c.replacedFrom;
  const end = from + c.replacedCount;
  if (c.replacementOmitted || end > conv.length) return undefined;
  return [...conv.slice(0, from), ...c.replacement, ...conv.slice(end)];
}

/**
 * standing returns the prefix of the committed messages that a new attempt
 * can resume from: a trailing assistant message whose tool calls have no
 * results is dropped, since the step that runs them has to be made again.
 */
export function standing(msgs: Message[]): Message[] {
  const last = msgs[msgs.length - 1];
  if (!last || last.role !== Role.ASSISTANT) return msgs;
  return last.parts.some((p) => p.kind.case === "toolCall") ? msgs.slice(0, -1) : msgs;
}

function addUsage(dst: Usage, u: Usage | undefined): void {
  if (!u) return;
  // Costs add up exactly; tokens of unknown cost beside a known cost make
  // the sum partial, and without any known cost there is none.
  const used = (x: Usage) =>
    x.inputTokens + x.outputTokens + x.cacheReadTokens + x.cacheWriteTokens !== 0n;
  const unpricedBefore = dst.cost === undefined && used(dst);
  const unpricedNow = u.cost === undefined && used(u);
  dst.inputTokens += u.inputTokens;
  dst.outputTokens += u.outputTokens;
  dst.cacheReadTokens += u.cacheReadTokens;
  dst.cacheWriteTokens += u.cacheWriteTokens;
  if (u.cost !== undefined) {
    const c = dst.cost ?? create(CostSchema, { currency: u.cost.currency });
    const nanos = c.nanos + u.cost.nanos;
    c.units += u.cost.units + BigInt(Math.floor(nanos / 1e9));
    c.nanos = nanos % 1e9;
    dst.cost = c;
    dst.costPartial = dst.costPartial || u.costPartial || unpricedBefore;
  } else if (unpricedNow && dst.cost !== undefined) {
    dst.costPartial = true;
  }
}

function addCounters(dst: TurnCounters, c: TurnCounters | undefined): void {
  if (!c) return;
  dst.modelCalls += c.modelCalls;
  dst.retries += c.retries;
  dst.fallbacks += c.fallbacks;
  dst.toolCalls += c.toolCalls;
  dst.toolErrors += c.toolErrors;
  dst.compactions += c.compactions;
  dst.hedges += c.hedges;
  dst.approvalsRequested += c.approvalsRequested;
  dst.approvalsDenied += c.approvalsDenied;
  dst.steered += c.steered;
}

/** sleep waits ms or until signal aborts; it reports whether the wait ran out. */
function sleep(ms: number, signal: AbortSignal): Promise<boolean> {
  if (signal.aborted) return Promise.resolve(false);
  return new Promise((resolve) => {
    const done = (ok: boolean) => {
      clearTimeout(timer);
      signal.removeEventListener("abort", onAbort);
      resolve(ok);
    };
    const onAbort = () => done(false);
    const timer = setTimeout(() => done(true), ms);
    signal.addEventListener("abort", onAbort, { once: true });
  });
}

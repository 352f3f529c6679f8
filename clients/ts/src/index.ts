/**
 * The TypeScript client of turnstile.v1.AgentService. A Client runs agent
 * turns with runTurn and streams every step of them as an async iterator of
 * Event values. When the stream of a turn breaks (a connection reset, a
 * replica that went away), the client re-attaches to the same run with
 * WatchTurn from the last event it received, on a server with a turn store,
 * and the turn goes on. When a turn fails in a way the server says is worth
 * retrying (an error event with retryable set to true), or its stream breaks
 * and cannot be re-attached, the client runs the failed step again: it
 * resumes the turn as a new attempt, re-sending the conversation plus every
 * message the failed attempt committed, under the same turn id, so a
 * server-side tool that already ran is never run twice. Aborting a turn's
 * signal cancels it on the server (CancelTurn); breaking out of its loop only
 * leaves it, as a process that dies does. It follows the Go
 * client's protocol (github.com/turnstile-dev/turnstile/client) step for
 * step.
 */
export { RESOLVE_EVERY_MS, parseTarget, type LoadBalancing, type Target } from "./balance.js";
export {
  ATTEMPT_HEADER,
  Client,
  DEFAULT_BACKOFF,
  DEFAULT_CANCEL_TIMEOUT_MS,
  DEFAULT_REATTACH_BACKOFF,
  DEFAULT_REATTACH_TIMEOUT_MS,
  Turn,
  applyCompaction,
  backoffDelay,
  standing,
  type ApprovalHandler,
  type Backoff,
  type CallOptions,
  type ClientOptions,
  type Decision,
  type Event,
  type Logger,
  type Result,
  type StepRetry,
  type TurnOptions,
} from "./client.js";
export { ERROR_DOMAIN, TurnError, codeName, type RpcStatus } from "./errors.js";
export { mediaPart, mediaType, mediaUriPart } from "./media.js";
export * from "./gen/turnstile/v1/agent_pb.js";
export * from "./gen/turnstile/v1/conversation_pb.js";
export * from "./gen/turnstile/v1/errors_pb.js";

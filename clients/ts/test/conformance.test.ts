import assert from "node:assert/strict";
import { readFileSync } from "node:fs";
import { join } from "node:path";
import { after, before, describe, it } from "node:test";
import { create, fromJson, type JsonObject } from "@bufbuild/protobuf";
import { Code, createClient } from "@connectrpc/connect";
import { createGrpcTransport } from "@connectrpc/connect-node";

import { AgentService, Client, type Event, MessageSchema, Role, RunTurnRequestSchema, TurnError, codeName, type Message, EndReason, type AgentEvent, mediaPart } from "../src/index.js";
import { HitlRun, type HitlScenario } from "./hitl.js";
import { repoRoot, startCutProxy, startServer, type Server } from "./server.js";

/** A runner's client options, in milliseconds. */
type ClientOptions = Record<string, number>;

interface Scenario extends HitlScenario {
  name: string;
  prompt: string;
  /** The messages sent before the prompt. */
  history?: { role: "USER" | "ASSISTANT"; text: string }[];
  /** Media sent after the prompt, made with mediaPart from their bytes. */
  media?: { mime_type: string; name: string; data_base64: string }[];
  /** Fields of the request, in protojson. */
  request?: JsonObject;
  cancel_on?: string;
  /** Read the run's stored log once the turn ended. */
  read_log?: boolean;
  /** The server's configuration: server.yaml when unset, else NAME.yaml. */
  server?: string;
  cut?: { on: string; then?: string };
  /** Overrides of the file's client options. */
  client?: ClientOptions;
  expect: Record<string, unknown>;
}

const conf = JSON.parse(readFileSync(join(repoRoot, "clients/conformance/scenarios.json"), "utf8")) as {
  client: ClientOptions;
  scenarios: Scenario[];
};

/** newClient makes a client for addr with opts that counts its re-attaches. */
function newClient(addr: string, opts: ClientOptions): { client: Client; reattaches: () => number } {
  let n = 0;
  const client = new Client(`http://${addr}`, {
    maxStepRetries: opts.max_step_retries,
    backoff: { initialMs: opts.backoff_initial_ms, maxMs: opts.backoff_max_ms, multiplier: 2, jitter: 0 },
    reattachTimeoutMs: opts.reattach_timeout_ms,
    maxReattaches: opts.max_reattaches, // undefined when the scenario gives none
    reattachBackoff: { initialMs: opts.reattach_backoff_initial_ms, maxMs: opts.reattach_backoff_max_ms, multiplier: 2, jitter: 0 },
    logger: {
      info: (message) => {
        if (message === "turnstile: re-attaching to the turn") n++;
      },
      warn: () => {},
    },
  });
  return { client, reattaches: () => n };
}

/** The gRPC status name as the specification spells it: FAILED_PRECONDITION. */
function statusName(c: Code): string {
  return Code[c].replace(/([a-z])([A-Z])/g, "$1_$2").toUpperCase();
}

const roles = (msgs: Message[]) => msgs.map((m) => Role[m.role]);
const text = (m: Message) => m.parts.map((p) => (p.kind.case === "text" ? p.kind.value : "")).join("");

/**
 * KeptText follows the discard signals as a consumer must: a server retry or
 * fallback drops its attempt's deltas from discard_from_seq on; a step retry
 * that discards drops everything since the last message that stands.
 */
class KeptText {
  private deltas: { attempt: number; seq: bigint; text: string }[] = [];
  private marks: number[] = [];

  event(ev: Event): void {
    if (ev.stepRetry) {
      if (ev.stepRetry.discardPartial) {
        const m = ev.stepRetry.messages.length;
        const cut = m > 0 && m <= this.marks.length ? this.marks[m - 1] : 0;
        this.deltas = this.deltas.slice(0, cut);
        this.marks = this.marks.slice(0, m);
      }
      return;
    }
    const a = ev.agent!;
    const drop = (from: bigint) => {
      this.deltas = this.deltas.filter((d) => d.attempt !== ev.attempt || d.seq < from);
    };
    switch (a.payload.case) {
      case "textDelta":
        this.deltas.push({ attempt: ev.attempt, seq: a.seq, text: a.payload.value.text });
        break;
      case "messageCompleted":
        this.marks.push(this.deltas.length);
        break;
      case "retry":
      case "fallback":
        if (a.payload.value.discardPartial) drop(a.payload.value.discardFromSeq);
        break;
    }
  }

  toString(): string {
    return this.deltas.map((d) => d.text).join("");
  }
}

/** observeLog reads the run's stored log and notes its model calls and how it ends. */
async function observeLog(addr: string, turnId: string, obs: Record<string, unknown>): Promise<void> {
  const rpc = createClient(AgentService, createGrpcTransport({ baseUrl: `http://${addr}` }));
  const log: AgentEvent[] = [];
  try {
    for await (const r of rpc.watchTurn({ turnId, attempt: 1 }, { timeoutMs: 10_000 })) if (r.event) log.push(r.event);
  } catch (e) {
    // A failed run's stream ends with its status, after its events.
    if (log.length === 0) throw e;
  }
  obs.log_model_calls = log.filter((e) => e.payload.case === "llmCallStarted").length;
  const last = log[log.length - 1]?.payload;
  if (last?.case === "turnCompleted") obs.log_end = "COMPLETED";
  else if (last?.case === "error") obs.log_end = codeName(last.value.code);
}

async function observe(client: Client, sc: Scenario, addr: string): Promise<Record<string, unknown>> {
  const ctl = new AbortController();
  const hitl = new HitlRun(sc);
  const req = fromJson(RunTurnRequestSchema, { ...sc.request });
  req.messages = [
    ...(sc.history ?? []).map((h) => create(MessageSchema, { role: Role[h.role], parts: [{ kind: { case: "text" as const, value: h.text } }] })),
    create(MessageSchema, {
      role: Role.USER,
      parts: [
        { kind: { case: "text", value: sc.prompt } },
        ...(sc.media ?? []).map((m) => mediaPart(Buffer.from(m.data_base64, "base64"), m.mime_type, m.name)),
      ],
    }),
  ];
  const turn = client.runTurn(req, { signal: ctl.signal, timeoutMs: 30_000, ...hitl.turnOptions() });
  const obs: Record<string, unknown> = { step_retries: [], tools_started: [], seq_gapless: true, terminal_events: 0, compactions: 0 };
  const kept = new KeptText();
  const next = new Map<number, bigint>(); // the seq each attempt's next event must have
  let failure: unknown;
  try {
    for await (const ev of turn.events()) {
      kept.event(ev);
      hitl.event(turn, ev, obs);
      if (ev.agent) {
        if (ev.agent.seq !== (next.get(ev.attempt) ?? 0n) + 1n) obs.seq_gapless = false;
        next.set(ev.attempt, ev.agent.seq);
      }
      if (ev.stepRetry) {
        const sr = ev.stepRetry;
        (obs.step_retries as unknown[]).push({
          attempt: sr.attempt,
          code: codeName(sr.error.code),
          discard_partial: sr.discardPartial,
          messages: sr.messages.length,
        });
        continue;
      }
      const p = ev.agent!.payload;
      if (p.case === "error" || p.case === "turnCompleted") obs.terminal_events = (obs.terminal_events as number) + 1;
      if (p.case === "toolStarted") (obs.tools_started as unknown[]).push(p.value.name);
      if (p.case === "compaction") obs.compactions = (obs.compactions as number) + 1;
      if (sc.cancel_on === "text_delta" && p.case === "textDelta") ctl.abort();
    }
  } catch (e) {
    failure = e;
  }
  obs.kept_text = kept.toString();
  await hitl.done(turn.result, obs);
  if (sc.read_log) await observeLog(addr, turn.id, obs);
  const res = turn.result;
  if (res) {
    obs.outcome = "completed";
    obs.end_reason = EndReason[res.endReason];
    obs.attempts = res.attempts;
    obs.reattaches = res.reattaches;
    obs.roles = roles(res.messages);
    obs.conversation_roles = roles(res.conversation);
    if (res.messages.length > 0) obs.final_text = text(res.messages[res.messages.length - 1]);
    const cost = res.usage.cost;
    obs.cost = cost ? `${cost.currency} ${cost.units}.${String(cost.nanos).padStart(9, "0")}` : "none";
    obs.cost_partial = res.usage.costPartial;
    return obs;
  }
  assert.ok(failure instanceof TurnError, `the turn ended with ${String(failure)}, want a result or a TurnError`);
  assert.equal(turn.error, failure);
  obs.outcome = "error";
  obs.code = codeName(failure.code);
  obs.retryable = failure.retryable;
  obs.attempts = failure.attempts;
  obs.reattaches = failure.reattaches;
  obs.roles = roles(failure.messages);
  obs.conversation_roles = roles(failure.conversation);
  if (failure.status) obs.status = statusName(failure.status.code);
  return obs;
}

describe("conformance (clients/conformance/scenarios.json on a live turnstile serve)", () => {
  const servers = new Map<string, Server>();
  before(async () => {
    for (const sc of conf.scenarios) {
      const name = sc.server ?? "";
      if (!servers.has(name)) {
        servers.set(name, await startServer(join(repoRoot, "clients/conformance", `${name || "server"}.yaml`)));
      }
    }
  });
  after(async () => {
    for (const s of servers.values()) await s.stop();
  });
  for (const sc of conf.scenarios) {
    it(sc.name, async () => {
      let addr = servers.get(sc.server ?? "")!.addr;
      const proxy = sc.cut ? await startCutProxy(addr, sc.cut.on, sc.cut.then === "refuse") : undefined;
      try {
        if (proxy) addr = proxy.addr;
        const { client, reattaches } = newClient(addr, { ...conf.client, ...sc.client });
        const obs = await observe(client, sc, addr);
        // The count the turn reports is the count the client logged.
        assert.strictEqual(obs.reattaches, reattaches(), "reattaches: the turn's count differs from the client's log");
        for (const [k, want] of Object.entries(sc.expect)) {
          assert.deepStrictEqual(obs[k], want, `${k}: got ${JSON.stringify(obs[k])}, want ${JSON.stringify(want)}`);
        }
      } finally {
        await proxy?.close();
      }
    });
  }
});

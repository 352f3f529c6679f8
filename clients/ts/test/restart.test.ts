import assert from "node:assert/strict";
import { mkdtempSync, writeFileSync } from "node:fs";
import { createServer } from "node:net";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { describe, it } from "node:test";

import { Client, EndReason, Role } from "../src/index.js";
import { startServer } from "./server.js";

/** Longer than the ten re-attaches of the client's former budget (about 6.4 s) took. */
const OUTAGE_MS = 12_000;

const ANSWER = "A restart is an outage the client waits out, however many tries it takes, until the turn goes on where it stopped.";

/** freePort returns a loopback port nothing listens on. */
function freePort(): Promise<number> {
  return new Promise((res) => {
    const s = createServer();
    s.listen(0, "127.0.0.1", () => {
      const p = (s.address() as { port: number }).port;
      s.close(() => res(p));
    });
  });
}

describe("a server restart", () => {
  it("an embedded-mode server killed and started again 12 s later loses no turn of a client with default options", async () => {
    const port = await freePort();
    const dir = mkdtempSync(join(tmpdir(), "turnstile-ts-restart-"));
    const config = join(dir, "turnstile.yaml");
    writeFileSync(
      config,
      `listen: 127.0.0.1:${port}
log: {format: json, level: info}
providers:
  sim: {type: simulator, token_delay: 20ms}
models:
  sim: {provider: sim, model: turnstile-sim-1, context_window: 32000}
default_model: sim
server: {shutdown_grace: 100ms, drain_delay: 0s}
store: {mode: embedded, dir: ${JSON.stringify(join(dir, "jetstream"))}}
`,
    );
    let server = await startServer(config);
    const turns = [0, 1].map(async (i) => {
      const client = new Client(`http://${server.addr}`);
      const turn = client.runTurn({
        messages: [{ role: Role.USER, parts: [{ kind: { case: "text", value: `[sim reply="${ANSWER}"] go on ${i}` } }] }],
      });
      let text = "";
      let stepRetries = 0;
      let streaming: () => void = () => {};
      const started = new Promise<void>((res) => (streaming = res));
      const done = (async () => {
        for await (const ev of turn.events()) {
          if (ev.stepRetry) stepRetries++;
          const p = ev.agent?.payload;
          if (p?.case === "textDelta") {
            text += p.value.text;
            streaming();
          }
          // The call taken over streams afresh.
          if (p?.case === "retry" && p.value.discardPartial) text = "";
        }
        return { result: turn.result!, text: text.trim(), stepRetries };
      })();
      return { started, done };
    });
    const running = await Promise.all(turns);
    await Promise.all(running.map((r) => r.started));
    const down = Date.now();
    await server.stop("SIGKILL");
    await new Promise((res) => setTimeout(res, OUTAGE_MS - (Date.now() - down)));
    server = await startServer(config);
    try {
      for (const r of running) {
        const { result, text, stepRetries } = await r.done;
        assert.equal(result.endReason, EndReason.END_TURN);
        assert.equal(stepRetries, 0, "the run was not re-attached: a step retry ran it again");
        assert.ok(result.reattaches > 0);
        assert.equal(text, ANSWER);
      }
    } finally {
      await server.stop();
    }
  });
});

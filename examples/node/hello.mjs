// Runs one turn on a turnstile server (TURNSTILE_ADDR, default
// 127.0.0.1:7700) with the TypeScript client and prints its reply as it streams.
import { Client, EndReason, Role, TurnError, codeName } from "@turnstile-dev/client";

const client = new Client(`http://${process.env.TURNSTILE_ADDR ?? "127.0.0.1:7700"}`);
const prompt = process.argv.slice(2).join(" ");
const turn = client.runTurn({ messages: [{ role: Role.USER, parts: [{ kind: { case: "text", value: prompt } }] }] });
try {
  for await (const ev of turn.events()) {
    if (ev.stepRetry) process.stdout.write(`\n[retrying: ${codeName(ev.stepRetry.error.code)}]\n`);
    else if (ev.agent?.payload.case === "textDelta") process.stdout.write(ev.agent.payload.value.text);
  }
  console.log(`\n${EndReason[turn.result.endReason]}`);
} catch (e) {
  if (!(e instanceof TurnError)) throw e;
  console.error(`\n${e}`);
  process.exitCode = 1;
}

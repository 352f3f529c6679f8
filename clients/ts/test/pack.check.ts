import assert from "node:assert/strict";
import { execFile } from "node:child_process";
import { existsSync, mkdirSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join, posix } from "node:path";
import { after, before, describe, it } from "node:test";
import { promisify } from "node:util";

import { repoRoot, startServer, type Server } from "./server.js";

// The package as it would be published: `npm pack` makes the tarball, a
// fresh project outside the repository installs it (its peer dependencies
// come from the npm registry, at the newest versions its ranges allow), and
// programs there run a turn against a real `turnstile serve` through import
// and through require, and type-check against the package's declarations in
// both module formats. Run with `npm run test:pack` after `npm run build`;
// it is not part of `npm test` because it needs the registry.

const run = promisify(execFile);
const pkgDir = join(repoRoot, "clients/ts");
const npm = process.platform === "win32" ? "npm.cmd" : "npm";
const tsc = require.resolve("typescript/bin/tsc");

interface Packed {
  filename: string;
  files: { path: string }[];
}

// A turn whose reply the simulator streams after failing its first step
// once, so the packaged client's step retry runs too, then a turn that
// fails, whose TurnError the app catches by instanceof.
const program = (reply: string, client: string) => `
const client = ${client};
const ask = (text) => ({ messages: [{ role: Role.USER, parts: [{ kind: { case: "text", value: text } }] }] });
const turn = client.runTurn(ask('[sim fail=server_error times=1 after=1] [sim reply="${reply}"] hi'));
let text = "";
for await (const ev of turn.events()) {
  if (ev.stepRetry) text += "[retry " + codeName(ev.stepRetry.error.code) + "]";
  else if (ev.agent?.payload.case === "textDelta") text += ev.agent.payload.value.text;
}
let failed;
try {
  for await (const ev of client.runTurn(ask("[sim fail=auth] hi")).events()) void ev;
} catch (e) {
  failed = { turnError: e instanceof TurnError, code: codeName(e.code) };
}
console.log(JSON.stringify({
  text,
  end: EndReason[turn.result.endReason],
  // The app's @bufbuild/protobuf takes the package's messages as its own.
  isMessage: isMessage(turn.result.messages.at(-1), MessageSchema),
  failed,
}));
`;

// From import: the app's own transport (its copy of @connectrpc/connect-node,
// which is the client's), so a second copy would show here.
const esm = `import { isMessage } from "@bufbuild/protobuf";
import { createGrpcTransport } from "@connectrpc/connect-node";
import { Client, EndReason, MessageSchema, Role, TurnError, codeName } from "@turnstile-dev/client";
import { AgentEventSchema } from "@turnstile-dev/client/gen/turnstile/v1/agent_pb";
if (AgentEventSchema.typeName !== "turnstile.v1.AgentEvent") throw new Error(AgentEventSchema.typeName);
console.error(import.meta.resolve("@turnstile-dev/client"));
${program("Hello from import.", 'new Client("unused", { transport: createGrpcTransport({ baseUrl: "http://" + process.argv[2] }) })')}
`;

// From require: two addresses of the same server, the packaged balancer's fixed list.
const cjs = `const { isMessage } = require("@bufbuild/protobuf");
const { Client, EndReason, MessageSchema, Role, TurnError, codeName } = require("@turnstile-dev/client");
const { AgentEventSchema } = require("@turnstile-dev/client/gen/turnstile/v1/agent_pb");
if (AgentEventSchema.typeName !== "turnstile.v1.AgentEvent") throw new Error(AgentEventSchema.typeName);
console.error(require.resolve("@turnstile-dev/client"));
(async () => {${program("Hello from require.", 'new Client(`http://${process.argv[2]},${process.argv[2]}`)')}})().catch((e) => { console.error(e); process.exitCode = 1; });
`;

// Consumers' TypeScript in each module format: the declarations of the root
// and of a gen/ subpath resolve through the matching condition (tsc fails on
// a module it cannot find) and type the API.
const typed = (from: string) => `${from}
import { AgentEventSchema, type AgentEvent } from "@turnstile-dev/client/gen/turnstile/v1/agent_pb";
export const typeName: AgentEvent["$typeName"] = AgentEventSchema.typeName as AgentEvent["$typeName"];
export async function reply(target: string): Promise<string> {
  const client: Client = new Client(target, { maxStepRetries: 2, loadBalancing: "round_robin" });
  const turn = client.runTurn({ messages: [{ role: Role.USER, parts: [{ kind: { case: "text", value: "hi" } }] }] }, { signal: AbortSignal.timeout(1000) });
  let text = "";
  try {
    for await (const ev of turn.events()) if (ev.agent?.payload.case === "textDelta") text += ev.agent.payload.value.text;
  } catch (e) {
    if (e instanceof TurnError) return ErrorCode[e.code] ?? "";
    throw e;
  }
  const r: Result | undefined = turn.result;
  return text + String(r?.endReason);
}
`;

describe("npm pack", () => {
  let work: string;
  let packed: Packed;
  let app: string;
  let server: Server;

  before(async () => {
    work = mkdtempSync(join(tmpdir(), "turnstile-pack-"));
    // --ignore-scripts: pack what `npm run build` made (prepack would build again).
    const { stdout } = await run(npm, ["pack", "--json", "--ignore-scripts", "--pack-destination", work], { cwd: pkgDir });
    [packed] = JSON.parse(stdout) as Packed[];
    app = join(work, "app");
    mkdirSync(app);
    writeFileSync(join(app, "package.json"), JSON.stringify({ name: "pack-check", version: "0.0.0", private: true }));
    await run(npm, ["install", "--no-audit", "--no-fund", join(work, packed.filename)], { cwd: app });
    server = await startServer();
  });
  after(async () => {
    await server?.stop();
    if (work) rmSync(work, { recursive: true, force: true });
  });

  it("ships the builds, the sources their maps name, the README, the licence and the google/rpc licence, and nothing else", () => {
    const files = new Set(packed.files.map((f) => f.path));
    for (const f of [
      "package.json",
      "README.md",
      "LICENSE",
      "dist/cjs/index.js",
      "dist/cjs/index.d.ts",
      "dist/cjs/package.json",
      "dist/esm/index.js",
      "dist/esm/index.d.ts",
      "dist/esm/package.json",
      "dist/esm/gen/turnstile/v1/agent_pb.js",
      "dist/cjs/gen/google/rpc/error_details_pb.d.ts",
      "src/client.ts",
      "src/balance.ts",
      "src/gen/turnstile/v1/agent_pb.ts",
      "src/gen/google/rpc/LICENSE",
    ]) {
      assert.ok(files.has(f), `${f} is not in the tarball`);
    }
    for (const f of files) {
      assert.match(f, /^(package\.json|README\.md|LICENSE|dist\/(cjs|esm)\/.+|src\/.+)$/, `${f} should not be in the tarball`);
      assert.doesNotMatch(f, /(^|\/)test\/|\.test\.|tsbuildinfo/, `${f} should not be in the tarball`);
    }
    let maps = 0;
    for (const f of files) {
      if (!f.endsWith(".map")) continue;
      maps++;
      const map = JSON.parse(readFileSync(join(app, "node_modules/@turnstile-dev/client", f), "utf8")) as { sources: string[]; sourcesContent?: string[] };
      for (const s of map.sources) {
        const p = posix.normalize(posix.join(posix.dirname(f), s));
        assert.ok(files.has(p), `${f} names ${s} (${p}), which is not in the tarball`);
      }
      if (f.endsWith(".js.map")) assert.equal(map.sourcesContent?.length, map.sources.length, `${f} has no inline sources`);
    }
    assert.ok(maps > 0, "no source maps in the tarball");
  });

  it("installs with its peer dependencies once, at the top level", () => {
    for (const dep of ["@bufbuild/protobuf", "@connectrpc/connect", "@connectrpc/connect-node"]) {
      assert.ok(existsSync(join(app, "node_modules", dep, "package.json")), `${dep} was not installed`);
    }
    // A second copy of a peer would make instanceof and isMessage fail between the app and the client.
    assert.ok(!existsSync(join(app, "node_modules/@turnstile-dev/client/node_modules")), "the client got copies of its own");
    const manifest = JSON.parse(readFileSync(join(app, "node_modules/@turnstile-dev/client/package.json"), "utf8")) as Record<string, unknown>;
    assert.equal(manifest.private, undefined);
  });

  for (const [file, source, build, reply] of [
    ["turn.mjs", esm, "esm", "Hello from import."],
    ["turn.cjs", cjs, "cjs", "Hello from require."],
  ] as const) {
    it(`runs a turn from ${file}`, async () => {
      writeFileSync(join(app, file), source);
      const { stdout, stderr } = await run("node", [file, server.addr], { cwd: app });
      assert.match(stderr.trim(), new RegExp(`[\\\\/]node_modules[\\\\/]@turnstile-dev[\\\\/]client[\\\\/]dist[\\\\/]${build}[\\\\/]index\\.js$`));
      assert.deepEqual(JSON.parse(stdout), {
        text: `Hello [retry SERVER_ERROR]${reply}`,
        end: "END_TURN",
        isMessage: true,
        failed: { turnError: true, code: "AUTH" },
      });
    });
  }

  it("type-checks from ES modules and CommonJS", async () => {
    const imports = "Client, ErrorCode, Role, TurnError, type Result";
    writeFileSync(join(app, "typed.mts"), typed(`import { ${imports} } from "@turnstile-dev/client";`));
    writeFileSync(join(app, "typed.cts"), typed(`import { ${imports} } from "@turnstile-dev/client";`));
    writeFileSync(
      join(app, "tsconfig.json"),
      JSON.stringify({
        compilerOptions: {
          target: "ES2022",
          // DOM: @connectrpc/connect's declarations name HeadersInit; no skipLibCheck, so the package's own are checked.
          lib: ["ES2022", "DOM"],
          module: "Node16",
          moduleResolution: "Node16",
          strict: true,
          noEmit: true,
          types: ["node"],
          typeRoots: [join(pkgDir, "node_modules/@types")],
        },
        files: ["typed.mts", "typed.cts"],
      }),
    );
    // --listFiles names every declaration file the program took in; an error prints its message.
    const { stdout } = await run("node", [tsc, "-p", ".", "--listFiles"], { cwd: app }).catch((e: { stdout?: string }) => {
      assert.fail(`tsc failed:\n${e.stdout}`);
    });
    const resolved = (from: string) => new RegExp(`/node_modules/@turnstile-dev/client/dist/${from}/index\\.d\\.ts$`, "m");
    assert.match(stdout, resolved("esm"));
    assert.match(stdout, resolved("cjs"));
  });
});

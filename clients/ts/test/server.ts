import { spawn, execFileSync, type ChildProcess } from "node:child_process";
import { mkdtempSync } from "node:fs";
import { tmpdir } from "node:os";
import { join, resolve } from "node:path";
import { createInterface } from "node:readline";

/** The repository's root, from dist/test. */
export const repoRoot = resolve(__dirname, "../../../..");

/** A running `turnstile serve`. */
export interface Server {
  /** The gRPC address, host:port. */
  addr: string;
  /** Stops it with SIGTERM and waits for it. */
  stop(): Promise<void>;
}

/**
 * startServer runs `turnstile serve --config config` on a free loopback
 * port (the configuration listens on 127.0.0.1:0) and resolves once it logs
 * its address. TURNSTILE_BIN names a built binary; without it one is built
 * with the Go toolchain.
 */
export async function startServer(config = join(repoRoot, "clients/conformance/server.yaml")): Promise<Server> {
  let bin = process.env.TURNSTILE_BIN;
  if (!bin) {
    bin = join(mkdtempSync(join(tmpdir(), "turnstile-ts-")), "turnstile");
    execFileSync("go", ["build", "-o", bin, "./cmd/turnstile"], { cwd: repoRoot, stdio: "inherit" });
  }
  const child: ChildProcess = spawn(bin, ["serve", "--config", config], { stdio: ["ignore", "ignore", "pipe"] });
  const exited = new Promise<void>((res) => child.once("exit", () => res()));
  const addr = await new Promise<string>((res, rej) => {
    const log: string[] = [];
    const timer = setTimeout(() => rej(new Error("turnstile serve did not log its address within 30s")), 30_000);
    createInterface({ input: child.stderr! }).on("line", (line) => {
      try {
        const rec = JSON.parse(line) as { msg?: string; address?: string };
        if (rec.msg === "serving" && rec.address) {
          clearTimeout(timer);
          res(rec.address);
          return;
        }
      } catch {
        // Not a JSON log line.
      }
      log.push(line);
    });
    child.once("exit", (code) => {
      clearTimeout(timer);
      rej(new Error(`turnstile serve exited (${code}) before serving:\n${log.join("\n")}`));
    });
  });
  return {
    addr,
    async stop() {
      if (child.exitCode === null) child.kill("SIGTERM");
      await exited;
    },
  };
}

// Builds the package: copies the generated code of gen/ts into src/gen
// (with the licence of the vendored google/rpc protos it is made from),
// compiles src twice, to CommonJS (dist/cjs) and to ES modules (dist/esm),
// each with declarations and source maps, and marks each directory's module
// format with a package.json of its own; then compiles the tests (build/).
import { execFileSync } from "node:child_process";
import { cpSync, mkdirSync, rmSync, writeFileSync } from "node:fs";
import { createRequire } from "node:module";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";

const pkg = join(dirname(fileURLToPath(import.meta.url)), "..");
const repo = join(pkg, "../..");
const tsc = createRequire(join(pkg, "package.json")).resolve("typescript/bin/tsc");

rmSync(join(pkg, "src/gen"), { recursive: true, force: true });
cpSync(join(repo, "gen/ts"), join(pkg, "src/gen"), { recursive: true });
cpSync(join(repo, "proto/google/rpc/LICENSE"), join(pkg, "src/gen/google/rpc/LICENSE"));

rmSync(join(pkg, "dist"), { recursive: true, force: true });
rmSync(join(pkg, "build"), { recursive: true, force: true });
for (const [config, type] of [
  ["tsconfig.cjs.json", "commonjs"],
  ["tsconfig.esm.json", "module"],
]) {
  execFileSync(process.execPath, [tsc, "-p", config], { cwd: pkg, stdio: "inherit" });
  const out = join(pkg, "dist", type === "module" ? "esm" : "cjs");
  mkdirSync(out, { recursive: true });
  writeFileSync(join(out, "package.json"), JSON.stringify({ type }) + "\n");
}
execFileSync(process.execPath, [tsc, "-p", "tsconfig.json"], { cwd: pkg, stdio: "inherit" });

#!/usr/bin/env node
// @ts-check
/**
 * Interop driver: the official ACP TypeScript SDK client (@agentclientprotocol/sdk 2.4.0) as an
 * editor runs a stdio agent: it spawns `CMD ARGS...` and speaks newline-delimited JSON-RPC on
 * the child's stdin/stdout (the SDK's `ndJsonStream`); the child's stderr passes through.
 *
 *   node stdio_client.mjs [--timeout SECONDS] [--trace] [--] CMD [ARGS...]
 *   node stdio_client.mjs -- .venv/bin/python -m demo_project.agent
 *   node stdio_client.mjs -- .venv/bin/python -m acp_channels.bridge http://127.0.0.1:8000/acp
 *
 * The child must behave as the demo agent (see ../README.md). The scenario (steps from
 * scenario.mjs): initialize (fs.readTextFile) -> session/new -> `stream 50 64` -> `tool_calls`
 * -> `permission` (answers `allow`) -> `fs_read <path>` (answered from memory) ->
 * `wait_for_cancel` + session/cancel -> a second session/new, `echo second` there, `echo first`
 * in the first -> close: end the child's stdin and wait for it to exit, with status 0.
 * Options: --timeout SECONDS (per step, default 20), --trace (each JSON-RPC message's kind and
 * direction as a JSON line on stderr).
 * Prints exactly one JSON line on stdout; exit 0 when every check passed, 1 when one failed,
 * 2 on bad usage.
 */
import { spawn } from "node:child_process";
import { Readable, Writable } from "node:stream";

import { ndJsonStream } from "@agentclientprotocol/sdk";

import {
  cancelStep,
  check,
  CheckFailed,
  describeError,
  describeMessage,
  echoStep,
  fsReadStep,
  initialize,
  newSession,
  permissionStep,
  ScenarioClient,
  sdkVersion,
  step,
  streamStep,
  toolCallsStep,
} from "./scenario.mjs";

/** @typedef {import("@agentclientprotocol/sdk").Stream} Stream */
/** @typedef {import("@agentclientprotocol/sdk").AnyMessage} AnyMessage */
/** @typedef {{code: number | null, signal: NodeJS.Signals | null, error?: string}} Exit */

/** How long a child that failed the run gets to exit on stdin EOF, then after SIGTERM. */
const GRACE_MS = 5000;

/**
 * The spawned agent: its stdio as an SDK Stream that records what this side wrote.
 */
class ChildAgent {
  /**
   * @param {string} command
   * @param {string[]} args
   * @param {boolean} trace
   */
  constructor(command, args, trace) {
    this.trace = trace;
    /** @type {AnyMessage[]} messages written to the child's stdin, in order */
    this.sent = [];
    this.child = spawn(command, args, { stdio: ["pipe", "pipe", "inherit"] });
    // Writing to a child that already exited fails with EPIPE; the run reports the exit instead.
    this.child.stdin.on("error", (error) => this.log({ stdin: "error", error: String(error) }));
    /** @type {Promise<Exit>} */
    this.exited = new Promise((resolve) => {
      this.child.once("exit", (code, signal) => resolve({ code, signal }));
      this.child.once("error", (error) => resolve({ code: null, signal: null, error: String(error) }));
    });
    /** @type {Exit | undefined} */
    this.exit = undefined;
    void this.exited.then((exit) => {
      this.exit = exit;
      this.log({ exit });
    });
  }

  /** @param {Record<string, unknown>} entry */
  log(entry) {
    if (this.trace) process.stderr.write(`${JSON.stringify({ trace: "stdio_client", ...entry })}\n`);
  }

  /** @returns {Stream} */
  stream() {
    const { child } = this;
    const raw = ndJsonStream(
      /** @type {WritableStream<Uint8Array>} */ (Writable.toWeb(child.stdin)),
      /** @type {ReadableStream<Uint8Array>} */ (/** @type {unknown} */ (Readable.toWeb(child.stdout))),
    );
    const agent = this;
    const writable = new WritableStream({
      async write(message) {
        const writer = raw.writable.getWriter();
        try {
          await writer.write(message);
        } finally {
          writer.releaseLock();
        }
        agent.sent.push(message);
        agent.log({ send: describeMessage(message) });
      },
    });
    const readable = this.trace
      ? raw.readable.pipeThrough(
          new TransformStream({
            transform(message, controller) {
              agent.log({ recv: describeMessage(message) });
              controller.enqueue(message);
            },
          }),
        )
      : raw.readable;
    return { readable, writable };
  }

  sentMethods() {
    return this.sent.filter((m) => "method" in m).map((m) => String(m.method));
  }

  responsesSent() {
    return this.sent.filter((m) => !("method" in m)).length;
  }

  /** End the child's stdin: a stdio agent's signal to finish. */
  endInput() {
    if (!this.child.stdin.writableEnded) this.child.stdin.end();
  }

  /** After a failed run: EOF, then SIGTERM, then SIGKILL, until the child is gone. */
  async stop() {
    this.endInput();
    for (const signal of /** @type {const} */ (["SIGTERM", "SIGKILL"])) {
      const gone = await Promise.race([this.exited, new Promise((r) => setTimeout(() => r(undefined), GRACE_MS))]);
      if (gone) return;
      this.child.kill(signal);
    }
    await this.exited;
  }
}

/**
 * @param {number} ms
 * @param {ChildAgent} agentProcess
 * @param {Record<string, unknown>} summary
 */
async function scenario(ms, agentProcess, summary) {
  const scenarioClient = new ScenarioClient("acp-channels-interop-ts-stdio");
  const connection = scenarioClient.app.connect(agentProcess.stream());
  /** @type {import("./scenario.mjs").Run} */
  const run = {
    agent: connection.agent,
    client: scenarioClient,
    ms,
    summary,
    // accepted = written to the child's stdin
    promptsSent: () => agentProcess.sentMethods().filter((m) => m === "session/prompt").length,
  };
  // A child that exits early fails the step in progress at once, with its status.
  const early = agentProcess.exited.then((exit) => {
    const what = exit.error ? `could not be started: ${exit.error}` : `exited during the scenario: ${JSON.stringify(exit)}`;
    throw new CheckFailed(`the agent ${what}`);
  });
  early.catch(() => {});
  try {
    await Promise.race([
      early,
      (async () => {
        await initialize(run, { readTextFile: true });
        const sessionId = await newSession(run, "session/new");
        summary.session = true;
        await streamStep(run, sessionId);
        await toolCallsStep(run, sessionId);
        await permissionStep(run, sessionId);
        await fsReadStep(run, sessionId);
        await cancelStep(run, sessionId);

        // a second session on the same connection; the first one still answers
        const second = await newSession(run, "session/new (second)");
        check(second !== sessionId, "session/new (second): the first session's id again");
        summary.second = await echoStep(run, second, "second");
        summary.first = await echoStep(run, sessionId, "first");
        summary.sessions = 2;
      })(),
    ]);
  } finally {
    summary.sent = agentProcess.sentMethods();
    summary.responsesSent = agentProcess.responsesSent();
  }

  // close: EOF on the child's stdin; it must exit by itself, with status 0
  const closing = Date.now();
  agentProcess.endInput();
  summary.exited = false;
  const exit = await step("close: the agent's exit after stdin EOF", agentProcess.exited, ms);
  summary.exitMs = Date.now() - closing;
  summary.exited = true;
  summary.exitCode = exit.code;
  connection.close();
  check(exit.code === 0, `close: the agent exited with ${JSON.stringify(exit)}, expected status 0`);
  summary.closed = true;
}

async function main() {
  const args = process.argv.slice(2);
  let timeoutSeconds = 20;
  let trace = process.env.ACP_INTEROP_TRACE === "1";
  let index = 0;
  for (; index < args.length; index++) {
    if (args[index] === "--trace") trace = true;
    else if (args[index] === "--timeout") timeoutSeconds = Number(args[++index]);
    else if (args[index] === "--") {
      index++;
      break;
    } else break;
  }
  const argv = args.slice(index);
  /** @type {Record<string, unknown>} */
  const summary = {
    ok: false,
    client: "typescript-sdk",
    sdk: sdkVersion(),
    transport: "stdio",
    command: argv,
  };
  if (!argv.length || !(timeoutSeconds > 0)) {
    summary.error = "usage: node stdio_client.mjs [--timeout SECONDS] [--trace] [--] CMD [ARGS...]";
    process.stdout.write(`${JSON.stringify(summary)}\n`);
    process.stderr.write(`stdio_client: ${summary.error}\n`);
    return 2;
  }
  const agentProcess = new ChildAgent(argv[0], argv.slice(1), trace);
  try {
    await scenario(timeoutSeconds * 1000, agentProcess, summary);
    summary.ok = true;
  } catch (error) {
    summary.error = describeError(error);
  } finally {
    if (agentProcess.exit === undefined) await agentProcess.stop();
    if (!("exitCode" in summary) && agentProcess.exit) summary.exitCode = agentProcess.exit.code;
    if (agentProcess.exit?.signal) summary.exitSignal = agentProcess.exit.signal;
  }
  process.stdout.write(`${JSON.stringify(summary)}\n`);
  if (!summary.ok) process.stderr.write(`stdio_client: FAILED: ${summary.error}\n`);
  return summary.ok ? 0 : 1;
}

// Exit explicitly: a failed run can leave streams or timers open.
main().then(
  (code) => process.exit(code),
  (error) => {
    process.stderr.write(`stdio_client: crashed: ${error instanceof Error ? error.stack : error}\n`);
    process.exit(1);
  },
);

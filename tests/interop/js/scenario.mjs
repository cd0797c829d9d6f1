// @ts-check
/**
 * The interop scenario's steps, shared by the drivers (ts_client.mjs: HTTP / WebSocket,
 * stdio_client.mjs: a spawned stdio agent), all through the official SDK's `client()` app.
 *
 * Each step sends one prompt to an agent with the demo agent's commands (see ../README.md),
 * checks what came back, records it in the run's summary and throws CheckFailed when a check
 * fails. Every wait has a timeout, so a hang fails the run instead of blocking it.
 */
import { mkdtempSync, readFileSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";

import { client, methods } from "@agentclientprotocol/sdk";

/** @typedef {import("@agentclientprotocol/sdk").SessionNotification} SessionNotification */
/** @typedef {import("@agentclientprotocol/sdk").RequestPermissionResponse} RequestPermissionResponse */
/** @typedef {import("@agentclientprotocol/sdk").PromptResponse} PromptResponse */
/** @typedef {import("@agentclientprotocol/sdk").ClientConnection["agent"]} AgentHandle */

export const STREAM_COUNT = 50;
export const STREAM_SIZE = 64;
export const PERMISSION_OPTIONS = ["allow", "reject"];
export const PERMISSION_CHOICE = "allow";
export const TOOL_CALL_STATUSES = ["pending", "in_progress", "completed"];
/** What the client answers fs/read_text_file with (two lines, non-ASCII: it must come back unchanged). */
export const FILE_CONTENT = "known content from the client: grüße ✓\nsecond line";
/** Absolute, as ACP requires; never touched on disk: the client answers from memory. */
export const FILE_PATH = join(tmpdir(), "acp-interop-fs-read.txt");

export class CheckFailed extends Error {}

/**
 * @param {boolean} condition
 * @param {string} message
 * @returns {asserts condition}
 */
export function check(condition, message) {
  if (!condition) throw new CheckFailed(message);
}

/**
 * Await one scenario step, turning a hang into a failure.
 * @template T
 * @param {string} label
 * @param {Promise<T>} promise
 * @param {number} ms
 * @returns {Promise<T>}
 */
export async function step(label, promise, ms) {
  /** @type {NodeJS.Timeout | undefined} */
  let timer;
  const timeout = new Promise((_, reject) => {
    timer = setTimeout(() => reject(new CheckFailed(`${label}: timed out after ${ms / 1000}s`)), ms);
  });
  try {
    return await Promise.race([promise, timeout]);
  } finally {
    clearTimeout(timer);
  }
}

/** Resolves after pending I/O callbacks and microtasks (queued notification handlers) ran. */
export const tick = () => new Promise((resolve) => setImmediate(resolve));

/**
 * Poll `predicate` every event-loop turn until it holds or `ms` elapsed.
 * @param {() => boolean} predicate
 * @param {number} ms
 */
export async function waitUntil(predicate, ms) {
  const deadline = Date.now() + ms;
  while (!predicate() && Date.now() < deadline) await tick();
  return predicate();
}

/** @param {unknown} body */
export function parseJson(body) {
  if (typeof body !== "string") return undefined;
  try {
    return JSON.parse(body);
  } catch {
    return undefined;
  }
}

/** @param {any} message */
export function describeMessage(message) {
  if (!message || typeof message !== "object") return undefined;
  if ("method" in message)
    return "id" in message ? `request ${message.method}` : `notification ${message.method}`;
  return "id" in message ? "response" : undefined;
}

/** @param {unknown} error */
export function describeError(error) {
  if (error instanceof CheckFailed) return error.message;
  if (error instanceof Error) return `${error.constructor.name}: ${error.message}`;
  return `error: ${JSON.stringify(error)}`;
}

export function sdkVersion() {
  try {
    const url = new URL("./node_modules/@agentclientprotocol/sdk/package.json", import.meta.url);
    return JSON.parse(readFileSync(url, "utf8")).version;
  } catch {
    return undefined;
  }
}

/**
 * Texts of agent_message_chunk updates; every update must belong to `sessionId`.
 * @param {SessionNotification[]} updates
 * @param {string} sessionId
 */
export function chunkTexts(updates, sessionId) {
  /** @type {string[]} */
  const texts = [];
  for (const notification of updates) {
    check(
      notification.sessionId === sessionId,
      `session/update for another session: ${notification.sessionId}`,
    );
    const update = notification.update;
    if (update.sessionUpdate === "agent_message_chunk") {
      check(
        update.content.type === "text",
        `non-text agent_message_chunk: ${JSON.stringify(update.content)}`,
      );
      texts.push(update.content.text);
    }
  }
  return texts;
}

/**
 * Chunks that start with a decimal index must count up by one; otherwise order is unchecked.
 * @param {string[]} texts
 */
export function checkStreamOrder(texts) {
  /** @type {number[]} */
  const indices = [];
  for (const text of texts) {
    const match = /^(\d+)/.exec(text);
    if (!match) return "unchecked";
    indices.push(Number(match[1]));
  }
  const start = indices.length ? indices[0] : 0;
  const inOrder = indices.every((index, position) => index === start + position);
  check(inOrder, `stream: chunks out of order: ${JSON.stringify(indices)}`);
  return "indexed";
}

/**
 * The client side: the SDK's client app recording session updates, answering permission
 * requests with `allow` and fs/read_text_file for FILE_PATH with FILE_CONTENT.
 */
export class ScenarioClient {
  /** @param {string} name */
  constructor(name) {
    /** @type {SessionNotification[]} */
    this.updates = [];
    /** @type {{sessionId: string, options: string[]}[]} */
    this.permissionRequests = [];
    /** @type {{sessionId: string, path: string}[]} */
    this.fileReads = [];
    this.app = client({ name })
      .onNotification(methods.client.session.update, ({ params }) => {
        this.updates.push(params);
      })
      .onRequest(methods.client.session.requestPermission, ({ params }) => {
        const options = params.options.map((option) => option.optionId);
        this.permissionRequests.push({ sessionId: params.sessionId, options });
        /** @type {RequestPermissionResponse} */
        const response = options.includes(PERMISSION_CHOICE)
          ? { outcome: { outcome: "selected", optionId: PERMISSION_CHOICE } }
          : { outcome: { outcome: "cancelled" } };
        return response;
      })
      .onRequest(methods.client.fs.readTextFile, ({ params }) => {
        this.fileReads.push({ sessionId: params.sessionId, path: params.path });
        return { content: params.path === FILE_PATH ? FILE_CONTENT : "" };
      });
  }

  takeUpdates() {
    const taken = this.updates;
    this.updates = [];
    return taken;
  }

  chunkCount() {
    return this.updates.filter((n) => n.update.sessionUpdate === "agent_message_chunk").length;
  }
}

/**
 * One run of the scenario over a connected client app.
 * @typedef {object} Run
 * @property {AgentHandle} agent the connection's handle on the agent
 * @property {ScenarioClient} client
 * @property {number} ms per-step timeout
 * @property {Record<string, unknown>} summary what the run observed (the driver prints it)
 * @property {() => number} promptsSent session/prompt requests the transport accepted so far
 */

/**
 * Send a prompt and wait for its response plus the notifications queued before it (the SDK
 * dispatches notifications asynchronously, so the last ones may land just after the response).
 * @param {Run} run
 * @param {string} label
 * @param {string} sessionId
 * @param {string} text
 * @param {number} expectedChunks
 * @returns {Promise<PromptResponse>}
 */
export async function prompt(run, label, sessionId, text, expectedChunks) {
  const response = await step(
    label,
    run.agent.request(methods.agent.session.prompt, { sessionId, prompt: [{ type: "text", text }] }),
    run.ms,
  );
  await waitUntil(() => run.client.chunkCount() >= expectedChunks, 1000);
  await tick();
  return response;
}

/**
 * @param {Run} run
 * @param {{readTextFile: boolean}} fs what the client advertises
 */
export async function initialize(run, fs) {
  const init = await step(
    "initialize",
    run.agent.request(methods.agent.initialize, {
      protocolVersion: 1,
      clientCapabilities: { fs: { readTextFile: fs.readTextFile, writeTextFile: false } },
      clientInfo: { name: "acp-channels-interop-ts", version: "0.0.0" },
    }),
    run.ms,
  );
  run.summary.protocolVersion = init.protocolVersion;
  check(init.protocolVersion === 1, `initialize: protocolVersion ${init.protocolVersion}`);
}

/**
 * session/new in a fresh temporary directory (no MCP servers); its session id.
 * @param {Run} run
 * @param {string} label
 */
export async function newSession(run, label) {
  const cwd = mkdtempSync(join(tmpdir(), "acp-interop-"));
  let sessionId;
  try {
    const session = await step(
      label,
      run.agent.request(methods.agent.session.new, { cwd, mcpServers: [] }),
      run.ms,
    );
    sessionId = session.sessionId;
  } finally {
    rmSync(cwd, { recursive: true, force: true });
  }
  check(typeof sessionId === "string" && sessionId.length > 0, `${label}: empty sessionId`);
  return sessionId;
}

/**
 * `stream 50 64`: 50 chunks of 64 characters, in order when indexed, then end_turn.
 * @param {Run} run
 * @param {string} sessionId
 */
export async function streamStep(run, sessionId) {
  const { summary } = run;
  run.client.takeUpdates();
  const started = Date.now();
  const response = await prompt(run, "prompt stream", sessionId, `stream ${STREAM_COUNT} ${STREAM_SIZE}`, STREAM_COUNT);
  summary.streamMs = Date.now() - started;
  const texts = chunkTexts(run.client.takeUpdates(), sessionId);
  summary.chunks = texts.length;
  summary.streamStopReason = response.stopReason;
  check(response.stopReason === "end_turn", `stream: stopReason ${response.stopReason}`);
  check(texts.length === STREAM_COUNT, `stream: ${texts.length} chunks, expected ${STREAM_COUNT}`);
  const sizes = [...new Set(texts.map((text) => text.length))].sort((a, b) => a - b);
  check(
    sizes.length === 1 && sizes[0] === STREAM_SIZE,
    `stream: chunk sizes ${JSON.stringify(sizes)}, expected ${STREAM_SIZE}`,
  );
  summary.order = checkStreamOrder(texts);
}

/**
 * `tool_calls`: tool_call pending -> tool_call_update in_progress -> completed with text content,
 * all for one toolCallId, then the chunk "tool call completed" and end_turn.
 * @param {Run} run
 * @param {string} sessionId
 */
export async function toolCallsStep(run, sessionId) {
  const { summary } = run;
  run.client.takeUpdates();
  const response = await prompt(run, "prompt tool_calls", sessionId, "tool_calls", 1);
  const updates = run.client.takeUpdates();
  const texts = chunkTexts(updates, sessionId);
  /** @type {string[]} */
  const statuses = [];
  /** @type {Set<string>} */
  const ids = new Set();
  /** @type {string[]} */
  const kinds = [];
  let output = null;
  for (const { update } of updates) {
    kinds.push(update.sessionUpdate);
    if (update.sessionUpdate !== "tool_call" && update.sessionUpdate !== "tool_call_update") continue;
    statuses.push(String(update.status));
    ids.add(update.toolCallId);
    for (const item of update.content ?? []) {
      if (item.type === "content" && item.content.type === "text") output = item.content.text;
    }
  }
  summary.toolCalls = statuses;
  summary.toolCallOutput = output;
  summary.toolCallsText = texts.length ? texts[texts.length - 1] : null;
  summary.toolCallsStopReason = response.stopReason;
  const expectedKinds = ["tool_call", "tool_call_update", "tool_call_update", "agent_message_chunk"];
  check(
    JSON.stringify(kinds) === JSON.stringify(expectedKinds),
    `tool_calls: updates ${JSON.stringify(kinds)}, expected ${JSON.stringify(expectedKinds)}`,
  );
  check(
    JSON.stringify(statuses) === JSON.stringify(TOOL_CALL_STATUSES),
    `tool_calls: statuses ${JSON.stringify(statuses)}, expected ${JSON.stringify(TOOL_CALL_STATUSES)}`,
  );
  check(ids.size === 1, `tool_calls: ${ids.size} toolCallIds, expected one`);
  check(typeof output === "string" && output.length > 0, "tool_calls: the completed update has no text content");
  check(
    texts.length === 1 && texts[0] === "tool call completed",
    `tool_calls: chunks ${JSON.stringify(texts)}`,
  );
  check(response.stopReason === "end_turn", `tool_calls: stopReason ${response.stopReason}`);
}

/**
 * `permission`: one session/request_permission (allow, reject), answered `allow`; then the chunk
 * "permission: allow" and end_turn.
 * @param {Run} run
 * @param {string} sessionId
 */
export async function permissionStep(run, sessionId) {
  const { summary } = run;
  run.client.takeUpdates();
  const asked = run.client.permissionRequests.length;
  const response = await prompt(run, "prompt permission", sessionId, "permission", 1);
  const texts = chunkTexts(run.client.takeUpdates(), sessionId);
  const requests = run.client.permissionRequests.slice(asked);
  summary.permission = texts.length ? texts[texts.length - 1] : null;
  summary.permissionStopReason = response.stopReason;
  check(requests.length === 1, `permission: ${requests.length} permission requests, expected 1`);
  check(requests[0].sessionId === sessionId, "permission: request names another session");
  check(
    JSON.stringify(requests[0].options) === JSON.stringify(PERMISSION_OPTIONS),
    `permission: options ${JSON.stringify(requests[0].options)}`,
  );
  check(
    texts.length === 1 && texts[0] === `permission: ${PERMISSION_CHOICE}`,
    `permission: chunks ${JSON.stringify(texts)}`,
  );
  check(response.stopReason === "end_turn", `permission: stopReason ${response.stopReason}`);
}

/**
 * `fs_read FILE_PATH`: one fs/read_text_file for FILE_PATH in this session; the agent says the
 * content back unchanged, then end_turn.
 * @param {Run} run
 * @param {string} sessionId
 */
export async function fsReadStep(run, sessionId) {
  const { summary } = run;
  run.client.takeUpdates();
  const asked = run.client.fileReads.length;
  const response = await prompt(run, "prompt fs_read", sessionId, `fs_read ${FILE_PATH}`, 1);
  const texts = chunkTexts(run.client.takeUpdates(), sessionId);
  const reads = run.client.fileReads.slice(asked);
  summary.fsRead = texts.length ? texts[texts.length - 1] : null;
  summary.fsReadStopReason = response.stopReason;
  check(reads.length === 1, `fs_read: ${reads.length} fs/read_text_file requests, expected 1`);
  check(reads[0].sessionId === sessionId, "fs_read: request names another session");
  check(reads[0].path === FILE_PATH, `fs_read: asked for ${JSON.stringify(reads[0].path)}`);
  check(texts.length === 1 && texts[0] === FILE_CONTENT, `fs_read: chunks ${JSON.stringify(texts)}`);
  check(response.stopReason === "end_turn", `fs_read: stopReason ${response.stopReason}`);
}

/**
 * `wait_for_cancel`, then session/cancel once the transport accepted the prompt (plus 100 ms):
 * stopReason cancelled.
 * @param {Run} run
 * @param {string} sessionId
 */
export async function cancelStep(run, sessionId) {
  const before = run.promptsSent();
  const pending = run.agent.request(methods.agent.session.prompt, {
    sessionId,
    prompt: [{ type: "text", text: "wait_for_cancel" }],
  });
  pending.catch(() => {});
  const inFlight = await waitUntil(() => run.promptsSent() > before, run.ms);
  check(inFlight, "send wait_for_cancel: the prompt was not accepted in time");
  await new Promise((resolve) => setTimeout(resolve, 100));
  await step("session/cancel", run.agent.notify(methods.agent.session.cancel, { sessionId }), run.ms);
  const response = await step("prompt wait_for_cancel", pending, run.ms);
  run.summary.cancel = response.stopReason;
  check(response.stopReason === "cancelled", `cancel: stopReason ${response.stopReason}`);
}

/**
 * `echo <text>` in one session: exactly the chunk <text>, end_turn; returns the chunk.
 * @param {Run} run
 * @param {string} sessionId
 * @param {string} text
 */
export async function echoStep(run, sessionId, text) {
  run.client.takeUpdates();
  const response = await prompt(run, `prompt echo ${text}`, sessionId, `echo ${text}`, 1);
  const texts = chunkTexts(run.client.takeUpdates(), sessionId);
  check(texts.length === 1 && texts[0] === text, `echo ${text}: chunks ${JSON.stringify(texts)}`);
  check(response.stopReason === "end_turn", `echo ${text}: stopReason ${response.stopReason}`);
  return texts[0];
}

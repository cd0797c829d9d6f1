// The demo page: a small ACP client on top of acp-client.js (connect, several sessions side by
// side, prompts, streamed messages, tool calls, plans, permission requests, cancel, list and
// load). Everything the agent sends is shown through textContent or the safe Markdown renderer.

import { AcpClient } from "/static/acp_channels/acp-client.js";
import { renderMarkdown } from "/static/demo/markdown.js";

const FORM_KEY = "acp-demo form";
const $ = (selector, root = document) => /** @type {HTMLElement} */ (root.querySelector(selector));

const form = /** @type {HTMLFormElement} */ ($("#connect"));
const serverInput = /** @type {HTMLInputElement} */ ($("#server"));
const tokenInput = /** @type {HTMLInputElement} */ ($("#token"));
const stateView = $("#state");
const sessionsView = $("#sessions");
const sessionList = $("#session-list");
const buttons = {
  connect: /** @type {HTMLButtonElement} */ ($("#connect-button")),
  disconnect: /** @type {HTMLButtonElement} */ ($("#disconnect-button")),
  newSession: /** @type {HTMLButtonElement} */ ($("#new-session")),
  listSessions: /** @type {HTMLButtonElement} */ ($("#list-sessions")),
};

/** @type {AcpClient | null} */
let client = null;
/** @type {Map<string, SessionPane>} */
const panes = new Map();

const STATE_TEXT = {
  idle: "not connected",
  connecting: "connecting…",
  connected: "connected",
  reconnecting: "reconnecting…",
  closed: "disconnected",
};

// ------------------------------------------------------------------ the connect form

function transport() {
  return /** @type {HTMLInputElement} */ (form.querySelector("input[name=transport]:checked")).value;
}

function restoreForm() {
  const params = new URLSearchParams(location.search);
  let saved = {};
  try {
    saved = JSON.parse(sessionStorage.getItem(FORM_KEY) ?? "{}");
  } catch {
    saved = {};
  }
  serverInput.value = params.get("server") ?? saved.server ?? new URL("/acp", location.href).href;
  tokenInput.value = saved.token ?? "";
  const chosen = params.get("transport") ?? saved.transport;
  const radio = form.querySelector(`input[name=transport][value="${chosen === "http" ? "http" : "websocket"}"]`);
  /** @type {HTMLInputElement} */ (radio).checked = true;
  return Boolean(saved.connected);
}

/** The form in this tab's sessionStorage, so a reload reconnects to the same connection. */
function saveForm(connected) {
  const saved = { server: serverInput.value, token: tokenInput.value, transport: transport(), connected };
  sessionStorage.setItem(FORM_KEY, JSON.stringify(saved));
}

function showError(message) {
  $("#error-text").textContent = message;
  $("#error").hidden = false;
}

function clearError() {
  $("#error").hidden = true;
  $("#error-text").textContent = "";
}

function showState(state, detail = "") {
  stateView.dataset.state = state;
  const transportName = client?.transport === "http" ? "HTTP + SSE" : "WebSocket";
  stateView.textContent = `${STATE_TEXT[state] ?? state}${state === "connected" || state === "reconnecting" ? ` · ${transportName}` : ""}${detail}`;
  const connected = state === "connected" || state === "reconnecting";
  buttons.newSession.disabled = !connected;
  buttons.listSessions.disabled = !connected;
  buttons.disconnect.disabled = !(connected || state === "connecting");
  buttons.connect.disabled = connected || state === "connecting";
  for (const pane of panes.values()) pane.setConnected(connected);
}

async function connect() {
  clearError();
  if (client) await client.close();
  for (const pane of panes.values()) pane.remove();
  panes.clear();
  sessionList.hidden = true;
  let url;
  try {
    url = new URL(serverInput.value, location.href).href;
  } catch {
    showError(`not a URL: ${serverInput.value}`);
    return;
  }
  const next = new AcpClient({
    url,
    transport: /** @type {"websocket" | "http"} */ (transport()),
    token: tokenInput.value.trim() || undefined,
    clientInfo: { name: "acp-channels-demo-page", title: "ACP demo client", version: "0.1.0" },
  });
  client = next;
  next.addEventListener("state", (event) => {
    if (client !== next) return;
    const { state, error } = /** @type {CustomEvent} */ (event).detail;
    showState(state);
    if (error) showError(error.message);
    if (state === "closed") saveForm(false);
  });
  next.addEventListener("update", (event) => {
    const { sessionId, update } = /** @type {CustomEvent} */ (event).detail;
    panes.get(sessionId)?.update(update);
  });
  next.addEventListener("request", (event) => onAgentRequest(next, /** @type {CustomEvent} */ (event).detail));
  next.addEventListener("error", (event) => {
    const { error, sessionId } = /** @type {CustomEvent} */ (event).detail;
    const pane = sessionId ? panes.get(sessionId) : null;
    if (pane) pane.note(error.message, true);
    else showError(error.message);
  });
  saveForm(true);
  try {
    await next.connect();
  } catch {
    return; // shown by the state event
  }
  const agent = next.initializeResult?.agentInfo;
  showState(next.state, agent ? ` · ${agent.title ?? agent.name}` : "");
  if (next.resumed) showState(next.state, " · resumed");
}

/** @param {AcpClient} from @param {{ id: number | string, method: string, params: any, sessionId: string | null }} request */
function onAgentRequest(from, request) {
  const pane = request.sessionId ? panes.get(request.sessionId) : null;
  if (request.method === "session/request_permission") {
    // No pane for its session (a request from before a reload): nobody can answer, so "cancelled".
    if (pane) pane.permission(request);
    else from.respond(request.id, { outcome: { outcome: "cancelled" } }).catch(() => undefined);
    return;
  }
  // The page advertises no fs and no terminal: anything else is not supported here.
  from.respondError(request.id, -32601, `the demo page does not support ${request.method}`).catch(() => undefined);
}

form.addEventListener("submit", (event) => {
  event.preventDefault();
  connect();
});
buttons.disconnect.addEventListener("click", async () => {
  saveForm(false);
  await client?.close();
});
$("#error-dismiss").addEventListener("click", clearError);

buttons.newSession.addEventListener("click", async () => {
  if (!client) return;
  const from = client;
  try {
    const { sessionId } = await from.newSession();
    openPane(sessionId).focus();
  } catch (error) {
    showError(`session/new failed: ${error.message}`);
  }
});

buttons.listSessions.addEventListener("click", async () => {
  if (!client) return;
  let sessions;
  try {
    ({ sessions } = await client.listSessions());
  } catch (error) {
    showError(`session/list failed: ${error.message}`);
    return;
  }
  const items = $("#session-list-items");
  items.replaceChildren();
  if (!sessions.length) {
    const empty = document.createElement("li");
    empty.className = "hint";
    empty.textContent = "No sessions yet.";
    items.append(empty);
  }
  for (const info of sessions) {
    const item = document.createElement("li");
    item.dataset.sessionId = info.sessionId;
    const name = document.createElement("span");
    name.className = "session-name";
    name.textContent = info.title ? `${info.title} (${shortId(info.sessionId)})` : shortId(info.sessionId);
    const load = document.createElement("button");
    load.type = "button";
    load.textContent = panes.has(info.sessionId) ? "Open" : "Load";
    load.addEventListener("click", () => loadSession(info.sessionId));
    item.append(name, load);
    items.append(item);
  }
  sessionList.hidden = false;
});

/** @param {string} sessionId */
async function loadSession(sessionId) {
  if (!client) return;
  const existing = panes.get(sessionId);
  if (existing) {
    existing.focus();
    return;
  }
  const pane = openPane(sessionId);
  pane.setTurn("running", "loading");
  try {
    await client.loadSession(sessionId);
    pane.setTurn("idle");
    pane.note("history loaded");
  } catch (error) {
    pane.setTurn("error");
    pane.note(`session/load failed: ${error.message}`, true);
  }
}

/** @param {string} sessionId */
function openPane(sessionId) {
  const pane = new SessionPane(sessionId);
  panes.set(sessionId, pane);
  sessionsView.append(pane.element);
  return pane;
}

/** @param {string} id */
function shortId(id) {
  return id.length > 14 ? `${id.slice(0, 13)}…` : id;
}

// ------------------------------------------------------------------ one session

class SessionPane {
  /** @param {string} sessionId */
  constructor(sessionId) {
    this.sessionId = sessionId;
    const template = /** @type {HTMLTemplateElement} */ ($("#session-template"));
    this.element = /** @type {HTMLElement} */ (template.content.firstElementChild.cloneNode(true));
    this.element.dataset.sessionId = sessionId;
    $(".session-title", this.element).textContent = shortId(sessionId);
    $(".session-title", this.element).title = sessionId;
    this.transcript = $(".transcript", this.element);
    this.turnView = $(".turn", this.element);
    this.cancelButton = /** @type {HTMLButtonElement} */ ($(".cancel", this.element));
    this.promptForm = /** @type {HTMLFormElement} */ ($(".prompt", this.element));
    this.textarea = /** @type {HTMLTextAreaElement} */ ($("textarea", this.element));
    /** @type {{ element: HTMLElement, text: string, kind: string } | null} the message chunks go to */
    this.current = null;
    /** @type {Map<string, HTMLElement>} */
    this.tools = new Map();
    /** @type {HTMLElement | null} */
    this.plan = null;
    /** @type {Set<() => void>} permission requests still waiting: answered "cancelled" on cancel */
    this.waiting = new Set();
    this.running = false;
    this.renderQueued = new Set();

    this.promptForm.addEventListener("submit", (event) => {
      event.preventDefault();
      this.send();
    });
    this.textarea.addEventListener("keydown", (event) => {
      if (event.key === "Enter" && !event.shiftKey && !event.isComposing) {
        event.preventDefault();
        this.send();
      }
    });
    this.cancelButton.addEventListener("click", () => this.cancel());
    $(".close-pane", this.element).addEventListener("click", () => {
      panes.delete(this.sessionId);
      this.remove();
    });
  }

  focus() {
    this.element.scrollIntoView({ block: "nearest" });
    this.textarea.focus();
    return this;
  }

  remove() {
    this.element.remove();
  }

  /** @param {boolean} connected */
  setConnected(connected) {
    for (const control of this.promptForm.elements) /** @type {HTMLButtonElement} */ (control).disabled = !connected;
    if (!connected) this.cancelButton.disabled = true;
    else this.cancelButton.disabled = !this.running;
  }

  /** @param {string} turn @param {string} [label] */
  setTurn(turn, label) {
    this.turnView.dataset.turn = turn;
    this.turnView.textContent = label ?? (turn === "running" ? "running…" : turn === "idle" ? "idle" : turn);
    this.running = turn === "running";
    this.cancelButton.disabled = !this.running;
  }

  async send() {
    const text = this.textarea.value.trim();
    if (!text || !client || this.running) return;
    this.textarea.value = "";
    this.current = null;
    this.append(this.message("user", text));
    this.setTurn("running");
    try {
      const { stopReason } = await client.prompt(this.sessionId, text);
      this.flush();
      this.setTurn(stopReason, `stop reason: ${stopReason}`);
    } catch (error) {
      this.setTurn("error");
      this.note(`the prompt failed: ${error.message}`, true);
    }
    this.current = null;
  }

  cancel() {
    if (!client || !this.running) return;
    for (const answer of this.waiting) answer();
    client.cancel(this.sessionId).catch((error) => this.note(`session/cancel failed: ${error.message}`, true));
  }

  /** @param {any} update a session/update's `update` */
  update(update) {
    switch (update.sessionUpdate) {
      case "agent_message_chunk":
      case "user_message_chunk":
      case "agent_thought_chunk":
        this.chunk(update.sessionUpdate === "user_message_chunk" ? "user" : update.sessionUpdate === "agent_thought_chunk" ? "thought" : "agent", update.content);
        break;
      case "tool_call":
      case "tool_call_update":
        this.tool(update);
        break;
      case "plan":
        this.showPlan(update.entries ?? []);
        break;
      case "current_mode_update":
        this.note(`mode: ${update.currentModeId}`);
        break;
      default:
        break; // commands, config options, ...: not shown by this page
    }
  }

  /** @param {"user" | "agent" | "thought"} kind @param {any} content */
  chunk(kind, content) {
    const text = content?.type === "text" ? content.text : `[${content?.type ?? "content"}]`;
    if (!this.current || this.current.kind !== kind) {
      this.current = { element: this.message(kind, ""), text: "", kind };
      this.append(this.current.element);
    }
    this.current.text += text;
    // Rendering a long answer on every chunk would cost quadratic time: once per frame instead.
    const target = this.current;
    if (!this.renderQueued.has(target)) {
      this.renderQueued.add(target);
      requestAnimationFrame(() => this.render(target));
    }
  }

  flush() {
    for (const target of this.renderQueued) this.render(target);
  }

  render(target) {
    if (!this.renderQueued.delete(target)) return;
    if (target.kind === "user") target.element.textContent = target.text;
    else renderMarkdown(target.text, target.element);
    this.transcript.scrollTop = this.transcript.scrollHeight;
  }

  /** @param {string} kind @param {string} text */
  message(kind, text) {
    const element = document.createElement("li");
    element.className = `message ${kind}`;
    element.textContent = text;
    return element;
  }

  /** @param {HTMLElement} element */
  append(element) {
    this.transcript.append(element);
    this.transcript.scrollTop = this.transcript.scrollHeight;
  }

  /** @param {string} text @param {boolean} [bad] */
  note(text, bad = false) {
    const element = document.createElement("li");
    element.className = bad ? "note bad" : "note";
    element.textContent = text;
    this.append(element);
    this.current = null;
  }

  /** A tool call card, updated in place by later tool_call_update notifications. @param {any} update */
  tool(update) {
    let card = this.tools.get(update.toolCallId);
    if (!card) {
      card = document.createElement("li");
      card.className = "tool";
      card.dataset.toolCallId = update.toolCallId;
      const head = document.createElement("div");
      head.className = "tool-head";
      const title = document.createElement("span");
      title.className = "tool-title";
      const badge = document.createElement("span");
      badge.className = "badge";
      head.append(title, badge);
      const body = document.createElement("div");
      body.className = "tool-body";
      card.append(head, body);
      this.tools.set(update.toolCallId, card);
      this.append(card);
      this.current = null;
    }
    if (update.title) $(".tool-title", card).textContent = `${update.kind ? `${update.kind}: ` : ""}${update.title}`;
    if (update.status) {
      const badge = $(".badge", card);
      badge.dataset.status = update.status;
      badge.textContent = update.status.replace("_", " ");
    }
    if (Array.isArray(update.content)) {
      const body = $(".tool-body", card);
      body.replaceChildren(
        ...update.content.map((item) => {
          const block = document.createElement("pre");
          block.className = "tool-content";
          if (item.type === "content") block.textContent = item.content?.type === "text" ? item.content.text : `[${item.content?.type}]`;
          else if (item.type === "diff") block.textContent = `${item.path}\n${item.newText ?? ""}`;
          else block.textContent = `[${item.type}]`;
          return block;
        }),
      );
    }
  }

  /** @param {{ content: string, status: string, priority?: string }[]} entries */
  showPlan(entries) {
    if (!this.plan) {
      this.plan = document.createElement("li");
      this.plan.className = "plan";
      const title = document.createElement("h3");
      title.textContent = "Plan";
      this.plan.append(title, document.createElement("ol"));
      this.append(this.plan);
      this.current = null;
    }
    $("ol", this.plan).replaceChildren(
      ...entries.map((entry) => {
        const item = document.createElement("li");
        item.dataset.status = entry.status;
        item.textContent = `${entry.content} (${entry.status.replace("_", " ")})`;
        return item;
      }),
    );
  }

  /** A permission request as buttons, one per option. @param {{ id: number | string, params: any }} request */
  permission(request) {
    const from = client;
    const card = document.createElement("li");
    card.className = "permission";
    const head = document.createElement("div");
    head.className = "permission-head";
    head.textContent = `Permission: ${request.params?.toolCall?.title ?? "the agent asks"}`;
    const options = document.createElement("div");
    options.className = "options";
    const chosen = document.createElement("p");
    chosen.className = "chosen";
    const answer = (outcome, label) => {
      if (!this.waiting.has(cancelAnswer)) return;
      this.waiting.delete(cancelAnswer);
      for (const button of options.querySelectorAll("button")) /** @type {HTMLButtonElement} */ (button).disabled = true;
      chosen.textContent = label;
      from?.respond(request.id, { outcome }).catch((error) => this.note(`the answer failed: ${error.message}`, true));
    };
    const cancelAnswer = () => answer({ outcome: "cancelled" }, "cancelled");
    for (const option of request.params?.options ?? []) {
      const button = document.createElement("button");
      button.type = "button";
      button.className = option.kind?.startsWith("allow") ? "primary" : "";
      button.textContent = option.name ?? option.optionId;
      button.addEventListener("click", () => answer({ outcome: "selected", optionId: option.optionId }, `you chose: ${option.name ?? option.optionId}`));
      options.append(button);
    }
    card.append(head, options, chosen);
    this.waiting.add(cancelAnswer);
    this.append(card);
    this.current = null;
  }
}

showState("idle");
if (restoreForm()) connect(); // a reload: pick the connection up again

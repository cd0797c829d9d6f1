// The demo page: a small ACP client on top of acp-client.js (connect, several sessions side by
// side, prompts, streamed messages, tool calls, plans, permission requests, cancel, list and
// load; the server's directory of live sessions, and attaching to one another tab or device
// runs). Everything the agent sends is shown through textContent or the safe Markdown renderer.

import { AcpClient, OBSERVER_REFUSED, TURN_RUNNING, fetchDirectory } from "/static/acp_channels/acp-client.js";
import { renderMarkdown } from "/static/demo/markdown.js";

const FORM_KEY = "acp-demo form";
const $ = (selector, root = document) => /** @type {HTMLElement} */ (root.querySelector(selector));

const form = /** @type {HTMLFormElement} */ ($("#connect"));
const serverInput = /** @type {HTMLInputElement} */ ($("#server"));
const tokenInput = /** @type {HTMLInputElement} */ ($("#token"));
const stateView = $("#state");
const sessionsView = $("#sessions");
const sessionList = $("#session-list");
const directoryView = $("#directory");
const directoryItems = $("#directory-items");
const directoryStatus = $("#directory-status");
const buttons = {
  connect: /** @type {HTMLButtonElement} */ ($("#connect-button")),
  disconnect: /** @type {HTMLButtonElement} */ ($("#disconnect-button")),
  newSession: /** @type {HTMLButtonElement} */ ($("#new-session")),
  listSessions: /** @type {HTMLButtonElement} */ ($("#list-sessions")),
  directory: /** @type {HTMLButtonElement} */ ($("#directory-button")),
  refreshDirectory: /** @type {HTMLButtonElement} */ ($("#refresh-directory")),
};
const CLIENT_INFO = { name: "acp-channels-demo-page", title: "ACP demo client", version: "0.1.0" };

/** @type {AcpClient | null} this tab's own connection (the form's Connect) */
let client = null;
/** @type {Map<string, SessionPane>} every pane, by session: this tab's connection's, or an attachment's */
const panes = new Map();
/** @type {import("/static/acp_channels/acp-client.js").Directory | null} the directory last fetched */
let directory = null;

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
  for (const pane of panes.values()) if (pane.client === client) pane.setConnected(connected);
}

/** The endpoint the form names, or null (and the error shown). */
function endpoint() {
  try {
    return new URL(serverInput.value, location.href).href;
  } catch {
    showError(`not a URL: ${serverInput.value}`);
    return null;
  }
}

/** The pane showing `sessionId` for `from` (a pane belongs to one client). @param {AcpClient} from @param {string | null} sessionId */
function paneOf(from, sessionId) {
  const pane = sessionId ? panes.get(sessionId) : undefined;
  return pane && pane.client === from ? pane : null;
}

/** Route what a client (this tab's connection, or an attachment) says to its panes. @param {AcpClient} from */
function listen(from) {
  /** @param {Event} event */
  const detail = (event) => /** @type {CustomEvent} */ (event).detail;
  from.addEventListener("update", (event) => paneOf(from, detail(event).sessionId)?.update(detail(event).update));
  from.addEventListener("request", (event) => onAgentRequest(from, detail(event)));
  from.addEventListener("turnended", (event) => paneOf(from, detail(event).sessionId)?.turnEnded(detail(event).stopReason));
  from.addEventListener("permissionresolved", (event) => {
    const { sessionId, requestId, outcome } = detail(event);
    paneOf(from, sessionId)?.permissionResolved(requestId, outcome);
  });
  from.addEventListener("error", (event) => {
    const { error, sessionId } = detail(event);
    const pane = paneOf(from, sessionId);
    if (pane) pane.note(error.message, true);
    else showError(error.message);
  });
}

async function connect() {
  clearError();
  const previous = client;
  if (previous) await previous.close();
  for (const [sessionId, pane] of panes) {
    if (pane.attached) continue; // attachments are connections of their own: they stay
    pane.remove();
    panes.delete(sessionId);
  }
  sessionList.hidden = true;
  const url = endpoint();
  if (url === null) return;
  const next = new AcpClient({
    url,
    transport: /** @type {"websocket" | "http"} */ (transport()),
    token: tokenInput.value.trim() || undefined,
    clientInfo: CLIENT_INFO,
  });
  client = next;
  next.addEventListener("state", (event) => {
    if (client !== next) return;
    const { state, error } = /** @type {CustomEvent} */ (event).detail;
    showState(state);
    if (error) showError(error.message);
    if (state === "closed") saveForm(false);
  });
  listen(next);
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
  const pane = paneOf(from, request.sessionId);
  if (request.method === "session/request_permission") {
    if (pane) {
      pane.permission(request);
    } else if (from === client && request.sessionId && !panes.has(request.sessionId)) {
      // A session of this connection without a pane (closed, or from before a reload): show it,
      // so someone can answer (answering "cancelled" here would win the race against another
      // client of a shared session that can).
      openPane(request.sessionId).permission(request);
    } else {
      from.respond(request.id, { outcome: { outcome: "cancelled" } }).catch(() => undefined);
    }
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

/**
 * @param {string} sessionId
 * @param {AcpClient | null} [owner] the client it belongs to (default: this tab's connection)
 * @param {"controller" | "observer" | null} [role] for an attachment: its role
 */
function openPane(sessionId, owner = client, role = null) {
  const pane = new SessionPane(sessionId, owner, role);
  panes.set(sessionId, pane);
  sessionsView.append(pane.element);
  renderDirectory();
  return pane;
}

// ------------------------------------------------------------------ live sessions: the directory

/** Fetch the server's directory of this principal's live sessions and show it. */
async function refreshDirectory() {
  directoryView.hidden = false;
  buttons.refreshDirectory.disabled = true;
  directoryStatus.textContent = "loading…";
  directoryStatus.classList.remove("bad");
  try {
    const url = endpoint();
    if (url === null) return;
    // This tab's connection knows where the server lists sessions; without one, `<endpoint>/sessions`.
    const token = tokenInput.value.trim() || undefined;
    directory = client && client.url === url && client.token === (token ?? null) && client.state !== "closed"
      ? await client.directory()
      : await fetchDirectory({ url, token });
    renderDirectory();
  } catch (error) {
    directory = null;
    directoryItems.replaceChildren();
    directoryStatus.textContent = `the directory failed: ${error.message}`;
    directoryStatus.classList.add("bad");
  } finally {
    buttons.refreshDirectory.disabled = false;
  }
}

function renderDirectory() {
  if (!directory) return;
  const { sessions, complete } = directory;
  directoryStatus.textContent = sessions.length
    ? `${sessions.length} live session${sessions.length === 1 ? "" : "s"}, most recently active first${complete ? "" : " (some workers did not answer: the list is incomplete)"}`
    : "No live sessions. The server lists your own sessions only: without a token or a login it lists none.";
  directoryItems.replaceChildren(
    ...sessions.map((info) => {
      const item = document.createElement("li");
      item.dataset.sessionId = info.sessionId;
      item.dataset.connectionId = info.connectionId;
      const name = document.createElement("span");
      name.className = "session-name";
      name.textContent = `${shortId(info.sessionId)}${info.agent ? ` · ${info.agent}` : ""}`;
      name.title = info.sessionId;
      const own = client !== null && client.state !== "closed" && info.connectionId === client.connectionId;
      const facts = document.createElement("span");
      facts.className = "session-facts";
      facts.textContent = [
        info.turnRunning ? "turn running" : "idle",
        info.pendingPermissions ? `${info.pendingPermissions} permission request${info.pendingPermissions === 1 ? "" : "s"} waiting` : "",
        `${info.attachments} attached`,
        own ? "this tab's connection" : "",
        `active ${new Date(info.lastActivity).toLocaleTimeString()}`,
      ].filter(Boolean).join(" · ");
      const actions = document.createElement("span");
      actions.className = "actions";
      /** @param {string} label @param {() => void} action @param {string} [title] */
      const button = (label, action, title) => {
        const element = document.createElement("button");
        element.type = "button";
        element.textContent = label;
        if (title) element.title = title;
        element.addEventListener("click", action);
        actions.append(element);
      };
      if (panes.has(info.sessionId)) button("Open", () => panes.get(info.sessionId)?.focus());
      else if (own) button("Load", () => loadSession(info.sessionId));
      else {
        button("Attach", () => attach(info.sessionId, "controller"), "See its output and take part: prompt, answer permission requests");
        button("Watch", () => attach(info.sessionId, "observer"), "See its output only (an observer)");
      }
      item.append(name, facts, actions);
      return item;
    }),
  );
}

/**
 * Attach to a live session (another tab's, another device's): a connection of its own that
 * carries that session; the pane shows what the session kept of its output, then live.
 * @param {string} sessionId @param {"controller" | "observer"} role
 */
async function attach(sessionId, role) {
  const existing = panes.get(sessionId);
  if (existing) {
    existing.focus();
    return;
  }
  const url = endpoint();
  if (url === null) return;
  const attachment = new AcpClient({
    url,
    transport: /** @type {"websocket" | "http"} */ (transport()),
    token: tokenInput.value.trim() || undefined,
    clientInfo: CLIENT_INFO,
    attachSession: sessionId,
    attachRole: role,
    storage: null, // a reload attaches afresh, and gets everything the session kept again
  });
  const pane = openPane(sessionId, attachment, role);
  listen(attachment);
  attachment.addEventListener("state", (event) => {
    const { state, error } = /** @type {CustomEvent} */ (event).detail;
    pane.attachmentState(state, error);
  });
  pane.setTurn("attaching", "attaching…");
  try {
    await attachment.connect();
  } catch {
    return; // shown in the pane by the state event
  }
  // Before the session's output arrives (it comes in later messages).
  const running = attachment.attachment?.turnRunning;
  pane.setTurn(running ? "elsewhere" : "idle");
  pane.note(role === "observer" ? "watching: the session's output so far, then live" : "attached: the session's output so far, then live");
  pane.focus();
}

/** @param {string} id */
function shortId(id) {
  return id.length > 14 ? `${id.slice(0, 13)}…` : id;
}

// ------------------------------------------------------------------ one session

class SessionPane {
  /**
   * @param {string} sessionId
   * @param {AcpClient | null} owner the client whose session this is (its own connection's, or an attachment)
   * @param {"controller" | "observer" | null} role an attachment's role; null: this tab's connection
   */
  constructor(sessionId, owner, role) {
    this.sessionId = sessionId;
    this.client = owner;
    this.role = role;
    this.attached = role !== null;
    const template = /** @type {HTMLTemplateElement} */ ($("#session-template"));
    this.element = /** @type {HTMLElement} */ (template.content.firstElementChild.cloneNode(true));
    this.element.dataset.sessionId = sessionId;
    if (role) this.element.dataset.role = role;
    $(".session-title", this.element).textContent = shortId(sessionId);
    $(".session-title", this.element).title = sessionId;
    this.linkView = $(".link", this.element);
    this.linkView.hidden = !this.attached;
    this.linkView.textContent = role === "observer" ? "watching" : "attached";
    this.transcript = $(".transcript", this.element);
    this.turnView = $(".turn", this.element);
    this.cancelButton = /** @type {HTMLButtonElement} */ ($(".cancel", this.element));
    this.promptForm = /** @type {HTMLFormElement} */ ($(".prompt", this.element));
    this.textarea = /** @type {HTMLTextAreaElement} */ ($("textarea", this.element));
    this.promptNote = $(".prompt-note", this.element);
    this.placeholder = this.textarea.placeholder;
    if (role === "observer") this.placeholder = "Watching: an observer sees the session, and cannot prompt";
    this.textarea.placeholder = this.placeholder;
    /** @type {{ element: HTMLElement, text: string, kind: string } | null} the message chunks go to */
    this.current = null;
    /** @type {Map<string, HTMLElement>} */
    this.tools = new Map();
    /** @type {HTMLElement | null} */
    this.plan = null;
    /** @type {Set<() => void>} permission requests still waiting: answered "cancelled" on cancel */
    this.waiting = new Set();
    /** @type {Map<string, { card: HTMLElement, cancelAnswer: () => void, options: any[] }>} by the request's id (JSON) */
    this.permissions = new Map();
    /** this tab's prompt runs */
    this.running = false;
    /** a turn another client prompted runs */
    this.elsewhere = false;
    this.connected = owner?.state === "connected" || owner?.state === "reconnecting";
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
    const close = $(".close-pane", this.element);
    if (this.attached) close.setAttribute("aria-label", "Detach: close this pane (the session goes on)");
    close.addEventListener("click", () => {
      if (panes.get(this.sessionId) === this) panes.delete(this.sessionId);
      this.remove();
      if (this.attached) this.client?.close(); // detach: the session and its other clients go on
      renderDirectory();
    });
    this.setConnected(this.connected);
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
    this.connected = connected;
    const canPrompt = connected && this.role !== "observer";
    for (const control of this.promptForm.elements) /** @type {HTMLButtonElement} */ (control).disabled = !canPrompt;
    this.updateCancel();
  }

  /** Cancel ends the running turn: this tab's, or (a controller's) one another client prompted. */
  updateCancel() {
    this.cancelButton.disabled = !(this.connected && (this.running || (this.elsewhere && this.role !== "observer")));
  }

  /** An attachment's connection changed state. @param {string} state @param {Error | null} error */
  attachmentState(state, error) {
    const name = this.role === "observer" ? "watching" : "attached";
    this.linkView.dataset.state = state;
    this.linkView.textContent = state === "connected" || state === "connecting" ? name : `${name} · ${STATE_TEXT[state] ?? state}`;
    this.setConnected(state === "connected" || state === "reconnecting");
    if (state === "closed" && error) {
      if (this.running || this.elsewhere || this.turnView.dataset.turn === "attaching") this.setTurn("error", "detached");
      this.note(error.message, true);
    }
  }

  /** @param {string} turn @param {string} [label] */
  setTurn(turn, label) {
    this.turnView.dataset.turn = turn;
    const labels = { running: "running…", idle: "idle", elsewhere: "running elsewhere…" };
    this.turnView.textContent = label ?? labels[turn] ?? turn;
    this.running = turn === "running";
    this.elsewhere = turn === "elsewhere";
    this.textarea.placeholder = this.elsewhere && this.role !== "observer"
      ? "A turn runs elsewhere (another tab or client): prompt once it ends"
      : this.placeholder;
    this.updateCancel();
  }

  /** Say something in the prompt box (why a prompt did not go); null: nothing. @param {string | null} text */
  sayInPromptBox(text) {
    this.promptNote.textContent = text ?? "";
    this.promptNote.hidden = text === null;
  }

  async send() {
    const text = this.textarea.value.trim();
    const from = this.client;
    if (!text || !from || this.running || this.role === "observer") return;
    this.textarea.value = "";
    this.sayInPromptBox(null);
    this.current = null;
    const shown = this.message("user", text);
    this.append(shown);
    this.setTurn("running");
    try {
      const { stopReason } = await from.prompt(this.sessionId, text);
      this.flush();
      this.setTurn(stopReason, `stop reason: ${stopReason}`);
    } catch (error) {
      if (error.code === TURN_RUNNING) {
        // A shared session runs another client's turn: nothing was sent. Say so where the
        // prompt was typed, and give the text back.
        shown.remove();
        if (!this.textarea.value) this.textarea.value = text;
        this.setTurn("elsewhere");
        this.sayInPromptBox("Not sent: a turn is running elsewhere on this session (another tab or client). Send again once it ends, or Cancel it.");
      } else if (error.code === OBSERVER_REFUSED) {
        shown.remove();
        this.setTurn("idle");
        this.sayInPromptBox("Not sent: an observer cannot prompt.");
      } else {
        this.setTurn("error");
        this.note(`the prompt failed: ${error.message}`, true);
      }
    }
    this.current = null;
  }

  cancel() {
    const from = this.client;
    if (!from || !(this.running || this.elsewhere)) return;
    for (const answer of this.waiting) answer();
    from.cancel(this.sessionId).catch((error) => this.note(`session/cancel failed: ${error.message}`, true));
  }

  /** A turn another client prompted ended (`_acp-channels/session/turn_ended`). @param {string} stopReason */
  turnEnded(stopReason) {
    this.flush();
    this.current = null;
    this.sayInPromptBox(null);
    if (!this.running) this.setTurn(stopReason, `stop reason: ${stopReason}`);
  }

  /** @param {any} update a session/update's `update` */
  update(update) {
    // Another client's prompt (shown to this one): its turn runs elsewhere.
    if (update.sessionUpdate === "user_message_chunk" && !this.running && !this.elsewhere) this.setTurn("elsewhere");
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
    const from = this.client;
    const key = JSON.stringify(request.id);
    if (this.permissions.has(key)) return; // asked again (a resumed stream): already shown
    const card = document.createElement("li");
    card.className = "permission";
    card.dataset.requestId = key;
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
      this.permissions.delete(key);
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
    this.permissions.set(key, { card, cancelAnswer, options: request.params?.options ?? [] });
    this.append(card);
    this.current = null;
  }

  /**
   * Another client answered a permission request this pane shows (or the server did, after
   * nobody answered in time): it goes from the page, a note says how it was answered.
   * @param {number | string} requestId @param {any} outcome
   */
  permissionResolved(requestId, outcome) {
    const key = JSON.stringify(requestId);
    const shown = this.permissions.get(key);
    if (!shown) return;
    this.permissions.delete(key);
    this.waiting.delete(shown.cancelAnswer);
    const option = shown.options.find((candidate) => candidate.optionId === outcome?.optionId);
    const how = outcome?.outcome === "selected" ? option?.name ?? outcome.optionId : outcome?.outcome ?? "answered";
    const note = document.createElement("li");
    note.className = "note";
    note.textContent = `permission answered elsewhere: ${how}`;
    shown.card.replaceWith(note);
  }
}

buttons.directory.addEventListener("click", refreshDirectory);
buttons.refreshDirectory.addEventListener("click", refreshDirectory);
// The tab goes: detach its attachments now (a dropped socket would hold its place on the
// session until the server's resume window ends). This tab's own connection stays, to resume.
addEventListener("pagehide", () => {
  for (const pane of panes.values()) if (pane.attached) pane.client?.close();
});

showState("idle");
if (restoreForm()) connect(); // a reload: pick the connection up again

// nanofleet's web chat: a client of the REST API (/api/v1) and its event stream, and the page that
// drives it. The client runs in a browser or in Node (tests/gateway/web_client.mjs uses it).
// Everything the model or a tool wrote is shown as text (textContent), never parsed as HTML.

const TERMINAL = new Set(["succeeded", "failed", "cancelled"]);
const POLL_MS = 2000;
const LISTED = 50;  // conversations offered in the page's picker
const TITLE_CHARS = 60;  // a new conversation is named after the start of its first message
// What the API takes with a message (gateway/schemas.py ChatIn): checked before sending, so the page
// can name the photo that is refused instead of showing the gateway's 422 or 413.
const MAX_PHOTOS = 4;
const MAX_PHOTO_BYTES = 5 * 1024 * 1024;
const PHOTO_TYPES = new Set(["image/jpeg", "image/png", "image/gif", "image/webp"]);

export class ApiError extends Error {
  constructor(status, detail) {
    super(`${status}: ${detail}`);
    this.status = status;
  }
}

export class Client {
  constructor(base, key) {
    this.base = base.replace(/\/$/, "");
    this.key = key;
  }

  headers(extra = {}) {
    return { Authorization: `Bearer ${this.key}`, ...extra };
  }

  // `waits`: a 504 with the gateway's own answer is /chat's "the turn goes on" (a proxy's 504 is no answer).
  async call(method, path, body, waits = false) {
    const init = { method, headers: this.headers({ "Content-Type": "application/json" }) };
    if (body !== undefined) init.body = JSON.stringify(body);
    const res = await fetch(this.base + path, init);
    const data = await res.json().catch(() => null);
    if (!res.ok && !(waits && res.status === 504 && data?.conversationId !== undefined)) {
      throw new ApiError(res.status, refusal(res, data));
    }
    return { status: res.status, data };
  }

  async newConversation() {
    const { data } = await this.call("POST", "/api/v1/conversations", {});
    return data.conversationId;
  }

  // The API's conversations, the most recently active first: [{conversationId, title, lastActiveAt, ...}].
  async conversations() {
    const { data } = await this.call("GET", `/api/v1/conversations?channel=api&limit=${LISTED}`);
    return data;
  }

  async rename(conversationId, title) {
    const { data } = await this.call("PATCH", `/api/v1/conversations/${conversationId}`, { title });
    return data;
  }

  // Send `text` (and `images`, data URLs) and return at once: {runId, messageId, queued, reply}
  // (`reply`: a command's answer; otherwise the answer comes on the event stream).
  async post(conversationId, text, images = []) {
    const { data } = await this.call("POST", `/api/v1/conversations/${conversationId}/messages`,
      images.length ? { message: text, images } : { message: text });
    return data;
  }

  // The answer to `text` (and `images`, data URLs): {text, status, toolCalls}. A turn longer than
  // the gateway's wait (504) is followed through its run until it ends; a message still waiting
  // behind another turn then (no run yet) is answered later: {status: "queued"}.
  async chat(conversationId, text, images = []) {
    const { status, data } = await this.call("POST", `/api/v1/conversations/${conversationId}/chat`,
      images.length ? { message: text, images } : { message: text }, true);
    if (status !== 504) {
      return { text: data.assistantMessage, status: data.status, toolCalls: data.toolCalls ?? [] };
    }
    if (!data.runId) return { text: "", status: "queued", toolCalls: [] };
    const run = await this.waitRun(data.runId);
    return { text: run.result ?? "", status: run.status, toolCalls: [] };
  }

  // The conversation's user and assistant messages with text, and what the agent sent with the
  // `message` tool (role "SENT": {content, files}, as a `message` event has them), oldest first (404
  // if it is gone); then the user's messages still waiting behind a turn ({pending: true}).
  async history(conversationId) {
    const path = `/api/v1/conversations/${conversationId}/messages?limit=1000`;
    const shown = [];
    const waiting = [];
    for (let after = null; ;) {
      const { data } = await this.call("GET", after === null ? path : `${path}&after=${after}`);
      for (const m of data) {
        if (m.type === "NORMAL" && ["USER", "ASSISTANT"].includes(m.role) && (m.content.trim() || m.images)) {
          const message = { role: m.role, content: withPhotos(m.content, m.images ?? 0) };
          if (!m.pending) shown.push(message);
          else if (m.role === "USER") waiting.push({ ...message, pending: true });
        } else if (m.role === "TOOL" && m.toolName === "message") {
          const sent = sentToCaller(m.content);
          if (sent) shown.push({ role: "SENT", ...sent });
        }
      }
      if (data.length < 1000) return [...shown, ...waiting];
      after = Math.max(...data.map((m) => m.seq));
    }
  }

  // A file the agent sent (a `message` event's files[i].url) as a Blob: the link needs the API key.
  async download(url) {
    const res = await fetch(this.base + url, { headers: this.headers() });
    if (!res.ok) throw new ApiError(res.status, await res.text());
    return res.blob();
  }

  async waitRun(runId) {
    for (;;) {
      const { data } = await this.call("GET", `/api/v1/runs/${runId}`);
      if (TERMINAL.has(data.status)) return data;
      await new Promise((done) => setTimeout(done, POLL_MS));
    }
  }

  // The conversation's events as they come: {id, event, data}, after the event `since` (an id seen
  // before, or "0" for what the stream holds; none: from now); ends when `signal` aborts. `opened`
  // is called once the stream answered.
  async *events(conversationId, signal, since = "", opened = () => {}) {
    const headers = this.headers({ Accept: "text/event-stream", ...(since ? { "Last-Event-ID": since } : {}) });
    const res = await fetch(`${this.base}/api/v1/conversations/${conversationId}/events`, { headers, signal });
    if (!res.ok) throw new ApiError(res.status, await res.text());
    opened();
    const reader = res.body.pipeThrough(new TextDecoderStream()).getReader();
    let buffer = "";
    let held = "";  // a chunk's last "\r": the next one may start with the "\n" of the same line break
    for (;;) {
      const { value, done } = await reader.read();
      if (done) return;
      const text = held + value;
      held = text.endsWith("\r") ? "\r" : "";
      buffer += (held ? text.slice(0, -1) : text).replace(/\r\n?/g, "\n");
      let end;
      while ((end = buffer.indexOf("\n\n")) >= 0) {
        const event = parseEvent(buffer.slice(0, end));
        buffer = buffer.slice(end + 2);
        if (event) yield event;
      }
    }
  }
}

// Why a request was not answered. A proxy's refusal may not be JSON: its status text, then; one
// that gave up waiting (502, 504) may have passed the request on all the same.
function refusal(res, data) {
  if (data !== null) return typeof data.detail === "string" ? data.detail : readable(data.detail ?? data);
  const reason = res.statusText || "no reason given";
  return [502, 504].includes(res.status) ? `${reason} (it may have reached the agent: the conversation shows it if so)`
    : reason;
}

// An API error's detail as people read it: a 422's problems as "field: what is wrong" lines.
export function readable(detail) {
  if (!Array.isArray(detail)) return JSON.stringify(detail);
  return detail.map((problem) => {
    const where = (problem.loc ?? []).filter((part) => part !== "body").join(".");
    const what = String(problem.msg ?? "not accepted").replace(/^Value error, /, "");
    return where ? `${where}: ${what}` : what;
  }).join("; ");
}

// One SSE block ("id: ...\nevent: ...\ndata: ..."); null for comments and pings.
export function parseEvent(block) {
  const event = { id: "", event: "message", data: "" };
  const data = [];
  for (const line of block.split("\n")) {
    const colon = line.indexOf(":");
    if (colon === 0) continue;
    const field = colon < 0 ? line : line.slice(0, colon);
    const value = colon < 0 ? "" : line.slice(colon + 1).replace(/^ /, "");
    if (field === "data") data.push(value);
    else if (field === "id" || field === "event") event[field] = value;
  }
  if (!data.length) return null;
  try {
    event.data = JSON.parse(data.join("\n"));
  } catch {
    event.data = data.join("\n");
  }
  return event;
}

// The page: only in a browser.
function page() {
  const $ = (id) => document.getElementById(id);
  const store = window.localStorage;
  let client = null;
  let conversation = store.getItem("nanofleet.conversation");
  let watching = null;
  const live = new Map();  // run id -> the answer bubble its streamed text goes to

  // The picker: this key's API conversations, newest first, the open one selected.
  async function listConversations() {
    const options = (await client.conversations()).map((c) => {
      const when = new Date(c.lastActiveAt).toLocaleString();
      const option = new Option(`${c.title ?? "untitled"} · ${when}`, c.conversationId);
      option.dataset.titled = c.title ? "yes" : "";
      return option;
    });
    if (!options.some((o) => o.value === (conversation ?? ""))) options.unshift(new Option("new conversation", conversation ?? ""));
    $("pick").replaceChildren(...options);
    $("pick").value = conversation ?? "";
    $("pick").hidden = false;
  }

  function bubble(kind, text) {
    const div = document.createElement("div");
    div.className = `msg ${kind}`;
    div.textContent = text;
    $("log").append(div);
    div.scrollIntoView({ block: "end" });
    return div;
  }

  // What the agent sent with the `message` tool: its text, and a download link per file.
  function sent(data) {
    const div = bubble("assistant", data.content ?? "");
    for (const file of data.files ?? []) {
      const link = document.createElement("a");
      link.href = "#";
      link.className = "file";
      link.textContent = `📎 ${file.name} (${sizeOf(file.size)})`;
      link.addEventListener("click", async (event) => {
        event.preventDefault();
        try {
          const url = URL.createObjectURL(await client.download(file.url));
          const save = Object.assign(document.createElement("a"), { href: url, download: file.name });
          save.click();
          setTimeout(() => URL.revokeObjectURL(url), 60000);
        } catch (err) {
          $("status").textContent = `could not download ${file.name}: ${err.message ?? err}`;
        }
      });
      div.append(link);
    }
  }

  function render(history) {
    $("log").replaceChildren();
    live.clear();
    if (history.length > 50) bubble("tool", `${history.length - 50} earlier messages are not shown`);
    for (const m of history.slice(-50)) {
      if (m.role === "SENT") sent(m);
      else bubble(m.role === "USER" ? (m.pending ? "user pending" : "user") : "assistant", m.content);
    }
  }

  // The answer bubble of run `runId`, made at its first streamed text.
  function answerOf(runId) {
    if (!live.has(runId)) live.set(runId, bubble("assistant pending", ""));
    return live.get(runId);
  }

  // A run of the conversation ended (this tab's, another tab's, or one a reload missed the start of):
  // the transcript as stored, which holds its question and answer in their places; a failed or
  // stopped run's reply, which is not stored, after it.
  async function ended(data) {
    const shown = conversation;
    let history;
    try {
      history = await client.history(shown);
    } catch {
      return;  // (gone: the stream says so next)
    }
    if (conversation !== shown) return;
    render(history);
    if (data.status !== "succeeded") bubble("assistant error", data.text || (data.status === "cancelled" ? "Stopped." : "The turn failed."));
  }

  // Follow the conversation's events; `fresh`: one just made, whose stream is read from its start
  // (the first message's run may publish before the stream is open).
  async function follow(fresh = false) {
    watching?.abort();
    watching = new AbortController();
    const signal = watching.signal;
    let since = fresh ? "0" : "";
    // Once the stream is open (from now), the transcript again: a run that ended while the page
    // loaded is in it. A fresh conversation's stream is read from its start instead, and later
    // reconnections resume from the last event seen.
    const opened = () => since || ended({ status: "succeeded" });
    while (!signal.aborted) {
      try {
        for await (const { id, event, data } of client.events(conversation, signal, since, opened)) {
          since = id;
          if (event === "text.delta") answerOf(data.run_id).textContent += data.text;
          if (event === "tool.started") bubble("tool", `⚙ ${data.tool} …`);
          if (event === "tool.finished") bubble("tool", `⚙ ${data.tool}: ${data.status} (${Math.round(data.elapsed_ms)} ms)`);
          if (event === "message") sent(data);
          if (event === "run.finished" || event === "run.failed") ended(data);
          if (event === "conversation.deleted") {
            await open(null);
            $("status").textContent = "That conversation was deleted (in another tab, or through the API): "
              + "this is a new one.";
            return;
          }
        }
      } catch (err) {
        if (signal.aborted) return;
        if (err.status === 401 || err.status === 404) {  // trying again will not help
          $("status").textContent = `live updates stopped: ${err.message}`;
          return;
        }
      }
      await new Promise((done) => setTimeout(done, POLL_MS));
    }
  }

  async function connect(event) {
    event.preventDefault();
    const key = $("key").value.trim();
    if (!key) return;
    client = new Client(window.location.origin, key);
    $("send").disabled = true;
    watching?.abort();
    try {
      let earlier = [];
      if (conversation) {
        try {
          earlier = await client.history(conversation);
        } catch (err) {
          if (err.status !== 404) throw err;
          conversation = null;  // gone (a reset database): a new one starts with the next message
          store.removeItem("nanofleet.conversation");
        }
      }
      await listConversations();  // (the key works: a 401 otherwise)
      if ($("remember").checked) store.setItem("nanofleet.key", key);  // a mistyped key replaces no good one
      else store.removeItem("nanofleet.key");
      render(earlier);
      $("status").textContent = conversation ? `conversation ${conversation}`
        : "a new conversation: it starts with your first message";
      $("send").disabled = false;
      if (conversation) follow();
    } catch (err) {
      $("status").textContent = err.status === 401 ? "that API key is not accepted" : String(err);
    }
  }

  async function send(event) {
    event.preventDefault();
    const text = $("text").value.trim();
    const files = [...$("photos").files];
    if ((!text && !files.length) || !client) return;
    const refused = photoProblem(files);
    if (refused) {  // nothing is sent: the photos stay picked, to pick again
      $("status").textContent = refused;
      return;
    }
    $("send").disabled = true;  // while it is posted (a turn that runs does not hold the page: /stop can go)
    const mine = bubble("user", withPhotos(text, files.length));  // before its answer starts to stream in
    let shown = conversation;
    try {
      const images = await Promise.all(files.map(dataUrl)).catch((err) => {
        throw new Error(`could not read the photo: ${err}`);
      });
      if (!shown) {  // a conversation is made with its first message: "New" alone leaves none behind
        shown = conversation = await client.newConversation();
        store.setItem("nanofleet.conversation", conversation);
        $("pick").selectedOptions[0].value = conversation;
        follow(true);
      }
      const posted = await client.post(shown, text, images);
      $("text").value = "";  // only once the API took it: a refused message stays, to fix and send again
      $("photos").value = "";
      if (conversation !== shown) return;
      if (posted.queued) mine.classList.add("pending");  // it waits behind a turn: it goes in with the next step
      if (posted.reply) bubble("assistant", posted.reply);
      $("status").textContent = `conversation ${conversation}`;
      name(text, images.length);
    } catch (err) {
      mine.remove();
      $("status").textContent = `not sent: ${err.message ?? err}`;
    } finally {
      $("send").disabled = false;
      $("text").focus();
    }
  }

  // A conversation is named after its first message (not twice at once; a failed rename is tried
  // with the next message).
  function name(text, photos) {
    const picked = $("pick").selectedOptions[0];
    if (!picked || picked.dataset.titled || text.startsWith("/")) return;
    picked.dataset.titled = "naming";
    client.rename(conversation, titleOf(text, photos)).then(() => {
      picked.dataset.titled = "yes";
      return listConversations();
    }, (err) => {
      picked.dataset.titled = "";
      $("status").textContent = `could not name the conversation: ${err.message ?? err}`;
    });
  }

  function open(id) {
    if (id) store.setItem("nanofleet.conversation", id);
    else store.removeItem("nanofleet.conversation");
    conversation = id;
    $("log").replaceChildren();
    return client ? connect(new Event("submit")) : Promise.resolve();
  }

  $("key").value = store.getItem("nanofleet.key") ?? "";
  $("remember").checked = Boolean($("key").value);
  $("connect").addEventListener("submit", connect);
  $("compose").addEventListener("submit", send);
  $("new").addEventListener("click", () => open(null));
  $("pick").addEventListener("change", () => open($("pick").value));
  if ($("key").value) connect(new Event("submit"));
}

// A message's text, with the photos sent with it counted (the page does not show them again).
export function withPhotos(text, count) {
  return count ? `${text}${text ? " " : ""}[${count} photo${count > 1 ? "s" : ""}]` : text;
}

// A new conversation's title from its first message: the start of its text, cut between code points
// (a UTF-16 cut inside an emoji leaves half of it, which JSON carries as a lone surrogate the API
// refuses), or its photos counted when it has no text.
export function titleOf(text, photos) {
  const start = Array.from(text.trim()).slice(0, TITLE_CHARS).join("").trim();
  return start || (photos > 1 ? `${photos} photos` : "Photo");
}

// Why the API would refuse these picked files (File or {name, size, type}), in words that name the
// photo; null when it takes them.
export function photoProblem(files) {
  if (files.length > MAX_PHOTOS) return `${files.length} photos picked: send at most ${MAX_PHOTOS} with a message.`;
  for (const file of files) {
    if (!PHOTO_TYPES.has(file.type)) return `"${file.name}" is not a photo the model takes: pick a JPEG, PNG, GIF or WebP image.`;
    if (file.size > MAX_PHOTO_BYTES) {
      return `"${file.name}" is too large (${sizeOf(file.size)}): a photo may be at most 5 MiB `
        + `(${MAX_PHOTO_BYTES.toLocaleString("en-US")} bytes).`;
    }
  }
  return null;
}

// What a `message` tool call sent to this page's caller, from its result in the transcript:
// {content, files}, or null for a call that sent elsewhere or failed.
function sentToCaller(result) {
  try {
    const out = JSON.parse(result);
    if (out?.delivered !== "to the API caller") return null;
    return { content: out.content ?? "", files: out.files ?? [] };
  } catch {
    return null;
  }
}

// A file's size as people read it: 812 B, 14 KB, 3.2 MB.
export function sizeOf(bytes) {
  if (bytes < 1000) return `${bytes} B`;
  if (bytes < 1e6) return `${Math.round(bytes / 1e3)} KB`;
  return `${(bytes / 1e6).toFixed(1)} MB`;
}

function dataUrl(file) {
  return new Promise((done, failed) => {
    const reader = new FileReader();
    reader.onload = () => done(reader.result);
    reader.onerror = () => failed(reader.error);
    reader.readAsDataURL(file);
  });
}

if (typeof document !== "undefined") page();

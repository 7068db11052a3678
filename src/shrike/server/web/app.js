// The chat page: talks to this server through the public OpenAI endpoints only (/v1/models,
// /v1/chat/completions with stream=true). Conversations and settings live in localStorage.
"use strict";

const STORE = { conversations: "shrike.conversations", settings: "shrike.settings", apiKey: "shrike.apiKey",
                current: "shrike.current" };
const $ = (id) => document.getElementById(id);

const state = {
  conversations: load(STORE.conversations, []),
  currentId: localStorage.getItem(STORE.current),
  model: null,
  controller: null, // AbortController of the answer being streamed
};

function load(key, fallback) {
  try {
    const value = JSON.parse(localStorage.getItem(key));
    return value === null ? fallback : value;
  } catch {
    return fallback;
  }
}

function save() {
  localStorage.setItem(STORE.conversations, JSON.stringify(state.conversations));
  if (state.currentId) localStorage.setItem(STORE.current, state.currentId);
}

// Settings -------------------------------------------------------------------------------------------

const SETTING_FIELDS = { "system-prompt": "system", temperature: "temperature", "top-p": "top_p",
                         "max-tokens": "max_tokens" };

function restoreSettings() {
  const settings = load(STORE.settings, {});
  for (const [id, key] of Object.entries(SETTING_FIELDS)) {
    if (settings[key] !== undefined) $(id).value = settings[key];
    $(id).addEventListener("change", storeSettings);
  }
}

function storeSettings() {
  const settings = {};
  for (const [id, key] of Object.entries(SETTING_FIELDS)) settings[key] = $(id).value;
  localStorage.setItem(STORE.settings, JSON.stringify(settings));
}

function number(id) {
  const value = parseFloat($(id).value);
  return Number.isFinite(value) ? value : undefined;
}

// API key --------------------------------------------------------------------------------------------

function headers() {
  const h = { "Content-Type": "application/json" };
  const key = localStorage.getItem(STORE.apiKey);
  if (key) h.Authorization = `Bearer ${key}`;
  return h;
}

function askForKey(message) {
  const dialog = $("api-key-dialog");
  $("api-key-error").hidden = !message;
  $("api-key-error").textContent = message || "";
  $("api-key-input").value = "";
  if (!dialog.open) dialog.showModal();
  return new Promise((resolve) => {
    $("api-key-form").onsubmit = () => {
      localStorage.setItem(STORE.apiKey, $("api-key-input").value.trim());
      $("forget-key").hidden = false;
      resolve();
    };
  });
}

// Sends a request; on 401 asks for the key and tries again.
async function api(path, options = {}) {
  for (;;) {
    const response = await fetch(path, { ...options, headers: headers() });
    if (response.status !== 401) return response;
    const hadKey = Boolean(localStorage.getItem(STORE.apiKey));
    await askForKey(hadKey ? "That key was refused; try again." : "");
  }
}

async function errorMessage(response) {
  try {
    const body = await response.json();
    if (body && body.error && body.error.message) return body.error.message;
  } catch { /* not JSON */ }
  return `${response.status} ${response.statusText}`;
}

function showError(message) {
  $("error").textContent = message;
  $("error").hidden = !message;
}

// Conversations ---------------------------------------------------------------------------------------

function current() {
  return state.conversations.find((c) => c.id === state.currentId);
}

function newConversation() {
  const conversation = { id: `c${Date.now()}${Math.random().toString(16).slice(2, 6)}`, title: "New chat",
                         messages: [] };
  state.conversations.unshift(conversation);
  state.currentId = conversation.id;
  save();
  renderAll();
  $("prompt").focus();
}

function renderSidebar() {
  const list = $("conversations");
  list.replaceChildren();
  for (const conversation of state.conversations) {
    const item = document.createElement("li");
    item.className = conversation.id === state.currentId ? "active" : "";
    const title = document.createElement("button");
    title.className = "title";
    title.textContent = conversation.title;
    title.onclick = () => {
      if (state.controller) return;
      state.currentId = conversation.id;
      save();
      renderAll();
      document.body.classList.remove("menu-open");
    };
    const remove = document.createElement("button");
    remove.className = "remove";
    remove.title = "Delete this conversation";
    remove.textContent = "\u00d7";
    remove.onclick = () => {
      if (state.controller) return;
      state.conversations = state.conversations.filter((c) => c.id !== conversation.id);
      if (state.currentId === conversation.id) state.currentId = state.conversations[0]?.id || null;
      save();
      renderAll();
    };
    item.append(title, remove);
    list.append(item);
  }
}

function messageElement(message) {
  const element = document.createElement("div");
  element.className = `msg ${message.role}`;
  const body = document.createElement("div");
  body.className = "body";
  element.append(body);
  fillMessage(element, message);
  return element;
}

function fillMessage(element, message) {
  const body = element.querySelector(".body");
  if (message.reasoning) {  // a reasoning model's thinking (--reasoning-parser), folded away
    let reasoning = element.querySelector(".reasoning");
    if (!reasoning) {
      reasoning = document.createElement("details");
      reasoning.className = "reasoning";
      reasoning.append(document.createElement("summary"), document.createElement("div"));
      reasoning.firstChild.textContent = "Reasoning";
      element.insertBefore(reasoning, body);
    }
    reasoning.lastChild.textContent = message.reasoning;
  }
  if (message.role === "user") body.textContent = message.content;
  else body.innerHTML = Markdown.render(message.content);
  element.classList.toggle("stopped", Boolean(message.stopped));
  element.classList.toggle("failed", Boolean(message.error));
  let note = element.querySelector(".note");
  const noteText = message.error ? `Error: ${message.error}` : message.stopped ? "stopped"
    : message.cut ? "cut off: the answer reached max tokens" : "";
  if (noteText && !note) {
    note = document.createElement("div");
    note.className = "note";
    element.insertBefore(note, element.querySelector(".actions"));
  }
  if (note) note.textContent = noteText;
}

function renderMessages() {
  const container = $("messages");
  container.replaceChildren();
  const conversation = current();
  if (!conversation || !conversation.messages.length) {
    const empty = document.createElement("div");
    empty.className = "empty";
    empty.textContent = "Ask anything. Answers stream from this Shrike server.";
    container.append(empty);
    return;
  }
  conversation.messages.forEach((message, index) => {
    const element = messageElement(message);
    element.append(messageActions(conversation, index));
    container.append(element);
  });
  container.scrollTop = container.scrollHeight;
}

// Copy an answer, regenerate the last one, or take a question back into the composer to edit and resend.
function messageActions(conversation, index) {
  const message = conversation.messages[index];
  const actions = document.createElement("div");
  actions.className = "actions";
  const action = (label, handler) => {
    const button = document.createElement("button");
    button.type = "button";
    button.textContent = label;
    button.onclick = () => !state.controller && handler();
    actions.append(button);
  };
  if (message.role === "assistant") {
    action("Copy", () => navigator.clipboard.writeText(message.content));
    if (index === conversation.messages.length - 1 && index > 0) {
      action("Regenerate", () => {
        const question = conversation.messages[index - 1].content;
        conversation.messages.splice(index - 1);
        send(question);
      });
    }
  } else {
    action("Edit", () => {
      $("prompt").value = message.content;
      conversation.messages.splice(index);
      save();
      renderAll();
      $("prompt").focus();
    });
  }
  return actions;
}

function renderAll() {
  renderSidebar();
  renderMessages();
}

// Chat -------------------------------------------------------------------------------------------------

function setBusy(busy) {
  $("send").hidden = busy;
  $("stop").hidden = !busy;
  $("status").textContent = busy ? "generating\u2026" : "";
}

function requestBody(conversation) {
  const messages = [];
  const system = $("system-prompt").value.trim();
  if (system) messages.push({ role: "system", content: system });
  for (const m of conversation.messages) {
    if (!m.error && m.content) messages.push({ role: m.role, content: m.content });
  }
  const body = { messages, stream: true };
  if (state.model) body.model = state.model;
  const temperature = number("temperature");
  const topP = number("top-p");
  const maxTokens = number("max-tokens");
  if (temperature !== undefined) body.temperature = temperature;
  if (topP !== undefined) body.top_p = topP;
  if (maxTokens !== undefined) body.max_tokens = Math.round(maxTokens);
  return body;
}

// Yields each parsed `data:` event of a server-sent event stream.
async function* sseEvents(response) {
  const reader = response.body.getReader();
  const decoder = new TextDecoder();
  let buffer = "";
  for (;;) {
    const { done, value } = await reader.read();
    if (done) return;
    buffer += decoder.decode(value, { stream: true });
    let end;
    while ((end = buffer.indexOf("\n\n")) >= 0) {
      const event = buffer.slice(0, end);
      buffer = buffer.slice(end + 2);
      for (const line of event.split("\n")) {
        if (!line.startsWith("data:")) continue;
        const data = line.slice(5).trim();
        if (data === "[DONE]") return;
        yield JSON.parse(data);
      }
    }
  }
}

async function send(text) {
  showError("");
  if (!current()) newConversation();
  const conversation = current();
  conversation.messages.push({ role: "user", content: text });
  if (conversation.title === "New chat") conversation.title = text.slice(0, 40);
  const answer = { role: "assistant", content: "" };
  const body = requestBody(conversation);
  conversation.messages.push(answer);
  save();
  renderAll();
  const element = $("messages").lastElementChild;
  element.classList.add("streaming");
  element.querySelector(".actions").hidden = true;
  const controller = new AbortController();
  state.controller = controller;
  setBusy(true);
  let scheduled = false;
  const repaint = () => {
    if (scheduled) return;
    scheduled = true;
    requestAnimationFrame(() => {
      scheduled = false;
      fillMessage(element, answer);
      $("messages").scrollTop = $("messages").scrollHeight;
    });
  };
  try {
    const response = await api("/v1/chat/completions", { method: "POST", body: JSON.stringify(body),
                                                          signal: controller.signal });
    if (!response.ok) throw new Error(await errorMessage(response));
    for await (const event of sseEvents(response)) {
      if (event.error) throw new Error(event.error.message);
      const choice = event.choices && event.choices[0];
      if (choice && choice.finish_reason === "length") answer.cut = true;
      if (choice && choice.delta && choice.delta.reasoning_content) {
        answer.reasoning = (answer.reasoning || "") + choice.delta.reasoning_content;
        repaint();
      }
      if (choice && choice.delta && choice.delta.content) {
        answer.content += choice.delta.content;
        repaint();
      }
    }
  } catch (error) {
    // The answer's bubble shows what went wrong; the banner is for the connection itself.
    if (controller.signal.aborted) answer.stopped = true;
    else answer.error = error.message || String(error);
  } finally {
    state.controller = null;
    setBusy(false);
    element.classList.remove("streaming");
    element.querySelector(".actions").hidden = false;
    fillMessage(element, answer);
    save();
    renderSidebar();
  }
}

// Start -------------------------------------------------------------------------------------------------

async function connect() {
  try {
    const response = await api("/v1/models");
    if (!response.ok) throw new Error(await errorMessage(response));
    const models = (await response.json()).data;
    state.model = models[0]?.id || null;
    $("model-name").textContent = state.model || "no model";
    document.title = `${state.model} \u00b7 Shrike chat`;
  } catch (error) {
    $("model-name").textContent = "not connected";
    showError(`Cannot reach the server: ${error.message}`);
  }
}

function wire() {
  $("composer").addEventListener("submit", (event) => {
    event.preventDefault();
    const text = $("prompt").value.trim();
    if (!text || state.controller) return;
    $("prompt").value = "";
    send(text);
  });
  $("prompt").addEventListener("keydown", (event) => {
    if (event.key === "Enter" && !event.shiftKey && !event.isComposing) {
      event.preventDefault();
      $("composer").requestSubmit();
    }
  });
  $("stop").addEventListener("click", () => state.controller && state.controller.abort());
  $("new-chat").addEventListener("click", () => {
    if (state.controller) return;
    newConversation();
    document.body.classList.remove("menu-open");
  });
  // On a narrow screen the sidebar (conversations, settings) is a panel opened from the header.
  $("menu").addEventListener("click", () => document.body.classList.toggle("menu-open"));
  $("forget-key").hidden = !localStorage.getItem(STORE.apiKey);
  $("forget-key").addEventListener("click", () => {
    localStorage.removeItem(STORE.apiKey);
    $("forget-key").hidden = true;
  });
  $("messages").addEventListener("click", (event) => {
    if (!event.target.classList.contains("copy")) return;
    const code = event.target.parentElement.querySelector("code").textContent;
    navigator.clipboard?.writeText(code).then(() => { event.target.textContent = "Copied"; });
  });
}

restoreSettings();
wire();
if (!current()) state.currentId = state.conversations[0]?.id || null;
renderAll();
connect();

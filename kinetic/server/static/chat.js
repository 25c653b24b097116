// Kinetic's chat page: talks to this server's /v1/chat/completions and keeps the conversation in
// the browser (localStorage). No framework and no build step; no inline code, so it runs under the
// strict Content-Security-Policy the server sends (kinetic/server/page.py). Model text is only ever
// set as textContent: code fences become <pre><code> elements, nothing the model writes becomes HTML.
"use strict";

(() => {
  const STORE = "kinetic-chat";
  const $ = (id) => document.getElementById(id);
  const state = load();
  let controller = null; // the AbortController of the answer being streamed
  let modelName = "";

  function load() {
    try {
      const saved = JSON.parse(localStorage.getItem(STORE));
      if (saved && Array.isArray(saved.messages)) {
        return { messages: saved.messages, settings: saved.settings || {} };
      }
    } catch (e) {
      // a broken entry starts a new conversation
    }
    return { messages: [], settings: {} };
  }

  function save() {
    localStorage.setItem(STORE, JSON.stringify(state));
  }

  // -- rendering -------------------------------------------------------------------------------------

  // Text split on ``` fences: even pieces are prose, odd pieces code (an unclosed fence, while an answer
  // streams, is code up to the end). Every piece is set with textContent.
  function renderContent(node, text) {
    node.replaceChildren();
    text.split("```").forEach((part, i) => {
      if (i % 2 === 0) {
        if (part) {
          const prose = document.createElement("div");
          prose.className = "prose";
          prose.textContent = part;
          node.append(prose);
        }
        return;
      }
      const newline = part.indexOf("\n");
      const language = newline >= 0 ? part.slice(0, newline).trim() : "";
      const pre = document.createElement("pre");
      const code = document.createElement("code");
      if (/^[A-Za-z0-9_+-]{1,24}$/.test(language)) code.className = "language-" + language;
      code.textContent = (newline >= 0 ? part.slice(newline + 1) : part).replace(/\n$/, "");
      pre.append(code);
      node.append(pre);
    });
  }

  function messageView(message) {
    const view = document.createElement("article");
    view.className = "message " + message.role;
    const role = document.createElement("div");
    role.className = "role";
    role.textContent = message.role === "user" ? "You" : modelName || "Assistant";
    const content = document.createElement("div");
    content.className = "content";
    const note = document.createElement("div");
    note.className = "note";
    view.append(role, content, note);
    updateView(view, message);
    return view;
  }

  function updateView(view, message) {
    view.dataset.state = message.state || "done";
    renderContent(view.querySelector(".content"), message.content);
    const note = view.querySelector(".note");
    note.textContent = message.error ? "Error: " + message.error : [message.stopped ? "stopped" : "", message.stats || ""]
      .filter(Boolean).join(" · ");
    note.classList.toggle("error", Boolean(message.error));
  }

  function renderAll() {
    $("conversation").replaceChildren(...state.messages.map(messageView));
    scrollDown();
  }

  function scrollDown() {
    window.scrollTo(0, document.body.scrollHeight); // the composer sticks below the last message
  }

  function setBusy(busy) {
    $("send").hidden = busy;
    $("stop").hidden = !busy;
    document.body.classList.toggle("busy", busy);
  }

  // -- talking to the server -------------------------------------------------------------------------

  function headers() {
    const out = { "Content-Type": "application/json" };
    if (state.settings.apiKey) out.Authorization = "Bearer " + state.settings.apiKey;
    return out;
  }

  async function errorText(response) {
    try {
      const body = await response.json();
      return (body.error && (body.error.message || body.error)) || response.statusText;
    } catch (e) {
      return response.status + " " + response.statusText;
    }
  }

  async function checkModel() {
    let response;
    try {
      response = await fetch("/v1/models", { headers: headers() });
    } catch (e) {
      $("model").textContent = "the server is not reachable";
      return;
    }
    $("key-form").hidden = response.status !== 401;
    if (response.status === 401) {
      $("model").textContent = "API key needed";
      $("key-error").hidden = !state.settings.apiKey;
      $("key-error").textContent = "That key was refused.";
      return;
    }
    if (!response.ok) {
      $("model").textContent = await errorText(response);
      return;
    }
    const body = await response.json();
    modelName = (body.data && body.data[0] && body.data[0].id) || "";
    $("model").textContent = modelName;
    document.title = modelName + " · Kinetic";
    renderAll();
  }

  function requestBody() {
    const s = state.settings;
    const messages = s.system ? [{ role: "system", content: s.system }] : [];
    for (const m of state.messages) {
      if (m.state !== "streaming" && !m.error && (m.content || m.role === "user")) {
        messages.push({ role: m.role, content: m.content });
      }
    }
    const body = { model: modelName, messages, stream: true, stream_options: { include_usage: true } };
    if (s.temperature !== undefined && s.temperature !== "") body.temperature = Number(s.temperature);
    if (s.seed !== undefined && s.seed !== "") body.seed = Number(s.seed);
    if (s.maxTokens !== undefined && s.maxTokens !== "") body.max_tokens = Number(s.maxTokens);
    return body;
  }

  // Server-sent events from a fetch body: calls onData with each event's parsed JSON.
  async function readEvents(response, onData) {
    const reader = response.body.getReader();
    const decoder = new TextDecoder();
    let buffer = "";
    for (;;) {
      const { done, value } = await reader.read();
      if (done) return;
      buffer += decoder.decode(value, { stream: true });
      let end;
      while ((end = buffer.indexOf("\n\n")) >= 0) {
        const lines = buffer.slice(0, end).split("\n");
        buffer = buffer.slice(end + 2);
        for (const line of lines) {
          if (line.startsWith("data: ") && line !== "data: [DONE]") onData(JSON.parse(line.slice(6)));
        }
      }
    }
  }

  function speed(tokens, seconds) {
    return seconds > 0 ? (tokens / seconds).toFixed(1) + " tokens/s" : "";
  }

  async function send(text) {
    state.messages.push({ role: "user", content: text });
    const body = requestBody();
    const answer = { role: "assistant", content: "", state: "streaming" };
    state.messages.push(answer);
    save();
    renderAll();
    const view = $("conversation").lastElementChild;
    controller = new AbortController();
    setBusy(true);
    const started = performance.now();
    let pieces = 0;
    let timings = null;
    try {
      const response = await fetch("/v1/chat/completions", {
        method: "POST", headers: headers(), body: JSON.stringify(body), signal: controller.signal,
      });
      if (!response.ok) throw new Error(await errorText(response));
      await readEvents(response, (chunk) => {
        if (chunk.error) throw new Error(chunk.error.message || "the server stopped the answer");
        if (chunk.timings) timings = chunk;
        const delta = chunk.choices && chunk.choices[0] && chunk.choices[0].delta;
        if (delta && delta.content) {
          answer.content += delta.content;
          pieces += 1;
          updateView(view, answer);
          $("speed").textContent = speed(pieces, (performance.now() - started) / 1000);
          scrollDown();
        }
      });
    } catch (e) {
      if (e.name === "AbortError") answer.stopped = true;
      else answer.error = String(e.message || e);
    } finally {
      if (!answer.stopped) controller.abort(); // after an error, close the connection (the server stops)
      controller = null;
      answer.state = answer.error ? "error" : answer.stopped ? "stopped" : "done";
      if (timings) {
        const t = timings.timings;
        answer.stats = timings.usage.completion_tokens + " tokens, " + speed(t.predicted_n, t.predicted_ms / 1000);
      } else if (pieces) {
        answer.stats = speed(pieces, (performance.now() - started) / 1000);
      }
      $("speed").textContent = answer.stats || "";
      setBusy(false);
      updateView(view, answer);
      save();
    }
  }

  // -- wiring ----------------------------------------------------------------------------------------

  function bindSetting(id, key) {
    const input = $(id);
    input.value = state.settings[key] === undefined ? "" : state.settings[key];
    input.addEventListener("input", () => {
      state.settings[key] = input.value;
      save();
    });
  }

  document.addEventListener("DOMContentLoaded", () => {
    // An answer that was streaming when the page closed was cut there.
    for (const m of state.messages) if (m.state === "streaming") Object.assign(m, { state: "stopped", stopped: true });
    bindSetting("system", "system");
    bindSetting("temperature", "temperature");
    bindSetting("seed", "seed");
    bindSetting("max-tokens", "maxTokens");
    bindSetting("api-key", "apiKey");
    $("settings-button").addEventListener("click", () => {
      const open = $("settings").hidden;
      $("settings").hidden = !open;
      $("settings-button").setAttribute("aria-expanded", String(open));
    });
    $("clear").addEventListener("click", () => {
      if (controller) controller.abort();
      state.messages = [];
      save();
      renderAll();
    });
    $("stop").addEventListener("click", () => controller && controller.abort());
    $("composer").addEventListener("submit", (event) => {
      event.preventDefault();
      const text = $("prompt").value.trim();
      if (!text || controller) return;
      $("prompt").value = "";
      send(text);
    });
    $("prompt").addEventListener("keydown", (event) => {
      if (event.key === "Enter" && !event.shiftKey) {
        event.preventDefault();
        $("composer").requestSubmit();
      }
    });
    $("key-form").addEventListener("submit", (event) => {
      event.preventDefault();
      state.settings.apiKey = $("key-input").value.trim();
      $("api-key").value = state.settings.apiKey;
      save();
      checkModel();
    });
    renderAll();
    checkModel();
  });
})();

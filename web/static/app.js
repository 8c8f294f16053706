// The Chorus demo page: compose a request, pick or make a voice, stream and play the audio.

import { audioContext, stats } from "./audio.js";
import { Connection } from "./connection.js";
import { composeInstruct, fillDesignSelects } from "./design.js";
import { Job } from "./jobs.js";
import { KNOBS, PACING, charCount, errorTarget, synthesizeFrame } from "./protocol.js";
import { Recorder, VoicesApi } from "./voices.js";

const $ = (id) => document.getElementById(id);
const boot = JSON.parse($("chorus-boot").textContent);
const limits = { max_text_chars: 5000, max_inflight: 16, max_num_step: 64, ...(boot.limits || {}) };

// ---------------------------------------------------------------------------- API key

const KEY_STORE = "chorus.apiKey";
function storedKey() {
  try {
    return localStorage.getItem(KEY_STORE) || "";
  } catch {
    return "";
  }
}
function apiKey() {
  return storedKey() || boot.api_key || "";
}
function authHeaders() {
  const key = apiKey();
  return key ? { Authorization: `Bearer ${key}` } : {};
}
function streamUrl() {
  const scheme = location.protocol === "https:" ? "wss:" : "ws:";
  const key = apiKey();
  return `${scheme}//${location.host}/v1/stream${key ? `?api_key=${encodeURIComponent(key)}` : ""}`;
}

// ---------------------------------------------------------------------------- messages

const announcer = $("announcer");
function announce(text) {
  announcer.textContent = "";
  setTimeout(() => {
    announcer.textContent = text;
  }, 30);
}

const FIELD_CONTROLS = {
  text: "text",
  voice: "voice-fieldset",
  instruct: "design-gender",
  language: "language",
  form: "generate",
};

function errorElementFor(target) {
  if (target === "speed" || target === "duration") return $("knob-pacing-error");
  if (KNOBS.some((k) => k.name === target)) return $(`knob-${target}-error`);
  return $(`${target}-error`) || $("form-error");
}

function controlFor(target) {
  if (target === "speed" || target === "duration") return $("pacing-value");
  if (KNOBS.some((k) => k.name === target)) return $(`knob-${target}`);
  return $(FIELD_CONTROLS[target] || "generate");
}

function showFieldError(target, message) {
  const el = errorElementFor(target);
  el.textContent = message;
  el.hidden = false;
  const control = controlFor(target);
  if (control && control.tagName !== "BUTTON") control.setAttribute("aria-invalid", "true");
  if (el.closest("#advanced")) $("advanced").open = true;
  if (target === "instruct") setVoiceMode("design");
}

function clearFieldError(target) {
  const el = errorElementFor(target);
  el.hidden = true;
  el.textContent = "";
  controlFor(target)?.removeAttribute("aria-invalid");
}

function clearAllFieldErrors() {
  for (const t of ["text", "voice", "instruct", "language", "form", "speed", ...KNOBS.map((k) => k.name)]) {
    clearFieldError(t);
  }
}

// ---------------------------------------------------------------------------- text

const textEl = $("text");
const countEl = $("char-count");

function updateCount() {
  const n = charCount(textEl.value);
  const max = limits.max_text_chars;
  countEl.textContent = `${n.toLocaleString()} / ${max.toLocaleString()}`;
  const over = n > max;
  countEl.classList.toggle("over", over);
  countEl.classList.toggle("near", !over && n > max * 0.9);
  if (over) showFieldError("text", `${(n - max).toLocaleString()} characters over the server's limit of ${max.toLocaleString()}.`);
  else if ($("text-error").dataset.kind !== "server") clearFieldError("text");
}
textEl.addEventListener("input", () => {
  $("text-error").dataset.kind = "";
  updateCount();
});
textEl.addEventListener("keydown", (ev) => {
  if (ev.key === "Enter" && (ev.ctrlKey || ev.metaKey)) {
    ev.preventDefault();
    $("compose-form").requestSubmit();
  }
});

// ---------------------------------------------------------------------------- voice mode

function voiceMode() {
  return document.querySelector('input[name="voice-mode"]:checked').value;
}

function setVoiceMode(mode) {
  const radio = document.querySelector(`input[name="voice-mode"][value="${mode}"]`);
  if (radio && !radio.checked) radio.checked = true;
  for (const panel of document.querySelectorAll(".voice-panel")) panel.hidden = panel.dataset.mode !== mode;
  if (mode === "library" && !voicesLoaded) refreshVoices();
}

for (const radio of document.querySelectorAll('input[name="voice-mode"]')) {
  radio.addEventListener("change", () => {
    clearFieldError("voice");
    clearFieldError("instruct");
    setVoiceMode(voiceMode());
  });
}

// ---------------------------------------------------------------------------- voice design

const designPanel = $("panel-design");
fillDesignSelects(designPanel);
function updateInstruct() {
  const instruct = composeInstruct(designPanel);
  $("instruct-preview").textContent = instruct || "(none: pick at least one)";
  $("instruct-preview").classList.toggle("empty", !instruct);
  clearFieldError("instruct");
}
for (const el of designPanel.querySelectorAll("[data-design]")) el.addEventListener("change", updateInstruct);
updateInstruct();

// ---------------------------------------------------------------------------- knobs

const knobsEl = $("knobs");

function el(tag, attrs = {}, ...children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) {
    if (v === null || v === undefined || v === false) continue;
    if (k === "text") node.textContent = v;
    else if (k === "className") node.className = v;
    else node.setAttribute(k, v === true ? "" : String(v));
  }
  node.append(...children);
  return node;
}

function knobHint(k) {
  const def = k.kind === "bool" ? (k.def ? "on" : "off") : k.def === null ? "random" : String(k.def);
  return `Default ${def}${k.range ? ` · ${k.range}` : ""}. ${k.help}`;
}

function buildKnobs() {
  const toggles = [];
  for (const k of KNOBS) {
    const id = `knob-${k.name}`;
    const describedBy = `${id}-hint ${id}-error`;
    let wrap;
    if (k.kind === "bool") {
      wrap = el(
        "div",
        { className: "field compact knob toggle", "data-knob": k.name },
        el(
          "label",
          { for: id },
          el("input", { type: "checkbox", id, name: k.name, checked: k.def, "aria-describedby": describedBy }),
          el("span", { text: k.label }),
        ),
        el("p", { className: "hint", id: `${id}-hint`, text: knobHint(k) }),
        el("p", { className: "field-error", id: `${id}-error`, hidden: true }),
      );
    } else {
      const input =
        k.kind === "seed"
          ? el("input", {
              type: "text", id, name: k.name, inputmode: "numeric", autocomplete: "off",
              placeholder: "random", spellcheck: "false", "aria-describedby": describedBy,
            })
          : el("input", {
              type: "number", id, name: k.name, value: k.def, min: k.min, max: k.max, step: k.step,
              inputmode: k.kind === "int" ? "numeric" : "decimal", "aria-describedby": describedBy,
            });
      wrap = el(
        "div",
        { className: "field compact knob", "data-knob": k.name },
        el("label", { for: id, text: k.label }),
        input,
        el("p", { className: "hint", id: `${id}-hint`, text: knobHint(k) }),
        el("p", { className: "field-error", id: `${id}-error`, hidden: true }),
      );
    }
    if (k.kind === "bool") toggles.push(wrap); // the on/off knobs go last
    else knobsEl.append(wrap);
  }

  // Pacing: natural, a speed factor, or a fixed duration.
  const pacing = el(
    "div",
    { className: "field compact knob pacing", "data-knob": "pacing" },
    el("label", { for: "pacing-mode", text: "Pacing" }),
    el(
      "div",
      { className: "inline" },
      el(
        "select",
        { id: "pacing-mode", "aria-describedby": "knob-pacing-hint knob-pacing-error" },
        new Option("Natural", ""),
        new Option("Speed ×", "speed"),
        new Option("Duration (s)", "duration"),
      ),
      el("input", {
        type: "number", id: "pacing-value", "aria-label": "Pacing value", hidden: true,
        "aria-describedby": "knob-pacing-hint knob-pacing-error",
      }),
    ),
    el("p", {
      className: "hint", id: "knob-pacing-hint",
      text: "Default natural. Speed 0.25–4 ×, or a total duration in seconds (> 0).",
    }),
    el("p", { className: "field-error", id: "knob-pacing-error", hidden: true }),
  );
  knobsEl.append(pacing);

  const delivery = el(
    "div",
    { className: "field compact knob", "data-knob": "stream" },
    el("label", { for: "knob-stream", text: "Delivery" }),
    el(
      "select",
      { id: "knob-stream", "aria-describedby": "knob-stream-hint" },
      new Option("Stream each chunk", "chunk"),
      new Option("Whole utterance at once", "whole"),
    ),
    el("p", {
      className: "hint", id: "knob-stream-hint",
      text: "Default stream. Whole sends one frame at the end, chunks cross-faded.",
    }),
  );
  knobsEl.append(delivery, ...toggles);

  const pacingMode = $("pacing-mode");
  const pacingValue = $("pacing-value");
  pacingMode.addEventListener("change", () => {
    const spec = PACING[pacingMode.value];
    pacingValue.hidden = !spec;
    if (spec) {
      pacingValue.min = spec.min;
      if (spec.max) pacingValue.max = spec.max;
      else pacingValue.removeAttribute("max");
      pacingValue.step = spec.step;
      pacingValue.value = spec.def;
      pacingValue.setAttribute("aria-label", spec.label);
    }
    clearFieldError("speed");
    updateAdvancedNote();
  });
  knobsEl.addEventListener("input", (ev) => {
    const name = ev.target.name || (ev.target.id === "pacing-value" ? "speed" : null);
    if (name) clearFieldError(name);
    updateAdvancedNote();
  });
  knobsEl.addEventListener("change", updateAdvancedNote);
}

function readOptions() {
  const options = {};
  for (const k of KNOBS) {
    const input = $(`knob-${k.name}`);
    if (k.kind === "bool") {
      if (input.checked !== k.def) options[k.name] = input.checked;
      continue;
    }
    const raw = input.value.trim();
    if (raw === "") continue;
    if (k.kind === "seed") {
      options.seed = raw; // digits are sent verbatim (64-bit); anything else lets the server explain
      continue;
    }
    const num = Number(raw);
    if (num !== k.def) options[k.name] = Number.isFinite(num) ? num : raw;
  }
  const mode = $("pacing-mode").value;
  if (mode) {
    const raw = $("pacing-value").value.trim();
    if (raw !== "") options[mode] = Number(raw);
  }
  return options;
}

function updateAdvancedNote() {
  const n = Object.keys(readOptions()).length + ($("knob-stream").value !== "chunk" ? 1 : 0);
  $("advanced-note").textContent = n ? `${n} changed` : "defaults";
  $("advanced-note").classList.toggle("changed", n > 0);
}

function resetKnobs() {
  for (const k of KNOBS) {
    const input = $(`knob-${k.name}`);
    if (k.kind === "bool") input.checked = k.def;
    else input.value = k.def === null ? "" : k.def;
    clearFieldError(k.name);
  }
  $("pacing-mode").value = "";
  $("pacing-mode").dispatchEvent(new Event("change"));
  $("knob-stream").value = "chunk";
  updateAdvancedNote();
}

buildKnobs();
$("reset-knobs").addEventListener("click", resetKnobs);
updateAdvancedNote();

function applyLimits() {
  $("max-chars").textContent = limits.max_text_chars.toLocaleString();
  const steps = $("knob-num_step");
  steps.max = limits.max_num_step;
  $("knob-num_step-hint").textContent = knobHint({ ...KNOBS[0], range: `1–${limits.max_num_step}` });
  updateCount();
}
applyLimits();

// ---------------------------------------------------------------------------- connection

const pill = $("conn-status");
const banner = $("conn-banner");
let countdown = null;
let everConnected = false;

function setPill(state, text) {
  pill.dataset.state = state;
  pill.querySelector(".conn-text").textContent = text;
}

function onConnState(state, detail) {
  clearInterval(countdown);
  if (state === "open") {
    const ready = detail.ready;
    everConnected = true;
    setPill("open", "Connected");
    if (!banner.hidden) announce("Reconnected to the server.");
    banner.hidden = true;
    Object.assign(limits, ready.limits || {});
    if (ready.model) $("model-name").textContent = ready.model;
    if (ready.sample_rate) $("footer-rate").textContent = ready.sample_rate;
    applyLimits();
    $("api-key-error").hidden = true;
    if (!voicesLoaded || voicesFailed) refreshVoices();
  } else if (state === "connecting") {
    setPill("connecting", "Connecting…");
  } else if (state === "reconnecting") {
    setPill("connecting", "Reconnecting…");
    $("conn-banner-text").textContent = "Connection lost. Reconnecting…";
  } else if (state === "lost") {
    setPill("lost", "Offline");
    banner.hidden = false;
    const tick = () => {
      const s = Math.max(0, Math.ceil((detail.at - Date.now()) / 1000));
      $("conn-banner-text").textContent = everConnected
        ? `Connection to the server lost. Reconnecting in ${s} s…`
        : `Cannot reach the server. Trying again in ${s} s…`;
    };
    tick();
    countdown = setInterval(tick, 500);
  } else if (state === "unauthorized") {
    setPill("auth", "API key needed");
    banner.hidden = true;
    const err = $("api-key-error");
    err.textContent = apiKey() ? "The server did not accept this API key." : "This server needs an API key.";
    err.hidden = false;
    $("api-key").setAttribute("aria-invalid", "true");
    $("apikey-panel").open = true;
  }
}

const jobs = new Map();

const connection = new Connection(streamUrl, {
  onState: onConnState,
  onMessage: (msg) => route(msg),
  onAudio: (header, samples) => jobs.get(header.id)?.onAudio(header, samples),
  onLost: () => {
    for (const job of jobs.values()) {
      if (job.active && job.state !== "connecting") {
        job.onError("The connection was lost before this request finished. Generate it again once reconnected.");
      }
    }
  },
});

function route(msg) {
  const job = msg.id != null ? jobs.get(msg.id) : undefined;
  switch (msg.type) {
    case "accepted":
      job?.onAccepted(msg);
      break;
    case "progress":
      job?.onProgress(msg);
      break;
    case "done":
      job?.onDone(msg);
      updateJobsUi();
      break;
    case "cancelled":
      job?.onCancelled();
      updateJobsUi();
      break;
    case "error":
      serverError(msg, job);
      updateJobsUi();
      break;
    default:
      break; // newer message types are ignored
  }
}

function serverError(msg, job) {
  if (msg.code === "unauthorized") {
    job?.onError("The server needs a valid API key.");
    return;
  }
  const target = errorTarget(msg);
  const text = msg.message || msg.code || "The server reported an error.";
  if (target) showFieldError(target, text);
  if (target === "text") $("text-error").dataset.kind = "server";
  if (job) job.onError(`${text}${msg.code ? ` (${msg.code})` : ""}`);
  else if (!target) showFieldError("form", text);
  announce(`Error: ${text}`);
}

$("reconnect-now").addEventListener("click", () => connection.reconnectNow());
window.addEventListener("online", () => {
  if (connection.state === "lost") connection.reconnectNow();
});

$("apikey-form").addEventListener("submit", (ev) => {
  ev.preventDefault();
  const key = $("api-key").value.trim();
  try {
    if (key) localStorage.setItem(KEY_STORE, key);
    else localStorage.removeItem(KEY_STORE);
  } catch {
    /* storage unavailable: the key lasts for this page only */
    boot.api_key = key;
  }
  $("api-key").removeAttribute("aria-invalid");
  $("api-key-error").hidden = true;
  $("apikey-panel").open = false;
  announce(key ? "API key saved." : "API key removed.");
  connection.reconnectNow(); // the voice library reloads once connected
});
$("api-key").value = storedKey();
if (boot.api_key_required && !apiKey()) $("apikey-panel").open = true;

// ---------------------------------------------------------------------------- generate

let seq = 0;
const session = Math.random().toString(36).slice(2, 8);
const jobList = $("job-list");

function updateJobsUi() {
  $("jobs-empty").hidden = jobs.size > 0;
  $("clear-finished").hidden = ![...jobs.values()].some((j) => !j.active);
}

function languageLabel() {
  const sel = $("language");
  return sel.value ? sel.options[sel.selectedIndex].text : "auto language";
}

async function generate() {
  clearAllFieldErrors();
  $("text-error").dataset.kind = "";
  const text = textEl.value;
  if (!text.trim()) {
    showFieldError("text", "Type some text to speak first.");
    textEl.focus();
    return;
  }
  const n = charCount(text);
  if (n > limits.max_text_chars) {
    showFieldError("text", `The text is ${n.toLocaleString()} characters; this server takes at most ${limits.max_text_chars.toLocaleString()}.`);
    textEl.focus();
    return;
  }
  let voice = null;
  let instruct = null;
  let voiceText = "Automatic voice";
  const mode = voiceMode();
  if (mode === "library") {
    const picked = document.querySelector('input[name="voice"]:checked');
    if (!picked) {
      showFieldError("voice", "Pick a saved voice, or add one below.");
      $("mode-library").focus();
      return;
    }
    voice = picked.value;
    voiceText = `Voice: ${picked.dataset.name || voice}`;
  } else if (mode === "design") {
    instruct = composeInstruct(designPanel);
    if (!instruct) {
      showFieldError("instruct", "Pick at least one attribute, or choose Automatic.");
      $("design-gender").focus();
      return;
    }
    voiceText = `Designed: ${instruct}`;
  }

  audioContext(); // created and resumed inside the click, so playback may start later
  seq += 1;
  const id = `${session}-${seq}`;
  const options = readOptions();
  const request = {
    id,
    text,
    voice,
    reference: null,
    instruct,
    language: $("language").value || null,
    encoding: "pcm_s16le",
    progress: true,
    options,
  };
  if ($("knob-stream").value === "whole") request.stream = "whole";

  const changed = Object.entries(options).map(([k, v]) => `${k} ${v}`);
  const summary = {
    title: text.trim().replace(/\s+/g, " ").slice(0, 80) + (n > 80 ? "…" : ""),
    fullText: text,
    meta: [voiceText, languageLabel(), ...changed].join(" · "),
  };
  const job = new Job(id, seq, summary, { cancel: cancelJob, remove: removeJob, announce });
  jobs.set(id, job);
  job.mount(jobList);
  updateJobsUi();
  // One column (phones): bring the new card into view; focus stays where it is.
  if (window.matchMedia("(max-width: 979px)").matches) job.el.scrollIntoView({ block: "nearest", behavior: "smooth" });
  announce(`Request ${seq} started.`);

  try {
    await connection.ensureOpen();
  } catch (err) {
    if (!job.active) return;
    job.onError(
      err.message === "unauthorized"
        ? "The server needs a valid API key (see API key, top right)."
        : "Could not reach the server. It will be retried automatically; generate again once connected.",
    );
    updateJobsUi();
    return;
  }
  if (!job.active) return; // cancelled while connecting
  try {
    connection.send(synthesizeFrame(request));
    job.setState("sending");
  } catch {
    job.onError("Could not send the request: the connection closed.");
    updateJobsUi();
  }
}

function cancelJob(job) {
  if (!job.active) return;
  if (job.state === "connecting") {
    job.onCancelled();
    updateJobsUi();
    return;
  }
  try {
    connection.send({ type: "cancel", id: job.id });
    job.setState("cancelling");
  } catch {
    job.onCancelled();
    updateJobsUi();
  }
}

function removeJob(job) {
  const next = job.el.nextElementSibling || job.el.previousElementSibling;
  job.dispose();
  jobs.delete(job.id);
  updateJobsUi();
  (next?.querySelector("button:not([hidden]), a:not([hidden])") || $("generate")).focus();
}

$("compose-form").addEventListener("submit", (ev) => {
  ev.preventDefault();
  generate();
});
$("clear-finished").addEventListener("click", () => {
  for (const job of [...jobs.values()]) {
    if (!job.active) {
      job.dispose();
      jobs.delete(job.id);
    }
  }
  updateJobsUi();
  $("generate").focus();
});
$("language").addEventListener("change", () => clearFieldError("language"));

// ---------------------------------------------------------------------------- voice library

const voicesApi = new VoicesApi(authHeaders);
const voiceList = $("voice-list");
let voicesLoaded = false;
let voicesFailed = false;

function formatSeconds(s) {
  return typeof s === "number" ? `${s.toFixed(1)} s` : "";
}

function renderVoices(voices, selectId) {
  const current = selectId || document.querySelector('input[name="voice"]:checked')?.value;
  voiceList.replaceChildren();
  for (const v of voices) {
    const rid = `voice-opt-${v.id}`;
    const name = v.name || v.id;
    const radio = el("input", { type: "radio", name: "voice", id: rid, value: v.id, "data-name": name });
    if (v.id === current) radio.checked = true;
    radio.addEventListener("change", () => clearFieldError("voice"));
    const meta = [formatSeconds(v.seconds), v.text ? `“${v.text}”` : ""].filter(Boolean).join(" · ");
    const label = el(
      "label",
      { for: rid },
      el("span", { className: "voice-name", text: name }),
      el("span", { className: "voice-meta", text: meta }),
    );
    const del = el("button", {
      type: "button", className: "icon-button danger-quiet", "aria-label": `Delete voice ${name}`, title: "Delete",
    });
    del.innerHTML =
      '<svg viewBox="0 0 24 24" aria-hidden="true" focusable="false"><path d="M9 3h6l1 2h4v2H4V5h4l1-2zm-3 6h12l-1 12H7L6 9zm4 2v8h2v-8h-2zm4 0v8h2v-8h-2z"/></svg><span class="confirm-text">Delete?</span>';
    del.addEventListener("click", () => deleteVoice(v, name, del));
    del.addEventListener("blur", () => del.classList.remove("confirming"));
    voiceList.append(el("li", { className: "voice-item", "data-voice-id": v.id }, radio, label, del));
  }
  $("voice-empty").hidden = voices.length > 0;
  if (!voices.length) $("add-voice").open = true;
}

async function refreshVoices(selectId) {
  try {
    const voices = await voicesApi.list();
    voicesLoaded = true;
    voicesFailed = false;
    $("voices-load-error").hidden = true;
    renderVoices(voices, selectId);
  } catch (err) {
    voicesFailed = true;
    const e = $("voices-load-error");
    e.textContent = `Could not load the voice library: ${err.message}`;
    e.hidden = false;
  }
}

async function deleteVoice(v, name, button) {
  if (!button.classList.contains("confirming")) {
    button.classList.add("confirming");
    button.setAttribute("aria-label", `Confirm: delete voice ${name}`);
    return;
  }
  button.disabled = true;
  try {
    await voicesApi.remove(v.id);
    announce(`Voice ${name} deleted.`);
    await refreshVoices();
    (voiceList.querySelector("input") || $("mode-library")).focus();
  } catch (err) {
    button.disabled = false;
    const e = $("voices-load-error");
    e.textContent = `Could not delete ${name}: ${err.message}`;
    e.hidden = false;
  }
}

// A clip to save: a chosen file or a recording.
let clip = null;
let clipUrl = null;

function setClip(next, status) {
  clip = next;
  if (clipUrl) URL.revokeObjectURL(clipUrl);
  clipUrl = null;
  const preview = $("clip-preview");
  if (next) {
    clipUrl = URL.createObjectURL(next.blob);
    $("clip-audio").src = clipUrl;
    preview.hidden = false;
  } else {
    $("clip-audio").removeAttribute("src");
    preview.hidden = true;
  }
  $("clip-status").textContent = status;
  hideVoiceFormErrors();
}

const CLIP_HINT = $("clip-status").textContent;

function hideVoiceFormErrors() {
  for (const id of ["voice-name-error", "voice-file-error", "voice-text-error", "voice-form-error"]) $(id).hidden = true;
  $("voice-text").removeAttribute("aria-invalid");
}

$("voice-file").addEventListener("change", () => {
  const file = $("voice-file").files[0];
  if (!file) return;
  setClip({ blob: file, filename: file.name }, `${file.name} · ${(file.size / 1024).toFixed(0)} KB`);
  if (!$("voice-name").value) $("voice-name").value = file.name.replace(/\.[^.]+$/, "");
});
$("clip-clear").addEventListener("click", () => {
  $("voice-file").value = "";
  setClip(null, CLIP_HINT);
  $("voice-file").focus();
});

let recorder = null;
const recordButton = $("record-button");

async function toggleRecording() {
  if (recorder) {
    const r = recorder;
    recorder = null;
    recordButton.classList.remove("recording");
    recordButton.setAttribute("aria-pressed", "false");
    recordButton.querySelector(".rec-text").textContent = "Record";
    const result = await r.stop();
    if (result && result.seconds > 0.2) {
      $("voice-file").value = "";
      setClip({ blob: result.blob, filename: "recording.wav" }, `Recorded ${result.seconds.toFixed(1)} s from the microphone.`);
    } else {
      setClip(null, "The recording was empty; try again.");
    }
    return;
  }
  recorder = new Recorder((level, seconds) => {
    recordButton.style.setProperty("--level", Math.min(1, level * 4).toFixed(2));
    recordButton.querySelector(".rec-text").textContent = `Stop · ${seconds.toFixed(1)} s`;
  });
  recorder.onLimit = () => {
    if (recorder) toggleRecording();
  };
  try {
    await recorder.start();
    recordButton.classList.add("recording");
    recordButton.setAttribute("aria-pressed", "true");
    recordButton.querySelector(".rec-text").textContent = "Stop · 0.0 s";
    $("clip-status").textContent = "Recording… read your transcript aloud, then press Stop.";
  } catch (err) {
    recorder = null;
    const e = $("voice-file-error");
    e.textContent = `Could not record: ${err.message || err.name}`;
    e.hidden = false;
  }
}
recordButton.addEventListener("click", toggleRecording);

function showVoiceFormError(err) {
  const message = err.message || String(err);
  let id = "voice-form-error";
  if (/^name\b/i.test(message)) id = "voice-name-error";
  else if (/transcript|\btext\b/i.test(message)) id = "voice-text-error";
  else if (err.status === 413 || err.status === 415 || /audio|file|clip|format/i.test(message)) id = "voice-file-error";
  $(id).textContent = message;
  $(id).hidden = false;
  if (id === "voice-text-error") $("voice-text").setAttribute("aria-invalid", "true");
}

$("voice-form").addEventListener("submit", async (ev) => {
  ev.preventDefault();
  hideVoiceFormErrors();
  if (!clip) {
    $("voice-file-error").textContent = "Choose an audio file or record a clip first.";
    $("voice-file-error").hidden = false;
    $("voice-file").focus();
    return;
  }
  const save = $("save-voice");
  save.disabled = true;
  save.textContent = "Saving…";
  try {
    const created = await voicesApi.create({
      file: clip.blob,
      filename: clip.filename,
      text: $("voice-text").value.trim(),
      name: $("voice-name").value.trim(),
    });
    announce(`Voice ${created.name || created.id} saved.`);
    $("voice-name").value = "";
    $("voice-text").value = "";
    $("voice-file").value = "";
    setClip(null, CLIP_HINT);
    setVoiceMode("library");
    await refreshVoices(created.id);
    $("add-voice").open = false;
    $(`voice-opt-${created.id}`)?.focus();
  } catch (err) {
    showVoiceFormError(err);
  } finally {
    save.disabled = false;
    save.textContent = "Save to library";
  }
});
$("voice-text").addEventListener("input", () => {
  $("voice-text-error").hidden = true;
  $("voice-text").removeAttribute("aria-invalid");
});

// ---------------------------------------------------------------------------- start

setVoiceMode(voiceMode());
updateJobsUi();
connection.connect(); // the voice library loads once connected

// For debugging and the browser tests.
window.chorus = { connection, jobs, limits, stats, boot };

// The Chorus demo page: wiring. The parts live in their own modules (knobs, voice library,
// field errors, playback queue, live mode, job cards, the dialogue tab, connection status and
// API key); this one holds the page's state in one object and connects the parts to the forms
// and the WebSocket.

import { audioContext, stats } from "./audio.js";
import { ChorusClient } from "./client.js";
import { JobsPanel } from "./batch.js";
import { composeInstruct, fillDesignSelects } from "./design.js";
import { DialogueJob, DialoguePanel } from "./dialogue.js";
import { $, announce } from "./dom.js";
import { FieldErrors, errorTarget } from "./field-errors.js";
import { Job } from "./jobs.js";
import { Knobs, optionTable } from "./knobs.js";
import { LexiconPanel } from "./lexicon.js";
import { VoiceLibrary } from "./library.js";
import { LiveSession } from "./live.js";
import { PlaybackQueue } from "./playback.js";
import { charCount, exactJson } from "./protocol.js";
import { ApiKey, ConnectionStatus } from "./status.js";
import { Tabs } from "./tabs.js";
import { VoicesApi } from "./voices.js";

const boot = JSON.parse($("chorus-boot").textContent);

// Everything about this page that changes while it is open.
const state = {
  boot,
  limits: { max_text_chars: 5000, max_inflight: 16, max_num_step: 64, ...(boot.limits || {}) },
  jobs: new Map(), // request id -> Job
  seq: 0, // requests made by this page
  session: Math.random().toString(36).slice(2, 8), // request ids are `${session}-${seq}`
};

const key = new ApiKey(boot);

// ---------------------------------------------------------------------------- parts

// The field errors ask the knobs which options have a control (only once events come).
const errors = new FieldErrors(() => knobs.names());
errors.onShow = (target, errorEl) => {
  if (errorEl.closest("#advanced")) $("advanced").open = true;
  if (target === "instruct") setVoiceMode("design");
};
const knobs = new Knobs($("knobs"), optionTable(boot), boot.page_defaults, errors);
knobs.build();
$("reset-knobs").addEventListener("click", () => knobs.reset());
knobs.changed();

const api = new VoicesApi(() => key.headers());
const lexicon = new LexiconPanel(() => key.headers(), () => api.list());
const library = new VoiceLibrary(api, () => errors.clear("voice"), Boolean(boot.asr));
library.onVoices = (voices) => { // every voice picker shows the same list
  dialogue.setVoices(voices);
  batch.setVoices(voices);
};
const queue = new PlaybackQueue();
$("play-one-at-a-time").addEventListener("change", (ev) => {
  queue.oneAtATime = ev.target.checked;
});

// ---------------------------------------------------------------------------- text

const textEl = $("text");

function updateCount() {
  const n = charCount(textEl.value);
  const max = state.limits.max_text_chars;
  const countEl = $("char-count");
  countEl.textContent = `${n.toLocaleString()} / ${max.toLocaleString()}`;
  const over = n > max;
  countEl.classList.toggle("over", over);
  countEl.classList.toggle("near", !over && n > max * 0.9);
  if (over) errors.show("text", `${(n - max).toLocaleString()} characters over the server's limit of ${max.toLocaleString()}.`);
  else if (!errors.fromServer("text")) errors.clear("text");
}
textEl.addEventListener("input", () => {
  errors.clear("text");
  updateCount();
});
textEl.addEventListener("keydown", (ev) => {
  if (ev.key === "Enter" && (ev.ctrlKey || ev.metaKey)) {
    ev.preventDefault();
    $("compose-form").requestSubmit();
  }
});

function applyLimits() {
  $("max-chars").textContent = state.limits.max_text_chars.toLocaleString();
  knobs.applyLimits(state.limits);
  updateCount();
  dialogue?.update();
}

// ---------------------------------------------------------------------------- voice

const voiceMode = () => document.querySelector('input[name="voice-mode"]:checked').value;

function setVoiceMode(mode) {
  const radio = document.querySelector(`input[name="voice-mode"][value="${mode}"]`);
  if (radio && !radio.checked) radio.checked = true;
  for (const panel of document.querySelectorAll(".voice-panel")) panel.hidden = panel.dataset.mode !== mode;
  // keeping a voice is for the voices the model picks (automatic, designed)
  $("keep-voice-row").hidden = $("keep-voice-hint").hidden = mode === "library";
  if (mode === "library" && !library.loaded) library.refresh();
}

// A kept voice (a result's `voice_id`): picked in Voices, for the next requests.
async function useVoice(voiceId) {
  api.remember(voiceId); // without API keys the library lists kept voices to nobody
  setVoiceMode("library");
  await library.refresh(voiceId);
  $(`voice-opt-${voiceId}`)?.focus();
  announce("The kept voice is picked: the next requests speak with it.");
}
for (const radio of document.querySelectorAll('input[name="voice-mode"]')) {
  radio.addEventListener("change", () => {
    errors.clear("voice");
    errors.clear("instruct");
    setVoiceMode(voiceMode());
  });
}

const designPanel = $("panel-design");
fillDesignSelects(designPanel);
function updateInstruct() {
  const instruct = composeInstruct(designPanel);
  $("instruct-preview").textContent = instruct || "(none: pick at least one)";
  $("instruct-preview").classList.toggle("empty", !instruct);
  errors.clear("instruct");
}
for (const input of designPanel.querySelectorAll("[data-design]")) input.addEventListener("change", updateInstruct);
updateInstruct();
$("language").addEventListener("change", () => errors.clear("language"));

// The voice, language and options of a request, from the form; null (with the reason shown
// next to its control) when the form is not complete. `chars`: the text's length.
function requestFields(chars) {
  const fields = { voice: null, reference: null, instruct: null, language: $("language").value || null };
  let label = "Automatic voice";
  const mode = voiceMode();
  if (mode === "library") {
    const picked = library.selection();
    if (!picked) {
      errors.show("voice", "Pick a voice, or add one below.");
      $("mode-library").focus();
      return null;
    }
    if (picked.voice) fields.voice = picked.voice;
    else fields.reference = picked.reference;
    label = `Voice: ${picked.name}`;
  } else if (mode === "design") {
    fields.instruct = composeInstruct(designPanel);
    if (!fields.instruct) {
      errors.show("instruct", "Pick at least one attribute, or choose Automatic.");
      $("design-gender").focus();
      return null;
    }
    label = `Designed: ${fields.instruct}`;
  }
  fields.options = knobs.read(chars);
  if (mode !== "library" && $("keep-voice").checked) fields.keep_voice = true;
  return { fields, label };
}

// ---------------------------------------------------------------------------- connection

const status = new ConnectionStatus(key, (ready) => {
  Object.assign(state.limits, ready.limits || {});
  if (ready.model) $("model-name").textContent = ready.model;
  if (ready.sample_rate) $("footer-rate").textContent = ready.sample_rate;
  applyLimits();
  if (!library.loaded || library.failed) library.refresh();
  lexicon.refresh();
});

// One client for the page (client.js, the Python client's names): every request, the live
// stream and the status pill share its connection.
const client = new ChorusClient(() => key.streamUrl(), {
  onState: (connState, detail) => status.show(connState, detail),
  onError: (msg) => { // an error frame no request owns
    serverError(msg, undefined);
    updateJobsUi();
  },
});

// A result card follows its request's events; `onServerError(msg, job)` shows an error frame
// (by default beside the Speak tab's control the error names).
function follow(job, request, onServerError = serverError) {
  return request
    .on("accepted", (msg) => job.onAccepted(msg))
    .on("progress", (msg) => job.onProgress(msg))
    .on("line", (msg) => job.onLine?.(msg))
    .on("audio", (header, samples) => job.onAudio(header, samples))
    .on("words", (msg) => job.onWords(msg))
    .on("done", (msg) => {
      job.onDone(msg);
      updateJobsUi();
    })
    .on("cancelled", () => {
      job.onCancelled();
      updateJobsUi();
    })
    .on("error", (msg) => {
      if (msg.code !== "connection_lost") {
        onServerError(msg, job);
        updateJobsUi();
      } else if (job.active) {
        job.onError("The connection was lost before this request finished. Generate it again once reconnected.");
      }
    });
}

// The error shows next to the control of the field the server names, and on the card.
function serverError(msg, job, { live: isLive = false } = {}) {
  if (msg.code === "unauthorized") {
    job?.onError("The server needs a valid API key.");
    return;
  }
  let target = errorTarget(msg, knobs.names());
  if (isLive && (target === "text" || target === "form")) target = "live-text";
  const text = msg.message || msg.code || "The server reported an error.";
  if (target) errors.show(target, text, { fromServer: true });
  if (job) job.onError(`${text}${msg.code ? ` (${msg.code})` : ""}`);
  announce(`Error: ${text}`);
}

$("reconnect-now").addEventListener("click", () => client.reconnectNow());
window.addEventListener("online", () => {
  if (client.state === "lost") client.reconnectNow();
});

key.wireForm(() => client.reconnectNow()); // the voice library reloads once connected

// ---------------------------------------------------------------------------- generate

function nextId(kind = "") {
  state.seq += 1;
  return `${state.session}-${kind ? `${kind}-` : ""}${state.seq}`;
}

function updateJobsUi() {
  $("jobs-empty").hidden = state.jobs.size > 0;
  $("clear-finished").hidden = ![...state.jobs.values()].some((j) => !j.active);
}

function languageLabel() {
  const sel = $("language");
  return sel.value ? sel.options[sel.selectedIndex].text : "auto language";
}

async function generate() {
  errors.clearAll();
  const text = textEl.value;
  if (!text.trim()) {
    errors.show("text", "Type some text to speak first.");
    textEl.focus();
    return;
  }
  const n = charCount(text);
  if (n > state.limits.max_text_chars) {
    errors.show("text", `The text is ${n.toLocaleString()} characters; this server takes at most ${state.limits.max_text_chars.toLocaleString()}.`);
    textEl.focus();
    return;
  }
  const picked = requestFields(n);
  if (!picked) return;
  const { fields, label } = picked;
  // A seed the page picks when none is set, so that the MP3 download is the same speech.
  if (fields.options.seed === undefined) fields.options.seed = Math.floor(Math.random() * 2 ** 32);

  audioContext(); // created and resumed inside the click, so playback may start later
  const id = nextId();
  // word timings (the model's own, free): the result's captions
  const params = { ...fields, request_id: id, encoding: "pcm_s16le", progress: true, timestamps: "word" };
  if (knobs.delivery() === "whole") params.stream = "whole";
  const synthesis = client.synthesize(text, params);
  const request = synthesis.frame;

  const changed = Object.entries(fields.options).map(([k, v]) => `${k} ${v}`);
  const summary = {
    title: text.trim().replace(/\s+/g, " ").slice(0, 80) + (n > 80 ? "…" : ""),
    fullText: text,
    meta: [label, languageLabel(), ...changed].join(" · "),
  };
  const job = new Job(id, state.seq, summary, cardHooks);
  job.request = request;
  job.mp3 = !request.reference; // the HTTP endpoint takes library and built-in voices only
  await launch(job, synthesis);
}

// A new card in Results following `request` (a synthesis or a dialogue), which is sent once
// connected.
async function launch(job, request, onServerError = serverError) {
  job.synthesis = follow(job, request, onServerError);
  state.jobs.set(job.id, job);
  job.mount($("job-list"));
  updateJobsUi();
  // One column (phones): bring the new card into view; focus stays where it is.
  if (window.matchMedia("(max-width: 979px)").matches) job.el.scrollIntoView({ block: "nearest", behavior: "smooth" });
  announce(`${job.el.dataset.kind === "dialogue" ? "Dialogue" : "Request"} ${job.seq} started.`);

  try {
    await client.connect();
  } catch (err) {
    if (!job.active) return;
    job.onError(
      err.code === "unauthorized"
        ? "The server needs a valid API key (see API key, top right)."
        : "Could not reach the server. It will be retried automatically; generate again once connected.",
    );
    updateJobsUi();
    return;
  }
  if (!job.active) return; // cancelled while connecting
  try {
    await request.start();
    job.setState("sending");
  } catch {
    job.onError("Could not send the request: the connection closed.");
    updateJobsUi();
  }
}

// The same request (text, voice, options, seed) made again by `/v1/audio/speech` as MP3.
async function downloadMp3(job) {
  const r = job.request;
  const body = {
    model: boot.model, input: r.text, voice: r.voice, instructions: r.instruct, language: r.language,
    response_format: "mp3", ...r.options,
  };
  const button = job.$.mp3;
  button.disabled = true;
  button.textContent = "MP3…";
  try {
    const blob = await api.speech(exactJson(body));
    const url = URL.createObjectURL(blob);
    const a = document.createElement("a");
    a.href = url;
    a.download = `chorus-${job.seq}-${job.id}.mp3`;
    document.body.append(a);
    a.click();
    a.remove();
    setTimeout(() => URL.revokeObjectURL(url), 60_000);
  } catch (err) {
    job.showError(`The server could not make an MP3: ${err.message}`);
  } finally {
    button.disabled = false;
    button.textContent = "MP3";
  }
}

function cancelJob(job) {
  if (!job.active) return;
  if (job.state === "connecting") {
    job.synthesis?.cancel(); // not sent: it never will be
    job.onCancelled();
    updateJobsUi();
    return;
  }
  if (job.synthesis?.cancel()) {
    job.setState("cancelling");
  } else {
    job.onCancelled();
    updateJobsUi();
  }
}

function removeJob(job) {
  const next = job.el.nextElementSibling || job.el.previousElementSibling;
  job.dispose();
  state.jobs.delete(job.id);
  updateJobsUi();
  (next?.querySelector("button:not([hidden]), a:not([hidden])") || (tabs.current === "dialogue" ? $("dialogue-play") : $("generate"))).focus();
}

// What every result card may ask of the page.
const cardHooks = { cancel: cancelJob, remove: removeJob, announce, queue, downloadMp3, useVoice };

// ---------------------------------------------------------------------------- dialogue

// The Dialogue tab's script, played as one `dialogue` request; its card joins Results.
const dialogue = new DialoguePanel({
  limits: () => state.limits,
  start: (lines, fields, summary) => {
    audioContext(); // created and resumed inside the click, so playback may start later
    const id = nextId("dialogue");
    const request = client.dialogue(lines.map(({ voice, text }) => ({ voice, text })), { ...fields, request_id: id });
    const job = new DialogueJob(id, state.seq, summary, cardHooks, lines);
    job.request = request.frame;
    launch(job, request, (msg, card) => {
      dialogue.serverError(msg);
      const text = msg.message || msg.code || "The server reported an error.";
      card?.onError(`${text}${msg.code ? ` (${msg.code})` : ""}`);
      announce(`Error: ${text}`);
    });
    return job;
  },
});
applyLimits();

// ---------------------------------------------------------------------------- jobs

// The Jobs tab: long-form work submitted over HTTP (`/v1/jobs`), followed by polling.
const batch = new JobsPanel({ headers: () => key.headers(), limits: () => state.limits });

$("compose-form").addEventListener("submit", (ev) => {
  ev.preventDefault();
  if (composeMode() === "text") generate();
});
$("clear-finished").addEventListener("click", () => {
  for (const job of [...state.jobs.values()]) {
    if (!job.active) {
      job.dispose();
      state.jobs.delete(job.id);
    }
  }
  updateJobsUi();
  (tabs.current === "dialogue" ? $("dialogue-play") : $("generate")).focus();
});

// ---------------------------------------------------------------------------- live mode

const live = new LiveSession({
  client,
  nextId,
  request: () => {
    errors.clearAll();
    return requestFields(0);
  },
  onError: (msg) => serverError(msg, null, { live: true }),
  stopOthers: () => queue.pause(),
  onFinished: (rec) => liveResult(rec),
});

// A finished live stream as a result card: replay, WAV, and captions from its segments.
function liveResult({ chunks, sampleRate, cues, segments, text, label, done }) {
  const id = nextId("live-result");
  const title = text.replace(/\s+/g, " ").slice(0, 80) + (text.length > 80 ? "…" : "");
  const summary = { title: `Live · ${title}`, fullText: text,
                    meta: [label, languageLabel(), `${segments} segment${segments === 1 ? "" : "s"}`].join(" · ") };
  const job = new Job(id, state.seq, summary, cardHooks);
  job.live = true;
  state.jobs.set(id, job);
  job.mount($("job-list"));
  job.fromRecording(chunks, sampleRate, cues, done);
  updateJobsUi();
}

const composeMode = () => document.querySelector('input[name="compose-mode"]:checked').value;
function setComposeMode(mode) {
  $("text-field").hidden = mode !== "text";
  $("live-field").hidden = mode !== "live";
  $("generate").closest(".actions").hidden = mode !== "text";
  knobs.setLive(mode === "live");
  if (mode === "text" && live.state === "open") live.close();
}
for (const radio of document.querySelectorAll('input[name="compose-mode"]')) {
  radio.addEventListener("change", () => setComposeMode(composeMode()));
}

// ---------------------------------------------------------------------------- start

const tabs = new Tabs(document.querySelector(".tabs"), (name) => {
  if (name !== "speak" && !library.loaded && client.ready) library.refresh();
});
tabs.fromHash();
setVoiceMode(voiceMode());
setComposeMode(composeMode());
updateJobsUi();
client.connect().catch(() => {}); // the voice library loads once connected; the status pill shows failures

// For debugging and the browser tests.
window.chorus = { state, client, connection: client.connection, jobs: state.jobs, limits: state.limits, stats, boot, queue, live, knobs, lexicon,
                  dialogue, batch, tabs };

// The Jobs tab: long-form work as a background job. A pasted text or a text file goes to
// `POST /v1/jobs` as one long text (the server cuts it into items), a JSONL file as it is (one
// speech body a line). Each job is a card that polls `GET /v1/jobs/{id}` for its progress
// (items done, audio made, time left) until it ends, and offers each item's audio once
// `GET /v1/jobs/{id}/items` says it is done (`/items/{n}`), a zip of all of them (`/archive`) and
// Cancel (`DELETE`).
// The jobs submitted from this browser are remembered (local storage), so a reload shows them
// again until the server forgets them.

import { $, announce, el } from "./dom.js";
import { fillVoicePicker } from "./library.js";
import { charCount } from "./protocol.js";
import { apiError } from "./voices.js";

const POLL_MS = 1000; // while a job runs
const POLL_MAX_MS = 8000; // backing off while the server cannot be reached
const STORE = "chorus.jobs";
const REMEMBERED = 30; // jobs kept in local storage at most
const SHOWN_ITEMS = 500; // item downloads listed per job (the zip has them all)
const FINISHED = new Set(["completed", "failed", "cancelled", "gone"]);
const STATUS_TEXT = {
  submitting: "Submitting…", queued: "Queued", running: "Running", completed: "Completed", failed: "Failed",
  cancelling: "Cancelling…", cancelled: "Cancelled", gone: "Gone",
};
const ITEM_STATUS_TEXT = { queued: "queued", running: "being made", failed: "failed", cancelled: "cancelled" };
const JSONL = /\.(jsonl|ndjson)$/i;

const plural = (n, word) => `${n.toLocaleString()} ${word}${n === 1 ? "" : "s"}`;

function duration(seconds) {
  if (seconds < 90) return `${seconds.toFixed(seconds < 10 ? 1 : 0)} s`;
  const m = Math.floor(seconds / 60);
  if (m < 90) return `${m} min ${Math.round(seconds % 60)} s`;
  return `${Math.floor(m / 60)} h ${m % 60} min`;
}

// A file the page saves: `blob` as `filename`, through a link click.
function save(blob, filename) {
  const url = URL.createObjectURL(blob);
  const a = el("a", { href: url, download: filename });
  document.body.append(a);
  a.click();
  a.remove();
  setTimeout(() => URL.revokeObjectURL(url), 60_000);
}

// The file name a response gives itself (Content-Disposition), or `fallback`.
function fileName(res, fallback) {
  const m = /filename="?([^";]+)"?/i.exec(res.headers.get("Content-Disposition") || "");
  return m ? m[1] : fallback;
}

// ------------------------------------------------------------------------------------ the API

export class JobsApi {
  // headers(): extra request headers (the API key as a Bearer token, when there is one)
  constructor(headers) {
    this.headers = headers;
  }

  path(id, rest = "") {
    return `/v1/jobs/${encodeURIComponent(id)}${rest}`;
  }

  async call(url, init = {}) {
    const res = await fetch(url, { cache: "no-store", ...init, headers: { ...(init.headers || {}), ...this.headers() } });
    if (!res.ok) throw await apiError(res);
    return res;
  }

  // One long text (`json`, a speech body) or a JSONL file (`jsonl`, a Blob): {id, status}.
  async submit({ json, jsonl, format }) {
    if (jsonl) {
      const url = `/v1/jobs?response_format=${encodeURIComponent(format)}`;
      return (await this.call(url, { method: "POST", body: jsonl, headers: { "Content-Type": "application/jsonl" } })).json();
    }
    return (await this.call("/v1/jobs", {
      method: "POST", body: JSON.stringify(json), headers: { "Content-Type": "application/json" },
    })).json();
  }

  async get(id) {
    return (await this.call(this.path(id))).json();
  }

  async cancel(id) {
    return (await this.call(this.path(id), { method: "DELETE" })).json();
  }

  // The first `limit` items' states (`GET /v1/jobs/{id}/items`): [{n, status, format?, audio_seconds?}].
  async items(id, limit) {
    return (await this.call(this.path(id, `/items?limit=${limit}`))).json();
  }

  async download(id, rest, fallback) {
    const res = await this.call(this.path(id, rest));
    return { blob: await res.blob(), filename: fileName(res, fallback) };
  }
}

// ------------------------------------------------------------------------------------ a job's card

class BatchCard {
  // record: {id, seq, title, meta, format}; hooks: {api, announce, remove(card), changed()}
  constructor(record, hooks) {
    this.record = record;
    this.id = record.id;
    this.hooks = hooks;
    this.view = null; // the server's latest answer
    this.status = "submitting";
    this.timer = null;
    this.delay = POLL_MS;
    this.itemsShown = 0;
    this.itemsKnown = -1; // items done when their states were last asked for (-2: the job had ended)
    this.itemsWanted = -1;
    this.itemsAsking = false;
    this.disposed = false;
    this.el = $("batch-template").content.firstElementChild.cloneNode(true);
    const q = (sel) => this.el.querySelector(sel);
    this.$ = {
      article: q("article"), title: q(".job-title"), state: q(".job-state"), meta: q(".job-meta"),
      progress: q(".progress"), bar: q(".progress-bar"), text: q(".job-progress-text"), error: q(".job-error"),
      items: q(".batch-items"), itemList: q(".batch-item-list"), archive: q(".batch-archive"),
      cancel: q(".batch-cancel"), remove: q(".batch-remove"),
    };
    const name = `job ${record.seq}`;
    this.$.title.textContent = `#${record.seq} · ${record.title}`;
    this.$.title.title = record.title;
    this.$.meta.textContent = record.meta;
    this.$.article.setAttribute("aria-label", `Job ${record.seq}`);
    this.$.progress.setAttribute("aria-label", `Progress of ${name}`);
    this.$.archive.setAttribute("aria-label", `Download the audio of ${name} as a zip`);
    this.$.cancel.setAttribute("aria-label", `Cancel ${name}`);
    this.$.remove.setAttribute("aria-label", `Remove ${name} from this list`);
    this.$.archive.addEventListener("click", () => this.downloadArchive());
    this.$.cancel.addEventListener("click", () => this.cancel());
    this.$.remove.addEventListener("click", () => this.hooks.remove(this));
    this.$.itemList.addEventListener("click", (ev) => {
      const button = ev.target.closest("button[data-item]");
      if (button) this.downloadItem(Number(button.dataset.item), button);
    });
    this.el.dataset.jobId = record.id || "";
    this.setStatus(record.id ? "queued" : "submitting");
  }

  get finished() {
    return FINISHED.has(this.status);
  }

  setStatus(status) {
    this.status = status;
    this.el.dataset.status = status;
    this.$.state.textContent = STATUS_TEXT[status] || status;
    this.$.cancel.hidden = this.finished || status === "submitting";
    this.$.cancel.disabled = status === "cancelling";
    this.$.remove.hidden = !this.finished;
  }

  // The job as the server answered (`GET /v1/jobs/{id}`, `DELETE`'s answer).
  update(view) {
    this.view = view;
    const total = view.items_total || 0;
    const done = view.items_done || 0;
    const pct = total ? (100 * done) / total : view.status === "completed" ? 100 : 0;
    this.$.bar.style.width = `${pct}%`;
    this.$.progress.setAttribute("aria-valuenow", String(Math.round(pct)));
    this.$.progress.setAttribute("aria-valuetext", `${done} of ${total} items`);
    if (this.status !== "cancelling" || FINISHED.has(view.status)) this.setStatus(view.status);
    const audio = `${duration(view.audio_seconds || 0)} of audio`;
    let text;
    if (view.status === "queued") text = `Queued · ${plural(total, "item")}`;
    else if (view.status === "running") {
      const left = typeof view.eta_seconds === "number" ? ` · about ${duration(view.eta_seconds)} left` : "";
      text = `${done} of ${plural(total, "item")} · ${audio}${left}`;
    } else if (view.status === "completed") text = `${plural(total, "item")} · ${audio}`;
    else if (view.status === "cancelled") text = `Cancelled after ${done} of ${plural(total, "item")} · ${audio}`;
    else text = `Stopped after ${done} of ${plural(total, "item")}`;
    this.$.text.textContent = text;
    if (view.status === "failed") {
      const err = view.error || {};
      this.showError(`${err.message || "The job failed."}${err.code ? ` (${err.code})` : ""}`);
    }
    // Downloads: each item and the zip, once any item is done.
    this.$.archive.hidden = done === 0;
    this.$.archive.textContent = view.status === "completed" || this.finished ? "Download all (zip)" : "Download the items done (zip)";
    if (done > 0) {
      this.showItems(total);
      this.refreshItems(done);
    }
  }

  // Which listed items are ready (`GET /v1/jobs/{id}/items`), asked again whenever more are done
  // or the job ends: a ready item's button names its file and length, the others say their state.
  async refreshItems(done) {
    this.itemsWanted = this.finished ? -2 : done;
    if (this.itemsAsking) return; // the call under way asks again if it is out of date
    this.itemsAsking = true;
    try {
      while (!this.disposed && this.itemsKnown !== this.itemsWanted) {
        const key = this.itemsWanted;
        const { items } = await this.hooks.api.items(this.id, SHOWN_ITEMS);
        if (this.disposed) return;
        this.itemsKnown = key;
        for (const item of items) this.markItem(item);
      }
    } catch {
      // the next poll asks again; the buttons stay as they were
    } finally {
      this.itemsAsking = false;
    }
  }

  markItem({ n, status, format, audio_seconds: seconds }) {
    const li = this.$.itemList.querySelector(`li[data-item="${n}"]`);
    if (!li) return;
    const ready = status === "done";
    li.dataset.status = status;
    li.querySelector("button").disabled = !ready;
    const name = `${String(n).padStart(4, "0")}.${format || this.record.format || "mp3"}`;
    li.querySelector(".batch-item-name").textContent = ready
      ? `${name} · ${duration(seconds || 0)}` : `${name} · ${ITEM_STATUS_TEXT[status] || status}`;
  }

  showItems(total) {
    const n = Math.min(total, SHOWN_ITEMS);
    if (this.itemsShown !== n) {
      const ext = this.record.format || "mp3";
      const items = [];
      for (let k = this.itemsShown; k < n; k++) {
        const name = `${String(k).padStart(4, "0")}.${ext}`;
        items.push(el("li", { className: "batch-item", "data-item": k },
          el("button", { type: "button", className: "link small", "data-item": k, disabled: true,
                         "aria-label": `Download item ${k + 1} of job ${this.record.seq}`, text: `Item ${k + 1}` }),
          el("span", { className: "batch-item-name", text: name })));
      }
      this.$.itemList.append(...items);
      this.itemsShown = n;
      if (total > n) {
        this.$.itemList.append(el("li", { className: "hint", text: `… and ${plural(total - n, "more item")}: download all as a zip.` }));
      }
    }
    this.$.items.hidden = false;
    this.$.items.querySelector("summary").textContent = `Items (${total.toLocaleString()})`;
  }

  showError(message) {
    this.$.error.textContent = message;
    this.$.error.hidden = false;
  }

  // ---- polling

  start() {
    this.poll();
  }

  async poll() {
    this.timer = null;
    if (this.disposed || !this.id) return;
    try {
      const view = await this.hooks.api.get(this.id);
      if (this.disposed) return;
      this.delay = POLL_MS;
      this.$.error.hidden = this.status === "failed" ? this.$.error.hidden : true;
      const was = this.status;
      this.update(view);
      if (this.finished && was !== this.status) {
        this.hooks.announce(`Job ${this.record.seq} ${STATUS_TEXT[this.status].toLowerCase()}.`);
        this.hooks.changed();
      }
    } catch (err) {
      if (this.disposed) return;
      if (err.status === 404) { // removed by the server (retention), or another API key's
        this.setStatus("gone");
        this.showError(`The server no longer has this job: ${err.message}`);
        this.hooks.changed();
        return;
      }
      this.showError(`Could not ask the server about this job (${err.message}); trying again.`);
      this.delay = Math.min(POLL_MAX_MS, this.delay * 2);
    }
    if (!this.finished) this.timer = setTimeout(() => this.poll(), this.delay);
  }

  // ---- actions

  async cancel() {
    if (this.finished) return;
    this.setStatus("cancelling");
    try {
      this.update(await this.hooks.api.cancel(this.id));
      this.hooks.changed();
      if (this.finished) this.hooks.announce(`Job ${this.record.seq} cancelled.`);
    } catch (err) {
      this.setStatus(this.view?.status || "queued");
      this.showError(`Could not cancel: ${err.message}`);
    }
  }

  async downloadItem(k, button) {
    button.disabled = true;
    try {
      const { blob, filename } = await this.hooks.api.download(this.id, `/items/${k}`,
        `${String(k).padStart(4, "0")}.${this.record.format || "mp3"}`);
      save(blob, `chorus-${this.id.slice(0, 12)}-${filename}`);
    } catch (err) {
      this.showError(err.status === 409 ? `Item ${k + 1} is not done yet; try again in a moment.` : `Item ${k + 1}: ${err.message}`);
    } finally {
      button.disabled = false;
    }
  }

  async downloadArchive() {
    const button = this.$.archive;
    const label = button.textContent;
    button.disabled = true;
    button.textContent = "Preparing zip…";
    try {
      const { blob, filename } = await this.hooks.api.download(this.id, "/archive", `${this.id}.zip`);
      save(blob, `chorus-${filename}`);
    } catch (err) {
      this.showError(`Could not download the zip: ${err.message}`);
    } finally {
      button.disabled = false;
      button.textContent = label;
    }
  }

  dispose() {
    this.disposed = true;
    clearTimeout(this.timer);
    this.el.remove();
  }
}

// ------------------------------------------------------------------------------------ the tab

export class JobsPanel {
  // hooks: {headers(): the API key's headers, limits(): the server's limits}
  constructor(hooks) {
    this.hooks = hooks;
    this.api = new JobsApi(hooks.headers);
    this.cards = new Map(); // job id -> BatchCard
    this.file = null;
    this.seq = 0;
    $("batch-form").addEventListener("submit", (ev) => {
      ev.preventDefault();
      this.submit();
    });
    $("batch-text").addEventListener("input", () => {
      this.clearError("batch-text");
      this.count();
    });
    $("batch-file").addEventListener("change", () => this.pickFile($("batch-file").files[0] || null));
    $("batch-file-clear").addEventListener("click", () => {
      this.pickFile(null);
      $("batch-file").focus();
    });
    for (const id of ["batch-voice", "batch-format", "batch-language", "batch-steps"]) {
      $(id).addEventListener("input", () => this.clearError(id));
    }
    $("batch-clear").addEventListener("click", () => {
      for (const card of [...this.cards.values()]) if (card.finished) this.remove(card, false);
      $("batch-submit").focus();
    });
    this.count();
    this.restore();
  }

  setVoices(voices) {
    fillVoicePicker($("batch-voice"), voices);
  }

  count() {
    const n = charCount($("batch-text").value);
    $("batch-count").textContent = plural(n, "character");
  }

  pickFile(file) {
    this.file = file;
    if (!file) $("batch-file").value = "";
    const jsonl = Boolean(file && JSONL.test(file.name));
    $("batch-file-name").textContent = file ? `${file.name} · ${(file.size / 1024).toFixed(1)} KB${jsonl ? " · JSONL" : ""}` : "";
    $("batch-file-name").hidden = $("batch-file-clear").hidden = !file;
    $("batch-text").disabled = Boolean(file); // a file is sent instead of the text box
    // A JSONL file's lines carry their own voice, language and settings.
    for (const id of ["batch-voice", "batch-language", "batch-steps"]) {
      $(id).disabled = jsonl;
      $(id).title = jsonl ? "Each line of the JSONL file says its own" : "";
    }
    this.clearError("batch-file");
    this.clearError("batch-text");
  }

  // ---- errors beside their controls

  showError(id, message) {
    const error = $(`${id}-error`);
    error.textContent = message;
    error.hidden = false;
    if (id !== "batch" && id !== "batch-file") $(id).setAttribute("aria-invalid", "true");
  }

  clearError(id) {
    $(`${id}-error`).hidden = true;
    $(id)?.removeAttribute("aria-invalid"); // "batch": the form's own error, beside the button
  }

  clearAll() {
    for (const id of ["batch-text", "batch-file", "batch-voice", "batch-format", "batch-language", "batch-steps", "batch"]) {
      this.clearError(id);
    }
  }

  // A refused submission: beside the control of the field the server names.
  serverError(err, source) {
    const field = err.field || "";
    const top = field.replace(/^items\[\d+\]\./, "");
    const byField = { voice: "batch-voice", language: "batch-language", num_step: "batch-steps",
                      response_format: "batch-format" };
    let id = byField[top];
    if (!id && (field === "input" || field.startsWith("items") || err.status === 413 || err.status === 415)) {
      id = source === "text" ? "batch-text" : "batch-file";
    }
    if (source === "jsonl" && field.startsWith("items")) id = "batch-file"; // a line of the file is at fault
    this.showError(id || "batch", `${err.message}${err.code ? ` (${err.code})` : ""}`);
  }

  // ---- submit

  async submit() {
    this.clearAll();
    const format = $("batch-format").value;
    let request;
    let title;
    let source;
    if (this.file) {
      title = this.file.name;
      if (JSONL.test(this.file.name)) {
        source = "jsonl";
        request = { jsonl: this.file, format };
      } else {
        source = "file";
        const text = await this.file.text();
        if (!text.trim()) {
          this.showError("batch-file", "This file has no text to speak.");
          return;
        }
        request = this.longText(text, format);
      }
    } else {
      source = "text";
      const text = $("batch-text").value;
      if (!text.trim()) {
        this.showError("batch-text", "Paste some text to speak, or choose a file.");
        $("batch-text").focus();
        return;
      }
      const flat = text.trim().replace(/\s+/g, " ");
      title = flat.slice(0, 70) + (flat.length > 70 ? "…" : "");
      request = this.longText(text, format);
    }
    if (!request) return;
    const seq = ++this.seq;
    const meta = source === "jsonl"
      ? ["JSONL", format.toUpperCase()]
      : [request.json.voice ? $("batch-voice").selectedOptions[0].text : "Automatic voice", format.toUpperCase(),
         ...(request.json.num_step ? [`num_step ${request.json.num_step}`] : [])];
    const button = $("batch-submit");
    button.disabled = true;
    let created;
    try {
      created = await this.api.submit(request);
    } catch (err) {
      this.serverError(err, source);
      announce(`The job was refused: ${err.message}`);
      return;
    } finally {
      button.disabled = false;
    }
    const record = { id: created.id, seq, title, meta: meta.join(" · "), format, at: Date.now() };
    const card = this.add(record);
    card.setStatus(created.status || "queued");
    this.remember();
    announce(`Job ${seq} submitted.`);
    if (window.matchMedia("(max-width: 979px)").matches) card.el.scrollIntoView({ block: "nearest", behavior: "smooth" });
    card.start();
  }

  // A long text's speech body, from the form; null (with the reason shown) when it is not valid.
  longText(text, format) {
    const json = { input: text, response_format: format };
    const voice = $("batch-voice").value;
    if (voice) json.voice = voice;
    const language = $("batch-language").value;
    if (language) json.language = language;
    const steps = $("batch-steps").value.trim();
    if (steps !== "") {
      const num = Number(steps);
      const most = this.hooks.limits().max_num_step || 64;
      if (!Number.isInteger(num) || num < 1 || num > most) {
        this.showError("batch-steps", `A whole number of steps, 1 to ${most}.`);
        $("batch-steps").focus();
        return null;
      }
      json.num_step = num;
    }
    return { json };
  }

  add(record) {
    const card = new BatchCard(record, {
      api: this.api,
      announce,
      remove: (c) => this.remove(c, true),
      changed: () => this.changed(),
    });
    this.cards.set(record.id, card);
    $("batch-list").prepend(card.el);
    this.changed();
    return card;
  }

  remove(card, focus) {
    const next = card.el.nextElementSibling || card.el.previousElementSibling;
    card.dispose();
    this.cards.delete(card.id);
    this.remember();
    this.changed();
    if (focus) (next?.querySelector("button:not([hidden])") || $("batch-submit")).focus();
  }

  changed() {
    $("batch-empty").hidden = this.cards.size > 0;
    $("batch-clear").hidden = ![...this.cards.values()].some((c) => c.finished);
    this.remember();
  }

  // ---- remembered across reloads (ids are the jobs' only key without an API key: kept in
  // this browser only)

  remember() {
    const records = [...this.cards.values()].filter((c) => c.status !== "gone").map((c) => c.record)
      .sort((a, b) => a.seq - b.seq).slice(-REMEMBERED);
    try {
      localStorage.setItem(STORE, JSON.stringify(records));
    } catch {
      /* storage unavailable: this page's jobs only */
    }
  }

  restore() {
    let records = [];
    try {
      records = JSON.parse(localStorage.getItem(STORE) || "[]");
    } catch {
      records = [];
    }
    if (!Array.isArray(records)) records = [];
    for (const r of records) {
      if (!r || typeof r.id !== "string" || this.cards.has(r.id)) continue;
      this.seq = Math.max(this.seq, Number(r.seq) || 0);
      this.add({ id: r.id, seq: Number(r.seq) || 0, title: String(r.title || r.id), meta: String(r.meta || ""),
                 format: String(r.format || "mp3"), at: r.at }).start();
    }
    this.changed();
  }
}

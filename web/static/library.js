// The voice panel's library: built-in voices, saved voices (pick, delete), and adding a
// voice from an uploaded or recorded clip, either saved to the library or used once (sent
// as the request's one-shot `reference`, never stored).

import { $, announce, el, formatSeconds } from "./dom.js";
import { Recorder } from "./voices.js";

const CLIP_ONCE = "__clip_once__"; // the radio value of the unsaved clip
const TRASH_SVG =
  '<svg viewBox="0 0 24 24" aria-hidden="true" focusable="false"><path d="M9 3h6l1 2h4v2H4V5h4l1-2zm-3 6h12l-1 12H7L6 9zm4 2v8h2v-8h-2zm4 0v8h2v-8h-2z"/></svg><span class="confirm-text">Delete?</span>';

function blobToBase64(blob) {
  return new Promise((resolve, reject) => {
    const reader = new FileReader();
    reader.onload = () => resolve(String(reader.result).replace(/^data:[^,]*,/, ""));
    reader.onerror = () => reject(reader.error);
    reader.readAsDataURL(blob);
  });
}

// A <select> of voices for the other tabs (a dialogue's lines, a job): "Automatic voice", then
// the built-in voices and yours, as `GET /v1/voices` lists them. The voice the select's
// `data-want` names is picked once the list has it (until then: Automatic, and still wanted).
export function fillVoicePicker(select, voices) {
  const want = select.dataset.want ?? "";
  const option = (v) => el("option", { value: v.id, text: v.name || v.id });
  const builtins = voices.filter((v) => v.builtin);
  const mine = voices.filter((v) => !v.builtin);
  const groups = [el("option", { value: "", text: "Automatic voice" })];
  if (builtins.length) groups.push(el("optgroup", { label: "Built-in" }, ...builtins.map(option)));
  if (mine.length) groups.push(el("optgroup", { label: "Yours" }, ...mine.map(option)));
  select.replaceChildren(...groups);
  select.value = voices.some((v) => v.id === want) ? want : "";
}

export class VoiceLibrary {
  // api: VoicesApi; onPicked(): a voice was picked (clears the voice error)
  // transcribes: the server has a speech recogniser (`--asr-model`), so a clip may come
  // without its transcript
  constructor(api, onPicked, transcribes = false) {
    this.transcribes = transcribes;
    this.api = api;
    this.onPicked = onPicked;
    this.loaded = false;
    this.failed = false;
    this.clip = null; // {blob, filename}: the clip in the add-voice form
    this.clipUrl = null;
    this.once = null; // {reference: {audio, text}, label}: the clip chosen for one-shot use
    this.recorder = null;
    this.onVoices = null; // (voices) => void: after each load of the list
    this.clipHint = $("clip-status").textContent;
    this.wire();
  }

  wire() {
    $("voice-file").addEventListener("change", () => {
      const file = $("voice-file").files[0];
      if (!file) return;
      this.setClip({ blob: file, filename: file.name }, `${file.name} · ${(file.size / 1024).toFixed(0)} KB`);
      if (!$("voice-name").value) $("voice-name").value = file.name.replace(/\.[^.]+$/, "");
    });
    $("clip-clear").addEventListener("click", () => {
      $("voice-file").value = "";
      this.setClip(null, this.clipHint);
      $("voice-file").focus();
    });
    $("record-button").addEventListener("click", () => this.toggleRecording());
    $("voice-form").addEventListener("submit", (ev) => {
      ev.preventDefault();
      this.save();
    });
    $("use-once").addEventListener("click", () => this.useOnce());
    $("voice-text").addEventListener("input", () => {
      $("voice-text-error").hidden = true;
      $("voice-text").removeAttribute("aria-invalid");
    });
  }

  // What the request should speak with: {voice, name} or {reference, name}; null if nothing
  // is picked.
  selection() {
    const picked = document.querySelector('input[name="voice"]:checked');
    if (!picked) return null;
    if (picked.value === CLIP_ONCE) return this.once && { reference: this.once.reference, name: this.once.label };
    return { voice: picked.value, name: picked.dataset.name || picked.value };
  }

  // ---- the lists

  async refresh(selectId) {
    try {
      const voices = await this.api.list();
      this.loaded = true;
      this.failed = false;
      $("voices-load-error").hidden = true;
      this.render(voices, selectId);
      this.onVoices?.(voices); // the other voice pickers (the dialogue's lines)
    } catch (err) {
      this.failed = true;
      const e = $("voices-load-error");
      e.textContent = `Could not load the voice library: ${err.message}`;
      e.hidden = false;
    }
  }

  render(voices, selectId) {
    const current = selectId || document.querySelector('input[name="voice"]:checked')?.value;
    const builtins = voices.filter((v) => v.builtin);
    const mine = voices.filter((v) => !v.builtin);
    $("builtin-list").replaceChildren(...builtins.map((v) => this.item(v, current, false)));
    $("builtin-group").hidden = builtins.length === 0;
    const items = mine.map((v) => this.item(v, current, true));
    if (this.once) items.unshift(this.onceItem(current === CLIP_ONCE));
    $("voice-list").replaceChildren(...items);
    $("voice-empty").hidden = items.length > 0;
    if (!items.length && !builtins.length) $("add-voice").open = true;
  }

  item(v, current, deletable) {
    const rid = `voice-opt-${v.id}`;
    const name = v.name || v.id;
    const radio = el("input", { type: "radio", name: "voice", id: rid, value: v.id, "data-name": name });
    if (v.id === current) radio.checked = true;
    radio.addEventListener("change", () => this.onPicked());
    // A kept voice (a request's `keep_voice`) says so, and until when.
    const kept = v.kept && v.expires_at ? `kept until ${new Date(v.expires_at * 1000).toLocaleString()}` : "";
    const meta = v.builtin
      ? ""
      : [kept, formatSeconds(v.seconds), v.text ? `“${v.text}”` : ""].filter(Boolean).join(" · ");
    const label = el("label", { for: rid },
      el("span", { className: "voice-name", text: name }),
      el("span", { className: "voice-meta", text: meta }));
    const li = el("li", { className: "voice-item", "data-voice-id": v.id, "data-builtin": v.builtin ? "yes" : null,
                          "data-kept": v.kept ? "yes" : null }, radio, label);
    if (deletable) {
      const del = el("button", {
        type: "button", className: "icon-button danger-quiet", "aria-label": `Delete voice ${name}`, title: "Delete",
      });
      del.innerHTML = TRASH_SVG;
      del.addEventListener("click", () => this.remove(v, name, del));
      del.addEventListener("blur", () => del.classList.remove("confirming"));
      li.append(del);
    }
    return li;
  }

  onceItem(checked) {
    const rid = "voice-opt-clip-once";
    const radio = el("input", { type: "radio", name: "voice", id: rid, value: CLIP_ONCE, "data-name": this.once.label, checked });
    radio.addEventListener("change", () => this.onPicked());
    const forget = el("button", { type: "button", className: "link small", "aria-label": "Forget the unsaved clip", text: "Forget" });
    forget.addEventListener("click", () => {
      this.once = null;
      $("voice-opt-clip-once")?.closest("li").remove();
      $("voice-empty").hidden = $("voice-list").children.length > 0;
      announce("The unsaved clip is forgotten.");
    });
    return el("li", { className: "voice-item once", "data-voice-id": CLIP_ONCE }, radio,
      el("label", { for: rid },
        el("span", { className: "voice-name", text: this.once.label }),
        el("span", { className: "voice-meta", text: "sent with each request, never saved" })),
      forget);
  }

  async remove(v, name, button) {
    if (!button.classList.contains("confirming")) {
      button.classList.add("confirming");
      button.setAttribute("aria-label", `Confirm: delete voice ${name}`);
      return;
    }
    button.disabled = true;
    try {
      await this.api.remove(v.id);
      announce(`Voice ${name} deleted.`);
      await this.refresh();
      ($("voice-list").querySelector("input") || $("mode-library")).focus();
    } catch (err) {
      button.disabled = false;
      const e = $("voices-load-error");
      e.textContent = `Could not delete ${name}: ${err.message}`;
      e.hidden = false;
    }
  }

  // ---- the add-voice form

  setClip(next, status) {
    this.clip = next;
    if (this.clipUrl) URL.revokeObjectURL(this.clipUrl);
    this.clipUrl = null;
    if (next) {
      this.clipUrl = URL.createObjectURL(next.blob);
      $("clip-audio").src = this.clipUrl;
    } else {
      $("clip-audio").removeAttribute("src");
    }
    $("clip-preview").hidden = !next;
    $("clip-status").textContent = status;
    this.hideFormErrors();
  }

  hideFormErrors() {
    for (const id of ["voice-name-error", "voice-file-error", "voice-text-error", "voice-form-error"]) $(id).hidden = true;
    $("voice-text").removeAttribute("aria-invalid");
  }

  // The server names the form field at fault; anything else is about the form as a whole.
  showFormError(err) {
    const byField = { name: "voice-name-error", text: "voice-text-error", audio: "voice-file-error" };
    let id = byField[err.field] || "voice-form-error";
    if (!err.field && (err.status === 413 || err.status === 415)) id = "voice-file-error";
    $(id).textContent = err.message || String(err);
    $(id).hidden = false;
    if (id === "voice-text-error") $("voice-text").setAttribute("aria-invalid", "true");
  }

  requireClip() {
    if (this.clip) return true;
    $("voice-file-error").textContent = "Choose an audio file or record a clip first.";
    $("voice-file-error").hidden = false;
    $("voice-file").focus();
    return false;
  }

  async toggleRecording() {
    const button = $("record-button");
    const label = button.querySelector(".rec-text");
    if (this.recorder) {
      const r = this.recorder;
      this.recorder = null; // from here on, late level reports of `r` change nothing
      button.classList.remove("recording");
      button.setAttribute("aria-pressed", "false");
      label.textContent = "Record";
      const result = await r.stop();
      if (result && result.seconds > 0.2) {
        $("voice-file").value = "";
        this.setClip({ blob: result.blob, filename: "recording.wav" }, `Recorded ${result.seconds.toFixed(1)} s from the microphone.`);
      } else {
        this.setClip(null, "The recording was empty; try again.");
      }
      return;
    }
    const r = new Recorder((level, seconds) => {
      if (this.recorder !== r) return;
      button.style.setProperty("--level", Math.min(1, level * 4).toFixed(2));
      label.textContent = `Stop · ${seconds.toFixed(1)} s`;
    });
    r.onLimit = () => {
      if (this.recorder === r) this.toggleRecording();
    };
    this.recorder = r;
    try {
      await r.start();
      if (this.recorder !== r) return;
      button.classList.add("recording");
      button.setAttribute("aria-pressed", "true");
      label.textContent = "Stop · 0.0 s";
      $("clip-status").textContent = "Recording… read your transcript aloud, then press Stop.";
    } catch (err) {
      if (this.recorder === r) this.recorder = null;
      const e = $("voice-file-error");
      e.textContent = `Could not record: ${err.message || err.name}`;
      e.hidden = false;
    }
  }

  async save() {
    this.hideFormErrors();
    if (!this.requireClip()) return;
    const save = $("save-voice");
    save.disabled = true;
    save.textContent = "Saving…";
    try {
      const created = await this.api.create({
        file: this.clip.blob,
        filename: this.clip.filename,
        text: $("voice-text").value.trim(),
        name: $("voice-name").value.trim(),
      });
      announce(`Voice ${created.name || created.id} saved.`);
      this.resetForm();
      await this.refresh(created.id);
      $("add-voice").open = false;
      $(`voice-opt-${created.id}`)?.focus();
    } catch (err) {
      this.showFormError(err);
    } finally {
      save.disabled = false;
      save.textContent = "Save as a voice";
    }
  }

  // Pick the clip for the next requests without saving it: it travels in each request.
  async useOnce() {
    this.hideFormErrors();
    if (!this.requireClip()) return;
    const text = $("voice-text").value.trim();
    if (!text && !this.transcribes) {
      // Asked now, not at Generate: a clip used once travels with its transcript.
      $("voice-text-error").textContent =
        "Type what the clip says: a clip used once needs its transcript (this server does not transcribe).";
      $("voice-text-error").hidden = false;
      $("voice-text").setAttribute("aria-invalid", "true");
      $("voice-text").focus();
      return;
    }
    const label = `Unsaved clip · ${$("voice-name").value.trim() || this.clip.filename}`;
    this.once = { reference: { audio: await blobToBase64(this.clip.blob), text: text || null }, label };
    this.resetForm();
    $("voice-list").querySelector(`[data-voice-id="${CLIP_ONCE}"]`)?.remove();
    $("voice-list").prepend(this.onceItem(true));
    $("voice-empty").hidden = true;
    $("add-voice").open = false;
    this.onPicked();
    $("voice-opt-clip-once").focus();
    announce("The clip will be used for the next requests, without saving it.");
  }

  resetForm() {
    $("voice-name").value = "";
    $("voice-text").value = "";
    $("voice-file").value = "";
    this.setClip(null, this.clipHint);
  }
}

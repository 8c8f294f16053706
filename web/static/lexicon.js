// The pronunciation lexicon (`/v1/pronunciations`): words the server always says a given way,
// for every voice or for one. Listed, added, edited (the old entry replaced) and deleted here.

import { $, announce, el } from "./dom.js";
import { apiError } from "./voices.js";

export class LexiconPanel {
  // headers(): the API key header, when there is one; voices(): the voices to offer as a scope
  constructor(headers, voices) {
    this.headers = headers;
    this.voices = voices;
    this.entries = [];
    this.editing = null; // the entry being edited: replaced when the form is saved
    $("lexicon").addEventListener("toggle", () => {
      if ($("lexicon").open) this.refresh();
    });
    $("lexicon-add").addEventListener("click", () => this.save());
    for (const id of ["lexicon-text", "lexicon-say"]) {
      $(id).addEventListener("keydown", (ev) => {
        if (ev.key === "Enter") {
          ev.preventDefault();
          this.save();
        }
      });
    }
  }

  async call(method, path, body) {
    const res = await fetch(`/v1/pronunciations${path}`, {
      method,
      headers: { ...(body ? { "Content-Type": "application/json" } : {}), ...this.headers() },
      body: body ? JSON.stringify(body) : undefined,
      cache: "no-store",
    });
    if (!res.ok) throw await apiError(res);
    return res.status === 204 ? null : res.json();
  }

  async refresh() {
    try {
      this.entries = (await this.call("GET", "")).pronunciations;
      this.render();
      await this.fillVoices();
    } catch (err) {
      this.showError(null, `Could not load the pronunciations: ${err.message}`);
    }
  }

  async fillVoices() {
    const select = $("lexicon-voice");
    const current = select.value;
    const voices = await this.voices().catch(() => []);
    select.replaceChildren(new Option("Every voice", ""), ...voices.map((v) => new Option(v.name || v.id, v.id)));
    select.value = current;
  }

  render() {
    const name = (id) => (id ? `only ${id}` : "every voice");
    $("lexicon-list").replaceChildren(...this.entries.map((e) => el("li", { className: "lexicon-item", "data-entry-id": e.id },
      el("span", { className: "lexicon-text", text: e.text }),
      el("span", { className: "lexicon-arrow", "aria-hidden": "true", text: " → " }),
      el("code", { className: "lexicon-say", text: e.say }),
      el("span", { className: "voice-meta", text: ` (${name(e.voice)})` }),
      this.button("Edit", `Edit the pronunciation of ${e.text}`, () => this.edit(e)),
      this.button("Delete", `Delete the pronunciation of ${e.text}`, () => this.remove(e)))));
    $("lexicon-empty").hidden = this.entries.length > 0;
    $("lexicon-note").textContent = this.entries.length ? `${this.entries.length}` : "none";
  }

  button(text, label, onClick) {
    const b = el("button", { type: "button", className: "link small", "aria-label": label, text });
    b.addEventListener("click", onClick);
    return b;
  }

  edit(entry) {
    this.editing = entry;
    $("lexicon-text").value = entry.text;
    $("lexicon-say").value = entry.say;
    $("lexicon-voice").value = entry.voice || "";
    $("lexicon-add").textContent = "Save";
    $("lexicon-say").focus();
  }

  async save() {
    this.clearErrors();
    const body = { text: $("lexicon-text").value, say: $("lexicon-say").value, voice: $("lexicon-voice").value || null };
    const old = this.editing;
    try {
      if (old) await this.call("DELETE", `/${encodeURIComponent(old.id)}`);
      try {
        await this.call("POST", "", body);
      } catch (err) {
        if (old) {  // put the entry back as it was (under a new id), and go on editing it
          const back = await this.call("POST", "", { text: old.text, say: old.say, voice: old.voice }).catch(() => null);
          this.editing = back;
          if (back) this.refresh();
        }
        throw err;
      }
      announce(`${body.text.trim()} will be said as ${body.say.trim()}.`);
      this.editing = null;
      $("lexicon-text").value = "";
      $("lexicon-say").value = "";
      $("lexicon-add").textContent = "Add";
      await this.refresh();
      $("lexicon-text").focus();
    } catch (err) {
      this.showError(err.field, err.message);
    }
  }

  async remove(entry) {
    try {
      await this.call("DELETE", `/${encodeURIComponent(entry.id)}`);
      announce(`The pronunciation of ${entry.text} was deleted.`);
      await this.refresh();
    } catch (err) {
      this.showError(null, err.message);
    }
  }

  clearErrors() {
    for (const id of ["lexicon-text", "lexicon-say", "lexicon-voice"]) {
      $(`${id}-error`).hidden = true;
      $(id).removeAttribute("aria-invalid");
    }
    $("lexicon-error").hidden = true;
  }

  // The server names the field at fault (text, say, voice); anything else goes under the form.
  showError(field, message) {
    const id = ["text", "say", "voice"].includes(field) ? `lexicon-${field}` : null;
    const box = $(id ? `${id}-error` : "lexicon-error");
    box.textContent = message;
    box.hidden = false;
    if (id) {
      $(id).setAttribute("aria-invalid", "true");
      $(id).focus();
    }
  }
}

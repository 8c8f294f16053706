// Errors shown next to the control they are about. A server `error` frame names the field
// at fault (`"field": "options.num_step"`); the page maps that name to a control and never
// reads the message to guess it.

import { $ } from "./dom.js";

// Top-level request fields and the controls that set them.
const CONTROLS = {
  text: { error: "text-error", control: "text" },
  "live-text": { error: "live-error", control: "live-text" },
  voice: { error: "voice-error", control: "voice-fieldset" },
  reference: { error: "voice-error", control: "voice-fieldset" },
  instruct: { error: "instruct-error", control: "design-gender" },
  language: { error: "language-error", control: "language" },
  form: { error: "form-error", control: "generate" },
};
const PACING = new Set(["speed", "duration"]);

// Where an error frame belongs: a target name of this module, or null for the card alone.
// `knobNames` is the set of options the page has controls for.
export function errorTarget(error, knobNames) {
  if (error.code === "internal") return null;
  const field = typeof error.field === "string" ? error.field : "";
  if (field.startsWith("options.")) {
    const name = field.slice("options.".length).split(".")[0];
    if (PACING.has(name) || knobNames.has(name)) return name;
    return "form";
  }
  const top = field.split(".")[0];
  if (top in CONTROLS) return top;
  // No field: the codes that always concern one control, then the request as a whole.
  if (error.code === "text_too_long") return "text";
  if (error.code === "voice_not_found") return "voice";
  return "form";
}

export class FieldErrors {
  // knobNames(): the option names that have a control (`knob-NAME`, `knob-NAME-error`)
  constructor(knobNames) {
    this.knobNames = knobNames;
    this.onShow = null; // (target) => void: e.g. open the panel that holds the control
  }

  parts(target) {
    if (PACING.has(target)) return { error: $("knob-pacing-error"), control: $("pacing-value") };
    if (this.knobNames().has(target)) return { error: $(`knob-${target}-error`), control: $(`knob-${target}`) };
    const spec = CONTROLS[target] || CONTROLS.form;
    return { error: $(spec.error), control: $(spec.control) };
  }

  show(target, message, { fromServer = false } = {}) {
    const { error, control } = this.parts(target);
    if (!error) return;
    error.textContent = message;
    error.hidden = false;
    error.dataset.kind = fromServer ? "server" : "";
    if (control && control.tagName !== "BUTTON") control.setAttribute("aria-invalid", "true");
    this.onShow?.(target, error);
  }

  clear(target) {
    const { error, control } = this.parts(target);
    if (!error) return;
    error.hidden = true;
    error.textContent = "";
    error.dataset.kind = "";
    control?.removeAttribute("aria-invalid");
  }

  clearAll() {
    for (const t of [...Object.keys(CONTROLS), "speed", ...this.knobNames()]) this.clear(t);
  }

  // Whether the error now shown for `target` came from the server (kept until the input changes).
  fromServer(target) {
    return this.parts(target).error?.dataset.kind === "server";
  }
}

// The advanced settings: one control per synthesis option. Names, defaults and ranges come
// from the server's options table (the page's boot JSON, `options`); this module adds the
// words a person reads (labels, help: knob-words.json) and decides how each control looks.

import { $, el } from "./dom.js";
// Labels and help, by option name, in the order the panel shows them: words apart from the
// code. An option the server lists that is not there still gets a control, labelled by its name.
import TEXT from "./knob-words.json" with { type: "json" };

// Options with a control of their own rather than a knob of the grid.
const PACING = ["speed", "duration"];
const FAST_START = "first_chunk_seconds";
const OWN_CONTROL = new Set([...PACING, FAST_START]);
// What a text stream does not use: chunking (each segment is one chunk) and the delivery.
const NOT_FOR_STREAMS = ["chunk_seconds", "chunk_threshold", FAST_START, "stream"];
// Texts longer than this are "long": fast start is sent for them (the server chunks only
// text estimated longer than `chunk_threshold`, about 30 s of speech, some 400 characters).
export const FAST_START_MIN_CHARS = 200;
const DEFAULT_FAST_START_S = 2.0;

const num = (v) => (typeof v === "number" && Number.isFinite(v) ? v : null);

// One entry of the boot JSON's options table (`{kind, default, min, max, nullable, range}`,
// `range` in the server's own words) -> what the page needs.
function normalise(name, s) {
  return {
    name,
    kind: ["int", "float", "bool", "seed"].includes(s.kind) ? s.kind : "float",
    def: s.default ?? null,
    min: num(s.min),
    max: num(s.max),
    range: typeof s.range === "string" ? s.range.replace(/(\d)\.\.(\d)/g, "$1–$2") : "",
  };
}

// The options table from the boot JSON, or null when the server sends none.
export function optionTable(boot) {
  const raw = boot.options;
  if (!raw || typeof raw !== "object") return null;
  return Object.entries(raw).map(([name, s]) => normalise(name, s || {}));
}

function rangeText(k) {
  return k.kind === "bool" ? "" : k.range;
}

function stepFor(k) {
  if (k.kind === "int") return 1;
  const scale = Math.abs(k.def ?? 1);
  return scale >= 10 ? 1 : scale >= 1 ? 0.1 : 0.01;
}

export class Knobs {
  // container: the element the controls go into; table: optionTable(boot) (may be null);
  // pageDefaults: the boot JSON's `page_defaults`; errors: a FieldErrors.
  constructor(container, table, pageDefaults, errors) {
    this.container = container;
    this.errors = errors;
    const known = table || [];
    // The grid in the order of TEXT, then any option the page has no words for.
    const rank = (k) => (k.name in TEXT ? Object.keys(TEXT).indexOf(k.name) : 1000);
    this.byName = new Map(known.map((k) => [k.name, k]));
    this.grid = known.filter((k) => !OWN_CONTROL.has(k.name)).sort((a, b) => rank(a) - rank(b));
    this.fastStart = this.byName.has(FAST_START)
      ? num(pageDefaults?.[FAST_START]) ?? DEFAULT_FAST_START_S
      : null;
    this.onChange = null;
  }

  // The option names that have a control of the grid (for field errors).
  names() {
    const names = new Set(this.grid.map((k) => k.name));
    if (this.fastStart !== null) names.add(FAST_START);
    return names;
  }

  hint(k) {
    const def = k.kind === "bool" ? (k.def ? "on" : "off") : k.def === null ? (k.kind === "seed" ? "random" : "server's") : String(k.def);
    const range = rangeText(k);
    return `Default ${def}${range ? ` · ${range}` : ""}. ${TEXT[k.name]?.help || ""}`.trim();
  }

  build() {
    const toggles = [];
    for (const k of this.grid) {
      const wrap = this.control(k);
      if (k.kind === "bool") toggles.push(wrap); // the on/off knobs go last
      else this.container.append(wrap);
    }
    if (PACING.some((n) => this.byName.has(n))) this.container.append(this.pacingControl());
    this.container.append(this.deliveryControl());
    if (this.fastStart !== null) this.container.append(this.fastStartControl());
    this.container.append(...toggles);
    this.container.addEventListener("input", (ev) => {
      const name = ev.target.name || (ev.target.id === "pacing-value" ? "speed" : null);
      if (name) this.errors.clear(name);
      this.changed();
    });
    this.container.addEventListener("change", () => this.changed());
  }

  control(k) {
    const id = `knob-${k.name}`;
    const describedBy = `${id}-hint ${id}-error`;
    const label = TEXT[k.name]?.label || k.name;
    const hint = el("p", { className: "hint", id: `${id}-hint`, text: this.hint(k) });
    const error = el("p", { className: "field-error", id: `${id}-error`, hidden: true });
    if (k.kind === "bool") {
      return el(
        "div",
        { className: "field compact knob toggle", "data-knob": k.name },
        el("label", { for: id },
          el("input", { type: "checkbox", id, name: k.name, checked: k.def !== false, "aria-describedby": describedBy }),
          el("span", { text: label })),
        hint,
        error,
      );
    }
    const input =
      k.kind === "seed"
        ? el("input", {
            type: "text", id, name: k.name, inputmode: "numeric", autocomplete: "off",
            placeholder: "random", spellcheck: "false", "aria-describedby": describedBy,
          })
        : el("input", {
            type: "number", id, name: k.name, value: k.def, min: k.min, max: k.max,
            step: stepFor(k),
            inputmode: k.kind === "int" ? "numeric" : "decimal", "aria-describedby": describedBy,
          });
    return el("div", { className: "field compact knob", "data-knob": k.name },
      el("label", { for: id, text: label }), input, hint, error);
  }

  pacingControl() {
    const speed = this.byName.get("speed");
    const duration = this.byName.get("duration");
    const parts = [speed && `Speed ${rangeText(speed)} ×`, duration && `a total duration: ${rangeText(duration)}`];
    const node = el(
      "div",
      { className: "field compact knob pacing", "data-knob": "pacing" },
      el("label", { for: "pacing-mode", text: "Pacing" }),
      el("div", { className: "inline" },
        el("select", { id: "pacing-mode", "aria-describedby": "knob-pacing-hint knob-pacing-error" },
          new Option("Natural", ""), new Option("Speed ×", "speed"), new Option("Duration (s)", "duration")),
        el("input", {
          type: "number", id: "pacing-value", "aria-label": "Pacing value", hidden: true,
          "aria-describedby": "knob-pacing-hint knob-pacing-error",
        })),
      el("p", { className: "hint", id: "knob-pacing-hint", text: `Default natural. ${parts.filter(Boolean).join(", or ") || "Speed or duration"}.` }),
      el("p", { className: "field-error", id: "knob-pacing-error", hidden: true }),
    );
    const mode = node.querySelector("#pacing-mode");
    const value = node.querySelector("#pacing-value");
    mode.addEventListener("change", () => {
      const k = this.byName.get(mode.value);
      value.hidden = !mode.value;
      if (mode.value) {
        const spec = k || { min: null, max: null };
        if (spec.min !== null) value.min = spec.min;
        else value.removeAttribute("min");
        if (spec.max !== null) value.max = spec.max;
        else value.removeAttribute("max");
        value.step = mode.value === "speed" ? 0.05 : 0.1;
        value.value = mode.value === "speed" ? 1 : 5;
        value.setAttribute("aria-label", mode.value === "speed" ? "Speed" : "Duration (s)");
      }
      this.errors.clear("speed");
      this.changed();
    });
    return node;
  }

  deliveryControl() {
    return el(
      "div",
      { className: "field compact knob", "data-knob": "stream" },
      el("label", { for: "knob-stream", text: "Delivery" }),
      el("select", { id: "knob-stream", "aria-describedby": "knob-stream-hint" },
        new Option("Stream each chunk", "chunk"), new Option("Whole utterance at once", "whole")),
      el("p", { className: "hint", id: "knob-stream-hint", text: "Default stream. Whole sends one frame at the end, chunks cross-faded." }),
    );
  }

  fastStartControl() {
    const id = `knob-${FAST_START}`;
    const k = this.byName.get(FAST_START);
    return el(
      "div",
      { className: "field compact knob fast-start", "data-knob": FAST_START },
      el("label", { for: id, text: "Fast start (s)" }),
      el("input", {
        type: "number", id, name: FAST_START, value: this.fastStart, min: k.min ?? 0, step: 0.5,
        inputmode: "decimal", "aria-describedby": `${id}-hint ${id}-error`,
      }),
      el("p", {
        className: "hint", id: `${id}-hint`,
        text: `On for texts over ${FAST_START_MIN_CHARS} characters: the first chunk ends at the first sentence past this many seconds, so sound starts sooner. Blank: off.`,
      }),
      el("p", { className: "field-error", id: `${id}-error`, hidden: true }),
    );
  }

  // The options that differ from the server's defaults (nothing else is sent). `chars`: the
  // text's length, which decides whether fast start applies.
  read(chars = 0) {
    const options = {};
    for (const k of this.grid) {
      const input = $(`knob-${k.name}`);
      if (k.kind === "bool") {
        if (input.checked !== (k.def !== false)) options[k.name] = input.checked;
        continue;
      }
      const raw = input.value.trim();
      if (raw === "") continue;
      if (k.kind === "seed") {
        options.seed = raw; // digits are sent verbatim (64-bit); anything else lets the server explain
        continue;
      }
      const value = Number(raw);
      if (value !== k.def) options[k.name] = Number.isFinite(value) ? value : raw;
    }
    const mode = $("pacing-mode")?.value;
    if (mode) {
      const raw = $("pacing-value").value.trim();
      if (raw !== "") options[mode] = Number(raw);
    }
    const fast = $(`knob-${FAST_START}`);
    if (fast && fast.value.trim() !== "" && chars > FAST_START_MIN_CHARS) options[FAST_START] = Number(fast.value);
    if (this.live) for (const name of NOT_FOR_STREAMS) delete options[name];
    return options;
  }

  // Live mode: the settings a text stream does not use (it cuts its own segments, one chunk
  // each, and streams them) are hidden, and not sent.
  setLive(live) {
    this.live = live;
    for (const name of NOT_FOR_STREAMS) {
      const wrap = this.container.querySelector(`[data-knob="${name}"]`);
      if (wrap) wrap.hidden = live;
    }
  }

  // "whole" or "chunk"
  delivery() {
    return $("knob-stream").value;
  }

  changed() {
    const n = Object.keys(this.read()).length + (this.delivery() !== "chunk" ? 1 : 0);
    const fast = $(`knob-${FAST_START}`);
    const fastChanged = fast && fast.value.trim() !== String(this.fastStart);
    const total = n + (fastChanged ? 1 : 0);
    $("advanced-note").textContent = total ? `${total} changed` : "defaults";
    $("advanced-note").classList.toggle("changed", total > 0);
    this.onChange?.();
  }

  reset() {
    for (const k of this.grid) {
      const input = $(`knob-${k.name}`);
      if (k.kind === "bool") input.checked = k.def !== false;
      else input.value = k.def === null ? "" : k.def;
      this.errors.clear(k.name);
    }
    const fast = $(`knob-${FAST_START}`);
    if (fast) fast.value = this.fastStart;
    const mode = $("pacing-mode");
    mode.value = "";
    mode.dispatchEvent(new Event("change"));
    $("knob-stream").value = "chunk";
    this.changed();
  }

  // The connection's `ready` limits: the step count's upper bound.
  applyLimits(limits) {
    const steps = $("knob-num_step");
    const k = this.byName.get("num_step");
    if (!steps || !k || !limits.max_num_step) return;
    k.max = limits.max_num_step;
    k.range = `${k.min}–${k.max}`;
    steps.max = k.max;
    $("knob-num_step-hint").textContent = this.hint(k);
  }
}

// Captions of a result: cues {text, start, end} in samples (a stream's segments, or the words
// of `words` frames) as a WebVTT file and as a list to read along.

import { el } from "./dom.js";

function stamp(samples, rate) {
  const ms = Math.round((samples / rate) * 1000);
  const h = Math.floor(ms / 3600000);
  const m = Math.floor(ms / 60000) % 60;
  const s = Math.floor(ms / 1000) % 60;
  const pad = (n, w = 2) => String(n).padStart(w, "0");
  return `${pad(h)}:${pad(m)}:${pad(s)}.${pad(ms % 1000, 3)}`;
}

export function toVtt(cues, rate) {
  const body = cues.map((c, i) => `${i + 1}\n${stamp(c.start, rate)} --> ${stamp(c.end, rate)}\n${c.text.trim()}\n`);
  return new Blob([`WEBVTT\n\n${body.join("\n")}`], { type: "text/vtt" });
}

export function cueList(cues, rate) {
  return el("ol", { className: "cue-list" },
    ...cues.map((c) => el("li", { "data-start": c.start, "data-end": c.end },
      el("span", { className: "cue-time", text: stamp(c.start, rate).slice(3, 8) }),
      el("span", { className: "cue-text", text: ` ${c.text.trim()}` }))));
}

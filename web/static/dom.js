// Small DOM helpers shared by the page's modules.

export const $ = (id) => document.getElementById(id);

// el("input", {type: "text", text: "…", className: "x"}, ...children): attributes that are
// null, undefined or false are left out; `true` sets an empty attribute.
export function el(tag, attrs = {}, ...children) {
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

// Status changes read out by screen readers (a polite live region).
export function announce(text) {
  const announcer = $("announcer");
  announcer.textContent = "";
  setTimeout(() => {
    announcer.textContent = text;
  }, 30);
}

export function formatSeconds(s) {
  return typeof s === "number" ? `${s.toFixed(1)} s` : "";
}

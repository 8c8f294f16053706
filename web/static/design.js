// Voice design: OmniVoice's English instruct items, one choice per category, joined ", ".

export const DESIGN_CATEGORIES = [
  { key: "gender", label: "Gender", items: ["male", "female"] },
  { key: "age", label: "Age", items: ["child", "teenager", "young adult", "middle-aged", "elderly"] },
  {
    key: "pitch",
    label: "Pitch",
    items: ["very low pitch", "low pitch", "moderate pitch", "high pitch", "very high pitch"],
  },
  {
    key: "accent",
    label: "Accent",
    items: [
      "american accent", "british accent", "australian accent", "canadian accent", "indian accent",
      "chinese accent", "japanese accent", "korean accent", "portuguese accent", "russian accent",
    ],
  },
];

// Order of items in the instruct: who, how old, how high, how (whisper), where from.
const ORDER = ["gender", "age", "pitch", "style", "accent"];

const capitalise = (s) => s.charAt(0).toUpperCase() + s.slice(1);

export function fillDesignSelects(root) {
  for (const cat of DESIGN_CATEGORIES) {
    const select = root.querySelector(`select[data-design="${cat.key}"]`);
    if (!select) continue;
    select.replaceChildren(new Option("Any", ""));
    for (const item of cat.items) {
      const label = cat.key === "accent" ? capitalise(item.replace(/ accent$/, "")) : capitalise(item);
      select.append(new Option(label, item));
    }
  }
}

// The instruct for the current choices, or null when nothing is chosen.
export function composeInstruct(root) {
  const picked = {};
  for (const el of root.querySelectorAll("[data-design]")) {
    if (el.type === "checkbox") {
      if (el.checked) picked[el.dataset.design] = el.value;
    } else if (el.value) {
      picked[el.dataset.design] = el.value;
    }
  }
  const items = ORDER.filter((k) => picked[k]).map((k) => picked[k]);
  return items.length ? items.join(", ") : null;
}

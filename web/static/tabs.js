// The tabs above the left column (Speak, Dialogue, ...): one panel shown at a time, picked by a
// click, the arrow keys (Home and End too) or the address's hash (`#dialogue`), which the page
// keeps up to date so that a reload or a shared link opens the same tab.

export class Tabs {
  // list: the element with role="tablist"; onChange(name): after a tab is shown
  constructor(list, onChange) {
    this.tabs = [...list.querySelectorAll('[role="tab"]')];
    this.onChange = onChange;
    for (const tab of this.tabs) {
      tab.addEventListener("click", () => this.select(this.name(tab), { focus: false }));
      tab.addEventListener("keydown", (ev) => this.onKey(ev, tab));
    }
    window.addEventListener("hashchange", () => this.fromHash());
  }

  name(tab) {
    return tab.id.replace(/^tab-/, "");
  }

  get current() {
    const tab = this.tabs.find((t) => t.getAttribute("aria-selected") === "true");
    return tab ? this.name(tab) : null;
  }

  select(name, { focus = false, updateHash = true } = {}) {
    const chosen = this.tabs.find((t) => this.name(t) === name);
    if (!chosen) return;
    for (const tab of this.tabs) {
      const on = tab === chosen;
      tab.setAttribute("aria-selected", on ? "true" : "false");
      tab.tabIndex = on ? 0 : -1;
      document.getElementById(tab.getAttribute("aria-controls")).hidden = !on;
    }
    if (focus) chosen.focus();
    if (updateHash) {
      const hash = name === this.name(this.tabs[0]) ? "" : `#${name}`;
      if (location.hash !== hash) history.replaceState(null, "", `${location.pathname}${location.search}${hash}`);
    }
    this.onChange?.(name);
  }

  onKey(ev, tab) {
    const i = this.tabs.indexOf(tab);
    const n = this.tabs.length;
    const to = { ArrowRight: (i + 1) % n, ArrowLeft: (i - 1 + n) % n, Home: 0, End: n - 1 }[ev.key];
    if (to === undefined) return;
    ev.preventDefault();
    this.select(this.name(this.tabs[to]), { focus: true });
  }

  // The tab the address names (`#dialogue`), if any.
  fromHash() {
    const name = location.hash.slice(1);
    if (name && this.tabs.some((t) => this.name(t) === name)) this.select(name, { updateHash: false });
  }
}

// The connection as the person sees it (status pill, lost-connection banner with its
// countdown) and the API key (kept in this browser, sent on the WebSocket and over HTTP).

import { $, announce } from "./dom.js";

const KEY_STORE = "chorus.apiKey";

export class ApiKey {
  // boot: the page's boot JSON (`api_key` when the page carries one, `api_key_required`)
  constructor(boot) {
    this.boot = boot;
    this.fallback = boot.api_key || ""; // the page's own key, or one typed where storage fails
  }

  stored() {
    try {
      return localStorage.getItem(KEY_STORE) || "";
    } catch {
      return "";
    }
  }

  get value() {
    return this.stored() || this.fallback;
  }

  headers() {
    return this.value ? { Authorization: `Bearer ${this.value}` } : {};
  }

  streamUrl() {
    const scheme = location.protocol === "https:" ? "wss:" : "ws:";
    const key = this.value;
    return `${scheme}//${location.host}/v1/stream${key ? `?api_key=${encodeURIComponent(key)}` : ""}`;
  }

  // The API key form: saving a key reconnects with it (`reconnect()`).
  wireForm(reconnect) {
    $("apikey-form").addEventListener("submit", (ev) => {
      ev.preventDefault();
      const key = $("api-key").value.trim();
      try {
        if (key) localStorage.setItem(KEY_STORE, key);
        else localStorage.removeItem(KEY_STORE);
      } catch {
        this.fallback = key; // storage unavailable: the key lasts for this page only
      }
      $("api-key").removeAttribute("aria-invalid");
      $("api-key-error").hidden = true;
      $("apikey-panel").open = false;
      announce(key ? "API key saved." : "API key removed.");
      reconnect();
    });
    $("api-key").value = this.stored();
    if (this.boot.api_key_required && !this.value) $("apikey-panel").open = true;
  }
}

export class ConnectionStatus {
  // key: ApiKey; onOpen(ready): the page's own work once connected
  constructor(key, onOpen) {
    this.key = key;
    this.onOpen = onOpen;
    this.everConnected = false;
    this.countdown = null;
  }

  pill(pillState, text) {
    const pill = $("conn-status");
    pill.dataset.state = pillState;
    pill.querySelector(".conn-text").textContent = text;
  }

  // Connection.onState
  show(connState, detail) {
    clearInterval(this.countdown);
    const banner = $("conn-banner");
    if (connState === "open") {
      this.everConnected = true;
      this.pill("open", "Connected");
      if (!banner.hidden) announce("Reconnected to the server.");
      banner.hidden = true;
      $("api-key-error").hidden = true;
      this.onOpen(detail.ready);
    } else if (connState === "connecting") {
      this.pill("connecting", "Connecting…");
    } else if (connState === "reconnecting") {
      this.pill("connecting", "Reconnecting…");
      $("conn-banner-text").textContent = "Connection lost. Reconnecting…";
    } else if (connState === "lost") {
      this.pill("lost", "Offline");
      banner.hidden = false;
      const tick = () => {
        const s = Math.max(0, Math.ceil((detail.at - Date.now()) / 1000));
        $("conn-banner-text").textContent = this.everConnected
          ? `Connection to the server lost. Reconnecting in ${s} s…`
          : `Cannot reach the server. Trying again in ${s} s…`;
      };
      tick();
      this.countdown = setInterval(tick, 500);
    } else if (connState === "unauthorized") {
      this.pill("auth", "API key needed");
      banner.hidden = true;
      const err = $("api-key-error");
      err.textContent = this.key.value ? "The server did not accept this API key." : "This server needs an API key.";
      err.hidden = false;
      $("api-key").setAttribute("aria-invalid", "true");
      $("apikey-panel").open = true;
    }
  }
}

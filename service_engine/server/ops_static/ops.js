// The ops page: polls /ops/api/state and renders it; retry and discard are
// JSON POSTs (the gateway adds the passport to every request).
"use strict";

(function () {
  const base = document.body.dataset.base;
  const POLL_MS = 2000;

  function el(tag, text, attrs) {
    const node = document.createElement(tag);
    if (text !== undefined && text !== null) node.textContent = String(text);
    for (const [k, v] of Object.entries(attrs || {})) node.setAttribute(k, v);
    return node;
  }

  function replaceRows(tbody, rows) {
    tbody.replaceChildren(...rows);
  }

  function renderReadiness(readiness) {
    const status = document.getElementById("readiness-status");
    status.textContent = readiness.status;
    status.className = "status " + readiness.status;
    const list = document.getElementById("readiness-reasons");
    list.replaceChildren(...(readiness.reasons || []).map(
      (r) => el("li", r.reason + ": " + r.detail, { "data-reason": r.reason })));
  }

  async function act(id, action) {
    const result = document.getElementById("action-result");
    result.textContent = action + " " + id + "…";
    const response = await fetch(base + "/api/dead-letters/" + encodeURIComponent(id) + "/" + action, {
      method: "POST", headers: { "Content-Type": "application/json" }, body: "{}",
    });
    const body = await response.json();
    result.textContent = response.ok
      ? action + " " + id + ": " + body.outcome
      : action + " " + id + " refused: " + body.error.code + " (" + body.error.message + ")";
    result.dataset.outcome = response.ok ? body.outcome : body.error.code;
    await refresh();
  }

  function renderDeadLetters(deadLetters) {
    const items = deadLetters.items;
    document.getElementById("dead-letter-count").textContent = "(" + items.length + ")";
    document.getElementById("dead-letter-sources").textContent = Object.entries(deadLetters.waiting)
      .map(([source, n]) => source + ": " + n).join(", ") || "none";
    const rows = items.map((letter) => {
      const row = el("tr", null, { "data-id": letter.id });
      row.append(el("td", letter.source), el("td", letter.work),
        el("td", letter.reason + (letter.detail ? " — " + letter.detail : "")),
        el("td", letter.occurrences), el("td", letter.recorded_at));
      const actions = el("td");
      if (letter.retryable) {
        const retry = el("button", "Retry", { "data-action": "retry" });
        retry.addEventListener("click", () => act(letter.id, "retry"));
        actions.append(retry);
      }
      const discard = el("button", "Discard", { "data-action": "discard" });
      discard.addEventListener("click", () => act(letter.id, "discard"));
      actions.append(discard);
      row.append(actions);
      return row;
    });
    replaceRows(document.querySelector("#dead-letters tbody"), rows);
  }

  function renderOutbox(outbox) {
    document.getElementById("outbox").textContent = "pending " + outbox.pending +
      " (oldest " + outbox.oldest_pending_age_seconds + " s), failed " + outbox.failed;
  }

  function renderSessions(sessions) {
    const rows = Object.entries(sessions).sort().map(([projector, n]) => {
      const row = el("tr", null, { "data-projector": projector });
      row.append(el("td", projector), el("td", n));
      return row;
    });
    replaceRows(document.querySelector("#sessions tbody"), rows);
  }

  function renderRates(rates) {
    const svg = document.getElementById("rates");
    const ns = "http://www.w3.org/2000/svg";
    const width = 600, height = 160, pad = 4;
    const now = Date.now() / 1000;
    const series = rates.series;
    const peak = Math.max(1, ...Object.values(series).flat().map((p) => p[1]));
    const lines = Object.entries(series).map(([name, points]) => {
      const line = document.createElementNS(ns, "polyline");
      line.setAttribute("class", name);
      line.setAttribute("points", points.map(([t, r]) => {
        const x = width - ((now - t) / rates.window_seconds) * width;
        const y = height - pad - (r / peak) * (height - 2 * pad);
        return x.toFixed(1) + "," + y.toFixed(1);
      }).join(" "));
      return line;
    });
    svg.replaceChildren(...lines);
    const last = (name) => {
      const points = series[name] || [];
      return points.length ? points[points.length - 1][1] : 0;
    };
    document.getElementById("rates-now").textContent =
      "now: " + last("impacts") + " impacts/s, " + last("deltas") + " deltas/s (peak " + peak + ")";
  }

  async function refresh() {
    const response = await fetch(base + "/api/state", { headers: { "Accept": "application/json" } });
    const body = await response.json();
    if (!response.ok) {
      document.getElementById("updated").textContent = "refused: " + body.error.code;
      return;
    }
    document.getElementById("who").textContent = "— " + (body.service || "") + " / " + body.pod +
      " (as " + body.operator + ")";
    renderReadiness(body.readiness);
    renderDeadLetters(body.dead_letters);
    renderOutbox(body.outbox);
    renderSessions(body.sessions);
    renderRates(body.rates);
    document.getElementById("updated").textContent = "updated " + new Date().toLocaleTimeString();
    document.body.dataset.loaded = "true";
  }

  async function loop() {
    try {
      await refresh();
    } catch (error) {
      document.getElementById("updated").textContent = "cannot reach the pod: " + error;
    }
    setTimeout(loop, POLL_MS);
  }

  loop();
})();

"""The live part of a run's page: its ranks, the Stop button, and the small script that keeps
them current.

A run that has not ended polls `…/live.json` (`LiveUpdate`) every `REFRESH_S` seconds and
rewrites only the figures (`data-live="…"`), the state badge and the ranks' table — no reload,
so a person reading the page keeps their scroll and selection — and stops polling once the run
has ended. The Stop button asks in an in-page `<dialog>` (Airflow's iframe sandbox has no
`allow-modals`: `confirm()` would answer "no" silently), then POSTs `…/stop` from this origin
(`guard.py` refuses any other). Plain DOM calls and `textContent`: no framework, nothing
fetched from elsewhere; without script the page is still whole, only not live.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from html import escape

from trainyard.plugins.control_room import fmt
from trainyard.plugins.control_room.model import RankLive

REFRESH_S = 3
"""How often the page of a run that has not ended asks for its progress."""

CSS = """
#ranks pre { margin: 0; font-size: 11px; max-width: 900px; white-space: pre-wrap; color: #333; }
#stop-button { background: #c43b3b; color: #fff; border: 0; border-radius: 4px; padding: 4px 12px; cursor: pointer; }
#stop-button:disabled { background: #aaa; cursor: default; }
dialog { border: 1px solid #999; border-radius: 6px; } dialog menu { display: flex; gap: 8px; padding: 0; }
"""


def waiting_line(waiting: str) -> str:
    """Why the live attempt's gang has not started (on Kueue its queue's reason), kept live."""
    return f'<p id="waiting" class="warn" data-live="waiting">{escape("waiting: " + waiting if waiting else "")}</p>'


def ranks_table(ranks: Sequence[RankLive]) -> str:
    """Each rank of the live attempt: node, state, step, heartbeat age, last log lines."""
    if not ranks:
        return "<p class='muted'>No attempt is running.</p>"
    rows = "".join(
        f"<tr data-rank='{r.rank}'><td class='n'>{r.rank}</td><td>{escape(r.node or fmt.DASH)}</td>"
        f"<td>{escape(r.state)}</td><td class='n'>{fmt.DASH if r.step is None else r.step}</td>"
        f"<td class='n'>{fmt.seconds(r.heartbeat_age_s)}</td><td><pre>{escape(chr(10).join(r.log_tail))}</pre></td></tr>"
        for r in ranks)
    return ("<table><thead><tr><th class='n'>rank</th><th>node</th><th>state</th><th class='n'>step</th>"
            f"<th class='n'>heartbeat</th><th>last log lines</th></tr></thead><tbody>{rows}</tbody></table>")


def stop_control(run: str) -> str:
    """The Stop button and its confirmation dialog."""
    return (f'<p><button id="stop-button" type="button">Stop this run</button> <span id="stop-result" '
            f'class="muted" role="status"></span></p>'
            f'<dialog id="stop-dialog"><form method="dialog"><p>Stop run <b>{escape(run)}</b>? Its ranks get '
            "SIGTERM and write an emergency checkpoint; the run ends <b>cancelled</b> and is not restarted.</p>"
            '<menu><button value="stop" id="stop-confirm">Stop the run</button>'
            '<button value="cancel" id="stop-cancel" autofocus>Keep it running</button></menu></form></dialog>')


def script(live_url: str, stop_url: str) -> str:
    """The polling and Stop script of a run that has not ended."""
    config = json.dumps({"live": live_url, "stop": stop_url, "every": REFRESH_S * 1000}).replace("</", "<\\/")
    return f"<script>const TRAINYARD = {config};{_JS}</script>"


_JS = r"""
(() => {
  const $ = (sel) => document.querySelector(sel);
  const put = (key, text) => { const el = $(`[data-live="${key}"]`); if (el) el.textContent = text; };
  const num = (x, digits) => (x === null || x === undefined) ? "—" : Number(x.toPrecision(digits)).toString();
  const age = (s) => (s === null || s === undefined) ? "—" : s < 10 ? s.toFixed(1) + " s" :  // as fmt.seconds
    s < 60 ? Math.round(s) + " s" : s < 3600 ? Math.floor(s / 60) + " min " + Math.floor(s % 60) + " s" :
    Math.floor(s / 3600) + " h " + Math.floor(s % 3600 / 60) + " min";
  let timer = null;

  function ranks(list) {
    const section = $("#ranks-body");
    if (!section) return;
    if (!list.length) { section.innerHTML = "<p class='muted'>No attempt is running.</p>"; return; }
    const table = document.createElement("table");
    table.innerHTML = "<thead><tr><th class='n'>rank</th><th>node</th><th>state</th><th class='n'>step</th>" +
      "<th class='n'>heartbeat</th><th>last log lines</th></tr></thead>";
    const body = table.createTBody();
    for (const r of list) {
      const row = body.insertRow();
      row.dataset.rank = r.rank;
      const cells = [r.rank, r.node || "—", r.state, r.step === null ? "—" : r.step, age(r.heartbeat_age_s)];
      cells.forEach((v, i) => { const c = row.insertCell(); c.textContent = String(v); if (i === 0 || i >= 3) c.className = "n"; });
      const pre = document.createElement("pre");
      pre.textContent = r.log_tail.join("\n");
      row.insertCell().appendChild(pre);
    }
    section.replaceChildren(table);
  }

  function apply(u) {
    const l = u.live;
    put("step", l.step === null ? "—" : l.step + (l.max_steps ? " / " + l.max_steps : ""));
    put("loss", num(l.loss, 4));
    put("tokens_per_s", num(l.tokens_per_s, 5));
    const ago = (t) => t ? age(Math.max(0, (Date.now() - Date.parse(t)) / 1000)) + " ago" : "—";
    const where = {heartbeats: "heartbeats of the live attempt", mlflow: "MLflow's latest metrics"}[l.source];
    put("source", where ? "from " + where + ", " + ago(l.updated_at) : "No progress recorded yet.");
    put("since", u.state + " since " + ago(u.updated_at));
    put("polled", "· live, polled " + new Date().toLocaleTimeString());
    const badge = $("h1 .state");
    if (badge) { badge.textContent = u.state; badge.className = "state s-" + u.state; }
    ranks(u.ranks);
    put("waiting", u.waiting ? "waiting: " + u.waiting : "");
    if (u.final) {
      put("polled", "· the run has ended (" + u.state + (u.final_reason ? ": " + u.final_reason : "") +
          "); reload for its checkpoints and timeline");
      const button = $("#stop-button");
      if (button) button.disabled = true;
    }
  }

  async function tick() {
    timer = null;
    try {
      const answer = await fetch(TRAINYARD.live, {credentials: "same-origin", headers: {Accept: "application/json"}});
      if (!answer.ok) throw new Error("HTTP " + answer.status);
      const u = await answer.json();
      apply(u);
      if (u.final) return;
    } catch (e) {
      put("polled", "not updated: " + e.message + " (retrying)");
    }
    timer = setTimeout(tick, TRAINYARD.every);
  }

  const button = $("#stop-button"), dialog = $("#stop-dialog");
  if (button && dialog) {
    button.addEventListener("click", () => dialog.showModal());
    dialog.addEventListener("close", async () => {
      if (dialog.returnValue !== "stop") return;
      button.disabled = true;
      $("#stop-result").textContent = "stopping (emergency checkpoint first)…";
      try {
        const answer = await fetch(TRAINYARD.stop, {method: "POST", credentials: "same-origin",
                                                     headers: {Accept: "application/json"}});
        const body = await answer.json();
        $("#stop-result").textContent = answer.ok ? body.message : "not stopped: " + body.detail;
        if (!answer.ok) button.disabled = false;
      } catch (e) {
        $("#stop-result").textContent = "not stopped: " + e.message;
        button.disabled = false;
      }
      if (timer !== null) clearTimeout(timer);
      tick();
    });
  }
  timer = setTimeout(tick, TRAINYARD.every);
})();
"""

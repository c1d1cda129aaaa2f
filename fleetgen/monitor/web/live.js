/* fleetgen's live page: fetches status.json from the page's own origin every interval and
   redraws; figures come from `fleetgen status --json` (the same gather). */
"use strict";

window.fleetgenLive = function (root, d) {
  const F = window.fleetgen, el = F.el;
  const head = el("header", {}, el("h1", {}, "fleetgen: run ", el("code", {}, d.run), " (live)"));
  const state = el("p", {id: "state"}, "waiting for the first figures…");
  const banner = el("p", {class: "warn", id: "stopped"});
  const progress = el("progress", {id: "progress", max: "1", value: "0", style: "width: 100%"});
  head.append(state, banner, progress);
  root.append(head);
  const s = F.section(root, "Progress");
  const figs = el("div", {id: "figures-box"});
  s.append(figs);
  const rates = F.section(root, "Rates over the last minutes",
    "measured between two samples, every " + d.interval_s + " s");
  const queue = F.section(root, "Queue depth and in flight");
  const workers = F.section(root, "Workers (GPUs)", "rows/s and output tokens/s over the last " +
    "interval; in flight / slots and health from each worker's heartbeat");
  const wtable = el("div", {id: "workers-box"});
  let charts = {};
  let names = null;

  function figures(st) {
    figs.replaceChildren();
    const f = ["total", "read", "queued", "in_flight", "done", "failed", "rejected",
               "truncated", "retries", "written", "prompt_tokens", "completion_tokens"];
    F.table(figs, ["total", "read", "queue depth", "in flight", "done", "failed", "rejected",
                   "truncated", "retries", "written", "prompt tokens", "completion tokens"],
            [f.map(n => F.figureCell(n, st[n]))], {id: "figures"});
    const sh = ["truncated", "empty", "unfinished", "failed"];
    F.table(figs, ["truncated", "empty", "unfinished reasoning", "failed"].map(x => x + " (of answers)"),
            [sh.map(n => el("td", {"data-share": n, class: "n"}, F.pct(st.shares[n])))],
            {id: "shares"});
    const eta = st.eta_s == null ? "–" : duration(st.eta_s);
    const rps = st.recent_rows_per_s ?? st.rows_per_s, tps = st.recent_tokens_per_s ?? st.tokens_per_s;
    figs.append(el("p", {id: "rates"}, "elapsed " + duration(st.elapsed_s) + " · ETA " + eta +
      " · " + F.num(rps) + " rows/s · " + F.num(tps) + " output tokens/s"));
  }

  function workerTable(st) {
    wtable.replaceChildren();
    F.table(wtable, ["worker", "done", "failed", "in flight", "rows/s", "tokens/s", "health"],
      st.workers.map(w => [w.name, el("td", {class: "n"}, F.num(w.done)),
        el("td", {class: "n"}, F.num(w.failed)),
        el("td", {class: "n"}, w.in_flight == null ? "–" : w.in_flight + "/" + (w.concurrency ?? "?")),
        el("td", {class: "n"}, F.num(w.recent_rows_per_s ?? w.rows_per_s)),
        el("td", {class: "n"}, F.num(w.recent_tokens_per_s ?? w.tokens_per_s)),
        el("td", {class: w.lost ? "warn" : ""}, w.health)]), {id: "workers"});
  }

  function draw(snap) {
    const st = snap.status;
    // Green only while the figures are fresh and the run moves: a stale sample (Redis gone)
    // or a run no worker serves says so in place of the state.
    if (snap.error) { state.textContent = snap.error; state.className = "warn"; }
    if (!st) return;
    if (!snap.error) {
      state.textContent = "state " + st.state + " · updated " +
        new Date(st.at * 1000).toLocaleTimeString() + (snap.idle ? " · NOT MOVING: " + snap.idle : "") +
        (snap.ended ? " · the run has ended: these are its final figures" : "");
      state.className = snap.idle ? "warn" : "ok";
    }
    banner.textContent = [st.stop_reason ? "STOPPED EARLY: " + st.stop_reason : "",
                          st.lost_held ? "WAITING " + st.lost_line : ""].filter(x => x).join(" · ");
    const total = st.total || st.read || 0;
    progress.max = Math.max(total, 1);
    progress.value = st.done + st.failed + st.rejected;
    figures(st);
    const h = snap.history;
    const x = h.map(p => p.at);
    const series = {
      rates: [h.map(p => p.rows_per_s), h.map(p => p.tokens_per_s)],
      queue: [h.map(p => p.queued), h.map(p => p.in_flight)],
    };
    if (!charts.rates) {
      charts.rates = F.overTime(F.chartBox(rates, "chart-rates", "Rows/s and output tokens/s"),
                                x, series.rates, ["rows/s", "output tokens/s"]);
      charts.queue = F.overTime(F.chartBox(queue, "chart-queue", "Queue depth and in flight"),
                                x, series.queue, ["queue depth", "in flight"]);
    } else {
      charts.rates.setData([x].concat(series.rates));
      charts.queue.setData([x].concat(series.queue));
    }
    const now = st.workers.map(w => w.name);
    const rows = st.workers.map(w => w.recent_rows_per_s ?? w.rows_per_s);
    const toks = st.workers.map(w => w.recent_tokens_per_s ?? w.tokens_per_s);
    if (names === null || names.join("\n") !== now.join("\n")) {
      for (const k of ["wrows", "wtoks"]) if (charts[k]) { charts[k].root.parentNode.remove(); charts[k].destroy(); }
      workers.querySelectorAll(".chart").forEach(c => c.remove());
      charts.wrows = F.categories(F.chartBox(workers, "chart-worker-rows", "Rows/s per worker"),
                                  now, rows, "rows/s");
      charts.wtoks = F.categories(F.chartBox(workers, "chart-worker-tokens", "Output tokens/s per worker"),
                                  now, toks, "tokens/s");
      workers.append(wtable);
      names = now;
    } else {
      charts.wrows.setData([now.map((_, i) => i), rows]);
      charts.wtoks.setData([now.map((_, i) => i), toks]);
    }
    workerTable(st);
    document.body.dataset.updates = String(Number(document.body.dataset.updates || 0) + 1);
  }

  function duration(sec) {
    sec = Math.floor(sec);
    const h = Math.floor(sec / 3600), m = Math.floor(sec % 3600 / 60), s2 = sec % 60;
    const pad = v => String(v).padStart(2, "0");
    return h ? h + "h" + pad(m) + "m" + pad(s2) + "s" : m + "m" + pad(s2) + "s";
  }

  // From the origin, not the page's own URL: a page opened as http://user:pw@host/ has
  // credentials in its URL, and fetch() refuses any URL resolved against it; the browser
  // keeps the login for the origin and sends it with this request.
  const source = location.origin + location.pathname.replace(/[^/]*$/, "") + "status.json";

  async function refresh() {
    try {
      const r = await fetch(source, {cache: "no-store", credentials: "same-origin"});
      if (r.ok) draw(await r.json());
      else { state.textContent = "the server answered " + r.status; state.className = "warn"; }
    } catch (e) {
      state.textContent = "the status server is not answering"; state.className = "warn";
    }
    setTimeout(refresh, d.interval_s * 1000);
  }
  refresh();
};

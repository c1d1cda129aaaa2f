/* fleetgen's report and live page: builds the DOM from the JSON the page carries (or fetches)
   and draws every chart with uPlot (vendored beside this file). Every text from the data is
   set with textContent: ids, reasons and error messages are the user's data. */
"use strict";

const COLORS = ["#2563eb", "#dc2626", "#16a34a", "#9333ea", "#ea580c", "#0891b2"];
const fmt = new Intl.NumberFormat("en-US");

function el(tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (k === "class") node.className = v; else node.setAttribute(k, v);
  }
  for (const c of children) {
    node.append(c instanceof Node ? c : document.createTextNode(c == null ? "" : String(c)));
  }
  return node;
}

function num(v) { return typeof v === "number" ? fmt.format(v) : (v == null ? "–" : String(v)); }
function pct(v) { return (100 * v).toFixed(1) + " %"; }

function section(root, title, note) {
  const s = el("section", {}, el("h2", {}, title));
  if (note) s.append(el("p", {class: "note"}, note));
  root.append(s);
  return s;
}

function chartBox(parent, id, title) {
  const box = el("div", {class: "chart", id: id, "data-title": title});
  parent.append(box);
  return box;
}

function width(box) { return Math.max(320, Math.min(box.parentNode.clientWidth - 8, 1100)); }

/* Vertical markers (the budget cap, the context), drawn over the plot; one beyond the axis
   (the axis fits the data, not a budget far above every answer) is named at the right edge
   with an arrow. The chart's box records what is drawn: data-xmax, data-off-axis. */
function markers(list) {
  return {hooks: {draw: [u => {
    const ctx = u.ctx;
    const off = [];
    for (const [i, m] of list.entries()) {
      if (m.value == null) continue;
      const x = u.valToPos(m.value, "x", true);
      if (x > u.bbox.left + u.bbox.width) {
        off.push(m.label);
        ctx.save();
        ctx.fillStyle = m.color; ctx.font = 12 * devicePixelRatio + "px sans-serif";
        ctx.textAlign = "right";
        ctx.fillText(m.label + " →", u.bbox.left + u.bbox.width - 4,
                     u.bbox.top + (14 + 14 * i) * devicePixelRatio);
        ctx.restore();
        continue;
      }
      if (x < u.bbox.left) continue;
      ctx.save();
      ctx.strokeStyle = m.color; ctx.setLineDash([6, 4]); ctx.lineWidth = 2;
      ctx.beginPath(); ctx.moveTo(x, u.bbox.top); ctx.lineTo(x, u.bbox.top + u.bbox.height);
      ctx.stroke();
      ctx.fillStyle = m.color; ctx.font = 12 * devicePixelRatio + "px sans-serif";
      ctx.fillText(m.label, x + 4, u.bbox.top + (14 + 14 * i) * devicePixelRatio);
      ctx.restore();
    }
    const box = u.root.parentNode;
    box.dataset.xmax = String(u.scales.x.max);
    box.dataset.offAxis = off.join("\n");
  }]}};
}

/* A histogram: bars from each bin's start, one series per count list. */
function histogram(box, h, labels, xLabel, marks) {
  const bars = uPlot.paths.bars({size: [1, Infinity], align: 1});
  const series = [{label: xLabel}].concat(labels.map((label, i) => ({
    label: label, stroke: COLORS[i], fill: COLORS[i] + (i ? "cc" : "66"), paths: bars,
    points: {show: false}})));
  const last = h.x.length ? h.x[h.x.length - 1] + h.width : 1;
  const opts = {
    width: width(box), height: 260, title: box.dataset.title, series: series,
    scales: {x: {time: false, range: [0, last]}},
    axes: [{label: xLabel}, {label: "rows", size: 70}],
    plugins: [markers(marks)], legend: {live: false},
  };
  return new uPlot(opts, [h.x].concat(h.y), box);
}

/* Bars over named categories (finish reasons, workers): one series. */
function categories(box, names, values, label) {
  const idx = names.map((_, i) => i);
  const series = [{label: "", value: (u, i) => names[i] ?? ""},
                  {label: label, stroke: COLORS[0], fill: COLORS[0] + "99", points: {show: false},
                   paths: uPlot.paths.bars({size: [0.6, 90]})}];
  const axes = [{splits: () => idx, values: (u, s) => s.map(i => names[i] ?? ""),
                 grid: {show: false}, rotate: names.length > 6 ? -30 : 0,
                 size: names.length > 6 ? 90 : 50},
                {label: label, size: 80}];
  const opts = {width: width(box), height: 260, title: box.dataset.title, series: series,
                scales: {x: {time: false, range: [-0.6, Math.max(names.length - 0.4, 0.4)]},
                         y: {range: (u, mn, mx) => [0, mx * 1.1 || 1]}},
                axes: axes, legend: {live: false}};
  return new uPlot(opts, [idx, values], box);
}

/* Rows/s and tokens/s (or any two series) against time, each on its own axis. */
function overTime(box, x, lists, labels) {
  const series = [{}].concat(labels.map((label, i) => ({
    label: label, stroke: COLORS[i], width: 2, scale: "s" + i,
    fill: i ? undefined : COLORS[i] + "22"})));
  const axes = [{}].concat(labels.map((label, i) => ({
    label: label, scale: "s" + i, side: i ? 1 : 3, grid: {show: i === 0}, size: 80})));
  const scales = {x: {time: true}};
  labels.forEach((_, i) => { scales["s" + i] = {range: (u, mn, mx) => [0, mx * 1.1 || 1]}; });
  const opts = {width: width(box), height: 260, title: box.dataset.title, series: series,
                axes: axes, scales: scales};
  return new uPlot(opts, [x].concat(lists), box);
}

function table(parent, heads, rows, attrs) {
  const t = el("table", attrs || {});
  t.append(el("thead", {}, el("tr", {}, ...heads.map(h => el("th", {}, h)))));
  const body = el("tbody");
  for (const r of rows) body.append(el("tr", {}, ...r.map(c => c instanceof Node ? c : el("td", {}, c))));
  t.append(body);
  parent.append(t);
  return t;
}

function figureCell(name, value) { return el("td", {"data-figure": name, class: "n"}, num(value)); }

/* -- the report ---------------------------------------------------------------------------- */
function report(root, d) {
  const head = el("header", {}, el("h1", {}, "fleetgen report: run ", el("code", {}, d.run)));
  const state = d.complete ? "complete" : (d.stopped ? "stopped early: " + d.stopped : "NOT complete");
  head.append(el("p", {class: d.complete ? "ok" : "warn", id: "state"}, state));
  for (const [name, bytes] of Object.entries(d.torn)) {
    head.append(el("p", {class: "warn"}, name + " ends in a torn line (" + bytes +
      " bytes, a drainer writing or killed mid-write): not counted"));
  }
  if (d.mismatch.length) {
    head.append(el("p", {class: "warn", id: "mismatch"}, "summary.json differs from the files on: " +
      d.mismatch.join(", ") + " (the files are the truth; the drainer rewrites summary.json when it ends)"));
  }
  root.append(head);

  const f = d.figures, s = section(root, "Outcomes");
  /* Requests, each in one file: total = done + failed + rejected + held out. */
  table(s, ["total (requests)", "done", "failed", "rejected", "held out", "truncated",
            "prompt tokens", "completion tokens", "empty", "unfinished reasoning",
            "JSON invalid"],
        [["total", "done", "failed", "rejected", "holdout", "truncated", "prompt_tokens",
          "completion_tokens", "empty", "reasoning_unfinished", "json_invalid"].map(
          n => figureCell(n, f[n]))],
        {id: "figures"});
  if (d.holdout_rows) s.append(el("p", {class: "note", id: "holdout-rows"},
    num(f.holdout) + " requests held out: " + num(d.holdout_rows) +
    " rows in holdout.jsonl (a row of --n samples or of several turns is several requests)"));
  table(s, ["truncated (finish length)", "unfinished reasoning", "empty", "JSON invalid",
            "failed (of answers)"],
        [["truncated", "reasoning_unfinished", "empty", "json_invalid", "failed"].map(
          n => el("td", {"data-share": n, class: "n"}, pct(d.shares[n])))], {id: "shares"});
  const t = d.timing;
  if (t.wall_s != null) {
    s.append(el("p", {}, "wall time " + num(t.wall_s) + " s · " + num(t.rows_per_s) +
      " rows/s · " + num(t.completion_tokens_per_s) + " output tokens/s (summary.json)"));
  }

  const a = section(root, "Answers", "completion tokens of every result; bars of answers cut at " +
    "their budget (finish_reason length) drawn over them. The budget of each request is " +
    "min(cap, room its prompt leaves); the median budget sent is marked.");
  const marks = [{value: d.cap, label: "cap " + d.cap, color: "#dc2626"},
                 {value: d.max_tokens_median, label: "median budget " + d.max_tokens_median,
                  color: "#9333ea"}];
  histogram(chartBox(a, "chart-completion", "Answer length"), d.completion,
            ["answers", "truncated"], "completion tokens", d.cap ? marks : marks.slice(1));
  if (d.reasoning) {
    histogram(chartBox(a, "chart-reasoning", "Reasoning length"), d.reasoning,
              ["answers"], "reasoning tokens", d.cap ? marks.slice(0, 1) : []);
    histogram(chartBox(a, "chart-reasoning-share", "Share of each answer that is reasoning"),
              d.reasoning_share, ["answers"], "% of output tokens", []);
  }
  categories(chartBox(a, "chart-finish", "Finish reasons"), Object.keys(d.finish),
             Object.values(d.finish), "results");

  const sa = section(root, "Sample answers", "the first results of results.jsonl and the first " +
    "one cut at its budget, each clipped to " + "1,500 characters");
  const text = v => el("td", {style: "white-space: pre-wrap; vertical-align: top"}, v || "");
  if ((d.samples || []).length) {
    table(sa, ["id", "prompt", "answer", "finish", "tokens"], d.samples.map(x => [
      x.id, text(x.prompt),
      text((x.reasoning ? "[reasoning] " + x.reasoning + "\n[answer] " : "") + x.completion),
      x.finish_reason, el("td", {class: "n"}, num(x.completion_tokens))]), {id: "samples"});
  } else {
    sa.append(el("p", {class: "note", id: "samples"}, "no results yet"));
  }

  const p = section(root, "Prompts", "prompt tokens of every request sent (results and failures), " +
    "and of the rejected rows whose length is known (too long for the context)" +
    (d.prompt_rejected_without_length ? "; " + num(d.prompt_rejected_without_length) +
     " rejected rows have no length (bad input)" : ""));
  histogram(chartBox(p, "chart-prompt", "Prompt length"), d.prompt, ["sent", "rejected"],
            "prompt tokens", [{value: d.context, label: "context " + d.context, color: "#dc2626"}]);

  const w = section(root, "Workers (GPUs)");
  const names = d.workers.map(x => x.name);
  categories(chartBox(w, "chart-worker-rows", "Results per worker"), names,
             d.workers.map(x => x.done), "results");
  categories(chartBox(w, "chart-worker-tokens", "Output tokens per worker"), names,
             d.workers.map(x => x.completion_tokens), "output tokens");
  table(w, ["worker", "results", "failures", "prompt tokens", "output tokens"],
        d.workers.map(x => [x.name, el("td", {class: "n"}, num(x.done)),
                            el("td", {class: "n"}, num(x.failed)),
                            el("td", {class: "n"}, num(x.prompt_tokens)),
                            el("td", {class: "n"}, num(x.completion_tokens))]), {id: "workers"});

  if (d.spec) acceptance(root, d.spec);

  const th = section(root, "Throughput over the run");
  if (d.throughput) {
    th.append(el("p", {class: "note"}, "outcomes written per second and output tokens per second, " +
      "from each record's finished_at, in buckets of " + d.throughput.width_s + " s"));
    overTime(chartBox(th, "chart-throughput", "Throughput"), d.throughput.x,
             [d.throughput.rows_per_s, d.throughput.tokens_per_s], ["rows/s", "output tokens/s"]);
  } else {
    th.append(el("p", {class: "note", id: "no-throughput"}, "the records carry no finished_at " +
      "(written by a fleetgen older than the report): no throughput over time"));
  }

  const fl = section(root, "Failures by kind");
  outcomeTable(fl, d.failures.map(x => [x.type, x.count, Object.entries(x.status).map(
    ([k, v]) => (k || "no HTTP answer") + ": " + v).join(", "), x.examples.map(
    e => e.id + " (line " + e.line + ", " + e.attempts + " attempts): " + e.message)]),
    ["kind", "rows", "HTTP status", "examples"], "failures");
  const rj = section(root, "Rejections by reason");
  outcomeTable(rj, d.rejections.map(x => [x.reason, x.count, "", x.examples.map(
    e => e.id + " (line " + e.line + "): " + e.reason)]), ["reason", "rows", "", "examples"],
    "rejections");

  const st = section(root, "Settings");
  const rows = Object.entries(d.settings).map(([k, v]) => [k, typeof v === "object" ? JSON.stringify(v) : String(v)]);
  for (const k of ["started_at", "finished_at"]) {
    if (t[k]) rows.push([k, new Date(t[k] * 1000).toISOString()]);
  }
  table(st, ["setting", "value"], rows, {id: "settings"});
}

/* Speculative acceptance: pooled and mean, each breakdown lowest first, the lowest groups
   and rows (weak.jsonl holds the rows again as input). */
function acceptance(root, sp) {
  const s = section(root, "Speculative acceptance", sp.note);
  const fig = v => el("td", {class: "n"}, v == null ? "–" : v.toFixed(3));
  const heads = ["requests", "accept length (pooled)", "per-request mean", "accept rate"];
  const cells = g => [el("td", {class: "n"}, num(g.requests)), fig(g.accept_length),
                      fig(g.accept_length_mean), fig(g.accept_rate)];
  if (sp.requests) table(s, heads, [cells(sp)], {id: "spec"});
  if (sp.vllm) {
    s.append(el("h3", {}, "vLLM servers (their /metrics counters, as the workers read them)"));
    const v = (name, f) => [name, el("td", {class: "n"}, num(f.drafts)),
                            el("td", {class: "n"}, num(f.accepted)), fig(f.accept_length),
                            fig(f.accept_rate)];
    table(s, ["worker", "drafts", "accepted tokens", "accept length (1 + accepted / drafts)",
              "accept rate"],
          [v("all", sp.vllm), ...Object.entries(sp.vllm.by_worker).map(([w, f]) => v(w, f))],
          {id: "spec-vllm"});
  }
  /* With several servers each group is a cell of a server x group table: one drafter's
     groups are compared with each other, never pooled with another's. */
  if (sp.compared) s.append(el("p", {class: "note", id: "spec-compared"},
                               "the breakdowns compare " + sp.compared));
  const who = g => g.server == null ? [] : [g.server];
  for (const [by, groups] of Object.entries(sp.breakdowns)) {
    if (groups.length < 2 && !by.startsWith("field:")) continue;
    const lead = groups.length && groups[0].server != null ? ["server"] : [];
    s.append(el("h3", {}, "by " + by.replace("field:", "row field ")));
    table(s, [...lead, "group", ...heads], groups.map(g => [...who(g), g.group, ...cells(g)]),
          {id: "spec-" + by.replace(":", "-")});
  }
  if (sp.lowest_groups.length) {
    const lead = sp.lowest_groups[0].server != null ? ["server"] : [];
    s.append(el("h3", {}, "lowest groups (of at least 5 answers)"));
    table(s, [...lead, "by", "group", ...heads],
          sp.lowest_groups.map(g => [...who(g), g.by, g.group, ...cells(g)]),
          {id: "spec-lowest-groups"});
  }
  if (!sp.lowest_rows.length) return;
  s.append(el("h3", {}, "lowest answers, each within its server (weak.jsonl beside this " +
                        "page holds their rows, one per id)"));
  table(s, ["id", "line", "worker", "turn", "completion tokens", "verify steps", "accept length"],
        sp.lowest_rows.map(r => [r.id, el("td", {class: "n"}, num(r.line)), r.worker,
                                 r.turn == null ? "" : String(r.turn),
                                 el("td", {class: "n"}, num(r.completion_tokens)),
                                 el("td", {class: "n"}, num(r.verify_ct)), fig(r.accept_length)]),
        {id: "spec-lowest-rows"});
}

function outcomeTable(parent, rows, heads, id) {
  if (!rows.length) { parent.append(el("p", {class: "note", id: id}, "none")); return; }
  const cols = heads[2] ? heads : [heads[0], heads[1], heads[3]];
  table(parent, cols, rows.map(r => {
    const ex = el("td", {}, el("ul", {}, ...r[3].map(e => el("li", {}, e))));
    const cells = [r[0], el("td", {class: "n", "data-count": r[0]}, num(r[1]))];
    if (heads[2]) cells.push(r[2]);
    cells.push(ex);
    return cells;
  }), {id: id});
}

window.fleetgen = {el, num, pct, section, chartBox, histogram, categories, overTime, table,
                   figureCell, report};

document.addEventListener("DOMContentLoaded", () => {
  const data = document.getElementById("page-data");
  const root = document.getElementById("root");
  if (data && root) {
    const d = JSON.parse(data.textContent);
    if (d.kind === "report") report(root, d);
    else if (window.fleetgenLive) window.fleetgenLive(root, d);
  }
  document.body.dataset.ready = "1";
});

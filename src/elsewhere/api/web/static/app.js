// elsewhere web view: the page. Three views by the address's #fragment:
//   #/            the jobs table (sortable, filterable)
//   #/job/ID      one job: progress by state, Gantt, plots, task table, task panel, cluster
//   #/peers       the peer network and fair share
// Live: one EventSource (api/events) per view pushes what changed; the Gantt and the task table
// are fetched again when their job moved, at most as often as they take to draw. Actions send
// the access token from the page's URL (?token=...) in a header; without it the server refuses.
"use strict";

const TOKEN = (() => {
  const t = new URLSearchParams(location.search).get("token");
  if (t) sessionStorage.setItem("elsewhere-token", t);
  return t || sessionStorage.getItem("elsewhere-token") || "";
})();
const STATES = ["pending", "queued", "running", "finished", "failed", "cancelled"];
const S = { info: { read_only: false, token_ok: false, now: Date.now() / 1000 }, offset: 0, view: null, es: null };

// ---- helpers ---------------------------------------------------------------------------
function el(tag, attrs, ...children) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v == null || v === false) continue;
    if (k === "class") e.className = v;
    else if (k === "text") e.textContent = v;
    else if (k.startsWith("on")) e.addEventListener(k.slice(2), v);
    else if (k.startsWith("data-")) e.setAttribute(k, v);
    else if (k in e && typeof e[k] !== "object") e[k] = v;
    else e.setAttribute(k, v);
  }
  for (const c of children.flat()) if (c != null && c !== false) e.append(c instanceof Node ? c : String(c));
  return e;
}
const $ = (sel, root) => (root || document).querySelector(sel);
const serverNow = () => Date.now() / 1000 + S.offset;
const fmtDur = (s) => (s == null ? "" : Charts.fmtDuration(s));

function fmtClock(t) {
  if (!t) return "";
  const d = new Date(t * 1000), now = new Date();
  const p = (x) => String(x).padStart(2, "0");
  const hms = `${p(d.getHours())}:${p(d.getMinutes())}:${p(d.getSeconds())}`;
  if (d.toDateString() === now.toDateString()) return hms;
  return `${d.getFullYear()}-${p(d.getMonth() + 1)}-${p(d.getDate())} ${hms.slice(0, 5)}`;
}

function fmtSize(b) {
  if (b == null) return "";
  const u = ["B", "KB", "MB", "GB", "TB"];
  let i = 0;
  while (b >= 1024 && i < u.length - 1) { b /= 1024; i++; }
  return `${+b.toPrecision(3)} ${u[i]}`;
}

async function api(path, opts) {
  const headers = {};
  if (TOKEN) headers["X-Elsewhere-Token"] = TOKEN;
  let r;
  try {
    r = await fetch(path, { ...(opts || {}), headers });
  } catch (err) {
    return { ok: false, status: 0, data: null, text: `the server does not answer (${err})` };
  }
  const text = await r.text();
  let data = null;
  try { data = JSON.parse(text); } catch (_) { /* a refusal is plain text */ }
  return { ok: r.ok, status: r.status, data, text };
}

function notice(text, kind) {
  const n = $("#notice");
  n.textContent = text;
  n.dataset.kind = kind || "info";
  n.hidden = false;
  clearTimeout(notice.timer);
  notice.timer = setTimeout(() => { n.hidden = true; }, kind === "error" ? 15000 : 6000);
}

function setConn(text, live) {
  const c = $("#conn");
  c.textContent = text;
  c.dataset.live = live ? "1" : "0";
}

// Runs fn (async) when asked, at most one at a time and no more often than the last run took
// (twice over) or minMs: a large job is fetched less often than a small one.
function throttle(fn, minMs) {
  let busy = false, again = false, last = 0, took = 0, timer = null;
  const run = async () => {
    timer = null;
    busy = true;
    const t = performance.now();
    try { await fn(); } finally {
      took = performance.now() - t;
      last = performance.now();
      busy = false;
      if (again) { again = false; ask(); }
    }
  };
  const ask = () => {
    if (busy) { again = true; return; }
    if (timer) return;
    const wait = Math.max(0, last + Math.max(minMs, 2 * took) - performance.now());
    timer = setTimeout(run, wait);
  };
  return ask;
}

function counts(row) {
  const c = row.counts || {};
  const done = (c.finished || 0) + (c.failed || 0) + (c.cancelled || 0);
  return { c, done, n: row.n_tasks || 0 };
}

// Elapsed and estimated time left, counted on from the row's times with the server's clock.
function timing(row) {
  if (!row.started) return { elapsed: null, eta: null };
  const now = serverNow();
  const elapsed = (row.ended || now) - row.started;
  const { done, n } = counts(row);
  let eta = null;
  const isDone = ["finished", "failed", "cancelled"].includes(row.state);
  if (!isDone && done > 0 && row.last_end && row.last_end > row.started) {
    const rate = done / (row.last_end - row.started);
    eta = Math.max(0, (n - done) / rate - (now - row.last_end));
  }
  return { elapsed, eta };
}

function stateBadge(state) {
  const s = String(state || "");
  return el("span", { class: `badge st-${s.split(":")[0]}`, text: s, title: s });
}

function progressBar(row) {
  const { c, n } = counts(row);
  const bar = el("div", { class: "stack", title: STATES.filter((s) => c[s]).map((s) => `${c[s]} ${s}`).join(", ") });
  for (const s of ["finished", "failed", "cancelled", "running"]) {
    if (!c[s] || !n) continue;
    bar.append(el("span", { class: `seg st-${s}`, "data-state": s }));
    bar.lastChild.style.width = `${(100 * c[s]) / n}%`;
  }
  return bar;
}

// ---- events ------------------------------------------------------------------------------
function connect(params) {
  if (S.es) S.es.close();
  const q = new URLSearchParams(params);
  if (TOKEN) q.set("token", TOKEN);
  const es = new EventSource(`api/events?${q}`);
  const on = (type, f) => es.addEventListener(type, (e) => {
    let data;
    try { data = JSON.parse(e.data); } catch (_) { return; }
    if (S.view && S.view[f]) S.view[f](data);
  });
  on("jobs", "onJobs");
  on("job", "onJob");
  on("gone", "onGone");
  on("peers", "onPeers");
  es.onopen = () => setConn("live", true);
  es.onerror = () => setConn("reconnecting…", false);
  S.es = es;
}

// ---- the jobs table --------------------------------------------------------------------------
const JOB_COLUMNS = [
  ["name", "name"], ["kind", "backend"], ["state", "state"], ["n_tasks", "tasks"], ["progress", "progress"],
  ["started", "started"], ["elapsed", "elapsed"], ["eta", "left"], ["created", "created"],
];

class JobsView {
  constructor(root) {
    this.sort = JSON.parse(sessionStorage.getItem("elsewhere-jobs-sort") || '{"key":"created","desc":true}');
    this.rows = [];
    const head = el("tr", {}, JOB_COLUMNS.map(([k, label]) => el("th", { "data-key": k, onclick: () => this.sortBy(k) }, label)));
    this.filter = el("input", { id: "job-filter", type: "search", placeholder: "filter: name, id, backend, tag, state", oninput: () => this.render() });
    this.stateSel = el("select", { id: "job-state", onchange: () => this.render() },
      el("option", { value: "", text: "every state" }), STATES.map((s) => el("option", { value: s, text: s })));
    this.countEl = el("span", { class: "muted", id: "job-count" });
    this.tbody = el("tbody");
    root.append(el("section", { class: "card" },
      el("div", { class: "toolbar" }, el("h2", { text: "Jobs" }), this.filter, this.stateSel, this.countEl),
      el("div", { class: "scroll" }, el("table", { id: "jobs", class: "grid" }, el("thead", {}, head), this.tbody))));
    this.timer = setInterval(() => this.tick(), 1000);
    api("api/jobs").then((r) => { if (r.ok) this.onJobs(r.data); });
    connect({});
  }

  close() { clearInterval(this.timer); }

  onJobs(data) {
    if (data.error) { notice(data.error, "error"); return; }
    this.rows = data.jobs;
    this.render();
  }

  sortBy(k) {
    this.sort = { key: k, desc: this.sort.key === k ? !this.sort.desc : k !== "name" };
    sessionStorage.setItem("elsewhere-jobs-sort", JSON.stringify(this.sort));
    this.render();
  }

  value(r, k) {
    if (k === "elapsed" || k === "eta") return timing(r)[k] ?? -1;
    if (k === "progress") return r.progress ?? 0;
    return r[k] ?? "";
  }

  render() {
    const f = this.filter.value.trim().toLowerCase(), st = this.stateSel.value;
    let rows = this.rows.filter((r) => (!st || r.state === st) && (!f ||
      [r.name, r.id, r.kind, r.tag, r.state, r.user].some((x) => String(x || "").toLowerCase().includes(f))));
    const { key, desc } = this.sort;
    rows = rows.slice().sort((a, b) => {
      const x = this.value(a, key), y = this.value(b, key);
      return (x < y ? -1 : x > y ? 1 : 0) * (desc ? -1 : 1);
    });
    for (const th of this.tbody.parentNode.querySelectorAll("th")) {
      th.dataset.sorted = th.dataset.key === key ? (desc ? "desc" : "asc") : "";
    }
    this.tbody.replaceChildren(...rows.map((r) => this.row(r)));
    this.countEl.textContent = `${rows.length} of ${this.rows.length} job${this.rows.length === 1 ? "" : "s"}`;
    if (!this.rows.length) {
      this.tbody.append(el("tr", {}, el("td", { colSpan: JOB_COLUMNS.length, class: "muted",
        text: "no jobs yet: submit one with ew.submit(...), or try `elsewhere demo`" })));
    }
  }

  row(r) {
    const { c } = counts(r);
    const t = timing(r);
    const chips = el("span", { class: "chips" }, STATES.filter((s) => c[s]).map((s) =>
      el("span", { class: `chip st-${s}`, "data-state": s, title: s }, String(c[s]))));
    return el("tr", { "data-job-id": r.id, "data-name": r.name, "data-state": r.state, class: "link",
      onclick: () => { location.hash = `#/job/${encodeURIComponent(r.id)}`; } },
    el("td", {}, el("a", { href: `#/job/${encodeURIComponent(r.id)}`, text: r.name }), el("div", { class: "muted small", text: r.id })),
    el("td", { text: r.kind || "" }),
    el("td", {}, stateBadge(r.state)),
    el("td", {}, el("span", { text: String(r.n_tasks ?? "") }), " ", chips),
    el("td", {}, progressBar(r), el("span", { class: "small muted", text: r.n_tasks ? `${Math.floor(100 * (r.progress || 0))}%` : "" })),
    el("td", { text: fmtClock(r.started) }),
    el("td", { "data-elapsed": "", text: fmtDur(t.elapsed) }),
    el("td", { "data-eta": "", text: fmtDur(t.eta) }),
    el("td", { text: fmtClock(r.created) }));
  }

  tick() {
    const byId = new Map(this.rows.map((r) => [r.id, r]));
    for (const tr of this.tbody.querySelectorAll("tr[data-job-id]")) {
      const r = byId.get(tr.dataset.jobId);
      if (!r || !r.started) continue;
      const t = timing(r);
      tr.querySelector("[data-elapsed]").textContent = fmtDur(t.elapsed);
      tr.querySelector("[data-eta]").textContent = fmtDur(t.eta);
    }
  }
}

// ---- one job ----------------------------------------------------------------------------------
class JobView {
  constructor(root, id) {
    this.id = id;
    this.summary = null;
    this.last = {};
    this.page = { offset: 0, limit: 100, sort: "task", desc: false, state: "", host: "" };
    this.build(root);
    this.loadTimeline = throttle(() => this.fetchTimeline(), 500);
    this.loadTasks = throttle(() => this.fetchTasks(), 500);
    this.loadDetail = throttle(() => this.fetchDetail(), 1000);
    this.loadDetail();
    this.loadTimeline();
    this.loadTasks();
    this.timer = setInterval(() => this.tick(), 1000);
    this.onResize = () => { this.gantt.draw(); this.drawPlots(); };
    window.addEventListener("resize", this.onResize);
    connect({ job: id });
  }

  close() {
    clearInterval(this.timer);
    window.removeEventListener("resize", this.onResize);
    $("#task-panel").hidden = true;
  }

  build(root) {
    const act = (label, verb, cls) => el("button", { class: cls || "", id: `act-${verb}`, text: label, onclick: () => this.act(verb) });
    this.actions = el("div", { class: "actions", id: "job-actions" },
      act("Cancel job", "cancel"), act("Retry failed", "retry"), act("Purge…", "purge", "danger"));
    if (S.info.read_only) this.actions.hidden = true;
    this.head = el("section", { class: "card", id: "job" },
      el("div", { class: "title" }, el("h1", { id: "job-name", text: this.id }), el("span", { id: "job-state" }), this.actions),
      el("div", { class: "facts", id: "job-facts" }),
      el("div", { id: "job-progress" }),
      el("div", { class: "legend", id: "counts" }),
      el("div", { class: "note", id: "job-note", hidden: true }));
    const canvas = el("canvas", { id: "gantt" });
    const tip = el("div", { class: "tip", id: "gantt-tip", hidden: true });
    this.gantt = new Gantt(canvas, tip, (t) => this.openTask(t));
    const legend = el("div", { class: "legend small" }, Object.entries(GANTT_NAMES).map(([k, name]) => {
      const dot = el("span", { class: "dot" });
      dot.style.background = GANTT_COLORS[k];
      return el("span", {}, dot, name);
    }));
    this.plotT = el("canvas", { class: "plot", id: "plot-throughput" });
    this.plotD = el("canvas", { class: "plot", id: "plot-durations" });
    const sel = el("select", { id: "task-state", onchange: (e) => { this.page.state = e.target.value; this.page.offset = 0; this.loadTasks(); } },
      el("option", { value: "", text: "every state" }), STATES.map((s) => el("option", { value: s, text: s })));
    const host = el("input", { id: "task-host", type: "search", placeholder: "host contains", onchange: (e) => { this.page.host = e.target.value; this.page.offset = 0; this.loadTasks(); } });
    this.range = el("span", { class: "muted", id: "task-range" });
    const pager = (label, d, id) => el("button", { id, text: label, onclick: () => {
      this.page.offset = Math.max(0, this.page.offset + d * this.page.limit);
      if (this.total != null && this.page.offset >= this.total) this.page.offset -= this.page.limit;
      this.loadTasks();
    } });
    const cols = [["task", "task"], ["state", "state"], ["host", "host"], ["attempt", "attempt"], ["started", "started"], ["seconds", "time"], [null, "reason"]];
    this.taskHead = el("tr", {}, cols.map(([k, label]) => el("th", { "data-key": k || "", onclick: k ? () => this.sortTasks(k) : null }, label)));
    this.taskBody = el("tbody");
    this.detail = el("div", { id: "job-detail" });
    root.append(this.head,
      el("section", { class: "card" }, el("h2", {}, "Tasks over time ", el("small", { class: "muted", text: "one lane per worker · wheel zooms, drag pans, double click shows all, a click opens a task" })),
        el("div", { class: "gantt-wrap" }, canvas, tip), legend),
      el("div", { class: "row2" },
        el("section", { class: "card" }, el("h2", { text: "Throughput" }), this.plotT),
        el("section", { class: "card" }, el("h2", { text: "Task durations" }), this.plotD)),
      el("section", { class: "card" },
        el("div", { class: "toolbar" }, el("h2", { text: "Tasks" }), sel, host, this.range, pager("‹ previous", -1, "task-prev"), pager("next ›", 1, "task-next")),
        el("div", { class: "scroll tall" }, el("table", { class: "grid", id: "tasks" }, el("thead", {}, this.taskHead), this.taskBody))),
      el("section", { class: "card" }, el("h2", { text: "Cluster, resources and job script" }), this.detail));
  }

  async act(verb) {
    if (verb === "purge" && !window.confirm("Purge this job: stop it and delete its folder and results?")) return;
    const r = await api(`api/jobs/${encodeURIComponent(this.id)}/${verb}`, { method: "POST" });
    if (r.ok) notice(r.data.message, "ok");
    else notice((r.data && r.data.error) || r.text.trim() || `refused (${r.status})`, "error");
    if (r.ok && verb === "purge") location.hash = "#/";
  }

  onJob(s) {
    if (s.error) { notice(s.error, "error"); return; }
    const before = this.summary;
    this.summary = s;
    this.renderHead();
    if (!before || before.version !== s.version || before.state !== s.state) { // the server's columns moved
      this.loadTimeline();
      this.loadTasks();
    }
    if (before && before.state !== s.state) this.loadDetail();
  }

  onGone(g) {
    notice(`job ${this.id} is gone: ${g.message}`, "error");
    setTimeout(() => { location.hash = "#/"; }, 1500);
  }

  renderHead() {
    const s = this.summary;
    if (!s) return;
    this.head.dataset.state = s.state;
    $("#job-name").textContent = s.name;
    $("#job-state").replaceChildren(stateBadge(s.state));
    document.title = `${s.name} · elsewhere`;
    const t = timing(s);
    const fact = (k, v) => (v === "" || v == null ? null : el("span", {}, el("span", { class: "muted", text: `${k} ` }), el("b", { "data-fact": k, text: String(v) })));
    $("#job-facts").replaceChildren(...[
      fact("id", s.id), fact("backend", s.kind), fact("tasks", s.n_tasks), fact("created", fmtClock(s.created)),
      fact("started", fmtClock(s.started)), fact("elapsed", fmtDur(t.elapsed)), fact("left", fmtDur(t.eta)),
      fact("user", s.user), fact("tag", s.tag),
    ].filter(Boolean));
    $("#job-progress").replaceChildren(progressBar(s));
    const c = s.counts || {};
    $("#counts").replaceChildren(...STATES.map((st) => el("span", { "data-state": st, class: c[st] ? "" : "zero" },
      el("span", { class: `dot st-${st}` }), `${st} `, el("b", { class: "n", text: String(c[st] || 0) }))));
    const note = $("#job-note");
    note.hidden = !s.note;
    note.textContent = s.note || "";
    const done = ["finished", "failed", "cancelled"].includes(s.state);
    $("#act-cancel").disabled = done;
    $("#act-retry").disabled = !(c.failed || c.cancelled);
  }

  tick() {
    if (this.summary && !this.summary.ended && this.summary.started) this.renderHead();
    if (this.gantt.running && this.gantt.follow) this.gantt.draw();
  }

  async fetchDetail() {
    const r = await api(`api/jobs/${encodeURIComponent(this.id)}`);
    if (!r.ok) {
      if (r.status === 404) this.onGone({ message: (r.data && r.data.error) || "not found" });
      return;
    }
    if (!this.summary) { this.summary = r.data; this.renderHead(); }
    const d = r.data;
    const kv = (obj) => el("table", { class: "kv" }, Object.entries(obj || {}).map(([k, v]) =>
      el("tr", {}, el("th", { text: k }), el("td", {}, typeof v === "object" ? el("code", { text: JSON.stringify(v) }) : String(v)))));
    const parts = [el("h3", { text: "Cluster" }), kv(d.cluster), el("h3", { text: "Resources and settings" }), kv(d.settings)];
    if (d.cluster_data && Object.keys(d.cluster_data).length) parts.push(el("h3", { text: "Cluster data" }), el("pre", { text: JSON.stringify(d.cluster_data, null, 2) }));
    if (d.reasons && d.reasons.length) {
      parts.push(el("h3", { text: "What the backend says of waiting tasks" }),
        el("ul", {}, d.reasons.map((r) => el("li", { text: `${r.reason}: ${r.count} task${r.count > 1 ? "s" : ""} (${r.tasks.slice(0, 10).join(", ")}${r.count > 10 ? ", …" : ""})` }))));
    }
    parts.push(el("h3", { text: "Job script" }));
    if (d.scripts && d.scripts.length) {
      for (const sc of d.scripts) parts.push(el("div", { class: "muted small", text: sc.name }), el("pre", { class: "script", text: sc.text }));
    } else {
      parts.push(el("p", { class: "muted", text: `none: a ${d.kind} job starts its workers without a batch script` }));
    }
    this.detail.replaceChildren(...parts);
  }

  async fetchTimeline() {
    const r = await api(`api/jobs/${encodeURIComponent(this.id)}/timeline`);
    if (!r.ok) return;
    const t = performance.now();
    this.gantt.setData(r.data);
    this.drawPlots();
    const canvas = this.gantt.canvas;
    canvas.dataset.renderMs = (performance.now() - t).toFixed(1);
    canvas.dataset.version = String(this.summary ? this.summary.version : "");
    canvas.dataset.loads = String((+canvas.dataset.loads || 0) + 1);
  }

  drawPlots() {
    const g = this.gantt;
    if (!g.m) {
      Charts.bars(this.plotT, { values: [], emptyText: "no task has ended yet" });
      Charts.bars(this.plotD, { values: [], emptyText: "no task has ended yet" });
      return;
    }
    // throughput: tasks ended per second, in about 60 buckets over the job's time
    let hi = 0;
    const durs = [];
    for (let i = 0; i < g.m; i++) {
      if (g.end[i] < 0) continue;
      if (g.end[i] > hi) hi = g.end[i];
      durs.push((g.end[i] - g.start[i]) / 1000);
    }
    const span = hi / 1000;
    const dx = Charts.niceStep(span, 60) || 1;
    const nb = Math.max(1, Math.ceil(span / dx + 1e-9));
    const tp = new Array(nb).fill(0);
    for (let i = 0; i < g.m; i++) if (g.end[i] >= 0) tp[Math.min(nb - 1, Math.floor(g.end[i] / 1000 / dx))] += 1 / dx;
    Charts.bars(this.plotT, { values: durs.length ? tp : [], x0: 0, dx, xFormat: (v) => (v > 0 ? `+${Charts.fmtDuration(v)}` : "0"),
      yLabel: "tasks ended per second", xLabel: "time since the first start", color: "#3a9d5d", emptyText: "no task has ended yet" });
    // durations: a histogram, on a log scale when they spread over more than 50x
    let lo = Infinity, top = 0;
    for (const d of durs) { if (d > 0 && d < lo) lo = d; if (d > top) top = d; }
    if (!durs.length) return Charts.bars(this.plotD, { values: [], emptyText: "no task has ended yet" });
    const log = lo > 0 && top / lo > 50;
    const a = log ? Math.log10(lo) : 0, b = log ? Math.log10(top) : top || 1e-6;
    const bins = 30, w = (b - a) / bins || 1;
    const h = new Array(bins).fill(0);
    for (const d of durs) {
      const v = log ? Math.log10(Math.max(d, lo)) : d;
      h[Math.min(bins - 1, Math.max(0, Math.floor((v - a) / w)))]++;
    }
    Charts.bars(this.plotD, { values: h, x0: a, dx: w, xFormat: (v) => Charts.fmtDuration(log ? Math.pow(10, v) : v),
      yLabel: "tasks", xLabel: log ? "task time (log scale)" : "task time", color: "#3b7dd8" });
  }

  sortTasks(k) {
    this.page.desc = this.page.sort === k ? !this.page.desc : k === "seconds" || k === "started";
    this.page.sort = k;
    this.page.offset = 0;
    this.loadTasks();
  }

  async fetchTasks() {
    const p = this.page;
    const q = new URLSearchParams({ offset: p.offset, limit: p.limit, sort: p.sort, desc: p.desc ? "1" : "0", state: p.state, host: p.host });
    const r = await api(`api/jobs/${encodeURIComponent(this.id)}/tasks?${q}`);
    if (!r.ok) return;
    const d = r.data;
    this.total = d.total;
    for (const th of this.taskHead.children) th.dataset.sorted = th.dataset.key === p.sort ? (p.desc ? "desc" : "asc") : "";
    const t0 = this.summary && this.summary.started;
    this.taskBody.replaceChildren(...d.rows.map((row) => el("tr", { class: "link", "data-task": row.task, "data-state": row.state, onclick: () => this.openTask(row.task) },
      el("td", { text: String(row.task) }), el("td", {}, stateBadge(row.state)),
      el("td", { text: row.host }), el("td", { text: String(row.attempt) }),
      el("td", { text: row.started && t0 ? `+${Charts.fmtDuration(row.started - t0)}` : "" }),
      el("td", { text: fmtDur(row.seconds) + (row.batch > 1 ? " ⁎" : ""), title: row.batch > 1 ? `ran in a batch of ${row.batch} fast tasks: its share of the batch's time` : "" }),
      el("td", { class: "reason", text: row.reason || "" }))));
    if (!d.rows.length) this.taskBody.append(el("tr", {}, el("td", { colSpan: 7, class: "muted", text: "no task matches" })));
    this.range.textContent = d.total ? `${d.offset + 1}–${d.offset + d.rows.length} of ${d.total}` : "0 tasks";
    if (this.openIndex != null && !$("#task-panel").hidden) this.fetchTask(this.openIndex, true);
  }

  openTask(i) {
    this.openIndex = i;
    this.fetchTask(i, false);
  }

  async fetchTask(i, quiet) {
    const r = await api(`api/jobs/${encodeURIComponent(this.id)}/tasks/${i}`);
    if (!r.ok) { if (!quiet) notice((r.data && r.data.error) || r.text, "error"); return; }
    if (this.openIndex !== i) return;
    showTaskPanel(this, r.data);
  }
}

function showTaskPanel(view, t) {
  const panel = $("#task-panel");
  const fact = (k, v) => (v === "" || v == null ? null : el("tr", {}, el("th", { text: k }), el("td", { text: String(v) })));
  const body = [
    el("table", { class: "kv" }, [
      fact("state", t.state), fact("host", t.host), fact("worker", t.worker), fact("pid", t.pid), fact("attempt", t.attempt),
      fact("started", fmtClock(t.started)), fact("ended", fmtClock(t.ended)), fact("time", fmtDur(t.seconds)),
      fact("batch", t.batch > 1 ? `ran with ${t.batch - 1} other fast tasks as one batch` : null),
      fact("peak memory", t.peak_rss ? fmtSize(t.peak_rss) : null), fact("seed", t.seed), fact("reason", t.reason),
    ].filter(Boolean)),
  ];
  if (!S.info.read_only) {
    const act = async (verb) => {
      const r = await api(`api/jobs/${encodeURIComponent(view.id)}/tasks/${t.task}/${verb}`, { method: "POST" });
      if (r.ok) notice(r.data.message, "ok");
      else notice((r.data && r.data.error) || r.text.trim() || `refused (${r.status})`, "error");
    };
    const ended = ["finished", "failed", "cancelled"].includes(t.state);
    body.push(el("div", { class: "actions" },
      el("button", { id: "act-cancel-task", text: "Cancel task", disabled: ended, onclick: () => act("cancel") }),
      el("button", { id: "act-retry-task", text: "Retry task", disabled: !(t.state === "failed" || t.state === "cancelled"), onclick: () => act("retry") })));
  }
  if (t.error) {
    body.push(el("h3", { text: "Error" }), el("div", { class: "error", id: "task-error" }, el("b", { text: t.error.type }), `: ${t.error.message}`));
    if (t.error.traceback) body.push(el("h3", { text: "Remote traceback" }, t.error.host ? el("small", { class: "muted", text: ` on ${t.error.host}` }) : null), el("pre", { id: "task-traceback", class: "traceback", text: t.error.traceback }));
  }
  body.push(el("h3", { text: "Output (stdout and stderr)" }),
    t.log_cut ? el("div", { class: "muted small", text: `the first ${fmtSize(t.log_cut)} are left out` }) : null,
    el("pre", { id: "task-log", class: "log", text: t.log || "(nothing printed)" }));
  panel.replaceChildren(
    el("div", { class: "panel-head" }, el("h2", { id: "task-title", text: `Task ${t.task}` }), stateBadge(t.state),
      el("button", { class: "close", id: "task-close", text: "×", title: "close (Esc)", onclick: () => { panel.hidden = true; view.openIndex = null; } })),
    el("div", { class: "panel-body" }, body));
  panel.dataset.task = String(t.task);
  panel.hidden = false;
}

// ---- peers --------------------------------------------------------------------------------------
class PeersView {
  constructor(root) {
    this.tbody = el("tbody");
    this.note = el("p", { class: "muted", id: "peers-note" });
    this.fair = el("div", { id: "fair-share" });
    const cols = ["host", "user", "group", "state", "slots free", "memory offered", "time offered", "working for", "wire", "address", "seen"];
    root.append(
      el("section", { class: "card" }, el("h2", { text: "Peers" }), this.note,
        el("div", { class: "scroll" }, el("table", { class: "grid", id: "peers" }, el("thead", {}, el("tr", {}, cols.map((c) => el("th", { text: c })))), this.tbody))),
      el("section", { class: "card" }, el("h2", {}, "Fair share ", el("small", { class: "muted", text: "each controller's recent use (decayed run time, s) of the background workers on this machine" })), this.fair));
    api("api/peers").then((r) => { if (r.ok) this.onPeers(r.data); });
    connect({ peers: "1" });
  }

  close() {}

  onPeers(d) {
    if (d.error) { this.note.textContent = d.error; return; }
    const n = d.peers.length;
    this.note.textContent = d.problem ? d.problem : `${n} peer${n === 1 ? "" : "s"} seen on discovery port ${d.port}` +
      (d.warming ? " (listening for a few seconds: peers announce themselves about once a second)" : "") +
      (n ? "" : ". Start a worker with `elsewhere peer worker`.");
    this.tbody.replaceChildren(...d.peers.map((p) => el("tr", { "data-peer": p.peer_id, "data-state": p.state },
      el("td", { text: p.host }), el("td", { text: p.user }), el("td", { text: p.group }), el("td", {}, stateBadge(p.state)),
      el("td", { text: p.state === "controller" ? "" : `${p.free}/${p.slots}` }),
      el("td", { text: p.state === "controller" ? "" : fmtSize(p.memory) }),
      el("td", { text: p.state === "controller" ? "" : p.time == null ? "no limit" : fmtDur(p.time) }),
      el("td", { text: p.task || "" }), el("td", { text: p.wire }), el("td", { text: p.address }),
      el("td", { text: `${p.seen_s_ago} s ago` }))));
    const charts = d.fair_share.map((w) => {
      const c = el("canvas", { class: "plot", "data-worker": w.worker });
      return [el("div", { class: "small muted", text: `worker ${w.worker}` }), c, w];
    });
    if (!charts.length) {
      this.fair.replaceChildren(el("p", { class: "muted", text: "no background peer worker of this user runs here (`elsewhere peer worker --detach` starts one)" }));
      return;
    }
    this.fair.replaceChildren(...charts.flatMap(([label, c]) => [label, c]));
    for (const [, c, w] of charts) {
      const t0 = w.t[0];
      Charts.lines(c, { x: w.t.map((t) => t - t0), series: w.series, xFormat: (v) => `+${Charts.fmtDuration(v)}`,
        yLabel: "use (s)", emptyText: "no controller has used this worker lately" });
    }
  }
}

// ---- the frame -------------------------------------------------------------------------------------
function route() {
  if (S.view && S.view.close) S.view.close();
  const main = $("#view");
  main.replaceChildren();
  const h = location.hash || "#/";
  let m;
  for (const a of document.querySelectorAll("header nav a")) a.dataset.active = "";
  if ((m = h.match(/^#\/job\/(.+)$/))) {
    S.view = new JobView(main, decodeURIComponent(m[1]));
    $("#nav-jobs").dataset.active = "1";
  } else if (h === "#/peers") {
    document.title = "peers · elsewhere";
    S.view = new PeersView(main);
    $("#nav-peers").dataset.active = "1";
  } else {
    document.title = "jobs · elsewhere";
    S.view = new JobsView(main);
    $("#nav-jobs").dataset.active = "1";
  }
}

async function start() {
  const r = await api("api/info");
  if (r.ok) {
    S.info = r.data;
    S.offset = r.data.now - Date.now() / 1000;
    const mode = $("#mode");
    mode.textContent = r.data.read_only ? "read-only" : r.data.token_ok ? "" : "view only: open the URL with its token to act";
    mode.dataset.kind = r.data.read_only ? "ro" : r.data.token_ok ? "" : "notoken";
    $("#version").textContent = `elsewhere ${r.data.version}`;
  } else {
    notice(r.text.trim() || "the server refused this page", "error");
  }
  document.addEventListener("keydown", (e) => { if (e.key === "Escape") $("#task-panel").hidden = true; });
  window.addEventListener("hashchange", route);
  route();
}

document.addEventListener("DOMContentLoaded", start);

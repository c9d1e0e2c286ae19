// elsewhere web view: the page. Four views by the address's #fragment:
//   #/            the jobs table (sortable, filterable)
//   #/job/ID      one job: progress by state, Gantt, plots, task table, task panel, cluster (job.js)
//   #/peers       the peer network and fair share
//   #/bench       the benchmark figures of a source checkout, where the server finds them (bench.js)
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

// Runs fn (async) when asked, at most one at a time and no more often than minMs or one and a
// half times what the last run took: a large job is fetched less often than a small one.
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
    const wait = Math.max(0, last + Math.max(minMs, 1.5 * took) - performance.now());
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

// ---- peers --------------------------------------------------------------------------------------
class PeersView {
  constructor(root) {
    this.tbody = el("tbody");
    this.note = el("p", { class: "muted", id: "peers-note" });
    this.fair = el("div", { id: "fair-share" });
    const cols = ["host", "user", "group", "state", "slots free", "memory offered", "time offered", "working for", "encryption", "address", "seen"];
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
      el("td", { text: p.task || "" }), el("td", { class: "wire", "data-cipher": p.cipher || "", "data-encrypt": p.encrypt ? "1" : "0", text: p.wire }), el("td", { text: p.address }),
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
  } else if ((m = h.match(/^#\/bench(?:\/(.+))?$/))) {
    S.view = new BenchView(main, m[1] ? decodeURIComponent(m[1]) : "");
    $("#nav-bench").dataset.active = "1";
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

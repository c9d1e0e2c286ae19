// elsewhere web view: the view of one job (#/job/ID): its progress by state, the Gantt of its
// tasks (gantt.js), the throughput and durations plots (charts.js), the task table (sorted and
// filtered by the server, a page at a time), a task's panel (its output, error and traceback),
// its cluster and job scripts, and the actions. The helpers (el, api, throttle, ...) are app.js's.
"use strict";

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
    }), el("span", { class: "muted", text: "· a stacked bar: the many tasks of one pixel column, by outcome (hover: how many; click: zoom in)" }));
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
    const headers = TOKEN ? { "X-Elsewhere-Token": TOKEN } : {};
    let buf;
    try {
      const r = await fetch(`api/jobs/${encodeURIComponent(this.id)}/timeline`, { headers });
      if (!r.ok) return;
      buf = await r.arrayBuffer();
    } catch (_) {
      return; // the server went away: the event stream says so
    }
    const t = performance.now();
    this.gantt.setData(Gantt.decode(buf));
    this.drawPlots();
    const canvas = this.gantt.canvas;
    canvas.dataset.renderMs = (performance.now() - t).toFixed(1);
    canvas.dataset.version = String(this.summary ? this.summary.version : "");
    canvas.dataset.loads = String((+canvas.dataset.loads || 0) + 1);
  }

  // Throughput and durations from the Gantt's entries (a batch's tasks end one after another
  // at equal steps of its time, each of them lasting one step): no array per task.
  drawPlots() {
    const { start, end, count, E } = this.gantt; // (locals: the hot loops read no object's fields)
    let hi = 0, ended = 0;
    for (let j = 0; j < E; j++) if (end[j] >= 0) { ended += count[j]; if (end[j] > hi) hi = end[j]; }
    if (!ended) {
      Charts.bars(this.plotT, { values: [], emptyText: "no task has ended yet" });
      Charts.bars(this.plotD, { values: [], emptyText: "no task has ended yet" });
      return;
    }
    // throughput: tasks ended per second, in about 60 buckets over the job's time
    const span = hi / 1000;
    const dx = Charts.niceStep(span, 60) || 1;
    const nb = Math.max(1, Math.ceil(span / dx + 1e-9));
    const tp = new Array(nb).fill(0);
    let lo = Infinity, top = 0;
    for (let j = 0; j < E; j++) {
      if (end[j] < 0) continue;
      const c = count[j], s = start[j] / 1000, step = (end[j] / 1000 - s) / c;
      if (step > 0 && step < lo) lo = step;
      if (step > top) top = step;
      // the tasks ended by time x: floor((x - s) / step), between 0 and c
      const b0 = Math.min(nb - 1, Math.floor((s + step) / dx)), b1 = Math.min(nb - 1, Math.floor((s + c * step) / dx));
      let before = 0;
      for (let b = b0; b <= b1; b++) {
        const upto = b === b1 || step <= 0 ? c : Math.max(0, Math.min(c, Math.floor(((b + 1) * dx - s) / step + 1e-9)));
        tp[b] += (upto - before) / dx;
        before = upto;
      }
    }
    Charts.bars(this.plotT, { values: tp, x0: 0, dx, xFormat: (v) => (v > 0 ? `+${Charts.fmtDuration(v)}` : "0"),
      yLabel: "tasks ended per second", xLabel: "time since the first start", color: "#3a9d5d", emptyText: "no task has ended yet" });
    // durations: a histogram, on a log scale when they spread over more than 50x
    const log = lo > 0 && lo !== Infinity && top / lo > 50;
    const a = log ? Math.log10(lo) : 0, b = log ? Math.log10(top) : top || 1e-6;
    const bins = 30, w = (b - a) / bins || 1;
    const h = new Array(bins).fill(0);
    for (let j = 0; j < E; j++) {
      if (end[j] < 0) continue;
      const c = count[j], d = (end[j] - start[j]) / 1000 / c;
      const v = log ? Math.log10(Math.max(d, lo)) : d;
      h[Math.min(bins - 1, Math.max(0, Math.floor((v - a) / w)))] += c;
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

// elsewhere web view: the Gantt of a job's tasks, one lane per worker, drawn on one <canvas>.
//
// Never a DOM node per task, and never a JavaScript object per task either: the timeline (one
// entry per journal record, a batch of fast tasks being one entry: see columns.py) is kept as
// typed arrays, each lane's entries sorted by start, and each frame draws only the lanes and
// the time window in view. Where a task is at least MIN_BAR_PX wide, or its lane has fewer
// tasks than half its pixels, it is drawn as its own bar (a narrow one a pixel wide);
// narrower tasks of a crowded lane are counted into the pixel column their middle falls in,
// per outcome, and each column is drawn as one aggregated bar stacked by outcome (a failure
// among a thousand successes keeps a sliver of red). A frame costs one pass over the entries in view
// and one over the lane's pixels: 100 000 tasks draw in a few milliseconds.
//
// Mouse: the wheel zooms the time axis around the pointer (shift+wheel scrolls the lanes),
// dragging pans, a double click shows everything again, hovering names a task or says what an
// aggregated bar holds, a click opens the task or zooms into the aggregated bar. The canvas
// carries, for tests and benchmarks: data-tasks (tasks in the timeline), data-bars (tasks
// drawn as their own bar in the last frame), data-grouped (tasks drawn inside aggregated
// bars), data-buckets (aggregated bars, one per lane and pixel column), data-rects (rectangles
// it took), data-lanes, data-draw-ms (the last frame's time) and data-ready once drawn.
"use strict";

const GANTT_COLORS = { 0: "#3b7dd8", 1: "#3a9d5d", 2: "#d64545", 3: "#e08a2e", 4: "#9aa0a6" };
const GANTT_NAMES = { 0: "running", 1: "finished", 2: "failed", 3: "lost", 4: "cancelled" };
const GANTT_STACK = [1, 0, 4, 3, 2]; // an aggregated bar's outcomes, bottom to top
const MIN_BAR_PX = 2; // narrower tasks are drawn aggregated, per pixel column

class Gantt {
  constructor(canvas, tooltip, onTask) {
    this.canvas = canvas;
    this.tooltip = tooltip;
    this.onTask = onTask;
    this.labelW = 150;
    this.axisH = 20;
    this.laneOffset = 0;
    this.v0 = 0;
    this.v1 = 1;
    this.follow = true; // the window follows the whole job until the user zooms or pans
    this.m = 0;
    this.E = 0;
    this.clockOffset = 0; // server time - browser time, ms
    this.drag = null;
    this.cells = new Int32Array(0); // per pixel column x 5 outcomes: one lane's counts
    canvas.addEventListener("wheel", (e) => this.wheel(e), { passive: false });
    canvas.addEventListener("mousedown", (e) => { this.drag = { x: e.clientX, y: e.clientY, v0: this.v0, v1: this.v1, lo: this.laneOffset, moved: false }; });
    window.addEventListener("mouseup", (e) => this.mouseup(e));
    canvas.addEventListener("mousemove", (e) => this.move(e));
    canvas.addEventListener("mouseleave", () => { this.tooltip.hidden = true; });
    canvas.addEventListener("dblclick", () => { this.follow = true; this.laneOffset = 0; this.fit(); this.draw(); });
  }

  // The server's timeline (its binary form: see columns.py) as the header and typed arrays.
  static decode(buf) {
    const dv = new DataView(buf);
    const magic = String.fromCharCode(...new Uint8Array(buf, 0, 4));
    if (magic !== "EWT2") throw new Error(`not a timeline (${magic})`);
    const h = dv.getUint32(4, true);
    const tl = JSON.parse(new TextDecoder().decode(new Uint8Array(buf, 8, h)));
    const E = tl.entries;
    let at = 8 + h + ((8 - ((8 + h) % 8)) % 8);
    const take = (Type) => { const a = new Type(buf, at, E); at += E * Type.BYTES_PER_ELEMENT; return a; };
    Object.assign(tl, { start: take(Float64Array), end: take(Float64Array), first: take(Int32Array),
      count: take(Int32Array), lane: take(Int32Array), attempt: take(Int32Array), kind: take(Uint8Array) });
    return tl;
  }

  // tl: a decoded timeline. Its entries are regrouped by lane (a counting sort), each lane's
  // by start, times made milliseconds after t0; nothing is made per task.
  setData(tl) {
    const E = tl.entries, L = tl.lanes.length, t0 = tl.t0;
    const ts = tl.start, te = tl.end, tlane = tl.lane; // (locals: the hot loops read no object's fields)
    const laneAt = new Int32Array(L + 1);
    for (let e = 0; e < E; e++) laneAt[tlane[e] + 1]++;
    for (let l = 0; l < L; l++) laneAt[l + 1] += laneAt[l];
    const fill = laneAt.slice(0, L), idx = new Int32Array(E);
    for (let e = 0; e < E; e++) idx[fill[tlane[e]]++] = e;
    for (let l = 0; l < L; l++) { // a worker writes its records in order: sorted already, mostly
      let sorted = true;
      for (let j = laneAt[l] + 1; j < laneAt[l + 1] && sorted; j++) sorted = ts[idx[j - 1]] <= ts[idx[j]];
      if (!sorted) idx.subarray(laneAt[l], laneAt[l + 1]).sort((a, b) => ts[a] - ts[b]);
    }
    const start = new Float64Array(E), end = new Float64Array(E), first = new Int32Array(E);
    const count = new Int32Array(E), kind = new Uint8Array(E), attempt = new Int32Array(E);
    const tfirst = tl.first, tcount = tl.count, tkind = tl.kind, tattempt = tl.attempt;
    let m = 0, running = false;
    for (let j = 0; j < E; j++) {
      const e = idx[j];
      start[j] = (ts[e] - t0) * 1000;
      end[j] = te[e] < 0 ? -1 : (te[e] - t0) * 1000; // -1: running
      first[j] = tfirst[e];
      count[j] = tcount[e];
      kind[j] = tkind[e];
      attempt[j] = tattempt[e];
      m += count[j];
      if (kind[j] === 0) running = true;
    }
    Object.assign(this, { start, end, first, count, kind, attempt, laneAt, E, m, running });
    this.t0 = t0 * 1000; // unix ms
    this.clockOffset = tl.now * 1000 - Date.now();
    this.lanes = tl.lanes;
    this.n = tl.n;
    // the longest entry of each lane bounds the search for the entries that reach into a window
    const now = this.nowRel();
    this.maxDur = new Float64Array(L);
    this.laneTasks = new Int32Array(L);
    for (let l = 0; l < L; l++) {
      let d = 0, n = 0;
      for (let j = laneAt[l]; j < laneAt[l + 1]; j++) {
        const x = (end[j] < 0 ? now : end[j]) - start[j];
        if (x > d) d = x;
        n += count[j];
      }
      this.maxDur[l] = d;
      this.laneTasks[l] = n;
    }
    // lanes in order of host, then of first start
    this.order = tl.lanes.map((_, i) => i).sort((a, b) => {
      const ha = tl.lanes[a].host || "", hb = tl.lanes[b].host || "";
      if (ha !== hb) return ha < hb ? -1 : 1;
      const sa = laneAt[a] < laneAt[a + 1] ? start[laneAt[a]] : 0;
      const sb = laneAt[b] < laneAt[b + 1] ? start[laneAt[b]] : 0;
      return sa - sb;
    });
    this.canvas.dataset.tasks = String(m);
    this.canvas.dataset.lanes = String(L);
    if (this.follow) this.fit();
    this.draw();
    this.canvas.dataset.ready = "1";
  }

  nowRel() { return Date.now() + this.clockOffset - this.t0; }

  fit() {
    let hi = 0;
    const now = this.nowRel(), end = this.end, E = this.E;
    for (let j = 0; j < E; j++) {
      const e = end[j] < 0 ? now : end[j];
      if (e > hi) hi = e;
    }
    this.v0 = 0;
    this.v1 = Math.max(hi * 1.01, 1);
  }

  laneHeight() {
    const n = Math.max(1, this.lanes ? this.lanes.length : 1);
    return Math.max(4, Math.min(18, Math.floor(400 / n)));
  }

  // The canvas's CSS height for its lanes (at most 460 px: more lanes scroll).
  wantedHeight() {
    const n = this.lanes ? this.lanes.length : 0;
    return Math.min(460, Math.max(64, this.axisH + n * this.laneHeight() + 8));
  }

  // The first entry of lane l that may reach time t: start >= t - the lane's longest entry.
  lowerBound(l, t) {
    let lo = this.laneAt[l], hi = this.laneAt[l + 1];
    const from = t - this.maxDur[l] - 1, start = this.start;
    while (lo < hi) {
      const mid = (lo + hi) >> 1;
      if (start[mid] < from) lo = mid + 1;
      else hi = mid;
    }
    return lo;
  }

  // Counts lane l's tasks narrower than MIN_BAR_PX into this.cells (per pixel column x 5
  // outcomes, columns 0 .. W-1 of the plot, k pixels per ms from v0) and calls bar(x0, x1,
  // entry, task) for each task drawn alone; returns [tasks counted, lowest column, highest].
  // A lane of fewer tasks than half its pixels has each drawn alone, however narrow.
  scan(l, W, k, bar) {
    const { start, end, count, kind } = this;
    const v0 = this.v0, v1 = this.v1, now = this.nowRel(), cells = this.cells;
    const least = this.laneTasks[l] * 2 <= W ? 0 : MIN_BAR_PX;
    let grouped = 0, cmin = W, cmax = -1;
    const stop = this.laneAt[l + 1];
    for (let j = this.lowerBound(l, v0); j < stop; j++) {
      const s = start[j];
      if (s > v1) break;
      const e = end[j] < 0 ? now : end[j];
      if (e < v0) continue;
      const c = count[j], x0 = (s - v0) * k, x1 = (e - v0) * k, per = (x1 - x0) / c;
      if (per >= least) { // each task its own bar: only those in the window
        const i0 = per > 0 ? Math.max(0, Math.floor(-x0 / per)) : 0, i1 = per > 0 ? Math.min(c, Math.ceil((W - x0) / per)) : c;
        for (let i = i0; i < i1; i++) bar(x0 + i * per, x0 + (i + 1) * per, j, i);
        continue;
      }
      // task i's middle is at x0 + (i + 0.5) per: the tasks of column p are those between
      const kd = kind[j];
      const p0 = Math.max(0, Math.floor(x0)), p1 = Math.min(W - 1, Math.floor(x1));
      if (c === 1 || per === 0) {
        const p = Math.floor((x0 + x1) / 2);
        if (p < 0 || p >= W) continue;
        cells[p * 5 + kd] += c;
        grouped += c;
        if (p < cmin) cmin = p;
        if (p > cmax) cmax = p;
        continue;
      }
      let before = Math.max(0, Math.min(c, Math.ceil((p0 - x0) / per - 0.5)));
      for (let p = p0; p <= p1; p++) {
        const upto = Math.max(0, Math.min(c, Math.ceil((p + 1 - x0) / per - 0.5)));
        if (upto > before) {
          cells[p * 5 + kd] += upto - before;
          grouped += upto - before;
          if (p < cmin) cmin = p;
          if (p > cmax) cmax = p;
        }
        before = upto;
      }
    }
    return [grouped, cmin, cmax];
  }

  draw() {
    const t = performance.now();
    const c = this.canvas, dpr = window.devicePixelRatio || 1;
    const w = Math.max(200, c.clientWidth);
    const h = this.wantedHeight();
    if (c.style.height !== `${h}px`) c.style.height = `${h}px`;
    if (c.width !== Math.round(w * dpr) || c.height !== Math.round(h * dpr)) {
      c.width = Math.round(w * dpr);
      c.height = Math.round(h * dpr);
    }
    const ctx = c.getContext("2d");
    ctx.setTransform(dpr, 0, 0, dpr, 0, 0);
    ctx.clearRect(0, 0, w, h);
    ctx.font = "11px system-ui, sans-serif";
    if (!this.m) {
      ctx.fillStyle = "#6b7280";
      ctx.textAlign = "center";
      ctx.fillText("no task has started yet", w / 2, h / 2);
      Object.assign(c.dataset, { bars: "0", grouped: "0", buckets: "0", rects: "0", drawMs: "0" });
      return;
    }
    if (this.follow && this.running) this.fit();
    const L = this.labelW, plotW = w - L - 4, lh = this.laneHeight(), W = Math.ceil(plotW);
    const visible = Math.max(1, Math.floor((h - this.axisH) / lh));
    this.laneOffset = Math.max(0, Math.min(this.laneOffset, this.order.length - visible));
    const k = plotW / (this.v1 - this.v0);
    this.axis(ctx, L, plotW, h);
    if (this.cells.length < W * 5) this.cells = new Int32Array(W * 5);
    const cells = this.cells, heights = new Int32Array(5), runH = new Int32Array(5);
    let bars = 0, grouped = 0, buckets = 0, rects = 0;
    for (let r = 0; r < visible && r + this.laneOffset < this.order.length; r++) {
      const l = this.order[r + this.laneOffset];
      const y = this.axisH + r * lh;
      if (r % 2) {
        ctx.fillStyle = "#f6f7f9";
        ctx.fillRect(L, y, plotW, lh);
      }
      ctx.fillStyle = "#2b2f36";
      ctx.textAlign = "right";
      ctx.textBaseline = "middle";
      if (lh >= 9) ctx.fillText(this.label(this.lanes[l]), L - 6, y + lh / 2, L - 10);
      const barH = Math.max(2, lh - 3), by = y + (lh - barH) / 2;
      let color = -1;
      const [, cmin, cmax] = this.scan(l, W, k, (x0, x1, j) => {
        const kd = this.kind[j];
        if (kd !== color) { ctx.fillStyle = GANTT_COLORS[kd] || "#999"; color = kd; }
        const a = Math.max(0, x0), b = Math.min(plotW, x1);
        ctx.fillRect(L + a, by, Math.max(1, b - a - (b - a > 3 ? 1 : 0)), barH);
        bars++;
        rects++;
      });
      // the aggregated bars: one per pixel column, stacked by outcome, equal neighbours as one
      let runFrom = -1, runTo = -1;
      const flush = () => {
        if (runFrom < 0) return;
        let yy = by + barH;
        for (const kd of GANTT_STACK) {
          if (!runH[kd]) continue;
          yy -= runH[kd];
          ctx.fillStyle = GANTT_COLORS[kd];
          ctx.fillRect(L + runFrom, yy, runTo - runFrom + 1, runH[kd]);
          rects++;
        }
        color = -1;
        runFrom = -1;
      };
      const least = barH >= 8 ? 2 : 1;
      for (let p = cmin; p <= cmax; p++) {
        let total = 0;
        for (let q = 0; q < 5; q++) total += cells[p * 5 + q];
        if (!total) { flush(); continue; }
        if (total === 1) bars++;
        else { buckets++; grouped += total; }
        let sum = 0, big = 1;
        for (let q = 0; q < 5; q++) {
          const n = cells[p * 5 + q];
          heights[q] = n ? Math.max(least, Math.round((barH * n) / total)) : 0;
          sum += heights[q];
          if (n > cells[p * 5 + big]) big = q;
        }
        heights[big] = Math.max(1, heights[big] + barH - sum); // the commonest outcome fills the rest
        let same = runFrom >= 0 && runTo === p - 1;
        for (let q = 0; q < 5 && same; q++) same = runH[q] === heights[q];
        if (!same) {
          flush();
          runFrom = p;
          runH.set(heights);
        }
        runTo = p;
        cells.fill(0, p * 5, p * 5 + 5);
      }
      flush();
    }
    if (this.order.length > visible) {
      ctx.fillStyle = "#6b7280";
      ctx.textAlign = "left";
      ctx.textBaseline = "top";
      ctx.fillText(`lanes ${this.laneOffset + 1}-${Math.min(this.order.length, this.laneOffset + visible)} of ${this.order.length} (shift+wheel scrolls)`, 4, 4);
    }
    Object.assign(c.dataset, { bars: String(bars), grouped: String(grouped), buckets: String(buckets), rects: String(rects),
      drawMs: (performance.now() - t).toFixed(2) });
  }

  label(ln) {
    const who = ln.host || ln.id;
    return ln.pid ? `${who} · ${ln.pid}` : who;
  }

  axis(ctx, L, plotW, h) {
    const span = (this.v1 - this.v0) / 1000;
    const step = Charts.niceStep(span, Math.max(2, Math.floor(plotW / 90)));
    ctx.fillStyle = "#6b7280";
    ctx.strokeStyle = "#e3e6ea";
    ctx.textAlign = "center";
    ctx.textBaseline = "top";
    for (let v = Math.ceil(this.v0 / 1000 / step) * step; v <= this.v1 / 1000; v += step) {
      const x = Math.round(L + (v * 1000 - this.v0) * (plotW / (this.v1 - this.v0))) + 0.5;
      ctx.beginPath();
      ctx.moveTo(x, this.axisH - 4);
      ctx.lineTo(x, h);
      ctx.stroke();
      ctx.fillText(Gantt.tick(v, step), x, 3);
    }
  }

  // An axis label: v seconds after the first start, with the digits that ticks step apart need.
  static tick(v, step) {
    if (v <= step * 1e-6) return "0";
    if (step >= 1) return `+${Charts.fmtDuration(v)}`;
    const d = Math.max(0, Math.ceil(-Math.log10(step) - 1e-9));
    if (v < 1) return `+${(v * 1000).toFixed(Math.max(0, d - 3))} ms`;
    if (v < 60) return `+${v.toFixed(d)} s`;
    const min = Math.floor(v / 60);
    return `+${min} min ${(v - 60 * min).toFixed(d)} s`;
  }

  // What is under the pointer: {task, j} (a task drawn alone: its number and entry), {bucket}
  // (an aggregated bar: its counts per outcome, its column's times and lane), or null.
  hit(ev) {
    if (!this.m) return null;
    const rect = this.canvas.getBoundingClientRect();
    const x = ev.clientX - rect.left, y = ev.clientY - rect.top;
    const plotW = rect.width - this.labelW - 4, W = Math.ceil(plotW);
    if (x < this.labelW || x >= this.labelW + plotW || y < this.axisH) return null;
    const r = Math.floor((y - this.axisH) / this.laneHeight()) + this.laneOffset;
    if (r >= this.order.length) return null;
    const l = this.order[r], px = x - this.labelW, col = Math.floor(px);
    const k = plotW / (this.v1 - this.v0);
    if (this.cells.length < W * 5) this.cells = new Int32Array(W * 5);
    let best = null, bestD = 3; // pixels
    this.scan(l, W, k, (x0, x1, j, i) => {
      const d = px < x0 ? x0 - px : px > x1 ? px - x1 : 0;
      if (d < bestD) { bestD = d; best = { task: this.first[j] + i, j, i, lane: l }; }
    });
    const counts = Array.from(this.cells.subarray(col * 5, col * 5 + 5));
    this.cells.fill(0);
    const total = counts.reduce((a, b) => a + b, 0);
    if (best && bestD === 0) return best;
    if (total > 1) {
      return { bucket: counts, total, lane: l, from: this.v0 + col / k, to: this.v0 + (col + 1) / k };
    }
    if (total === 1) { // one narrow task alone in its column: find which
      let found = null;
      const stop = this.laneAt[l + 1], now = this.nowRel();
      for (let j = this.lowerBound(l, this.v0 + col / k); j < stop && !found; j++) {
        const s = this.start[j];
        if (s > this.v0 + (col + 1) / k) break;
        const e = this.end[j] < 0 ? now : this.end[j], c = this.count[j], per = ((e - s) * k) / c;
        for (let i = 0; i < c && !found; i++) {
          const mid = (s - this.v0) * k + (i + 0.5) * per;
          if (mid >= col && mid < col + 1) found = { task: this.first[j] + i, j, i, lane: l };
          if (mid >= col + 1) break;
        }
      }
      return found || best;
    }
    return best;
  }

  move(ev) {
    if (this.drag) {
      const dx = ev.clientX - this.drag.x, dy = ev.clientY - this.drag.y;
      if (Math.abs(dx) + Math.abs(dy) > 3) this.drag.moved = true;
      if (this.drag.moved) {
        const plotW = this.canvas.clientWidth - this.labelW - 4;
        const dv = (-dx / plotW) * (this.drag.v1 - this.drag.v0);
        this.v0 = this.drag.v0 + dv;
        this.v1 = this.drag.v1 + dv;
        this.laneOffset = this.drag.lo - Math.round(dy / this.laneHeight());
        this.follow = false;
        this.draw();
        return;
      }
    }
    const h = this.hit(ev);
    if (!h) { this.tooltip.hidden = true; this.canvas.style.cursor = "default"; return; }
    this.canvas.style.cursor = h.bucket ? "zoom-in" : "pointer";
    const ln = this.lanes[h.lane];
    if (h.bucket) {
      const parts = GANTT_STACK.slice().reverse().filter((q) => h.bucket[q]).map((q) => `${h.bucket[q]} ${GANTT_NAMES[q]}`);
      const at = (v) => Gantt.tick(v / 1000, (h.to - h.from) / 1000);
      this.tooltip.textContent = `${h.total} tasks at ${at(h.from)} to ${at(h.to)} · ${this.label(ln)} · ${parts.join(", ")} · click zooms in`;
      this.tooltip.dataset.kind = "bucket";
    } else {
      const j = h.j, c = this.count[j], s = this.start[j], e = this.end[j] < 0 ? this.nowRel() : this.end[j];
      const dur = Charts.fmtDuration((e - s) / c / 1000);
      const batch = c > 1 ? ` · one of a batch of ${c}` : "";
      this.tooltip.textContent = `task ${h.task} · ${GANTT_NAMES[this.kind[j]]} · ${dur} · ${this.label(ln)}` +
        `${this.attempt[j] ? ` · attempt ${this.attempt[j]}` : ""}${batch}`;
      this.tooltip.dataset.kind = "task";
    }
    const rect = this.canvas.getBoundingClientRect();
    this.tooltip.hidden = false;
    const x = ev.clientX - rect.left, wide = this.tooltip.offsetWidth;
    this.tooltip.style.left = `${Math.max(0, x + 12 + wide > rect.width ? x - 12 - wide : x + 12)}px`;
    this.tooltip.style.top = `${ev.clientY - rect.top + 14}px`;
  }

  mouseup(ev) {
    const d = this.drag;
    this.drag = null;
    if (!d || d.moved || ev.target !== this.canvas) return;
    const h = this.hit(ev);
    if (!h) return;
    if (h.bucket) { // zoom into the aggregated bar: its tasks a few pixels wide, or 20 times
      const rect = this.canvas.getBoundingClientRect();
      this.zoom(ev.clientX - rect.left, Math.max(1 / 20, Math.min(1 / 4, (4 * h.total) / (rect.width - this.labelW))));
      return;
    }
    if (this.onTask) this.onTask(h.task);
  }

  // Zoom by factor z (below 1: in) around x, a pixel of the canvas.
  zoom(x, z) {
    const plotW = this.canvas.clientWidth - this.labelW - 4;
    const f = Math.max(0, Math.min(1, (x - this.labelW) / plotW));
    const at = this.v0 + f * (this.v1 - this.v0);
    const span = Math.max(0.01, (this.v1 - this.v0) * z);
    this.v0 = at - f * span;
    this.v1 = this.v0 + span;
    this.follow = false;
    this.draw();
  }

  wheel(ev) {
    if (!this.m) return;
    ev.preventDefault();
    if (ev.shiftKey) {
      this.laneOffset += ev.deltaY > 0 ? 3 : -3;
      this.draw();
      return;
    }
    const rect = this.canvas.getBoundingClientRect();
    this.zoom(ev.clientX - rect.left, Math.exp(ev.deltaY * 0.0015));
  }
}

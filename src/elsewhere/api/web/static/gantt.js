// elsewhere web view: the Gantt of a job's tasks, one lane per worker, drawn on one <canvas>.
//
// Never a DOM node per task: the timeline (one entry per journal record, see columns.py) is
// expanded into typed arrays, each lane's tasks sorted by start, and each frame draws only the
// lanes and the time window in view. Bars narrower than a pixel that touch and share a colour
// are merged into one rectangle, so 100 000 tasks cost a few thousand fillRect calls at most.
//
// Mouse: the wheel zooms the time axis around the pointer (shift+wheel scrolls the lanes),
// dragging pans, a double click shows everything again, hovering names the task, a click
// opens it. The canvas carries, for tests and benchmarks: data-tasks (tasks in the timeline),
// data-bars (tasks drawn in the last frame), data-rects (rectangles it took), data-lanes,
// data-draw-ms (the last frame's time) and data-ready once data has been drawn.
"use strict";

const GANTT_COLORS = { 0: "#3b7dd8", 1: "#3a9d5d", 2: "#d64545", 3: "#e08a2e", 4: "#9aa0a6" };
const GANTT_NAMES = { 0: "running", 1: "finished", 2: "failed", 3: "lost", 4: "cancelled" };

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
    this.clockOffset = 0; // server time - browser time, ms
    this.drag = null;
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
    if (magic !== "EWT1") throw new Error(`not a timeline (${magic})`);
    const h = dv.getUint32(4, true);
    const tl = JSON.parse(new TextDecoder().decode(new Uint8Array(buf, 8, h)));
    const E = tl.entries;
    let at = 8 + h + ((8 - ((8 + h) % 8)) % 8);
    const take = (Type) => { const a = new Type(buf, at, E); at += E * Type.BYTES_PER_ELEMENT; return a; };
    Object.assign(tl, { start: take(Float64Array), end: take(Float64Array), first: take(Int32Array),
      count: take(Int32Array), lane: take(Int32Array), attempt: take(Int32Array), kind: take(Uint8Array) });
    return tl;
  }

  // tl: a decoded timeline (times in seconds after t0), expanded into one element per task.
  setData(tl) {
    const E = tl.entries;
    let m = 0;
    for (let e = 0; e < E; e++) m += tl.count[e];
    const start = new Float64Array(m), end = new Float64Array(m);
    const task = new Int32Array(m), lane = new Int32Array(m);
    const kind = new Uint8Array(m), batch = new Int32Array(m), attempt = new Int32Array(m);
    let k = 0;
    for (let e = 0; e < E; e++) {
      const c = tl.count[e], s = tl.start[e] * 1000, en = tl.end[e] * 1000;
      const step = en >= 0 ? (en - s) / c : 0;
      for (let j = 0; j < c; j++, k++) {
        task[k] = tl.first[e] + j;
        lane[k] = tl.lane[e];
        kind[k] = tl.kind[e];
        attempt[k] = tl.attempt[e];
        batch[k] = c;
        start[k] = s + j * step;
        end[k] = en >= 0 ? s + (j + 1) * step : -1; // -1: running
      }
    }
    this.t0 = tl.t0 * 1000; // unix ms
    this.clockOffset = tl.now * 1000 - Date.now();
    this.m = m;
    Object.assign(this, { start, end, task, lane, kind, batch, attempt });
    this.lanes = tl.lanes;
    this.n = tl.n;
    // each lane's tasks by start; the longest task of each lane bounds the search for a window
    const byLane = tl.lanes.map(() => []);
    for (let i = 0; i < m; i++) byLane[lane[i]].push(i);
    this.byLane = byLane.map((ids) => {
      const a = Int32Array.from(ids);
      a.sort((x, y) => start[x] - start[y]);
      return a;
    });
    this.maxDur = this.byLane.map((ids) => {
      let d = 0;
      for (const i of ids) {
        const e = end[i] < 0 ? this.nowRel() : end[i];
        if (e - start[i] > d) d = e - start[i];
      }
      return d;
    });
    // lanes in order of host, then of first start
    this.order = tl.lanes.map((_, i) => i).sort((a, b) => {
      const ha = tl.lanes[a].host || "", hb = tl.lanes[b].host || "";
      if (ha !== hb) return ha < hb ? -1 : 1;
      const sa = this.byLane[a].length ? start[this.byLane[a][0]] : 0;
      const sb = this.byLane[b].length ? start[this.byLane[b][0]] : 0;
      return sa - sb;
    });
    this.running = kind.indexOf(0) >= 0;
    this.canvas.dataset.tasks = String(m);
    this.canvas.dataset.lanes = String(tl.lanes.length);
    if (this.follow) this.fit();
    this.draw();
    this.canvas.dataset.ready = "1";
  }

  nowRel() { return Date.now() + this.clockOffset - this.t0; }

  fit() {
    let hi = 0;
    for (let i = 0; i < this.m; i++) {
      const e = this.end[i] < 0 ? this.nowRel() : this.end[i];
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
      Object.assign(c.dataset, { bars: "0", rects: "0", drawMs: "0" });
      return;
    }
    if (this.follow && this.running) this.fit();
    const L = this.labelW, plotW = w - L - 4, lh = this.laneHeight();
    const visible = Math.max(1, Math.floor((h - this.axisH) / lh));
    this.laneOffset = Math.max(0, Math.min(this.laneOffset, this.order.length - visible));
    const k = plotW / (this.v1 - this.v0), v0 = this.v0, v1 = this.v1;
    const now = this.nowRel();
    this.axis(ctx, L, plotW, h);
    let bars = 0, rects = 0;
    const { start, end, kind } = this;
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
      if (lh >= 9) {
        const ln = this.lanes[l];
        ctx.fillText(this.label(ln), L - 6, y + lh / 2, L - 10);
      }
      const ids = this.byLane[l];
      // the first task that may reach into the window: start >= v0 - the lane's longest task
      let lo = 0, hi = ids.length;
      const from = v0 - this.maxDur[l] - 1;
      while (lo < hi) {
        const mid = (lo + hi) >> 1;
        if (start[ids[mid]] < from) lo = mid + 1;
        else hi = mid;
      }
      let runColor = -1, rx0 = 0, rx1 = -1;
      const barH = Math.max(2, lh - 3), by = y + (lh - barH) / 2;
      for (let j = lo; j < ids.length; j++) {
        const i = ids[j];
        const s = start[i];
        if (s > v1) break;
        const e = end[i] < 0 ? now : end[i];
        if (e < v0) continue;
        let x0 = L + (s - v0) * k, x1 = L + (e - v0) * k;
        if (x0 < L) x0 = L;
        if (x1 > L + plotW) x1 = L + plotW;
        const col = kind[i];
        if (x1 - x0 < 1 && col !== 1) x1 = x0 + 1; // a failure or a running task stays visible
        bars++;
        if (col === runColor && x0 <= rx1 + 0.5 && x1 - x0 < 2) { // a sliver touching the last bar
          if (x1 > rx1) rx1 = x1;
          continue;
        }
        if (runColor >= 0) {
          ctx.fillRect(rx0, by, Math.max(0.5, rx1 - rx0 - (rx1 - rx0 > 3 ? 1 : 0)), barH);
          rects++;
        }
        if (col !== runColor) ctx.fillStyle = GANTT_COLORS[col] || "#999";
        runColor = col;
        rx0 = x0;
        rx1 = x1;
      }
      if (runColor >= 0) {
        ctx.fillRect(rx0, by, Math.max(0.5, rx1 - rx0 - (rx1 - rx0 > 3 ? 1 : 0)), barH);
        rects++;
      }
    }
    if (this.order.length > visible) {
      ctx.fillStyle = "#6b7280";
      ctx.textAlign = "left";
      ctx.textBaseline = "top";
      ctx.fillText(`lanes ${this.laneOffset + 1}-${Math.min(this.order.length, this.laneOffset + visible)} of ${this.order.length} (shift+wheel scrolls)`, 4, 4);
    }
    Object.assign(c.dataset, { bars: String(bars), rects: String(rects), drawMs: (performance.now() - t).toFixed(2) });
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
      ctx.fillText(v > 0 ? `+${Charts.fmtDuration(v)}` : "0", x, 3);
    }
  }

  // The task under the pointer (its index in the arrays), or -1.
  hit(ev) {
    if (!this.m) return -1;
    const rect = this.canvas.getBoundingClientRect();
    const x = ev.clientX - rect.left, y = ev.clientY - rect.top;
    const plotW = rect.width - this.labelW - 4;
    if (x < this.labelW || y < this.axisH) return -1;
    const r = Math.floor((y - this.axisH) / this.laneHeight()) + this.laneOffset;
    if (r >= this.order.length) return -1;
    const l = this.order[r], ids = this.byLane[l];
    const k = plotW / (this.v1 - this.v0);
    const t = this.v0 + (x - this.labelW) / k, tol = 2 / k;
    const now = this.nowRel();
    let lo = 0, hi = ids.length;
    while (lo < hi) {
      const mid = (lo + hi) >> 1;
      if (this.start[ids[mid]] <= t + tol) lo = mid + 1;
      else hi = mid;
    }
    let best = -1, bestD = Infinity;
    for (let j = lo - 1; j >= 0 && j >= lo - 64; j--) {
      const i = ids[j];
      const e = this.end[i] < 0 ? now : this.end[i];
      const d = t < this.start[i] ? this.start[i] - t : t > e ? t - e : 0;
      if (d < bestD) { best = i; bestD = d; }
      if (d === 0) break;
    }
    return bestD <= tol ? best : -1;
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
    const i = this.hit(ev);
    if (i < 0) { this.tooltip.hidden = true; this.canvas.style.cursor = "default"; return; }
    this.canvas.style.cursor = "pointer";
    const ln = this.lanes[this.lane[i]];
    const e = this.end[i] < 0 ? this.nowRel() : this.end[i];
    const dur = Charts.fmtDuration((e - this.start[i]) / 1000);
    const batch = this.batch[i] > 1 ? ` · one of a batch of ${this.batch[i]}` : "";
    this.tooltip.textContent = `task ${this.task[i]} · ${GANTT_NAMES[this.kind[i]]} · ${dur} · ${this.label(ln)}` +
      `${this.attempt[i] ? ` · attempt ${this.attempt[i]}` : ""}${batch}`;
    const rect = this.canvas.getBoundingClientRect();
    this.tooltip.style.left = `${Math.min(ev.clientX - rect.left + 12, rect.width - 260)}px`;
    this.tooltip.style.top = `${ev.clientY - rect.top + 14}px`;
    this.tooltip.hidden = false;
  }

  mouseup(ev) {
    const d = this.drag;
    this.drag = null;
    if (d && !d.moved && ev.target === this.canvas) {
      const i = this.hit(ev);
      if (i >= 0 && this.onTask) this.onTask(this.task[i]);
    }
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
    const plotW = rect.width - this.labelW - 4;
    const f = Math.max(0, Math.min(1, (ev.clientX - rect.left - this.labelW) / plotW));
    const at = this.v0 + f * (this.v1 - this.v0);
    const z = Math.exp(ev.deltaY * 0.0015);
    const span = Math.max(0.01, (this.v1 - this.v0) * z);
    this.v0 = at - f * span;
    this.v1 = this.v0 + span;
    this.follow = false;
    this.draw();
  }
}

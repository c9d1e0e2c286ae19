// elsewhere web view: a small charting module on <canvas>, no dependencies.
//
//   Charts.bars(canvas, {values, x0, dx, xFormat, yFormat, color, xLabel, yLabel})
//       a histogram or a series of counts: bar i covers [x0 + i*dx, x0 + (i+1)*dx)
//   Charts.lines(canvas, {x, series: {name: [y...]}, xFormat, yFormat, xLabel, yLabel, logX, logY})
//       one line per series over shared x values (null: no point there), with a legend;
//       logX, logY: that axis on a logarithmic scale (whole decades)
//   Charts.hbars(canvas, {labels, values, strong, format, color, strongColor})
//       one horizontal bar per label, its value written after it (strong[i]: drawn in strongColor);
//       sets the canvas's CSS height to fit its rows
//   Charts.niceStep(span, target)   a 1-2-5 step that cuts span into about target parts
//   Charts.fmtDuration(seconds)     "850 ms", "12.5 s", "3 min 20 s", "2 h 5 min"
//
// Each chart sizes itself to the canvas's CSS box (times devicePixelRatio) and sets
// data-points on the canvas (how many bars or points it drew).
"use strict";

const Charts = (() => {
  const INK = "#2b2f36", GRID = "#e3e6ea", MUTED = "#6b7280";
  const PALETTE = ["#3b7dd8", "#d64545", "#3a9d5d", "#e08a2e", "#8e5bd6", "#1fa3a3", "#b5892d", "#d6458f"];

  function niceStep(span, target) {
    if (!(span > 0)) return 1;
    const raw = span / Math.max(1, target);
    const mag = Math.pow(10, Math.floor(Math.log10(raw)));
    const f = raw / mag;
    return (f <= 1 ? 1 : f <= 2 ? 2 : f <= 5 ? 5 : 10) * mag;
  }

  function fmtDuration(s) {
    if (s == null || !isFinite(s)) return "";
    if (s <= 0) return "0";
    if (s < 1e-3) return `${Math.round(s * 1e6)} µs`;
    if (s < 1) return `${+(s * 1e3).toPrecision(3)} ms`;
    if (s < 60) return `${+s.toPrecision(3)} s`;
    if (s < 3600) return `${Math.floor(s / 60)} min ${Math.round(s % 60)} s`;
    if (s < 86400) return `${Math.floor(s / 3600)} h ${Math.round((s % 3600) / 60)} min`;
    return `${Math.floor(s / 86400)} d ${Math.round((s % 86400) / 3600)} h`;
  }

  function fmtNumber(v) {
    if (v === 0) return "0";
    const a = Math.abs(v);
    if (a >= 1e6) return `${+(v / 1e6).toPrecision(3)}M`;
    if (a >= 1e3) return `${+(v / 1e3).toPrecision(3)}k`;
    if (a >= 1) return `${+v.toPrecision(3)}`;
    return `${+v.toPrecision(2)}`;
  }

  // The canvas's 2D context scaled to CSS pixels, and its CSS size.
  function setup(canvas) {
    const dpr = window.devicePixelRatio || 1;
    const w = Math.max(50, canvas.clientWidth), h = Math.max(40, canvas.clientHeight);
    if (canvas.width !== Math.round(w * dpr) || canvas.height !== Math.round(h * dpr)) {
      canvas.width = Math.round(w * dpr);
      canvas.height = Math.round(h * dpr);
    }
    const ctx = canvas.getContext("2d");
    ctx.setTransform(dpr, 0, 0, dpr, 0, 0);
    ctx.clearRect(0, 0, w, h);
    ctx.font = "11px system-ui, sans-serif";
    return { ctx, w, h };
  }

  function empty(canvas, text) {
    const { ctx, w, h } = setup(canvas);
    ctx.fillStyle = MUTED;
    ctx.textAlign = "center";
    ctx.fillText(text, w / 2, h / 2);
    canvas.dataset.points = "0";
  }

  // The y axis (yMin, default 0, to yMax, nice ticks; whole decades for a log scale, its
  // values given as log10) and its grid; returns the y scale.
  function yAxis(ctx, box, yMax, yFormat, yMin, log) {
    const lo = yMin || 0;
    const step = log ? Math.max(1, Math.ceil((yMax - lo) / 4)) : niceStep(yMax - lo, 4);
    const top = Math.max(lo + step, lo + Math.ceil((yMax - lo) / step) * step);
    const sy = (v) => box.y + box.h - ((v - lo) / (top - lo)) * box.h;
    const label = log ? (v) => (yFormat || fmtNumber)(Math.pow(10, v)) : yFormat || fmtNumber;
    ctx.textAlign = "right";
    ctx.textBaseline = "middle";
    for (let v = lo; v <= top + step / 2; v += step) {
      const y = Math.round(sy(v)) + 0.5;
      ctx.strokeStyle = GRID;
      ctx.beginPath();
      ctx.moveTo(box.x, y);
      ctx.lineTo(box.x + box.w, y);
      ctx.stroke();
      ctx.fillStyle = MUTED;
      ctx.fillText(label(v), box.x - 4, y);
    }
    return sy;
  }

  // The x axis under box from x0 to x1 (nice ticks; whole ones where whole: a log scale's
  // decades); returns the x scale.
  function xAxis(ctx, box, x0, x1, xFormat, whole) {
    const sx = (v) => box.x + ((v - x0) / (x1 - x0 || 1)) * box.w;
    const step = whole ? Math.max(1, niceStep(x1 - x0, Math.max(2, Math.floor(box.w / 90)))) : niceStep(x1 - x0, Math.max(2, Math.floor(box.w / 90)));
    ctx.textAlign = "center";
    ctx.textBaseline = "top";
    ctx.fillStyle = MUTED;
    for (let v = Math.ceil(x0 / step) * step; v <= x1 + step * 1e-9; v += step) {
      const x = Math.round(sx(v)) + 0.5;
      ctx.strokeStyle = INK;
      ctx.beginPath();
      ctx.moveTo(x, box.y + box.h);
      ctx.lineTo(x, box.y + box.h + 3);
      ctx.stroke();
      ctx.fillText((xFormat || fmtNumber)(v), x, box.y + box.h + 5);
    }
    return sx;
  }

  function labels(ctx, w, h, xLabel, yLabel) {
    ctx.fillStyle = MUTED;
    if (xLabel) {
      ctx.textAlign = "right";
      ctx.textBaseline = "top";
      ctx.fillText(`→ ${xLabel}`, w - 4, 2);
    }
    if (yLabel) {
      ctx.textAlign = "left";
      ctx.textBaseline = "top";
      ctx.fillText(yLabel, 4, 2);
    }
  }

  function bars(canvas, o) {
    const values = o.values || [];
    if (!values.length) return empty(canvas, o.emptyText || "no data yet");
    const { ctx, w, h } = setup(canvas);
    const box = { x: 46, y: 16, w: w - 56, h: h - 38 };
    const yMax = Math.max(...values, 0) || 1;
    const sy = yAxis(ctx, box, yMax, o.yFormat);
    xAxis(ctx, box, o.x0, o.x0 + values.length * o.dx, o.xFormat);
    const bw = box.w / values.length;
    ctx.fillStyle = o.color || PALETTE[0];
    let drawn = 0;
    for (let i = 0; i < values.length; i++) {
      if (!values[i]) continue;
      const x = box.x + i * bw, y = sy(values[i]);
      ctx.fillRect(x + (bw > 3 ? 0.5 : 0), y, Math.max(1, bw - (bw > 3 ? 1 : 0)), box.y + box.h - y);
      drawn++;
    }
    ctx.strokeStyle = INK;
    ctx.beginPath();
    ctx.moveTo(box.x, box.y + box.h + 0.5);
    ctx.lineTo(box.x + box.w, box.y + box.h + 0.5);
    ctx.stroke();
    labels(ctx, w, h, o.xLabel, o.yLabel);
    canvas.dataset.points = String(drawn);
  }

  function lines(canvas, o) {
    const x = (o.x || []).map((v) => (o.logX ? Math.log10(v) : v));
    const names = Object.keys(o.series || {});
    if (x.length < 1 || !names.length) return empty(canvas, o.emptyText || "no data yet");
    const { ctx, w, h } = setup(canvas);
    const legendW = Math.min(220, Math.max(...names.map((n) => ctx.measureText(n).width)) + 24);
    const ty = o.logY ? (v) => (v > 0 ? Math.log10(v) : null) : (v) => v;
    let yMax = o.logY ? -Infinity : 0, yMin = Infinity;
    for (const n of names) {
      for (const v of o.series[n]) {
        if (v == null || ty(v) == null) continue;
        yMax = Math.max(yMax, ty(v));
        yMin = Math.min(yMin, ty(v));
      }
    }
    if (o.logY && !(yMax > -Infinity)) return empty(canvas, o.emptyText || "no data yet");
    const widest = ctx.measureText((o.yFormat || fmtNumber)(o.logY ? Math.pow(10, Math.ceil(yMax)) : yMax * 1.25)).width;
    const left = Math.max(46, Math.ceil(widest) + 8);
    const box = { x: left, y: 16, w: w - left - 10 - legendW, h: h - 38 };
    const sy = o.logY ? yAxis(ctx, box, Math.ceil(yMax), o.yFormat, Math.floor(yMin), true) : yAxis(ctx, box, yMax || 1, o.yFormat);
    const x0 = x[0], x1 = x.length > 1 ? x[x.length - 1] : x[0] + 1;
    const xf = o.logX ? (v) => (o.xFormat || fmtNumber)(Math.pow(10, v)) : o.xFormat;
    const sx = xAxis(ctx, box, x0, x1, xf, o.logX);
    let points = 0;
    names.forEach((n, k) => {
      const ys = o.series[n];
      ctx.strokeStyle = PALETTE[k % PALETTE.length];
      ctx.fillStyle = ctx.strokeStyle;
      ctx.lineWidth = 1.5;
      ctx.beginPath();
      let pen = false;
      for (let i = 0; i < x.length; i++) {
        const yv = ys[i] == null ? null : ty(ys[i]);
        if (yv == null) { pen = false; continue; }
        const px = sx(x[i]), py = sy(yv);
        if (pen) ctx.lineTo(px, py);
        else ctx.moveTo(px, py);
        if (o.logX || o.logY) ctx.fillRect(px - 2, py - 2, 4, 4);
        pen = true;
        points++;
      }
      ctx.stroke();
      ctx.fillStyle = ctx.strokeStyle;
      ctx.fillRect(w - legendW + 4, 18 + k * 16, 10, 10);
      ctx.fillStyle = INK;
      ctx.textAlign = "left";
      ctx.textBaseline = "top";
      ctx.fillText(n, w - legendW + 18, 17 + k * 16);
    });
    ctx.lineWidth = 1;
    labels(ctx, w, h, o.xLabel, o.yLabel);
    canvas.dataset.points = String(points);
  }

  function hbars(canvas, o) {
    const labels = o.labels || [], values = o.values || [];
    const rowH = 22;
    canvas.style.height = `${Math.max(40, labels.length * rowH + 12)}px`;
    if (!labels.length) return empty(canvas, o.emptyText || "no data");
    const { ctx, w } = setup(canvas);
    const fmt = o.format || fmtNumber;
    const labelW = Math.min(w * 0.45, Math.max(...labels.map((t) => ctx.measureText(t).width)) + 12);
    const valueW = Math.max(...values.map((v) => ctx.measureText(fmt(v)).width)) + 10;
    const barW = Math.max(10, w - labelW - valueW - 8);
    const top = Math.max(...values, 0) || 1;
    let drawn = 0;
    ctx.textBaseline = "middle";
    labels.forEach((label, i) => {
      const y = 6 + i * rowH, v = values[i];
      ctx.fillStyle = o.strong && o.strong[i] ? INK : MUTED;
      ctx.textAlign = "right";
      ctx.font = `${o.strong && o.strong[i] ? "600 " : ""}11px system-ui, sans-serif`;
      ctx.fillText(label, labelW - 8, y + rowH / 2 - 2, labelW - 10);
      if (!(v >= 0)) return;
      const bw = Math.max(1, (v / top) * barW);
      ctx.fillStyle = o.strong && o.strong[i] ? o.strongColor || PALETTE[0] : o.color || "#b8c2d0";
      ctx.fillRect(labelW, y + 3, bw, rowH - 10);
      ctx.fillStyle = INK;
      ctx.textAlign = "left";
      ctx.font = "11px system-ui, sans-serif";
      ctx.fillText(fmt(v), labelW + bw + 5, y + rowH / 2 - 2);
      drawn++;
    });
    canvas.dataset.points = String(drawn);
  }

  return { bars, hbars, lines, niceStep, fmtDuration, fmtNumber, PALETTE };
})();

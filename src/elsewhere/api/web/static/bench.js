// elsewhere web view: the benchmark figures (#/bench, #/bench/NAME): bench/figures/*.json of a
// source checkout as the server finds them (benchfigures.py), one benchmark script at a time:
// its runs, and per measurement a table (each system's figure, elsewhere's lead over it) and a
// chart (charts.js: bars per system, or lines over the job's size). The helpers (el, api, ...)
// are app.js's.
"use strict";

// A figure in its unit, as bench/report.py writes it in bench/README.md.
function fmtFigure(v, unit) {
  if (unit === "s") {
    if (v < 1e-3) return `${(v * 1e6).toFixed(0)} µs`;
    if (v < 1) return v < 0.1 ? `${(v * 1e3).toFixed(1)} ms` : `${(v * 1e3).toFixed(0)} ms`;
    return `${v.toFixed(2)} s`;
  }
  if (unit === "tasks/s") return v >= 1e6 ? `${(v / 1e6).toFixed(2)}M/s` : v >= 1e3 ? `${(v / 1e3).toFixed(1)}k/s` : `${v.toFixed(1)}/s`;
  if (unit === "MB" || unit === "MB/s" || unit === "B") return `${v.toFixed(0)} ${unit}`;
  if (unit === "GB/s") return `${v.toFixed(2)} GB/s`;
  if (unit === "%") return `${v < 10 ? v.toFixed(1) : v.toFixed(0)}%`;
  if (unit === "x") return v.toFixed(3);
  return unit ? `${+v.toPrecision(6)} ${unit}` : `${+v.toPrecision(6)}`;
}

const fmtRatio = (r) => `${r < 10 ? r.toFixed(2) : r < 100 ? r.toFixed(1) : r.toFixed(0)}x`;

class BenchView {
  constructor(root, name) {
    this.name = name;
    this.card = el("section", { class: "card", id: "bench" }, el("h2", { text: "Benchmarks" }),
      el("p", { class: "muted", id: "bench-note", text: "reading the figures…" }));
    this.body = el("div", { id: "bench-body" });
    root.append(this.card, this.body);
    document.title = "benchmarks · elsewhere";
    api("api/bench").then((r) => this.show(r));
    connect({});
  }

  close() {}

  show(r) {
    const note = $("#bench-note");
    if (!r.ok) { note.textContent = (r.data && r.data.error) || r.text; return; }
    const d = r.data;
    note.textContent = d.message;
    this.card.dataset.found = d.found ? "1" : "0";
    if (d.problems && d.problems.length) {
      this.card.append(el("div", { class: "note", id: "bench-problems" }, `not read: ${d.problems.join("; ")}`));
    }
    if (!d.found) {
      this.card.append(el("div", { id: "bench-none" },
        el("p", { text: "The benchmark scripts of a source checkout (bench/*.py) write their figures to bench/figures/*.json; " +
          "this view shows them where it finds them. It looked at:" }),
        el("ul", {}, (d.searched || []).map((s) => el("li", {}, el("code", { text: s })))),
        el("p", {}, "Start it with ", el("code", { text: "elsewhere web --bench-figures DIR" }), " or set ",
          el("code", { text: "ELSEWHERE_BENCH_FIGURES" }), " to show a folder of them.")));
      return;
    }
    const names = d.benches.map((b) => b.bench);
    const pick = names.includes(this.name) ? this.name : names[0];
    this.card.append(el("nav", { class: "tabs", id: "bench-tabs" }, names.map((n) =>
      el("a", { href: `#/bench/${encodeURIComponent(n)}`, "data-bench": n, "data-active": n === pick ? "1" : "" }, n))));
    this.render(d.benches.find((b) => b.bench === pick));
  }

  render(b) {
    const runs = el("ul", { class: "runs small" }, b.runs.map((run) => {
      const load = run.load && run.load.length ? `, load ${run.load.map((x) => x.toFixed(1)).join(" to ")}` : "";
      return el("li", {}, el("code", { text: run.command || run.file }),
        `: ${run.date || "?"} ${run.time || ""}, ${run.cores || "?"} cores${load}`,
        run.carried ? el("span", { class: "muted", text: ` (carried over: ${run.why || "not measured again"})` }) : null);
    }));
    const cards = b.measurements.map((m) => this.measurement(m));
    this.body.replaceChildren(
      el("section", { class: "card", "data-bench": b.bench }, el("h2", {}, `bench/${b.bench}.py `,
        el("small", { class: "muted", text: `${b.measurements.length} measurements` })), el("h3", { text: "Measured with" }), runs),
      el("div", { class: "grid2" }, cards.map(([card]) => card)));
    for (const [, canvas, draw] of cards) if (canvas) draw(canvas);
  }

  // A measurement's card: its table, and the function that draws its chart into its canvas.
  measurement(m) {
    const figs = m.figures.slice().sort((a, b) => (b.elsewhere ? 1 : 0) - (a.elsewhere ? 1 : 0));
    const sized = figs.some((f) => f.tasks != null);
    const when = (f) => `${f.date || ""}${f.carried ? ", carried over" : ""}`;
    let head, rows;
    if (sized) { // one row per job size, one column per system (elsewhere's lead in brackets)
      const systems = [...new Set(figs.map((f) => f.system))];
      const sizes = [...new Set(figs.map((f) => f.tasks))].sort((a, b) => a - b);
      head = el("tr", {}, el("th", { text: "tasks" }), systems.map((s) => el("th", { text: s })), el("th", { text: "date" }));
      rows = sizes.map((n) => el("tr", { "data-tasks": n }, el("td", { text: Charts.fmtNumber(n) }), systems.map((s) => {
        const f = figs.find((x) => x.system === s && x.tasks === n);
        const lead = f && !f.elsewhere && f.ratio != null ? ` (${fmtRatio(f.ratio)})` : "";
        return el("td", { class: `num${f && f.elsewhere ? " ours" : ""}`, text: f ? fmtFigure(f.value, m.unit) + lead : "" });
      }), el("td", { class: "muted date", text: [...new Set(figs.filter((f) => f.tasks === n).map(when))].join(", ") })));
    } else {
      head = el("tr", {}, el("th", { text: "system" }), el("th", { text: m.unit ? `figure (${m.unit}, ${m.better} is better)` : "figure" }),
        el("th", { text: "elsewhere's lead" }), el("th", { text: "date" }));
      rows = figs.map((f) => {
        let lead = "";
        if (f.ratio != null) lead = f.elsewhere ? `${fmtRatio(f.ratio)} over ${f.against}` : fmtRatio(f.ratio);
        return el("tr", { "data-system": f.system, class: f.elsewhere ? "ours" : "" },
          el("td", { text: f.system }), el("td", { class: "num", text: fmtFigure(f.value, m.unit) }),
          el("td", { class: "num", text: lead }), el("td", { class: "muted date", text: when(f) }));
      });
    }
    const canvas = figs.length > 1 ? el("canvas", { class: "plot bench-chart" }) : null;
    const card = el("div", { class: "measure", "data-measure": m.name },
      el("h3", { text: m.name }),
      el("div", { class: "scroll" }, el("table", { class: "grid bench" }, el("thead", {}, head), el("tbody", {}, rows))),
      canvas);
    const fmt = (v) => fmtFigure(v, m.unit);
    const draw = (c) => {
      if (sized) { // one line per system over the job's size
        c.style.height = "220px";
        const xs = [...new Set(figs.filter((f) => f.tasks != null).map((f) => f.tasks))].sort((a, b) => a - b);
        const series = {};
        for (const f of figs) {
          if (f.tasks == null) continue;
          const name = f.elsewhere ? `elsewhere ${f.system}` : f.system;
          (series[name] = series[name] || new Array(xs.length).fill(null))[xs.indexOf(f.tasks)] = f.value;
        }
        Charts.lines(c, { x: xs, series, logX: true, logY: true, yFormat: fmt, xLabel: "tasks (log scale)", yLabel: `${m.unit} (log scale)` });
      } else {
        Charts.hbars(c, { labels: figs.map((f) => f.system), values: figs.map((f) => f.value), strong: figs.map((f) => f.elsewhere),
          format: fmt, strongColor: "#3b5bdb" });
      }
    };
    return [card, canvas, draw];
  }
}

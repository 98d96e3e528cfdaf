/* tracewhy HTML report: renders the JSON report embedded in this page.
   Every string from the trace goes into the page through textContent, never as HTML. */
(function () {
  "use strict";
  var data = JSON.parse(document.getElementById("report-data").textContent);
  var CLASS_COLORS = {
    input: "#e6550d", sync: "#d62728", launch: "#9467bd", host: "#8c564b", allocator: "#e377c2",
    comm: "#17becf", graph: "#bcbd22", dependency: "#7f7f7f", other: "#b8b8b8"
  };
  var DEVICE_COLORS = ["#1f77b4", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#17becf", "#bcbd22"];

  function el(tag, cls, text) {
    var e = document.createElement(tag);
    if (cls) { e.className = cls; }
    if (text !== undefined && text !== null) { e.textContent = String(text); }
    return e;
  }
  function show(id) { document.getElementById(id).hidden = false; }
  function byId(id) { return document.getElementById(id); }
  function fmtNs(ns) {
    if (ns === null || ns === undefined) { return "-"; }
    var a = Math.abs(ns);
    if (a >= 1e9) { return (ns / 1e9).toFixed(3) + " s"; }
    if (a >= 1e6) { return (ns / 1e6).toFixed(3) + " ms"; }
    if (a >= 1e3) { return (ns / 1e3).toFixed(1) + " µs"; }
    return Math.round(ns) + " ns";
  }
  function fmtPct(x) { return (x === null || x === undefined) ? "-" : (100 * x).toFixed(1) + "%"; }
  function fmtNum(x) { return (x === null || x === undefined) ? "-" : (Number.isInteger(x) ? String(x) : x.toFixed(2)); }
  function fmtSci(x) { return (x === null || x === undefined) ? "-" : Number(x).toPrecision(3); }
  function width(id) { return Math.max(480, Math.min(1230, byId(id).clientWidth || 900)); }

  /* A table whose columns sort on click. columns: [{key, label, fmt, text}] */
  function sortableTable(columns, rows) {
    var wrap = el("div", "scroll"), table = el("table"), thead = el("thead"), tbody = el("tbody");
    var tr = el("tr"), state = { key: null, desc: true };
    columns.forEach(function (c) {
      var th = el("th", c.text ? "text" : "", c.label);
      th.addEventListener("click", function () {
        state.desc = state.key === c.key ? !state.desc : !c.text;
        state.key = c.key;
        Array.prototype.forEach.call(tr.children, function (h) { h.classList.remove("sorted-asc", "sorted-desc"); });
        th.classList.add(state.desc ? "sorted-desc" : "sorted-asc");
        rows = rows.slice().sort(function (a, b) {
          var x = a[c.key], y = b[c.key];
          if (x === y) { return 0; }
          if (x === null || x === undefined) { return 1; }
          if (y === null || y === undefined) { return -1; }
          var r = (typeof x === "number" && typeof y === "number") ? x - y : String(x).localeCompare(String(y));
          return state.desc ? -r : r;
        });
        fill();
      });
      tr.appendChild(th);
    });
    thead.appendChild(tr);
    function fill() {
      while (tbody.firstChild) { tbody.removeChild(tbody.firstChild); }
      rows.forEach(function (row) {
        var r = el("tr");
        columns.forEach(function (c) {
          var v = row[c.key], shown = c.fmt ? c.fmt(v) : (v === null || v === undefined ? "-" : String(v));
          var td = el("td", c.text ? "text" : "", shown.length > 160 ? shown.slice(0, 159) + "…" : shown);
          if (shown.length > 160) { td.title = shown; }
          r.appendChild(td);
        });
        tbody.appendChild(r);
      });
    }
    fill();
    table.appendChild(thead);
    table.appendChild(tbody);
    wrap.appendChild(table);
    return wrap;
  }

  function header() {
    var t = data.trace, lines = [t.path + "  (" + t.format + ")"];
    if (t.devices && t.devices.length) {
      var counts = {}, order = [];
      t.devices.forEach(function (d) { if (!(d in counts)) { counts[d] = 0; order.push(d); } counts[d] += 1; });
      lines.push("devices: " + order.map(function (d) { return counts[d] > 1 ? counts[d] + " x " + d : d; }).join(", "));
    }
    if (t.rank !== null && t.rank !== undefined) { lines.push("rank " + t.rank + " of " + t.world_size); }
    if (data.ranks && data.ranks.straggler !== null && data.ranks.straggler !== undefined) {
      lines.push("straggler: rank " + data.ranks.straggler);
    }
    if (data.steps && data.steps.stats) {
      var s = data.steps.stats;
      lines.push(s.count + " steady steps: p50 " + fmtNs(s.p50_ns) + ", p90 " + fmtNs(s.p90_ns) + ", p99 " + fmtNs(s.p99_ns));
    }
    (t.warnings || []).forEach(function (w) { lines.push("warning: " + w); });
    byId("trace-info").textContent = lines.join("\n");
    byId("footer").textContent = "tracewhy " + data.tool_version + ", JSON schema " + data.json_schema +
      ". Self-contained: no network access.";
  }

  function findings() {
    if (!data.findings || !data.findings.length) { return; }
    var list = byId("findings-list");
    data.findings.forEach(function (f) {
      var li = el("li"), head = el("div");
      head.appendChild(el("span", "sev sev-" + f.severity, f.severity));
      head.appendChild(el("span", "code", f.code));
      if (f.recoverable_ns_per_step) {
        head.appendChild(el("span", "recover", "  ~" + fmtNs(f.recoverable_ns_per_step) + " " + (data.recoverable_unit || "per step") + " recoverable"));
      }
      li.appendChild(head);
      li.appendChild(el("div", "", f.statement));
      li.appendChild(el("div", "next", "next: " + f.next_step));
      list.appendChild(li);
    });
    show("findings");
  }

  function stepsChart() {
    var st = data.steps;
    if (!st || !st.rows || !st.rows.length) { return; }
    show("steps");
    var xs = [], steady = [], warm = [], p50 = [], p90 = [], p99 = [], s = st.stats;
    st.rows.forEach(function (r, i) {
      xs.push(i + 1);
      steady.push(r.steady ? r.dur_ns / 1e6 : null);
      warm.push(r.steady ? null : r.dur_ns / 1e6);
      p50.push(s ? s.p50_ns / 1e6 : null);
      p90.push(s ? s.p90_ns / 1e6 : null);
      p99.push(s ? s.p99_ns / 1e6 : null);
    });
    byId("steps-note").textContent = st.marker + " steps; the first " + st.warmup +
      " excluded as warm-up; lines: steady-window p50, p90, p99." + (st.note ? " " + st.note : "");
    var opts = {
      width: width("steps-chart"), height: 260,
      scales: { x: { time: false } },
      axes: [{ label: "step", incrs: [1, 2, 5, 10, 20, 50, 100, 200, 500, 1000] }, { label: "ms" }],
      series: [
        { label: "step" },
        { label: "steady (ms)", stroke: "#1f77b4", width: 1.5, points: { show: true, size: 6 } },
        { label: "warm-up (ms)", stroke: "#b8b8b8", width: 1, points: { show: true, size: 6 } },
        { label: "p50", stroke: "#2ca02c", dash: [6, 4] },
        { label: "p90", stroke: "#ff7f0e", dash: [6, 4] },
        { label: "p99", stroke: "#d62728", dash: [6, 4] }
      ]
    };
    new uPlot(opts, [xs, steady, warm, p50, p90, p99], byId("steps-chart"));
  }

  function utilizationChart() {
    var u = data.utilization;
    if (!u || !u.series || !u.series.length) { return; }
    show("utilization");
    var devices = [], byDev = {};
    u.series.forEach(function (r) {
      if (!(r.device in byDev)) { byDev[r.device] = []; devices.push(r.device); }
      byDev[r.device].push(r);
    });
    var t0 = u.t0_ns, xs = byDev[devices[0]].map(function (r) { return (r.start_ns - t0) / 1e6; });
    var columns = [xs], series = [{ label: "ms" }];
    devices.forEach(function (d, i) {
      var rows = byDev[d];
      columns.push(xs.map(function (_, k) { return rows[k] ? 100 * rows[k].busy_share : null; }));
      series.push({ label: "GPU " + d + " busy %", stroke: DEVICE_COLORS[i % DEVICE_COLORS.length], width: 1.5 });
    });
    var gaps = (data.gaps && data.gaps.timeline) || [];
    var legend = byId("gap-legend"), used = {};
    gaps.forEach(function (g) { used[g.gap_class] = true; });
    Object.keys(CLASS_COLORS).forEach(function (c) {
      if (!used[c]) { return; }
      var span = el("span"), swatch = el("i");
      swatch.style.background = CLASS_COLORS[c];
      span.appendChild(swatch);
      span.appendChild(document.createTextNode(c));
      legend.appendChild(span);
    });
    function drawGaps(plot) {
      var ctx = plot.ctx, top = plot.bbox.top, h = plot.bbox.height;
      ctx.save();
      ctx.globalAlpha = 0.35;
      gaps.forEach(function (g) {
        var a = plot.valToPos((g.start_ns - t0) / 1e6, "x", true);
        var b = plot.valToPos((g.start_ns + g.dur_ns - t0) / 1e6, "x", true);
        ctx.fillStyle = CLASS_COLORS[g.gap_class] || CLASS_COLORS.other;
        ctx.fillRect(a, top, Math.max(1, b - a), h);
      });
      ctx.restore();
    }
    new uPlot({
      width: width("utilization-chart"), height: 280,
      scales: { x: { time: false }, y: { range: [0, 100] } },
      axes: [{ label: "ms since the first GPU activity" }, { label: "busy %" }],
      series: series,
      hooks: { drawClear: [drawGaps] }
    }, columns, byId("utilization-chart"));
  }

  var LEDGER_COLORS = {
    parameters: "#1f77b4", optimizer_state: "#2ca02c", inputs: "#8c564b", temporaries: "#d62728",
    activations: "#ff7f0e", gradients: "#9467bd", autograd_detail: "#e377c2", unknown: "#7f7f7f",
    comm_buckets: "#17becf", kv_cache: "#bcbd22", preexisting: "#b8b8b8"
  };
  function fmtBytes(n) {
    if (n === null || n === undefined) { return "-"; }
    var a = Math.abs(n), units = [["GiB", 1073741824], ["MiB", 1048576], ["KiB", 1024]];
    for (var i = 0; i < units.length; i++) {
      if (a >= units[i][1]) { return (n / units[i][1]).toFixed(1) + " " + units[i][0]; }
    }
    return Math.round(n) + " B";
  }
  function memoryAxis(label) {
    return { label: label, size: 80, values: function (u, v) { return v.map(function (x) { return fmtBytes(x); }); } };
  }
  /* Steps shaded (steady darker than warm-up) and the peak as a red line. */
  function memoryHooks(m, peakMs) {
    return function (plot) {
      var ctx = plot.ctx, top = plot.bbox.top, h = plot.bbox.height;
      ctx.save();
      (m.steps || []).forEach(function (s, i) {
        var a = plot.valToPos((s.start_ns - m.t0_ns) / 1e6, "x", true);
        var b = plot.valToPos((s.end_ns - m.t0_ns) / 1e6, "x", true);
        ctx.fillStyle = s.steady ? (i % 2 ? "#e3e8f0" : "#eef1f6") : "#f6f1e7";
        ctx.fillRect(a, top, Math.max(1, b - a), h);
      });
      if (peakMs !== null && peakMs !== undefined) {
        var x = plot.valToPos(peakMs, "x", true);
        ctx.strokeStyle = "#d62728";
        ctx.lineWidth = 2;
        ctx.setLineDash([5, 3]);
        ctx.beginPath(); ctx.moveTo(x, top); ctx.lineTo(x, top + h); ctx.stroke();
      }
      ctx.restore();
    };
  }
  function ledgerRows(device, ledger, peak) {
    return Object.keys(ledger).filter(function (k) { return ledger[k] > 0; }).map(function (k) {
      return { device: device, category: k, bytes: ledger[k], share: peak ? ledger[k] / peak : null };
    });
  }
  function memoryTimelineChart(m) {
    var ms = m.series.ts_ns.map(function (t) { return (t - m.t0_ns) / 1e6; });
    var cats = m.categories.slice(), cum = ms.map(function () { return 0; }), stacked = [];
    cats.forEach(function (c) {
      cum = cum.map(function (v, k) { return v + m.series[c][k]; });
      stacked.push(cum);
    });
    /* Drawn from the top of the stack down: each band paints over the one below it. */
    var columns = [ms], series = [{ label: "ms" }];
    for (var i = cats.length - 1; i >= 0; i--) {
      columns.push(stacked[i]);
      series.push({ label: cats[i], stroke: LEDGER_COLORS[cats[i]] || "#7f7f7f", fill: LEDGER_COLORS[cats[i]] || "#7f7f7f",
                    width: 1, value: (function (c) { return function (u, v, si, k) { return k === null ? "-" : fmtBytes(m.series[c][k]); }; }(cats[i])) });
    }
    var box = el("div", "chart");
    byId("memory-charts").appendChild(box);
    var peakMs = m.peak_ts_ns === null ? null : (m.peak_ts_ns - m.t0_ns) / 1e6;
    new uPlot({
      width: width("memory-charts"), height: 300, scales: { x: { time: false } },
      axes: [{ label: "ms since the first instant" }, memoryAxis("live bytes")],
      series: series, hooks: { drawClear: [memoryHooks(m, peakMs)] }
    }, columns, box);
    byId("memory-note").textContent = "Memory-timeline export, the profiler's own categories stacked; peak " +
      fmtBytes(m.peak_total_bytes) + " (red line).";
    return ledgerRows("", m.ledger_at_peak, m.peak_total_bytes);
  }
  function memoryDeviceChart(m, d, i) {
    var ms = d.series.ts_ns.map(function (t) { return (t - m.t0_ns) / 1e6; });
    var box = el("div", "chart"), title = el("div", "note", d.device + ": peak " + fmtBytes(d.peak_allocated_bytes) +
      " allocated" + (d.reserved_at_peak_bytes ? " (" + fmtBytes(d.reserved_at_peak_bytes) + " reserved)" : "") +
      (d.peak_step ? " in " + d.peak_step : "") + (d.peak_op ? " during " + d.peak_op : ""));
    byId("memory-charts").appendChild(title);
    byId("memory-charts").appendChild(box);
    var color = DEVICE_COLORS[i % DEVICE_COLORS.length];
    new uPlot({
      width: width("memory-charts"), height: 260, scales: { x: { time: false } },
      axes: [{ label: "ms since the trace start" }, memoryAxis("bytes")],
      series: [{ label: "ms" },
               { label: "allocated", stroke: color, width: 1.5, value: function (u, v) { return fmtBytes(v); } },
               { label: "reserved", stroke: "#7f7f7f", width: 1, dash: [4, 3], value: function (u, v) { return fmtBytes(v); } }],
      hooks: { drawClear: [memoryHooks(m, (d.peak_ts_ns - m.t0_ns) / 1e6)] }
    }, [ms, d.series.allocated, d.series.reserved], box);
    return ledgerRows(d.device, d.ledger, d.peak_allocated_bytes);
  }
  function memorySection() {
    var m = data.memory;
    if (!m) { return; }
    show("memory");
    var rows = [];
    if (m.source === "memory_timeline") {
      rows = memoryTimelineChart(m);
    } else {
      byId("memory-note").textContent = "Allocated (line) and reserved (dashed) per device, from the [memory] events; " +
        "steps shaded (warm-up in beige), the allocation peak as a red line. Ledger " + m.ledger_source + ".";
      m.devices.forEach(function (d, i) { rows = rows.concat(memoryDeviceChart(m, d, i)); });
    }
    rows.sort(function (a, b) { return b.bytes - a.bytes; });
    var columns = m.source === "memory_timeline" ? [] : [{ key: "device", label: "device", text: true }];
    byId("memory-ledger").appendChild(sortableTable(columns.concat([
      { key: "category", label: "category", text: true },
      { key: "bytes", label: "bytes", fmt: fmtBytes },
      { key: "share", label: "share of the peak", fmt: fmtPct }
    ]), rows));
  }

  function gapsTable() {
    var g = data.gaps;
    if (!g || !g.top || !g.top.length) { return; }
    show("gaps");
    byId("gaps-table").appendChild(sortableTable([
      { key: "device", label: "GPU" },
      { key: "start_ms", label: "start (ms)", fmt: fmtNum },
      { key: "dur_ns", label: "idle", fmt: fmtNs },
      { key: "gap_class", label: "class", text: true },
      { key: "host_innermost", label: "host was in", text: true },
      { key: "host_op", label: "op", text: true },
      { key: "host_annotation", label: "annotation", text: true },
      { key: "host_python", label: "Python", text: true },
      { key: "next_activity", label: "next on GPU", text: true }
    ], g.top));
  }

  function overlapTable() {
    var o = data.overlap;
    if (!o || !o.rows || !o.rows.length) { return; }
    show("overlap");
    byId("overlap-table").appendChild(sortableTable([
      { key: "device", label: "GPU" },
      { key: "window_ns", label: o.per_step ? "step" : "span", fmt: fmtNs },
      { key: "compute_ns", label: "compute", fmt: fmtNs },
      { key: "comm_ns", label: "communication", fmt: fmtNs },
      { key: "comm_hidden_ns", label: "comm hidden", fmt: fmtNs },
      { key: "comm_exposed_ns", label: "comm exposed", fmt: fmtNs },
      { key: "copy_exposed_ns", label: "copies exposed", fmt: fmtNs },
      { key: "idle_ns", label: "idle", fmt: fmtNs }
    ], o.rows));
  }

  function blocksTable() {
    var b = data.blocks;
    if (!b || !b.length) { return; }
    show("blocks");
    byId("blocks-table").appendChild(sortableTable([
      { key: "name", label: "block", text: true },
      { key: "instances", label: "instances" },
      { key: "cpu_ns_per_step", label: "CPU / step", fmt: fmtNs },
      { key: "gpu_time_ns_per_step", label: "GPU / step", fmt: fmtNs },
      { key: "gpu_share", label: "GPU share", fmt: fmtPct },
      { key: "synced_instances", label: "ended by a sync" }
    ], b));
  }

  /* torch.compile: regions, breaks, recompiles and compile time per step; where the breaks are. */
  function compileSection() {
    var c = data.compile;
    if (!c || !c.steps) { return; }
    show("compile");
    byId("compile-note").textContent = "graph breaks per step " + fmtNum(c.graph_breaks_per_step) +
      " · compiled regions per step " + fmtNum(c.regions_per_step) + " · recompiles " + c.recompiles +
      " (" + c.steady_recompiles + " in steady steps) · compile time " + fmtNs(c.compile_ns) +
      (c.cold_start_ns ? " · cold start " + fmtNs(c.cold_start_ns) + " in " + c.cold_start_step + " (" +
        fmtPct(c.cold_start_share) + " of the capture)" : "");
    var target = byId("compile-tables");
    target.appendChild(sortableTable([
      { key: "step", label: "step", text: true },
      { key: "steady", label: "steady", fmt: function (v) { return v ? "yes" : "no"; } },
      { key: "regions", label: "regions" },
      { key: "graph_breaks", label: "graph breaks" },
      { key: "recompiles", label: "recompiles" },
      { key: "compile_ns", label: "compile", fmt: fmtNs },
      { key: "eager_ns_between_regions", label: "eager between regions", fmt: fmtNs },
      { key: "graph_calls", label: "graph calls" },
      { key: "kernels", label: "kernels" },
      { key: "graph_launches", label: "CUDA graph launches" }
    ], c.steps));
    if (c.break_locations && c.break_locations.length) {
      target.appendChild(el("h3", "", "Graph breaks (resume functions)"));
      target.appendChild(sortableTable([
        { key: "location", label: "break at", text: true },
        { key: "function", label: "in", text: true },
        { key: "calls", label: "calls" },
        { key: "steps", label: "steps" }
      ], c.break_locations));
    }
    if (c.recompile_list && c.recompile_list.length) {
      target.appendChild(el("h3", "", "Recompiles"));
      target.appendChild(sortableTable([
        { key: "region", label: "compile id", text: true },
        { key: "step", label: "step", text: true },
        { key: "steady", label: "steady", fmt: function (v) { return v ? "yes" : "no"; } },
        { key: "cost_ns", label: "cost", fmt: fmtNs }
      ], c.recompile_list));
    }
  }

  function ranksHeatmap() {
    var r = data.ranks;
    if (!r || !r.rows || !r.rows.length) { return; }
    show("ranks");
    var table = el("table", "heat"), head = el("tr");
    head.appendChild(el("th", "text", "rank"));
    r.metrics.forEach(function (m) { head.appendChild(el("th", "", m.label)); });
    table.appendChild(head);
    var lo = [], hi = [];
    r.metrics.forEach(function (m, j) {
      var vals = r.rows.map(function (row) { return row.values[j]; }).filter(function (v) { return v !== null; });
      lo.push(vals.length ? Math.min.apply(null, vals) : 0);
      hi.push(vals.length ? Math.max.apply(null, vals) : 0);
    });
    r.rows.forEach(function (row) {
      var tr = el("tr");
      tr.appendChild(el("td", "text", row.rank));
      row.values.forEach(function (v, j) {
        var td = el("td", "", v === null ? "-" : fmtNs(v));
        var t = (v === null || hi[j] === lo[j]) ? 0 : (v - lo[j]) / (hi[j] - lo[j]);
        td.style.background = "rgba(214, 39, 40, " + (0.08 + 0.6 * t).toFixed(3) + ")";
        tr.appendChild(td);
      });
      table.appendChild(tr);
    });
    byId("ranks-heatmap").appendChild(table);
  }

  function rooflineChart() {
    var r = data.roofline;
    if (!r || !r.points || !r.points.length) { return; }
    show("roofline");
    var pts = r.points.filter(function (p) { return p.ai > 0 && p.flop_per_s > 0; })
      .sort(function (a, b) { return a.ai - b.ai; });
    if (!pts.length) { return; }
    byId("roofline-note").textContent = r.note || "";
    /* Points and a dense log-spaced roof share one x axis: the roof's knee must be drawn too. */
    var pf = r.peak_flop_per_s, pb = r.peak_bytes_per_s, lo = pts[0].ai / 2, hi = pts[pts.length - 1].ai * 2;
    if (pf && pb) { lo = Math.min(lo, pf / pb / 4); hi = Math.max(hi, pf / pb * 4); }
    var rows = pts.map(function (p) { return [p.ai, p.flop_per_s, null]; });
    if (pf && pb) {
      for (var i = 0; i <= 60; i++) {
        var x = lo * Math.pow(hi / lo, i / 60);
        rows.push([x, null, Math.min(pf, x * pb)]);
      }
      rows.push([pf / pb, null, pf]);
    }
    rows.sort(function (a, b) { return a[0] - b[0]; });
    var xs = rows.map(function (q) { return q[0]; });
    var ys = rows.map(function (q) { return q[1]; });
    var roof = rows.map(function (q) { return q[2]; });
    new uPlot({
      width: width("roofline-chart"), height: 320, mode: 1,
      scales: { x: { time: false, distr: 3 }, y: { distr: 3 } },
      axes: [{ label: "arithmetic intensity (FLOP/byte)" }, { label: "FLOP/s", size: 70, values: function (u, v) { return v.map(fmtSci); } }],
      series: [
        { label: "FLOP/byte" },
        { label: "ops (achieved)", stroke: "#1f77b4", paths: function () { return null; }, points: { show: true, size: 7, fill: "#1f77b4" } },
        { label: "roof", stroke: "#d62728", width: 1.5, spanGaps: true, points: { show: false } }
      ]
    }, [xs, ys, roof], byId("roofline-chart"));
  }

  function verdictsTable() {
    if (!data.verdicts || !data.verdicts.length) { return; }
    show("verdicts");
    byId("verdicts-table").appendChild(sortableTable([
      { key: "name", label: "kernel", text: true },
      { key: "launches", label: "launches" },
      { key: "total_ns", label: "total", fmt: fmtNs },
      { key: "bound", label: "bound", text: true },
      { key: "roof_fraction", label: "of roof", fmt: fmtPct },
      { key: "achieved_occupancy_pct", label: "occupancy %", fmt: fmtNum },
      { key: "occupancy_limiter", label: "limiter", text: true },
      { key: "reason", label: "why", text: true }
    ], data.verdicts));
  }

  function opsTable() {
    if (!data.ops || !data.ops.length) { return; }
    show("ops");
    byId("ops-table").appendChild(sortableTable([
      { key: "name", label: "operator", text: true },
      { key: "calls", label: "calls" },
      { key: "cpu_total_ns", label: "CPU total", fmt: fmtNs },
      { key: "cpu_self_ns", label: "CPU self", fmt: fmtNs },
      { key: "gpu_total_ns", label: "GPU total", fmt: fmtNs },
      { key: "gpu_self_ns", label: "GPU self", fmt: fmtNs }
    ], data.ops));
  }

  function kernelsTable() {
    if (!data.kernels || !data.kernels.length) { return; }
    show("kernels");
    byId("kernels-table").appendChild(sortableTable([
      { key: "name", label: "kernel", text: true },
      { key: "family", label: "family", text: true },
      { key: "count", label: "count" },
      { key: "total_ns", label: "total", fmt: fmtNs },
      { key: "mean_ns", label: "mean", fmt: fmtNs },
      { key: "max_ns", label: "max", fmt: fmtNs },
      { key: "share", label: "share", fmt: fmtPct }
    ], data.kernels));
  }

  header();
  [findings, stepsChart, utilizationChart, memorySection, gapsTable, overlapTable, compileSection, blocksTable, ranksHeatmap,
   rooflineChart, verdictsTable, opsTable, kernelsTable].forEach(function (render) {
    try { render(); } catch (e) { console.error("tracewhy report: " + render.name + ": " + e); }
  });
}());

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
  function round3(x) { return String(Number(Number(x).toPrecision(3))); }
  /* A rate with an SI prefix: 1.2e15 FLOP/s reads "1.2 PFLOP/s", not "1.20e+15". */
  function fmtSI(x, unit) {
    if (x === null || x === undefined || !isFinite(x)) { return "-"; }
    var a = Math.abs(x), prefixes = [[1e15, "P"], [1e12, "T"], [1e9, "G"], [1e6, "M"], [1e3, "k"]];
    for (var i = 0; i < prefixes.length; i++) {
      if (a >= prefixes[i][0]) { return round3(x / prefixes[i][0]) + " " + prefixes[i][1] + unit; }
    }
    return round3(x) + " " + unit;
  }
  /* A log axis names its powers of ten only; uPlot asks for the ticks between them too. */
  function decades(fmt) {
    return function (v) {
      if (v === null || v === undefined || v <= 0) { return ""; }
      var e = Math.log10(v);
      return Math.abs(e - Math.round(e)) < 1e-6 ? fmt(v) : "";
    };
  }
  function commonPrefix(names) {
    if (names.length < 2) { return ""; }
    var p = names[0];
    names.forEach(function (n) { while (n.indexOf(p) !== 0) { p = p.slice(0, -1); } });
    return p.replace(/[0-9]+$/, "");
  }
  /* An axis' tick labels, also written on the chart (data-x-ticks, data-y-ticks): the canvas holds
     only pixels, and a screen reader or a test reads what the axis says there. */
  function ticks(target, axis, fmt) {
    return function (u, splits) {
      var shown = splits.map(function (v) { return fmt(v); });
      target.setAttribute("data-" + axis + "-ticks", shown.join("|"));
      return shown;
    };
  }
  /* Legends show values only while the pointer is over the chart: uPlot otherwise writes "--"
     for every series, which reads as data. */
  function legendOnHover(u) {
    var idle = u.legend.idx === null || u.legend.idx === undefined;
    u.root.classList.toggle("legend-idle", idle);
    if (idle) {  /* (the text node stays: uPlot writes the next value into it) */
      Array.prototype.forEach.call(u.root.querySelectorAll(".u-legend .u-value"), function (c) {
        if (c.firstChild) { c.firstChild.nodeValue = ""; }
      });
    }
  }
  function chart(opts, columns, target) {
    var hooks = opts.hooks || {};
    hooks.setLegend = (hooks.setLegend || []).concat([legendOnHover]);
    hooks.ready = (hooks.ready || []).concat([legendOnHover]);
    hooks.setCursor = (hooks.setCursor || []).concat([legendOnHover]);
    opts.hooks = hooks;
    /* The axis titles are drawn on the canvas too: said again where a screen reader finds them. */
    var titles = (opts.axes || []).map(function (a) { return a.label || ""; });
    target.setAttribute("role", "img");
    target.setAttribute("aria-label", "x: " + (titles[0] || "") + "; y: " + (titles[1] || ""));
    return new uPlot(opts, columns, target);
  }

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
      if (f.predicted_step_ns !== null && f.predicted_step_ns !== undefined && f.recoverable_ns_per_step) {
        var r = data.replayed, subset = r && r.steps < r.of_steps ?
          " (mean of the " + r.steps + " of " + r.of_steps + " analysed steps the fixes were replayed on)" : "";
        head.appendChild(el("span", "recover", "  step " + fmtNs(f.predicted_step_ns + f.recoverable_ns_per_step) +
          " → " + fmtNs(f.predicted_step_ns) + " with the fix (−" + fmtNs(f.recoverable_ns_per_step) + ")" + subset));
      } else if (f.recoverable_ns_per_step) {
        head.appendChild(el("span", "recover", "  ~" + fmtNs(f.recoverable_ns_per_step) + " " + (data.recoverable_unit || "per step") + " recoverable"));
      }
      li.appendChild(head);
      li.appendChild(el("div", "", f.statement));
      if (f.code === "block-attribution" && f.evidence && f.evidence.blocks && f.evidence.blocks.length) {
        li.appendChild(sortableTable([
          { key: "name", label: "block", text: true },
          { key: "gpu_time_ns_per_step", label: f.evidence.unit === "per step" ? "GPU time / step" : "GPU time", fmt: fmtNs },
          { key: "gpu_share", label: "share", fmt: fmtPct }
        ], f.evidence.blocks));
      }
      if (f.part) {
        li.appendChild(el("div", "next", "explains: " + f.part + (f.next_bottleneck ? "; next bottleneck: " + f.next_bottleneck : "")));
      }
      li.appendChild(el("div", "next", "next: " + f.next_step));
      list.appendChild(li);
    });
    show("findings");
  }

  /* Where the step goes: one stacked bar per analysed step, its parts coloured by kind (a fixed
     colour per kind), bars to the scale of the longest window; the values in a table beneath. */
  var KIND_COLORS = {
    kernels: "#1f77b4", copies: "#ff7f0e", communication: "#17becf", host: "#8c564b", data_loading: "#e6550d",
    compilation: "#bcbd22", launch_overhead: "#9467bd", sync: "#d62728", gpu_queue_gap: "#7f7f7f", idle: "#c7c7c7",
    unexplained: "#e8e8e8"
  };
  function accountSection() {
    var a = data.account;
    if (!a || !a.steps || !a.steps.length) { return; }
    show("account");
    var kindOf = {}, essential = {};
    a.parts.forEach(function (p) { kindOf[p.part] = p.kind; essential[p.part] = p.essential; });
    var words = function (k) { return k.replace(/_/g, " "); };
    byId("account-note").textContent = "Each analysed step's critical path split into parts that add up to the step " +
      "(mean " + fmtNs(a.mean_step_ns) + "), coloured by kind. " +
      a.lines.map(function (l) { return fmtPct(l.share) + " " + l.part + (l.kind === "rest" ? "" : l.essential ? " (essential)" : " (avoidable)"); }).join("; ") +
      "." + (a.note ? " Note: " + a.note : "");
    var used = {};
    a.parts.forEach(function (p) { used[p.kind] = true; });
    var legend = byId("account-legend");
    Object.keys(KIND_COLORS).forEach(function (k) {
      if (!used[k]) { return; }
      var span = el("span"), swatch = el("i");
      swatch.style.background = KIND_COLORS[k];
      span.appendChild(swatch);
      span.appendChild(document.createTextNode(words(k)));
      legend.appendChild(span);
    });
    var order = a.parts.map(function (p) { return p.part; });
    var longest = Math.max.apply(null, a.steps.map(function (s) { return s.window_ns; }).concat([1]));
    var bars = byId("account-bars");
    a.steps.forEach(function (s) {
      var row = el("div", "cp-row"), track = el("div", "cp-track"), bar = el("div", "cp-bar");
      row.setAttribute("data-step", String(s.step));
      row.appendChild(el("span", "cp-label", pathLabel(s)));
      bar.style.width = (100 * s.window_ns / longest) + "%";
      order.forEach(function (part) {
        var ns = s.parts[part];
        if (!ns) { return; }
        var seg = el("div");
        seg.style.width = (100 * ns / (s.window_ns || 1)) + "%";
        seg.style.background = KIND_COLORS[kindOf[part]] || KIND_COLORS.unexplained;
        seg.title = part + ": " + fmtNs(ns) + " (" + fmtPct(ns / (s.window_ns || 1)) + ")";
        seg.setAttribute("data-part", part);
        seg.setAttribute("data-ns", String(ns));
        bar.appendChild(seg);
      });
      track.appendChild(bar);
      row.appendChild(track);
      row.appendChild(el("span", "cp-total", fmtNs(s.window_ns)));
      bars.appendChild(row);
    });
    byId("account-table").appendChild(sortableTable([
      { key: "part", label: "part", text: true },
      { key: "kind", label: "kind", text: true, fmt: words },
      { key: "ns_per_step", label: "per step", fmt: fmtNs },
      { key: "share", label: "share", fmt: fmtPct },
      { key: "essential", label: "essential", fmt: function (v) { return v ? "yes" : "no"; } }
    ], a.parts));
  }

  /* Step time as bars from zero, named by step, warm-up in its own colour; the steady window's
     p50/p90/p99 as dashed lines across the whole chart (one step still shows its bar and lines). */
  function stepsChart() {
    var st = data.steps;
    if (!st || !st.rows || !st.rows.length) { return; }
    show("steps");
    var rows = st.rows, s = st.stats, names = rows.map(function (r) { return r.name; });
    var prefix = commonPrefix(names), xs = [], steady = [], warm = [];
    var stats = s ? [["p50", s.p50_ns, "#2ca02c"], ["p90", s.p90_ns, "#ff7f0e"], ["p99", s.p99_ns, "#d62728"]] : [];
    rows.forEach(function (r, i) {
      xs.push(i);
      steady.push(r.steady ? r.dur_ns / 1e6 : null);
      warm.push(r.steady ? null : r.dur_ns / 1e6);
    });
    function stepName(i) { return Number.isInteger(i) && rows[i] ? rows[i].name.slice(prefix.length) : ""; }
    function ms(u, v) { return v === null || v === undefined ? "" : round3(v) + " ms"; }
    byId("steps-note").textContent = st.marker + " steps; " + (st.warmup ? "the first " + st.warmup +
      " (orange) excluded as warm-up" : "none excluded as warm-up") + (s ? "; dashed: steady-window p50, p90, p99." : ".") +
      (st.note ? " " + st.note : "");
    var target = byId("steps-chart"), bars = uPlot.paths.bars({ size: [0.6, 80] });
    var series = [{ label: "step", value: function (u, v) { return prefix + stepName(v); } },
      { label: "steady", fill: "rgba(31, 119, 180, 0.6)", stroke: "#1f77b4", paths: bars, points: { show: false }, value: ms },
      { label: "warm-up (excluded)", fill: "rgba(255, 127, 14, 0.45)", stroke: "#ff7f0e", paths: bars,
        points: { show: false }, value: ms }];
    var columns = [xs, steady, warm];
    stats.forEach(function (q) {
      series.push({ label: q[0], stroke: q[2], dash: [6, 4], paths: function () { return null; }, points: { show: false },
                    value: function () { return round3(q[1] / 1e6) + " ms"; } });
      columns.push(xs.map(function () { return q[1] / 1e6; }));
    });
    function drawStats(u) {
      var ctx = u.ctx, left = u.bbox.left, right = left + u.bbox.width;
      ctx.save();
      ctx.lineWidth = 1.5 * uPlot.pxRatio;
      ctx.setLineDash([6 * uPlot.pxRatio, 4 * uPlot.pxRatio]);
      stats.forEach(function (q) {
        var y = u.valToPos(q[1] / 1e6, "y", true);
        ctx.strokeStyle = q[2];
        ctx.beginPath(); ctx.moveTo(left, y); ctx.lineTo(right, y); ctx.stroke();
      });
      ctx.restore();
    }
    chart({
      width: width("steps-chart"), height: 260,
      scales: { x: { time: false, range: function () { return [-0.5, rows.length - 0.5]; } },
                y: { range: function (u, lo, hi) { return [0, hi > 0 ? hi * 1.1 : 1]; } } },
      axes: [{ label: prefix ? "step (" + prefix + "N)" : "step", incrs: [1, 2, 5, 10, 20, 50, 100, 200, 500, 1000],
               values: ticks(target, "x", stepName) },
             { label: "step time (ms)", size: 60, values: ticks(target, "y", round3) }],
      series: series,
      hooks: { draw: [drawStats] }
    }, columns, target);
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
      var color = DEVICE_COLORS[i % DEVICE_COLORS.length];
      columns.push(xs.map(function (_, k) { return rows[k] ? 100 * rows[k].busy_share : null; }));
      series.push({ label: "GPU " + d + " busy %", stroke: color, width: 1.5 });
      /* Busy is not one number: kernels, copies and memsets each apart (they may overlap). */
      [["kernels_share", "kernels", []], ["copies_share", "copies", [6, 3]], ["memsets_share", "memsets", [2, 3]]]
        .forEach(function (k) {
          if (!rows.some(function (r) { return r[k[0]]; })) { return; }
          columns.push(xs.map(function (_, j) { return rows[j] ? 100 * (rows[j][k[0]] || 0) : null; }));
          series.push({ label: "GPU " + d + " " + k[1] + " %", stroke: color, width: 1, dash: k[2].length ? k[2] : undefined,
                        alpha: 0.7 });
        });
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
    var target = byId("utilization-chart");
    chart({
      width: width("utilization-chart"), height: 280,
      scales: { x: { time: false, range: function (u, lo, hi) { return [0, hi]; } }, y: { range: [0, 100] } },
      axes: [{ label: "ms since the trace start", values: ticks(target, "x", round3) },
             { label: "busy %", values: ticks(target, "y", round3) }],
      series: series,
      hooks: { drawClear: [drawGaps] }
    }, columns, target);
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
    chart({
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
    chart({
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
      { key: "start_ms", label: "start (ms from trace start)", fmt: fmtNum },
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

  /* MFU: the matrix math of each step and region at the device's peak over its time (FLOP/s alone
     on a trace without GPU work, which has no peak to measure against). */
  function fmtFlops(x) {
    if (x === null || x === undefined) { return "-"; }
    var units = [[1e15, "P"], [1e12, "T"], [1e9, "G"], [1e6, "M"], [1e3, "k"]];
    for (var i = 0; i < units.length; i++) {
      if (x >= units[i][0]) { return (x / units[i][0]).toPrecision(3) + " " + units[i][1] + "FLOP"; }
    }
    return Math.round(x) + " FLOP";
  }
  function mfuSection() {
    var m = data.mfu;
    if (!m || !m.steps) { return; }
    show("mfu");
    byId("mfu-note").textContent = (m.steady_mfu !== null ? "MFU " + fmtPct(m.steady_mfu) + " of the " + m.peak +
      " peak over the steady steps" : "MFU: none, " + m.note) + " · " + fmtFlops(m.steady_flops_per_step) +
      " of matrix math (GEMMs, convolutions, attention) per steady step, FLOPs from " + m.flops_source +
      (m.steady_mfu !== null && m.note ? " · " + m.note : "");
    var rate = { key: "flop_per_s", label: "FLOP/s", fmt: function (v) { return v === null ? "-" : fmtFlops(v) + "/s"; } };
    var target = byId("mfu-tables");
    target.appendChild(sortableTable([
      { key: "step", label: "step", text: true },
      { key: "steady", label: "steady", fmt: function (v) { return v ? "yes" : "no"; } },
      { key: "window_ns", label: "window", fmt: fmtNs },
      { key: "flops", label: "FLOPs", fmt: fmtFlops },
      rate,
      { key: "mfu", label: "MFU", fmt: fmtPct }
    ], m.steps));
    if (m.regions && m.regions.length) {
      target.appendChild(el("h3", "", "Per region (time: each instance's " + m.regions[0].time_basis + ", summed)"));
      target.appendChild(sortableTable([
        { key: "region", label: "region", text: true },
        { key: "kind", label: "kind", text: true },
        { key: "instances", label: "instances" },
        { key: "time_ns", label: "time", fmt: fmtNs },
        { key: "flops", label: "FLOPs", fmt: fmtFlops },
        rate,
        { key: "mfu", label: "MFU", fmt: fmtPct }
      ], m.regions.slice(0, 50)));
    }
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

  /* Critical path: per step one bar of what its path spent time on (to the scale of the longest
     window, so a step's bar is as long as its path covers), then per step in numbers, the kernel
     families on it and what shortening each item on it would save. */
  var PATH_COLORS = {
    host_ops: "#8c564b", launch_overhead: "#9467bd", kernels: "#1f77b4", communication: "#17becf",
    copies: "#2ca02c", sync: "#d62728", kernel_gap: "#bcbd22", idle: "#b8b8b8"
  };
  function pathLabel(s) {
    return (s.number === null || s.number === undefined ? "step " + s.step : "#" + s.number) + (s.steady ? "" : " (warm-up)");
  }
  function criticalPathSection() {
    var c = data.critical_path;
    if (!c || !c.steps || !c.steps.length) { return; }
    show("critical-path");
    var cats = c.categories, words = function (k) { return k.replace(/_/g, " "); };
    byId("critical-path-note").textContent = "What set each step's length: the chain of host work, launches, GPU work " +
      "and waits that runs back from the step's end to its start. A total marked * is shorter than its window: " +
      "somewhere the trace does not say what the path waited on." + (c.scope ? " " + c.scope : "") +
      (c.note ? " Note: " + c.note : "");
    var legend = byId("critical-path-legend");
    cats.forEach(function (k) {
      var span = el("span"), swatch = el("i");
      swatch.style.background = PATH_COLORS[k];
      span.appendChild(swatch);
      span.appendChild(document.createTextNode(words(k)));
      legend.appendChild(span);
    });
    var longest = Math.max.apply(null, c.steps.map(function (s) { return s.window_ns; }).concat([1]));
    var bars = byId("critical-path-bars");
    c.steps.forEach(function (s) {
      var row = el("div", "cp-row"), track = el("div", "cp-track"), bar = el("div", "cp-bar");
      row.setAttribute("data-step", String(s.step));
      row.appendChild(el("span", "cp-label", pathLabel(s)));
      bar.style.width = (100 * s.total_ns / longest) + "%";
      cats.forEach(function (k) {
        var ns = s.composition[k];
        if (!ns) { return; }
        var seg = el("div");
        seg.style.width = (100 * ns / (s.total_ns || 1)) + "%";
        seg.style.background = PATH_COLORS[k];
        seg.title = words(k) + ": " + fmtNs(ns) + " (" + fmtPct(ns / (s.total_ns || 1)) + ")";
        seg.setAttribute("data-category", k);
        seg.setAttribute("data-ns", String(ns));
        bar.appendChild(seg);
      });
      track.appendChild(bar);
      row.appendChild(track);
      row.appendChild(el("span", "cp-total", fmtNs(s.total_ns) + (s.determined ? "" : " *") + " of " +
                                                 fmtNs(s.window_ns) + " window"));
      bars.appendChild(row);
    });
    var target = byId("critical-path-tables");
    var rows = c.steps.map(function (s) {
      var r = { step: pathLabel(s), window_ns: s.window_ns, total_ns: s.total_ns, determined: s.determined };
      cats.forEach(function (k) { r[k] = s.composition[k]; });
      return r;
    });
    target.appendChild(sortableTable([
      { key: "step", label: "step", text: true },
      { key: "window_ns", label: "window", fmt: fmtNs },
      { key: "total_ns", label: "path", fmt: fmtNs },
      { key: "determined", label: "covers the window", fmt: function (v) { return v ? "yes" : "no"; } }
    ].concat(cats.map(function (k) { return { key: k, label: words(k), fmt: fmtNs }; })), rows));
    var families = {};
    c.steps.forEach(function (s) {
      var f = s.composition.kernel_families || {};
      Object.keys(f).forEach(function (k) { families[k] = (families[k] || 0) + f[k]; });
    });
    var famRows = Object.keys(families).map(function (k) { return { family: k, ns: families[k] }; })
      .sort(function (a, b) { return b.ns - a.ns; });
    if (famRows.length) {
      target.appendChild(el("h3", "", "Kernels on the path, by family"));
      target.appendChild(sortableTable([
        { key: "family", label: "family", text: true },
        { key: "ns", label: "on the path", fmt: fmtNs }
      ], famRows));
    }
    if (c.items && c.items.length) {
      target.appendChild(el("h3", "", "What shortening would save"));
      target.appendChild(el("p", "note", "Summed over the " + c.steps.length + " step(s) above, by time on the path; " +
        "saves: step time saved per step if all of the item's instances took no time (replayed for the items with " +
        "most time on the path, in the steps counted)."));
      target.appendChild(sortableTable([
        { key: "name", label: "name", text: true },
        { key: "category", label: "category", text: true, fmt: words },
        { key: "count", label: "count" },
        { key: "on_path_ns", label: "on the path", fmt: fmtNs },
        { key: "gain_ns_per_step", label: "saves / step", fmt: fmtNs },
        { key: "replayed_steps", label: "replayed in steps" }
      ], c.items));
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

  /* A point's label: the op or kernel without namespaces and template arguments, then its shapes. */
  function pointLabel(p) {
    var name = String(p.name).replace(/<.*>/, "<…>").replace(/^void /, "").replace(/\(.*$/, "");
    name = name.split("::").pop();
    var dims = String(p.input_dims || "").replace(/,\[\]/g, "").replace(/\],\[/g, "][").replace(/^\[\[/, "[")
      .replace(/\]\]$/, "]").replace(/(\[\])+$/, "");
    return dims ? name + " " + dims : name;
  }
  function rooflineChart() {
    var r = data.roofline;
    if (!r || !r.points || !r.points.length) { return; }
    show("roofline");
    var pts = r.points.filter(function (p) { return p.ai > 0 && p.flop_per_s > 0; })
      .sort(function (a, b) { return a.ai - b.ai; });
    if (!pts.length) { return; }
    byId("roofline-note").textContent = (r.note || "") + " Hover a point for its name; the five with most GPU time are labelled.";
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
    var top = pts.slice().sort(function (a, b) { return b.gpu_ns - a.gpu_ns; }).slice(0, 5);
    var target = byId("roofline-chart"), hover = el("div", "note hover");
    hover.id = "roofline-hover";
    target.parentNode.insertBefore(hover, target.nextSibling);
    function drawLabels(u) {
      var ctx = u.ctx, px = uPlot.pxRatio;
      ctx.save();
      ctx.font = (11 * px) + "px system-ui, sans-serif";
      ctx.textAlign = "left";
      ctx.textBaseline = "alphabetic";
      ctx.fillStyle = "#1d2430";
      var taken = [];
      function put(text, x, y) {
        taken.push([x, y - 12 * px, x + ctx.measureText(text).width, y]);
        ctx.fillText(text, x, y);
      }
      if (pf && pb) {
        ctx.fillStyle = "#d62728";
        put("compute roof " + fmtSI(pf, "FLOP/s"), u.valToPos(pf / pb, "x", true) + 6 * px, u.valToPos(pf, "y", true) - 6 * px);
        var xm = Math.sqrt(lo * (pf / pb));
        put("memory roof " + fmtSI(pb, "B/s"), u.valToPos(xm, "x", true) + 6 * px, u.valToPos(xm * pb, "y", true) - 6 * px);
        ctx.fillStyle = "#1d2430";
      }
      /* A label that would cover one already drawn goes below its point, or is left to the hover line. */
      var drawn = [];
      top.forEach(function (p) {
        var text = pointLabel(p), w = ctx.measureText(text).width, h = 12 * px;
        var x = u.valToPos(p.ai, "x", true) + 6 * px, y0 = u.valToPos(p.flop_per_s, "y", true);
        if (x + w > u.bbox.left + u.bbox.width) { x -= w + 12 * px; }  /* near the right edge: left of the point */
        [y0 - 6 * px, y0 + 16 * px].some(function (y) {
          var box = [x, y - h, x + w, y];
          var free = taken.every(function (b) { return box[2] < b[0] || box[0] > b[2] || box[3] < b[1] || box[1] > b[3]; });
          if (free) { taken.push(box); drawn.push(text); ctx.fillText(text, x, y); }
          return free;
        });
      });
      target.setAttribute("data-point-labels", drawn.join("|"));
      ctx.restore();
    }
    /* The point nearest the pointer, within 20 px, named under the chart. */
    function showPoint(u) {
      var left = u.cursor.left, topPx = u.cursor.top, p = null, best = 400;
      if (left !== null && left !== undefined && left >= 0) {
        pts.forEach(function (q) {
          var dx = u.valToPos(q.ai, "x") - left, dy = u.valToPos(q.flop_per_s, "y") - topPx;
          if (dx * dx + dy * dy < best) { best = dx * dx + dy * dy; p = q; }
        });
      }
      hover.textContent = p ? pointLabel(p) + ": " + fmtSI(p.flop_per_s, "FLOP/s") + " at " + round3(p.ai) +
        " FLOP/B, " + fmtNs(p.gpu_ns) + " GPU time" + (p.bound ? ", " + p.bound : "") : "";
    }
    chart({
      width: width("roofline-chart"), height: 360, mode: 1, padding: [18, 48, 0, 0],
      scales: { x: { time: false, distr: 3 }, y: { distr: 3 } },
      axes: [{ label: "arithmetic intensity (FLOP per byte)", values: ticks(target, "x", decades(function (v) { return fmtSI(v, "FLOP/B"); })) },
             { label: "achieved FLOP/s", size: 90, values: ticks(target, "y", decades(function (v) { return fmtSI(v, "FLOP/s"); })) }],
      series: [
        { label: "intensity", value: function (u, v) { return v === null || v === undefined ? "" : round3(v) + " FLOP/B"; } },
        { label: "ops (achieved)", stroke: "#1f77b4", paths: function () { return null; }, points: { show: true, size: 7, fill: "#1f77b4" },
          value: function (u, v) { return v === null || v === undefined ? "" : fmtSI(v, "FLOP/s"); } },
        { label: "roof", stroke: "#d62728", width: 1.5, spanGaps: true, points: { show: false },
          value: function (u, v) { return v === null || v === undefined ? "" : fmtSI(v, "FLOP/s"); } }
      ],
      hooks: { draw: [drawLabels], setCursor: [showPoint] }
    }, [xs, ys, roof], target);
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
  [findings, accountSection, mfuSection, stepsChart, utilizationChart, memorySection, gapsTable, overlapTable, criticalPathSection, compileSection, blocksTable, ranksHeatmap,
   rooflineChart,
   verdictsTable, opsTable, kernelsTable].forEach(function (render) {
    try { render(); } catch (e) { console.error("tracewhy report: " + render.name + ": " + e); }
  });
}());

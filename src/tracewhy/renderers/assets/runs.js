/* tracewhy HTML report of several traces: says how they were read and draws the comparison of
   the runs with the first; each trace's own part is drawn by report.js in its turn
   (runs_next.js). Every string from a trace goes into the page through textContent. */
(function () {
  "use strict";
  var doc = JSON.parse(document.getElementById("runs-data").textContent);
  function el(tag, cls, text) {
    var e = document.createElement(tag);
    if (cls) { e.className = cls; }
    if (text !== undefined && text !== null) { e.textContent = String(text); }
    return e;
  }
  function fmtNs(ns) {
    if (ns === null || ns === undefined) { return "-"; }
    var a = Math.abs(ns);
    if (a >= 1e9) { return (ns / 1e9).toFixed(3) + " s"; }
    if (a >= 1e6) { return (ns / 1e6).toFixed(3) + " ms"; }
    if (a >= 1e3) { return (ns / 1e3).toFixed(1) + " µs"; }
    return Math.round(ns) + " ns";
  }
  function signed(ns) { return ns === null || ns === undefined ? "" : (ns >= 0 ? "+" : "-") + fmtNs(Math.abs(ns)); }
  var lines = [doc.inputs.length + " traces: " + doc.grouping.reason];
  doc.grouping.skipped.forEach(function (s) { lines.push("skipped: " + s); });
  (doc.warnings || []).forEach(function (w) { lines.push("warning: " + w); });
  document.getElementById("runs-info").textContent = lines.join("\n");
  var c = doc.comparison;
  if (!c) { return; }
  document.getElementById("runs").hidden = false;
  document.getElementById("runs-note").textContent = c.note +
    (c.compared ? ". The shift of the median step and its interval are those tracewhy diff measures." : "");
  if (!c.compared) { return; }
  var table = el("table"), head = el("tr");
  ["run", "steady steps", "step p50", "shift vs first", "interval", "verdict", "details"].forEach(function (h, i) {
    head.appendChild(el("th", i === 0 || i === 5 || i === 6 ? "text" : "", h));
  });
  table.appendChild(head);
  c.runs.forEach(function (r, i) {
    var tr = el("tr"), verdict = i === 0 ? "baseline" : (r.verdict === null ? "not compared: " + r.relation :
      r.verdict + (r.comparable ? "" : " (not comparable: " + r.not_comparable_because.join("; ") + ")"));
    var interval = r.ci_low_ns === null ? "" : "[" + signed(r.ci_low_ns) + ", " + signed(r.ci_high_ns) + "] " +
      Math.round(100 * r.confidence) + "%";
    [r.path, String(r.steady_steps), fmtNs(r.step_p50_ns), signed(r.shift_ns), interval, verdict,
     r.details || ""].forEach(function (v, j) {
      tr.appendChild(el("td", j === 0 || j === 5 || j === 6 ? "text" : "", v));
    });
    table.appendChild(tr);
  });
  document.getElementById("runs-table").appendChild(table);
}());

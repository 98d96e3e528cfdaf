/* Before report.js draws the next trace's part of a report of several traces: the part drawn
   last gives up the element ids report.js looks for, the next part takes them (its elements
   carry them as data-id), and report.js' data element holds that trace's report. */
(function () {
  "use strict";
  var doc = JSON.parse(document.getElementById("runs-data").textContent);
  var k = window.tracewhyRun = window.tracewhyRun === undefined ? 0 : window.tracewhyRun + 1;
  Array.prototype.forEach.call(document.querySelectorAll("[data-id][id]"), function (e) { e.removeAttribute("id"); });
  var old = document.getElementById("report-data");
  if (old) { old.parentNode.removeChild(old); }
  var part = document.getElementById("run-" + k);
  Array.prototype.forEach.call(part.querySelectorAll("[data-id]"), function (e) { e.id = e.getAttribute("data-id"); });
  part.querySelector("h2.run-path").textContent = (k + 1) + " of " + doc.inputs.length + ": " + doc.inputs[k].path;
  var input = {}, key;
  for (key in doc.inputs[k]) { if (Object.prototype.hasOwnProperty.call(doc.inputs[k], key)) { input[key] = doc.inputs[k][key]; } }
  ["tool", "tool_version", "json_schema", "command"].forEach(function (f) { input[f] = doc[f]; });
  input.warnings = [];
  var data = document.createElement("script");
  data.type = "application/json";
  data.id = "report-data";
  data.textContent = JSON.stringify(input);
  document.body.appendChild(data);
}());

// Live tail of the event log: one EventSource on /ui/events/stream, resuming after the last event the
// page already shows. New events go on top; the table keeps the newest 500 rows.
(function () {
  "use strict";
  var table = document.getElementById("events");
  if (!table || !window.EventSource) return;
  var body = table.tBodies[0];
  var state = document.getElementById("tail-state");
  var params = new URLSearchParams({ after: table.dataset.after || "" });
  if (table.dataset.types) params.set("types", table.dataset.types);
  var source = new EventSource(table.dataset.stream + "?" + params.toString());

  function cell(row, text, code) {
    var td = row.insertCell();
    var el = document.createElement(code ? "code" : "span");
    el.textContent = text;
    if (!code && row.cells.length === 3) el.className = "etype";
    td.appendChild(el);
  }

  source.onopen = function () { state.textContent = "live"; state.className = "badge ok"; };
  source.onerror = function () { state.textContent = "reconnecting…"; state.className = "badge warn"; };
  // The dashboard's stream sends every event as a plain "message" (the type is in the data).
  var seen = Object.create(null);
  source.onmessage = function (msg) {
    var ev;
    try { ev = JSON.parse(msg.data); } catch (e) { return; }
    if (seen[ev.id]) return;
    seen[ev.id] = true;
    var row = body.insertRow(0);
    row.className = "fresh";
    cell(row, ev.id); cell(row, ev.at); cell(row, ev.type);
    cell(row, ev.subject.kind + " " + ev.subject.id, true);
    cell(row, JSON.stringify(ev.data), true);
    while (body.rows.length > 500) body.deleteRow(body.rows.length - 1);
  };
})();

// Shows every <time datetime> in the viewer's own time zone (the HTML
// carries UTC, readable without this script), reads the filters' times in
// that zone too (sent as UTC), and keeps a confirmed action from being sent
// twice by a double click.
document.addEventListener("DOMContentLoaded", function () {
  var zone = Intl.DateTimeFormat().resolvedOptions().timeZone;
  var two = function (n) { return (n < 10 ? "0" : "") + n; };
  var localText = function (at) {
    return at.getFullYear() + "-" + two(at.getMonth() + 1) + "-" + two(at.getDate()) +
      " " + two(at.getHours()) + ":" + two(at.getMinutes());
  };
  document.querySelectorAll("span.zone").forEach(function (el) {
    el.textContent = "(" + zone + ")";
  });
  document.querySelectorAll("input.local-time").forEach(function (input) {
    // A value sent before is UTC (RFC 3339): show it in the viewer's zone.
    if (/[zZ]$|[+-]\d\d:\d\d$/.test(input.value)) {
      var sent = new Date(input.value);
      if (!isNaN(sent.getTime())) input.value = localText(sent);
    }
    input.form.addEventListener("submit", function () {
      var text = input.value.trim();
      if (!text || /[zZ]$|[+-]\d\d:\d\d$/.test(text)) return;
      // A date alone is the start of that day here (JavaScript would read
      // "2026-12-06" as UTC midnight).
      if (/^\d{4}-\d{2}-\d{2}$/.test(text)) text += "T00:00";
      var at = new Date(text.replace(" ", "T"));
      if (!isNaN(at.getTime())) input.value = at.toISOString();
    });
  });
  document.querySelectorAll("time[datetime]").forEach(function (el) {
    var at = new Date(el.getAttribute("datetime"));
    if (isNaN(at.getTime())) return;
    el.title = el.textContent;
    el.textContent = at.toLocaleString(undefined, {
      year: "numeric", month: "2-digit", day: "2-digit",
      hour: "2-digit", minute: "2-digit", second: "2-digit",
      hour12: false, timeZoneName: "short"
    });
    el.dataset.zone = zone;
  });
  document.querySelectorAll("form.confirm").forEach(function (form) {
    form.addEventListener("submit", function () {
      // After the browser took the pressed button's value into the form.
      setTimeout(function () {
        form.querySelectorAll("button").forEach(function (b) { b.disabled = true; });
      }, 0);
    });
  });
  document.querySelectorAll("input.select-all").forEach(function (box) {
    box.addEventListener("change", function () {
      var form = box.closest("form");
      form.querySelectorAll("input[name=id]").forEach(function (b) { b.checked = box.checked; });
    });
  });
});

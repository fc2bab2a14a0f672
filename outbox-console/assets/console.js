// Shows every <time datetime> in the viewer's own time zone (the HTML
// carries UTC, readable without this script), and asks before a confirmed
// action is sent twice by a double click.
document.addEventListener("DOMContentLoaded", function () {
  var zone = Intl.DateTimeFormat().resolvedOptions().timeZone;
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

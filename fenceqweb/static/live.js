// fenceq dashboard: refreshes the page's live part (the element with id "live") every
// data-refresh milliseconds by fetching the same URL with the X-Fenceq-Fragment header;
// the server answers with that part alone. It pauses while the tab is hidden and while
// the pointer or focus is inside a form of the live part, so a click is never lost to a
// refresh. Without this script every page still works; it shows the state at load.
(function () {
  "use strict";
  var live = document.getElementById("live");
  var status = document.getElementById("live-status");
  if (!live || !window.fetch) {
    if (status) status.hidden = true;
    return;
  }
  var every = Math.max(2000, parseInt(live.getAttribute("data-refresh"), 10) || 2000);
  var busy = false;
  var hovering = false;

  live.addEventListener("pointerover", function (e) {
    hovering = !!(e.target.closest && e.target.closest("form, details, button, a"));
  });
  live.addEventListener("pointerleave", function () { hovering = false; });

  function interacting() {
    var a = document.activeElement;
    return hovering || (a && a !== document.body && live.contains(a)) ||
      live.querySelector("details[open]") !== null;
  }

  function mark(state, text) {
    if (!status) return;
    status.className = "live " + state;
    status.title = text;
  }

  function tick() {
    if (busy || document.hidden || interacting()) return;
    busy = true;
    fetch(window.location.href, {
      headers: { "X-Fenceq-Fragment": "live" },
      credentials: "same-origin",
      cache: "no-store",
      redirect: "error"
    }).then(function (res) {
      if (!res.ok || res.headers.get("X-Fenceq-Fragment") !== "live") {
        throw new Error("HTTP " + res.status);
      }
      return res.text();
    }).then(function (html) {
      if (!interacting()) {
        live.innerHTML = html;
      }
      mark("ok", "updated " + new Date().toLocaleTimeString());
    }).catch(function (err) {
      mark("stale", "live updates failed: " + err.message);
    }).then(function () {
      busy = false;
    });
  }

  mark("ok", "updates every " + every / 1000 + " s");
  window.setInterval(tick, every);
})();

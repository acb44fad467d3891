// Refreshes the status page's live part in place; the page works without it (it then reloads
// itself through a <noscript> meta refresh). No framework, no external code.
(function () {
  "use strict";
  var live = document.getElementById("live");
  if (!live || !window.fetch) {
    return;
  }
  var seconds = parseFloat(live.getAttribute("data-refresh-s")) || 5;
  var updated = document.getElementById("updated");
  var stale = document.getElementById("stale");

  function two(n) {
    return (n < 10 ? "0" : "") + n;
  }

  function stamp(d) {  // the same form as the server's: 2026-11-30 14:31:05
    return d.getFullYear() + "-" + two(d.getMonth() + 1) + "-" + two(d.getDate()) + " " +
      two(d.getHours()) + ":" + two(d.getMinutes()) + ":" + two(d.getSeconds());
  }

  function schedule() {
    window.setTimeout(refresh, seconds * 1000);
  }

  function refresh() {
    if (document.hidden) {
      schedule();
      return;
    }
    fetch(live.getAttribute("data-src"), {
      credentials: "same-origin",
      cache: "no-store",
      redirect: "manual",
      headers: { "Accept": "text/html" }
    }).then(function (response) {
      if (response.type === "opaqueredirect" || response.status === 401) {
        window.location.reload();  // the session ended: the server shows the sign-in form
        return null;
      }
      if (!response.ok) {
        throw new Error("HTTP " + response.status);
      }
      return response.text();
    }).then(function (html) {
      if (html !== null) {
        live.innerHTML = html;
        updated.textContent = stamp(new Date());
        stale.hidden = true;
      }
    }).catch(function () {
      stale.hidden = false;
    }).then(schedule);
  }

  schedule();
})();

// The console works without this script; it only asks before actions
// that touch many jobs or plugins (forms marked data-confirm).
document.addEventListener("submit", function (ev) {
  var msg = ev.target.getAttribute("data-confirm");
  if (msg && !window.confirm(msg)) ev.preventDefault();
});

// A page's parts marked data-live="SECONDS" (the overview, the jobs, a
// job, the dead letters, a dead letter, the workflows, a workflow, the
// schedules, the plugins) ask for the page again that often
// while it is visible and each part is swapped for its fresh copy (found
// by its id) when it changed, with no reload; #live-at (outside them)
// says when. A part that comes back without data-live has reached a final
// state (a job done, a workflow ended, a letter requeued or discarded): it is swapped in once more and no
// longer asked for; once none is, the page stops asking and removes what
// only made sense while it could change (data-while-live: a job's cancel
// form). A form field changed inside a part holds the page as it is (the
// operator's ticks and typing are never swapped away). A failed fetch, or
// one sent to the login form (the session ended), leaves the page as it
// is until the next. A page slow to answer is asked for less often: the
// next ask waits ten times as long as the last answer took (a jobs search
// over a long history costs the database seconds; an open tab must not
// keep one of its backends busy).
(function () {
  var parts = Array.prototype.slice.call(document.querySelectorAll("[data-live]"));
  if (!parts.length || !window.fetch || !window.DOMParser) return;
  var every = Math.max(1, parseFloat(parts[0].getAttribute("data-live")) || 2) * 1000;
  var busy = false, held = false, timer, next = 0;
  var at = document.getElementById("live-at");
  var last = at ? at.textContent : "";
  function say(text) { if (at) at.textContent = text; }
  function hold(ev) {
    for (var i = 0; i < parts.length; i++) {
      if (parts[i].contains(ev.target)) {
        held = true;
        say(last + ", then held while you choose (reload to update)");
        return;
      }
    }
  }
  document.addEventListener("input", hold, true);
  document.addEventListener("change", hold, true);
  function refresh() {
    if (busy || held || document.hidden || Date.now() < next) return;
    busy = true;
    var asked = Date.now();
    fetch(location.href, { credentials: "same-origin" })
      .then(function (res) {
        if (!res.ok || res.redirected) throw new Error("live: " + res.status);
        return res.text();
      })
      .then(function (html) {
        if (held) return;
        var doc = new DOMParser().parseFromString(html, "text/html");
        var still = [];
        parts.forEach(function (part) {
          var fresh = doc.getElementById(part.id);
          if (fresh && fresh.outerHTML !== part.outerHTML) {
            part.replaceWith(fresh);
            part = fresh;
          }
          if (part.hasAttribute("data-live")) still.push(part);
        });
        parts = still;
        last = new Date().toISOString().slice(11, 19) + " UTC";
        if (parts.length) {
          say(last);
          return;
        }
        clearInterval(timer);
        document.querySelectorAll("[data-while-live]").forEach(function (e) { e.remove(); });
        say(last + ", final: no longer updated");
      })
      .catch(function () {})
      .then(function () {
        busy = false;
        next = asked + 10 * (Date.now() - asked);
      });
  }
  timer = setInterval(refresh, every);
})();

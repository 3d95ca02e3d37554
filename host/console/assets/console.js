// The console works without this script; it only asks before actions
// that touch many jobs or plugins (forms marked data-confirm).
document.addEventListener("submit", function (ev) {
  var msg = ev.target.getAttribute("data-confirm");
  if (msg && !window.confirm(msg)) ev.preventDefault();
});

// A page whose content is marked data-live="SECONDS" (the overview) asks
// for itself again that often while it is visible and swaps the fresh
// content in, with no reload; #live-at (outside it) says when. A failed
// fetch, or one sent to the login form (the session ended), leaves the
// page as it is until the next.
(function () {
  var live = document.querySelector("[data-live]");
  if (!live || !window.fetch || !window.DOMParser) return;
  var every = Math.max(1, parseFloat(live.getAttribute("data-live")) || 2) * 1000;
  var busy = false;
  function refresh() {
    if (busy || document.hidden) return;
    busy = true;
    fetch(location.href, { credentials: "same-origin" })
      .then(function (res) {
        if (!res.ok || res.redirected) throw new Error("live: " + res.status);
        return res.text();
      })
      .then(function (html) {
        var fresh = new DOMParser().parseFromString(html, "text/html").querySelector("[data-live]");
        if (fresh && fresh.id === live.id) {
          live.replaceWith(fresh);
          live = fresh;
          var at = document.getElementById("live-at");
          if (at) at.textContent = new Date().toISOString().slice(11, 19) + " UTC";
        }
      })
      .catch(function () {})
      .then(function () { busy = false; });
  }
  setInterval(refresh, every);
})();

// The console works without this script; it only asks before actions
// that touch many jobs or plugins (forms marked data-confirm).
document.addEventListener("submit", function (ev) {
  var msg = ev.target.getAttribute("data-confirm");
  if (msg && !window.confirm(msg)) ev.preventDefault();
});

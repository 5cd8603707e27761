// The dashboard's only script: one EventSource per page (the URL is the body's data-live);
// each "regions" event replaces the named elements' contents with HTML the server rendered
// (and escaped). EventSource reconnects by itself after a server restart.
(function () {
  "use strict";
  var url = document.body.getAttribute("data-live");
  var badge = document.getElementById("live");
  if (!url || !window.EventSource) return;
  function show(state) {
    if (badge) { badge.textContent = state; badge.className = "live " + state; }
  }
  var source = new EventSource(url);
  show("connecting");
  source.addEventListener("open", function () { show("live"); });
  source.addEventListener("error", function () {
    show(source.readyState === EventSource.CLOSED ? "off" : "reconnecting");
  });
  source.addEventListener("regions", function (e) {
    var regions = JSON.parse(e.data);
    Object.keys(regions).forEach(function (id) {
      var el = document.getElementById(id);
      if (el) el.innerHTML = regions[id];
    });
    show("live");
  });
  window.addEventListener("pagehide", function () { source.close(); });
})();

// The reproduction scorecard's status filter (book/tools/scorecard_page.py writes the page).
// Each claim is a <tbody class="nnk-claim" data-status="..."> (data-disagree="1" when its scales
// disagree); a button shows the claims of one status, "all" shows every claim. Without
// JavaScript every claim is shown.
(function () {
  function apply(filter) {
    document.querySelectorAll("tbody.nnk-claim").forEach(function (row) {
      var show = filter === "all" || row.dataset.status === filter ||
        (filter === "disagree" && row.dataset.disagree === "1");
      row.hidden = !show;
    });
    document.querySelectorAll("table.nnk-scorecard").forEach(function (table) {
      var any = table.querySelector("tbody.nnk-claim:not([hidden])");
      table.closest(".nnk-scorecard-wrap").classList.toggle("nnk-empty", !any);
    });
    document.querySelectorAll("button.nnk-filter").forEach(function (b) {
      b.setAttribute("aria-pressed", String(b.dataset.filter === filter));
    });
  }
  function init() {
    var buttons = document.querySelectorAll("button.nnk-filter");
    buttons.forEach(function (b) {
      b.addEventListener("click", function () { apply(b.dataset.filter); });
    });
    // a link to one claim (#claim-<id>) shows it, whatever filter was on
    function reveal() {
      var id = decodeURIComponent(location.hash.slice(1));
      var row = id && document.getElementById(id);
      if (row && row.classList.contains("nnk-claim")) {
        if (row.hidden) apply("all");
        var d = row.querySelector("details");
        if (d) d.open = true;
      }
    }
    window.addEventListener("hashchange", reveal);
    reveal();
  }
  if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", init);
  else init();
})();

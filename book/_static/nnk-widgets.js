/* Loaded between RequireJS and the ipywidgets embed manager (see _config.yml).
 *
 * 1. The embed manager derives the URL of its bundled fonts (Font Awesome, used by the
 *    widgets' icons) from its AMD module URL, which RequireJS resolves against the
 *    page's own folder (chapters/@jupyter-widgets/...): six 404s per page. Map that
 *    module path to the folder this book serves the manager from.
 * 2. The widgets typeset their labels with the MathJax 2 API (MathJax.Hub.Queue); the
 *    book loads MathJax 3, where Hub is undefined and every labelled control raised a
 *    TypeError. Give MathJax 3 a Hub.Queue that forwards "Typeset" jobs to
 *    MathJax.typesetPromise.
 */
(function () {
  "use strict";
  var here = document.currentScript && document.currentScript.src;
  if (here && window.require && window.require.config) {
    var vendor = here.slice(0, here.lastIndexOf("/") + 1) + "vendor/html-manager";
    window.require.config({ paths: { "@jupyter-widgets/html-manager/dist": vendor } });
  }

  function typeset(element) {
    var mj = window.MathJax;
    if (!mj || typeof mj.typesetPromise !== "function") {
      return; // MathJax 3 has not started yet: its startup typesets the whole page.
    }
    var ready = mj.startup && mj.startup.promise ? mj.startup.promise : Promise.resolve();
    ready.then(function () { return mj.typesetPromise([element]); }).catch(function (err) {
      console.warn("nnk-widgets: MathJax could not typeset a widget label", err);
    });
  }
  var hub = {
    Queue: function () {
      for (var i = 0; i < arguments.length; i++) {
        var job = arguments[i];
        if (Array.isArray(job) && job[0] === "Typeset" && job[2]) { typeset(job[2]); }
      }
    }
  };
  function withHub(value) {
    if (value && typeof value === "object" && !("Hub" in value)) {
      // Not enumerable: MathJax 3 copies its configuration object's own keys.
      Object.defineProperty(value, "Hub", { value: hub, enumerable: false, configurable: true });
    }
    return value;
  }
  // MathJax 3 replaces window.MathJax (its configuration) with itself when it loads.
  var current = withHub(window.MathJax);
  Object.defineProperty(window, "MathJax", {
    configurable: true,
    enumerable: true,
    get: function () { return current; },
    set: function (value) { current = withHub(value); }
  });
})();

/* django-sqlqueue: opt-in auto-refresh of the dashboard and the job list.
 *
 * Off until the operator turns it on (the choice is kept per page in localStorage). While on, the
 * page reloads every N seconds, but never while the operator is doing something: a row is selected,
 * a field or menu has focus, text is selected, a <details> is open, or the mouse / keyboard was used
 * in the last few seconds. The control shows which ("paused: row selected"). No inline script: a
 * Content-Security-Policy without 'unsafe-inline' keeps working.
 *
 * A page that names a JSON endpoint (data-json-url, the dashboard) is not reloaded: its numbers are
 * fetched and written in place into the elements marked data-sqlqueue-value="key". When the endpoint's
 * "shape" (which rows the page has: queues, types, workers...) differs from the page's, it reloads.
 */
(function () {
  "use strict";
  var IDLE_MS = 4000;

  function init(box) {
    var key = "sqlqueue.autorefresh." + (box.dataset.page || location.pathname);
    var select = box.querySelector("select");
    var status = box.querySelector(".sqlqueue-autorefresh-status");
    var lastInput = 0;
    var left = 0;
    var saved = null;
    try { saved = localStorage.getItem(key); } catch (e) { saved = null; }
    if (saved && select.querySelector('option[value="' + saved + '"]')) { select.value = saved; }

    ["mousedown", "keydown", "wheel", "touchstart"].forEach(function (name) {
      document.addEventListener(name, function (ev) {
        if (!box.contains(ev.target)) { lastInput = Date.now(); }
      }, true);
    });

    function interval() { return parseInt(select.value, 10) || 0; }

    function busyReason() {
      if (document.querySelector("#result_list input.action-select:checked, #action-toggle:checked")) {
        return "row selected";
      }
      var el = document.activeElement;
      // a field being typed in or a menu being chosen from (a clicked checkbox or button keeps focus: not that)
      var typing = el && el !== select && (/^(SELECT|TEXTAREA)$/.test(el.tagName) ||
        (el.tagName === "INPUT" && !/^(checkbox|radio|submit|button|reset|image|hidden)$/.test(el.type)));
      if (typing) { return "field in use"; }
      if (String(window.getSelection ? window.getSelection() : "").length) { return "text selected"; }
      if (document.querySelector("details.sqlqueue-attempt-error[open]")) { return "details open"; }
      if (Date.now() - lastInput < IDLE_MS) { return "you are using the page"; }
      return "";
    }

    function show(state, text) {
      box.dataset.state = state;
      status.textContent = text;
    }

    select.addEventListener("change", function () {
      try { localStorage.setItem(key, select.value); } catch (e) { /* private mode: this page only */ }
      left = interval();
      select.blur();
      tick();
    });

    function tick() {
      var every = interval();
      if (!every) { show("off", ""); return; }
      var why = busyReason();
      if (why) { left = every; show("paused", "paused: " + why); return; }
      if (left <= 0) { left = every; }
      left -= 1;
      if (left <= 0) {
        if (box.dataset.jsonUrl) { show("reloading", "updating…"); update(); return; }
        show("reloading", "refreshing…"); location.reload(); return;
      }
      show("on", "next in " + left + " s");
    }

    function update() {
      fetch(box.dataset.jsonUrl, {credentials: "same-origin", headers: {"Accept": "application/json"}})
        .then(function (response) {
          if (!response.ok) { throw new Error("HTTP " + response.status); }
          return response.json();
        })
        .then(function (data) {
          if (data.shape !== box.dataset.shape) { location.reload(); return; }
          Array.prototype.forEach.call(document.querySelectorAll("[data-sqlqueue-value]"), function (el) {
            var value = data.values[el.dataset.sqlqueueValue];
            if (value !== undefined && el.textContent !== value) { el.textContent = value; }
          });
          box.dataset.updated = String(Date.now());
          left = interval();
          show("on", "updated; next in " + left + " s");
        })
        .catch(function (err) { left = interval(); show("paused", "update failed: " + err.message); });
    }

    left = interval();
    tick();
    setInterval(tick, 1000);
  }

  function start() {
    Array.prototype.forEach.call(document.querySelectorAll("[data-sqlqueue-autorefresh]"), init);
  }
  if (document.readyState === "loading") { document.addEventListener("DOMContentLoaded", start); } else { start(); }
})();

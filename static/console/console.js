/* mqtthub console: small progressive enhancements (every page works without them). */
(function () {
  "use strict";

  // the navigation folds behind a Menu button on narrow screens (CSS shows the button there)
  document.documentElement.classList.add("js");
  document.addEventListener("click", function (event) {
    var button = event.target.closest("[data-nav-toggle]");
    if (!button) return;
    var sidebar = button.closest("[data-sidebar]");
    var open = !sidebar.classList.contains("nav-open");
    sidebar.classList.toggle("nav-open", open);
    button.setAttribute("aria-expanded", open ? "true" : "false");
  });

  // "Copy" buttons next to secrets: data-copy="#element-id"
  document.addEventListener("click", function (event) {
    var button = event.target.closest("[data-copy]");
    if (!button) return;
    var source = document.querySelector(button.getAttribute("data-copy"));
    if (!source || !navigator.clipboard) return;
    navigator.clipboard.writeText(source.textContent.trim()).then(function () {
      var text = button.textContent;
      button.textContent = "Copied";
      setTimeout(function () { button.textContent = text; }, 1500);
    });
  });

  // Tenant switcher: navigate on change (its button does the same without JS)
  document.addEventListener("change", function (event) {
    var select = event.target.closest("[data-navigate]");
    if (select && select.value) window.location = select.value;
  });

  // ACL rule form: show the device or pattern field only when it applies
  function syncWho(root) {
    (root || document).querySelectorAll("form[data-acl-form]").forEach(function (form) {
      var who = form.querySelector("[name=who]");
      if (!who) return;
      var apply = function () {
        var device = form.querySelector("[data-who=device]");
        var pattern = form.querySelector("[data-who=pattern]");
        if (device) device.hidden = who.value !== "device";
        if (pattern) pattern.hidden = who.value !== "pattern";
      };
      who.addEventListener("change", apply);
      apply();
    });
  }
  document.addEventListener("DOMContentLoaded", function () { syncWho(); });
  document.addEventListener("htmx:afterSettle", function (event) { syncWho(event.target); });
})();

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

  // "Copy" buttons next to secrets: data-copy="#element-id". The Clipboard API exists only on HTTPS
  // and localhost: on a console served over plain HTTP the button did nothing, so it then selects the
  // text and copies the selection (or, where the browser refuses, asks for Ctrl+C).
  function flash(button, text) {
    if (!button.hasAttribute("data-label")) button.setAttribute("data-label", button.textContent);
    button.textContent = text;
    clearTimeout(button._flash);
    button._flash = setTimeout(function () { button.textContent = button.getAttribute("data-label"); }, 2000);
  }
  document.addEventListener("click", function (event) {
    var button = event.target.closest("[data-copy]");
    if (!button) return;
    var source = document.querySelector(button.getAttribute("data-copy"));
    if (!source) return;
    var fallback = function () {
      var range = document.createRange();
      range.selectNodeContents(source);
      var selection = window.getSelection();
      selection.removeAllRanges();
      selection.addRange(range);
      var copied = false;
      try { copied = document.execCommand("copy"); } catch (e) { copied = false; }
      flash(button, copied ? "Copied" : "Selected: press Ctrl+C");
    };
    if (navigator.clipboard && window.isSecureContext) {
      navigator.clipboard.writeText(source.textContent.trim()).then(function () { flash(button, "Copied"); }, fallback);
    } else {
      fallback();
    }
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

  // An htmx request that fails swaps nothing: without a word the button seemed to do nothing (a rule
  // deleted meanwhile in another window, a role that may not, the console down). Say so in one alert
  // at the bottom of the screen (seen wherever the page is scrolled); a new failure replaces it.
  function showRequestError(text) {
    var box = document.querySelector("[data-request-error]");
    if (!box) {
      box = document.createElement("div");
      box.className = "toast message error";
      box.setAttribute("role", "alert");
      box.setAttribute("data-request-error", "");
      box.appendChild(document.createElement("span"));
      var close = document.createElement("button");
      close.type = "button";
      close.className = "btn btn-sm";
      close.textContent = "Dismiss";
      close.addEventListener("click", function () { box.remove(); });
      box.appendChild(close);
      document.body.appendChild(box);
    }
    box.firstChild.textContent = text;
  }
  function pageMessage(xhr) {
    // the error pages mark their explanation (templates/403.html, 403_csrf.html, 404.html, 500.html)
    try {
      var doc = new DOMParser().parseFromString(xhr.responseText || "", "text/html");
      var el = doc.querySelector("[data-error-message]");
      return el ? el.textContent.replace(/\s+/g, " ").trim() : "";
    } catch (e) {
      return "";
    }
  }
  document.addEventListener("htmx:responseError", function (event) {
    var xhr = event.detail.xhr;
    var status = xhr.status;
    var text;
    if (status === 404) {
      text = "That is no longer there: it may have been changed or deleted meanwhile. Reload the page to see it as it is now.";
    } else if (status === 403) {
      text = pageMessage(xhr) || "Your role does not allow this.";
    } else if (status >= 500) {
      text = "The console hit an error (HTTP " + status + "); it has been logged. Please try again.";
    } else {
      text = (pageMessage(xhr) || "The request was refused") + " (HTTP " + status + ").";
    }
    showRequestError(text);
  });
  document.addEventListener("htmx:sendError", function () {
    showRequestError("The console did not answer: check the connection, then try again.");
  });
  document.addEventListener("htmx:afterSettle", function (event) { syncWho(event.target); });
})();

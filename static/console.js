// ModelForge console: the few behaviours HTMX does not cover. No inline script (strict CSP).
// C4: a revealed secret lives only in this page's DOM; these functions take it out again.
(function () {
  "use strict";

  function clearSecrets(reason) {
    document.querySelectorAll("[data-secret-reveal]").forEach(function (reveal) {
      var note = document.createElement("p");
      note.className = "mf-notice";
      note.setAttribute("role", "status");
      note.setAttribute("data-secret-cleared", reason);
      note.textContent = reason === "expired"
        ? "The token expired and has been removed from this page. Create a new one to enrol the node."
        : "The secret has been removed from this page.";
      reveal.replaceWith(note);
    });
  }

  function startCountdowns(root) {
    root.querySelectorAll("[data-expires-in]").forEach(function (element) {
      if (element.dataset.countdownStarted) return;
      element.dataset.countdownStarted = "1";
      // Count against the monotonic clock from the server's remaining seconds, so a skewed
      // client clock cannot keep a token on screen past its expiry.
      var deadline = performance.now() + Number(element.dataset.expiresIn) * 1000;
      function tick() {
        var left = Math.max(0, Math.round((deadline - performance.now()) / 1000));
        var minutes = Math.floor(left / 60);
        element.textContent = minutes > 0 ? minutes + " min " + (left % 60) + " s" : left + " s";
        if (left <= 0) {
          clearSecrets("expired");
          return;
        }
        if (document.contains(element)) window.setTimeout(tick, 1000);
      }
      tick();
    });
  }

  function copyText(button) {
    var source = document.querySelector(button.dataset.copyTarget);
    if (!source) return;
    var done = function () {
      button.textContent = "Copied";
      window.setTimeout(function () { button.textContent = "Copy"; }, 1500);
    };
    if (navigator.clipboard && window.isSecureContext) {
      navigator.clipboard.writeText(source.textContent).then(done);
    } else {
      var range = document.createRange();
      range.selectNodeContents(source);
      var selection = window.getSelection();
      selection.removeAllRanges();
      selection.addRange(range);
      done();
    }
  }

  // C4, issue 25: a shown enrolment token is gone for good once the page is left, so while one is
  // on screen (data-guard-unload) a reload or a navigation asks first. That stops once the node
  // has used the token (the reveal's poll renders data-token-used) or the operator says it is saved.
  function tokenUnsaved() {
    return document.querySelector("[data-secret-reveal][data-guard-unload]") !== null;
  }

  function tokenSafe(root) {
    root.querySelectorAll("[data-secret-reveal][data-guard-unload]").forEach(function (reveal) {
      reveal.removeAttribute("data-guard-unload");
      reveal.querySelectorAll("[data-secret-saved]").forEach(function (button) {
        var note = document.createElement("p");
        note.className = "mf-small";
        note.setAttribute("role", "status");
        note.setAttribute("data-secret-saved-note", "");
        note.textContent = "Noted: this page no longer asks before you leave it.";
        button.replaceWith(note);
      });
    });
  }

  window.addEventListener("beforeunload", function (event) {
    if (!tokenUnsaved()) return;
    event.preventDefault();
    event.returnValue = "";  // what Chromium before 119 needs to ask
  });

  document.addEventListener("htmx:load", function (event) {
    var element = event.detail.elt;
    if (element.matches("[data-token-used]") || element.querySelector("[data-token-used]")) tokenSafe(document);
  });

  // Capture phase: the secret is gone before htmx sends the request or the link navigates. A
  // control that leaves the token (data-confirm-leave) asks first while it is not saved; "Cancel"
  // stops the click before htmx or the link sees it.
  document.addEventListener("click", function (event) {
    var target = event.target.closest("[data-clear-secret], [data-copy-target], [data-secret-saved]");
    if (!target) return;
    if (target.hasAttribute("data-copy-target")) {
      copyText(target);
    } else if (target.hasAttribute("data-secret-saved")) {
      tokenSafe(document);
    } else if (target.hasAttribute("data-confirm-leave") && tokenUnsaved() &&
               !window.confirm(target.dataset.confirmLeave)) {
      event.preventDefault();
      event.stopPropagation();
    } else if (!target.hasAttribute("hx-confirm")) {
      clearSecrets("closed");
    }
  }, true);

  // A confirmed revoke clears the reveal too; a cancelled one leaves it.
  document.addEventListener("htmx:confirm", function (event) {
    var source = event.detail.elt;
    if (!source.hasAttribute("data-clear-secret") || !source.hasAttribute("hx-confirm")) return;
    event.preventDefault();
    if (window.confirm(event.detail.question)) {
      clearSecrets("closed");
      event.detail.issueRequest(true);
    }
  });

  // A tab nobody is looking at does not poll: a self-refresh (no triggering event) is skipped
  // while the page is hidden, and the next tick after it is shown refreshes as usual. At 1,000
  // nodes the node list is ~450 KiB every 5 s, so a forgotten tab is real load.
  document.addEventListener("htmx:beforeRequest", function (event) {
    var config = event.detail.requestConfig;
    if (document.hidden && config && !config.triggeringEvent && config.verb === "get") {
      event.preventDefault();
    }
  });

  // V1: a panel that refreshes itself keeps the evidence its reader opened: each open <details>
  // with an id is open again in the content that replaces it.
  var openDetails = [];
  document.addEventListener("htmx:beforeSwap", function (event) {
    openDetails = Array.prototype.map.call(
      event.detail.target.querySelectorAll("details[open][id]"), function (details) { return details.id; });
  });
  document.addEventListener("htmx:afterSwap", function () {
    openDetails.forEach(function (id) {
      var details = document.getElementById(id);
      if (details && details.tagName === "DETAILS") details.open = true;
    });
    openDetails = [];
  });

  // Times come from the server in UTC (app/console/formatting.py `utc`); each is shown in the
  // reader's own time zone, to the second, with the UTC text kept as its title.
  function localTimes(root) {
    var format = new Intl.DateTimeFormat(undefined, {
      year: "numeric", month: "2-digit", day: "2-digit", hour: "2-digit", minute: "2-digit",
      second: "2-digit", hourCycle: "h23", timeZoneName: "short" });
    root.querySelectorAll("time[data-local-time]").forEach(function (element) {
      var moment = new Date(element.getAttribute("datetime"));
      if (isNaN(moment.getTime())) return;
      var parts = {};
      format.formatToParts(moment).forEach(function (part) { parts[part.type] = part.value; });
      element.title = element.textContent;
      element.textContent = parts.year + "-" + parts.month + "-" + parts.day + " " + parts.hour + ":" +
        parts.minute + ":" + parts.second + " " + parts.timeZoneName;
      element.removeAttribute("data-local-time");
    });
  }
  document.addEventListener("DOMContentLoaded", function () { localTimes(document); });
  document.addEventListener("htmx:load", function (event) { localTimes(event.detail.elt); });

  // Leaving the page (including into the back/forward cache) takes the secret with it.
  window.addEventListener("pagehide", function () { clearSecrets("closed"); });

  // S6: the playground posts its form and reads the answer's Server-Sent Events as they arrive,
  // each chunk's text appended as text (never as HTML). Stop aborts the request, which cancels
  // the generation on the node.
  function readEvents(response, onData) {
    var reader = response.body.getReader();
    var decoder = new TextDecoder();
    var buffer = "";
    function pump() {
      return reader.read().then(function (chunk) {
        if (chunk.done) return;
        buffer += decoder.decode(chunk.value, { stream: true });
        var events = buffer.split("\n\n");
        buffer = events.pop();
        for (var i = 0; i < events.length; i++) {
          var lines = events[i].split("\n");
          for (var j = 0; j < lines.length; j++) {
            if (lines[j].indexOf("data: ") === 0 && onData(lines[j].slice(6)) === false) {
              reader.cancel();
              return;
            }
          }
        }
        return pump();
      });
    }
    return pump();
  }

  function startPlaygrounds(root) {
    root.querySelectorAll("form[data-playground]").forEach(function (form) {
      if (form.dataset.playgroundStarted) return;
      form.dataset.playgroundStarted = "1";
      var section = form.closest("section");
      var answer = section.querySelector("[data-testid=playground-answer]");
      var status = section.querySelector("[data-testid=playground-status]");
      var send = form.querySelector("[data-playground-send]");
      var stop = form.querySelector("[data-playground-stop]");
      var controller = null;
      stop.addEventListener("click", function () { if (controller) controller.abort(); });
      form.addEventListener("submit", function (event) {
        event.preventDefault();
        controller = new AbortController();
        answer.textContent = "";
        status.textContent = "Waiting for the model…";
        send.disabled = true;
        stop.hidden = false;
        var pieces = 0;
        var failure = null;
        fetch(form.action, { method: "POST", body: new FormData(form), signal: controller.signal,
                             headers: { "Accept": "text/event-stream" }, credentials: "same-origin" })
          .then(function (response) {
            if (!response.ok) {
              return response.json().then(function (body) { throw body.error; },
                                          function () { throw { message: "The control plane answered " + response.status + "." }; });
            }
            return readEvents(response, function (data) {
              if (data === "[DONE]") return false;
              var chunk = JSON.parse(data);
              if (chunk.error) { failure = chunk.error; return false; }
              var text = chunk.choices && chunk.choices[0] && chunk.choices[0].delta.content;
              if (text) {
                answer.append(document.createTextNode(text));
                pieces += 1;
                status.textContent = "Generating… " + pieces + " pieces so far.";
              }
            });
          })
          .then(function () {
            if (failure) throw failure;
            status.textContent = "Done: " + pieces + " pieces.";
          })
          .catch(function (error) {
            if (error && error.name === "AbortError") {
              status.textContent = "Stopped.";
            } else {
              status.textContent = ((error && error.message) || "The request failed.") +
                (error && error.next_step ? " " + error.next_step : "");
            }
          })
          .finally(function () {
            send.disabled = false;
            stop.hidden = true;
            controller = null;
          });
      });
    });
  }

  document.addEventListener("DOMContentLoaded", function () { startCountdowns(document); startPlaygrounds(document); });
  document.addEventListener("htmx:load", function (event) { startCountdowns(event.detail.elt); });

  // C5: the console shell. The narrow-screen menu opens and closes behind its button.
  document.addEventListener("click", function (event) {
    var toggle = event.target.closest("[data-menu-toggle]");
    if (!toggle) return;
    var menu = document.getElementById(toggle.getAttribute("aria-controls"));
    var open = toggle.getAttribute("aria-expanded") !== "true";
    toggle.setAttribute("aria-expanded", open ? "true" : "false");
    if (menu) menu.classList.toggle("mf-open", open);
  });

  // A plain (non-htmx) form that ends something asks first: data-confirm on the form or its
  // submit button. htmx requests ask through hx-confirm instead, handled by htmx itself.
  document.addEventListener("submit", function (event) {
    var form = event.target;
    var asker = (event.submitter && event.submitter.closest("[data-confirm]")) || form.closest("[data-confirm]");
    if (asker && !window.confirm(asker.getAttribute("data-confirm"))) event.preventDefault();
  }, true);

  // A polled value marked data-announce="Label" is read out (politely) when a refresh changes
  // it, through the one live region that outlives every swap (#mf-announcer in base.html).
  var announced = {};
  function announceValues(root, speak) {
    root.querySelectorAll("[data-announce]").forEach(function (element) {
      var label = element.getAttribute("data-announce");
      var value = element.textContent.trim();
      if (speak && label in announced && announced[label] !== value) {
        var region = document.getElementById("mf-announcer");
        if (region) region.textContent = label + ": " + value;
      }
      announced[label] = value;
    });
  }
  document.addEventListener("DOMContentLoaded", function () { announceValues(document, false); });
  document.addEventListener("htmx:load", function (event) { announceValues(event.detail.elt, true); });

  // A swapped-in step (the enrolment wizard's) takes the focus to its heading, so a keyboard or
  // screen-reader user continues from the new step rather than from <body>.
  document.addEventListener("htmx:afterSettle", function (event) {
    var heading = event.detail.elt && event.detail.elt.querySelector
      ? event.detail.elt.querySelector("[data-focus-on-swap]") : null;
    if (heading && heading.isConnected) {
      if (!heading.hasAttribute("tabindex")) heading.setAttribute("tabindex", "-1");
      heading.focus();
    }
  });

  // A table (or code) wider than its card scrolls inside it; only then is it a tab stop, so a
  // keyboard can scroll it too (WCAG 2.1.1) without an extra stop on every wide screen.
  function markScrollers() {
    document.querySelectorAll(".mf-table-scroll, .mf-code, .mf-generated").forEach(function (scroller) {
      if (scroller.scrollWidth > scroller.clientWidth + 1 || scroller.scrollHeight > scroller.clientHeight + 1) {
        scroller.setAttribute("tabindex", "0");
      } else {
        scroller.removeAttribute("tabindex");
      }
    });
  }
  var scrollerFrame = 0;
  function markScrollersSoon() {
    if (scrollerFrame) return;
    scrollerFrame = window.requestAnimationFrame(function () { scrollerFrame = 0; markScrollers(); });
  }
  document.addEventListener("DOMContentLoaded", markScrollers);
  document.addEventListener("htmx:afterSettle", markScrollersSoon);
  window.addEventListener("resize", markScrollersSoon);
  document.addEventListener("toggle", markScrollersSoon, true);  // an opened <details> shows its code
})();

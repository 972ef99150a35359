// The "live" badge shows whether the page's WebSocket is connected. The htmx ws
// extension reconnects by itself after an abnormal close (a server restart); a
// server going away cleanly (1001) is retried here too. 4403 means the session
// ended (logout, or staff status taken away): no retry, the operator logs in again.
const SIGNED_OUT = 4403;

// A socket opened again (after a restart or a dropped connection) missed what changed
// while it was closed. The pages the hub renders every second catch up by themselves
// and a task page is sent its task as its socket opens; the dead letter is fetched
// again (or marked stale while the operator is selecting).
let openedBefore = false;
document.addEventListener("htmx:wsOpen", () => {
  setBadge("live", "live");
  if (openedBefore) applyDeadLetterChange({ left: [], arrived: 0, unknown: 1 });
  openedBefore = true;
});
document.addEventListener("htmx:wsClose", (event) => {
  const code = event.detail.event.code;
  if (code === SIGNED_OUT) {
    setBadge("down", "signed out: reload to log in");
    return;
  }
  setBadge("down", "reconnecting…");
  if (code === 1000 || code === 1001) {
    setTimeout(() => event.detail.socketWrapper.reconnect(), 1000 + Math.random() * 1000);
  }
});

function setBadge(state, text) {
  for (const badge of document.querySelectorAll("[data-live-badge]")) {
    badge.className = "live-badge " + state;
    badge.textContent = text;
  }
}

// Every message from the server (consumers.py) is JSON that names its type:
// - {"type": "html", "html": "…"}: fragments the ws extension swaps in by element id;
// - {"type": "changes", …}: a change this page applies itself; so far, the dead
//   letter's {"dead_letter": {"left": [ids], "arrived": n, "unknown": n}}.
// Pages open their socket with hx-ext="ws,live": the ws extension hands each message
// to this extension first, and swaps what it returns.
htmx.defineExtension("live", {
  transformResponse(text, xhr) {
    if (xhr) return text; // an ordinary htmx request made inside a live element
    const message = JSON.parse(text);
    switch (message.type) {
      case "html":
        return message.html;
      case "changes":
        if (message.dead_letter) applyDeadLetterChange(message.dead_letter);
        return "";
      default:
        throw new Error(`unknown live message type: ${message.type}`);
    }
  },
});

// Rows that left are removed where shown; tasks that arrived are announced rather
// than inserted under the operator's selection. When tasks left beyond what the
// notification could name, or the page emptied, the results are fetched again,
// unless the operator is selecting rows or confirming: then a note says so.
function applyDeadLetterChange({ left, arrived, unknown }) {
  if (!document.getElementById("dead-letter-results")) return;
  let removed = 0;
  for (const id of left) {
    const row = document.getElementById("dl-" + id);
    // A row whose own Revive or Cancel is on its way stays: that answer redraws the
    // results, and the htmx django-htmx ships (2.0.10) drops the answer's out-of-band
    // outcome message when the button that asked has left the page meanwhile.
    if (row && !row.querySelector(".htmx-request")) {
      row.remove();
      removed++;
    }
  }
  if (arrived) announce("dead-letter-arrivals", arrived);
  const emptied = removed && !document.querySelector("#dead-letter-table tr[data-task]");
  if (unknown || emptied) {
    if (!operatorBusy()) return reloadResults();
    document.getElementById("dead-letter-stale").hidden = false;
  }
  refreshCount();
}

function operatorBusy() {
  return Boolean(
    document.querySelector("#dead-letter-table input[name=ids]:checked") ||
      document.querySelector("#confirm *"),
  );
}

function announce(id, n) {
  const note = document.getElementById(id);
  const total = Number(note.dataset.count || 0) + n;
  note.dataset.count = total;
  note.querySelector("[data-n]").textContent = total;
  note.hidden = false;
}

let reloadTimer = null;
function reloadResults() {
  clearTimeout(reloadTimer); // one fetch for a burst of changes, so none lands stale
  reloadTimer = setTimeout(() => {
    refetch("#dead-letter-results", "outerHTML");
  }, 200);
}

let countTimer = null;
function refreshCount() {
  clearTimeout(countTimer);
  countTimer = setTimeout(() => {
    refetch("#dead-letter-count", "innerHTML");
  }, 300);
}

// An element that says where it is fetched from (data-url: the results and the count
// have URLs of their own), fetched again for the filter and page in the address bar.
function refetch(selector, swap) {
  const element = document.querySelector(selector);
  if (!element) return;
  htmx.ajax("GET", element.dataset.url + window.location.search, { target: element, swap });
}

// The "live" badge shows whether the page's WebSocket is connected. The htmx ws
// extension reconnects by itself after an abnormal close (a server restart); a
// server going away cleanly (1001) is retried here too. 4403 means the session
// ended (logout, or staff status taken away): no retry, the operator logs in again.
const SIGNED_OUT = 4403;

document.addEventListener("htmx:wsOpen", () => setBadge("live", "live"));
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

// Most messages are HTML the ws extension swaps in by id. A JSON message is a
// change this page applies itself: so far, the dead letter's
// {"dead_letter": {"left": [ids], "arrived": n, "unknown": n}}.
document.addEventListener("htmx:wsBeforeMessage", (event) => {
  const text = event.detail.message;
  if (!text.startsWith("{")) return;
  event.preventDefault();
  const message = JSON.parse(text);
  if (message.dead_letter) applyDeadLetterChange(message.dead_letter);
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
    if (row) {
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
    htmx.ajax("GET", window.location.href, { target: "#dead-letter-results", swap: "outerHTML" });
  }, 200);
}

let countTimer = null;
function refreshCount() {
  clearTimeout(countTimer);
  countTimer = setTimeout(() => {
    htmx.ajax("GET", window.location.href, { target: "#dead-letter-count", swap: "innerHTML" });
  }, 300);
}

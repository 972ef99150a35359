// The "live" badge shows whether the page's WebSocket is connected. The htmx ws
// extension reconnects by itself after an abnormal close (a server restart); a
// server going away cleanly (1001) is retried here too.
document.addEventListener("htmx:wsOpen", () => setBadge("live", "live"));
document.addEventListener("htmx:wsClose", (event) => {
  setBadge("down", "reconnecting…");
  const code = event.detail.event.code;
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

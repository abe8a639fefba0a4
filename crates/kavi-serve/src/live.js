// Follows a running node on its page: each stream's lines are appended as the node prints them,
// and the page is loaded again once the node has ended, to show what the ledger kept. Without
// this script the page reads the same, with a link to load it again.
for (const view of document.querySelectorAll("[data-live]")) {
  const source = new EventSource(view.dataset.live);
  for (const pre of view.querySelectorAll("pre[data-stream]")) {
    source.addEventListener(pre.dataset.stream, (event) => pre.append(event.data));
  }
  const status = view.querySelector("[role=status]");
  status.textContent = "Running: its output grows below as it prints; the page reloads when it ends.";
  source.addEventListener("end", () => {
    source.close();
    location.reload();
  });
  source.addEventListener("error", () => {
    source.close();
    status.textContent = "The live view lost the server: reload the page.";
  });
}

// flower console: live pages over server-sent events. No framework: the
// server renders every fragment; this script only swaps them in.
"use strict";

(function () {
  // The jobs list: refresh its rows whenever the server says jobs changed.
  const jobs = document.getElementById("jobs");
  if (jobs && jobs.dataset.live) {
    const source = new EventSource(jobs.dataset.live);
    source.addEventListener("changed", async () => {
      const r = await fetch(jobs.dataset.rows, { credentials: "same-origin" });
      if (r.ok) jobs.tBodies[0].innerHTML = await r.text();
    });
  }

  // A job page: the event log, and the header, actions and task tree
  // refreshed when an event changes them. EventSource resumes from the last
  // event id after a reconnect.
  const job = document.querySelector("main.job");
  if (!job || !job.dataset.live) return;
  const log = document.getElementById("events");
  const status = document.getElementById("ev-status");
  const live = document.getElementById("live");
  const refreshing = new Set([
    "job_state", "session_started", "task_queued", "task_started", "task_finished",
    "question_asked", "question_answered", "judge_verdict", "handoff",
  ]);
  let pending = null;
  // Never swap out a form the user is filling in: try again later.
  const busy = () => [...live.querySelectorAll("input:not([type=hidden])")]
    .some((i) => i.value !== "" || i === document.activeElement);
  const refresh = () => {
    if (pending) return;
    pending = setTimeout(async () => {
      pending = null;
      if (busy()) { refresh(); return; }
      // The same window of the timeline as the page shows (`tasks=N`).
      const shown = new URLSearchParams(location.search);
      shown.set("fragment", "live");
      const r = await fetch(`/jobs/${job.dataset.job}?${shown}`, { credentials: "same-origin" });
      if (r.ok && !busy()) live.innerHTML = await r.text();
    }, 150);
  };
  const source = new EventSource(job.dataset.live);
  source.onopen = () => { status.textContent = "live"; };
  source.onerror = () => { status.textContent = "reconnecting…"; };
  source.addEventListener("job", (m) => {
    const e = JSON.parse(m.data);
    const li = document.createElement("li");
    li.dataset.kind = e.kind;
    const when = new Date(e.at).toLocaleTimeString();
    const payload = JSON.stringify(e.payload);
    li.textContent = `#${e.seq} ${when} ${e.kind} ${payload.length > 160 ? payload.slice(0, 160) + "…" : payload}`;
    log.prepend(li);
    while (log.children.length > 200) log.lastElementChild.remove();
    if (refreshing.has(e.kind)) refresh();
  });
  source.addEventListener("end", () => {
    status.textContent = "ended";
    source.close();
    refresh();
  });
})();

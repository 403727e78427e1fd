// The index page: the run's state and summary, its plots, and the episode table, refreshed every
// POLL_MS while the run is not finished (the table only when the ledger changed).
"use strict";

const view = { rows: [], version: null, plots: null, sortKey: "task", sortDir: 1 };
const UNSCORED = new Set(["infra_error", "network_denied", "network_unreachable"]);

async function refresh() {
  let run;
  try {
    run = await getJSON("/api/run");
    if (run.version !== view.version) {
      view.rows = (await getJSON("/api/episodes")).episodes;
      view.version = run.version;
      renderOutcomes();
      renderTable();
    }
    showProblem(run.ledger_error);
    renderRun(run);
  } catch (error) {
    showProblem("the viewer did not answer (" + error.message + "); trying again");
  }
  if (!run || run.live) setTimeout(refresh, POLL_MS);
}

function renderRun(run) {
  document.getElementById("run-dir").textContent = run.run_dir;
  const state = document.getElementById("state");
  state.className = "state " + run.state;
  state.dataset.state = run.state;
  state.textContent = { finished: "finished", in_progress: "in progress", incomplete: "ended incomplete" }[run.state]
    + (run.live ? " (refreshing every " + POLL_MS / 1000 + " s)" : "") + ": " + run.detail;
  pairs(document.getElementById("headline"), run.headline);
  const summary = run.summary || {};
  const scheduled = (summary.counts || {}).scheduled;
  const finished = Object.values(run.counts).reduce((a, b) => a + b, 0);
  const counts = [["episodes finished", finished + (scheduled === undefined ? "" : " of " + scheduled)]];
  if (run.live) counts.push(["in flight", run.in_flight]);
  for (const [outcome, count] of Object.entries(run.counts).sort()) counts.push([outcome, count]);
  counts.push(["mean reward", number(run.mean_reward)]);
  pairs(document.getElementById("counts"), counts);
  pairs(document.getElementById("summary"), run.summary ? summaryEntries(summary) : []);
  renderPlots(run.plots);
  fileList(document.getElementById("files"), run.files);
}

function summaryEntries(summary) {
  const latency = summary.latency_ms || {};
  const throughput = summary.throughput || {};
  const entries = [
    ["pass rate", number(summary.pass_rate)],
    ...Object.entries(summary.pass_at_k || {}).map(([k, v]) => ["pass@" + k, number(v)]),
    ["start states identical", summary.start_states_identical],
    ["episodes/s", number(throughput.episodes_per_s, 2) + " over " + number(throughput.wall_s, 1) + " s"],
    ["reset p50 (ms)", number((latency.reset || {}).p50_ms, 1)],
    ["episode p50 (ms)", number((latency.episode || {}).p50_ms, 1)],
  ];
  if (summary.stopped) entries.push(["stopped", summary.stopped]);
  for (const [task, why] of Object.entries(summary.skipped_tasks || {})) entries.push(["skipped " + task, why]);
  for (const [task, info] of Object.entries((summary.network || {}).tasks_blocked || {})) {
    entries.push(["network-blocked " + task, info.outcome + ": " + info.hint]);
  }
  for (const [cause, count] of Object.entries(summary.infra_causes || {})) entries.push(["infra error ×" + count, cause]);
  return entries;
}

function renderPlots(plots) {
  const signature = JSON.stringify(plots);
  if (signature === view.plots) return;
  view.plots = signature;
  const box = clear(document.getElementById("plots"));
  for (const plot of plots) box.append(el("img", { src: fileUrl(plot.path, plot.version), alt: plot.path }));
  document.getElementById("plots-section").hidden = plots.length === 0;
}

function renderOutcomes() {
  const select = document.getElementById("outcome");
  const chosen = select.value;
  const counts = {};
  for (const row of view.rows) counts[row.outcome] = (counts[row.outcome] || 0) + 1;
  const options = [el("option", { value: "", text: "all (" + view.rows.length + ")" })];
  for (const outcome of Object.keys(counts).sort()) {
    options.push(el("option", { value: outcome, text: outcome + " (" + counts[outcome] + ")" }));
  }
  options.push(el("option", { value: ":passed", text: "passed" }), el("option", { value: ":failed", text: "not passed" }));
  select.replaceChildren(...options);
  select.value = options.some((option) => option.value === chosen) ? chosen : "";
}

function matches(row, text, outcome) {
  if (outcome === ":passed" && !row.passed) return false;
  if (outcome === ":failed" && row.passed) return false;
  if (outcome && !outcome.startsWith(":") && row.outcome !== outcome) return false;
  if (!text) return true;
  const haystack = [row.id, row.task, row.outcome, row.end_reason, row.error].join(" ").toLowerCase();
  return text.split(/\s+/).every((word) => haystack.includes(word));
}

function compare(a, b) {
  const x = a[view.sortKey], y = b[view.sortKey];
  if (x === y) return String(a.id).localeCompare(String(b.id));
  if (x === null || x === undefined) return 1;
  if (y === null || y === undefined) return -1;
  return (typeof x === "number" && typeof y === "number" ? x - y : String(x).localeCompare(String(y))) * view.sortDir;
}

function renderTable() {
  const text = document.getElementById("filter").value.trim().toLowerCase();
  const outcome = document.getElementById("outcome").value;
  const shown = view.rows.filter((row) => matches(row, text, outcome)).sort(compare);
  const body = document.querySelector("#episodes tbody");
  body.replaceChildren(...shown.map(tableRow));
  document.getElementById("shown").textContent = shown.length + " of " + view.rows.length + " episodes";
  document.getElementById("no-episodes").hidden = view.rows.length > 0;
  for (const th of document.querySelectorAll("#episodes th")) {
    th.classList.toggle("sorted-up", th.dataset.key === view.sortKey && view.sortDir > 0);
    th.classList.toggle("sorted-down", th.dataset.key === view.sortKey && view.sortDir < 0);
  }
}

function tableRow(row) {
  const kind = UNSCORED.has(row.outcome) ? "unscored" : row.passed ? "passed" : "failed";
  const title = row.error || row.end_reason || "";
  return el("tr", { class: kind, "data-id": row.id },
    el("td", {}, el("a", { href: episodeUrl(row.id), text: row.task })),
    el("td", { class: "num", text: row.sample }),
    el("td", { class: "num", text: row.attempt }),
    el("td", { class: "outcome", text: row.outcome, title: title }),
    el("td", { class: "num", text: number(row.reward) }),
    el("td", { class: "num", text: number(row.episode_s, 2) }),
    el("td", { class: "num", text: number(row.steps, 0) }),
    el("td", { class: "num", text: number(row.tokens, 0) }));
}

function sortBy(key) {
  view.sortDir = view.sortKey === key ? -view.sortDir : 1;
  view.sortKey = key;
  renderTable();
}

document.getElementById("filter").addEventListener("input", renderTable);
document.getElementById("outcome").addEventListener("change", renderTable);
for (const th of document.querySelectorAll("#episodes th")) th.addEventListener("click", () => sortBy(th.dataset.key));
refresh();

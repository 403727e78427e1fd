// The episode page: result, instruction, every step's action and output (with the model's message and
// tokens for a model agent), the verifier's verdict and output, the end-state diff, the network audit.
"use strict";

const episodeId = new URLSearchParams(location.search).get("id") || "";

async function load() {
  document.getElementById("episode-id").textContent = episodeId;
  document.title = "snapgym episode " + episodeId;
  try {
    render(await getJSON("/api/episode?id=" + encodeURIComponent(episodeId)));
    showProblem(null);
  } catch (error) {
    if (error.status !== 404) {
      showProblem("the viewer did not answer (" + error.message + "); trying again");
      setTimeout(load, POLL_MS);
      return;
    }
    const run = await getJSON("/api/run").catch(() => ({ live: true }));
    showProblem("this episode has no result " + (run.live ? "yet; waiting for it" : "in this run"));
    if (run.live) setTimeout(load, POLL_MS);
  }
}

function render(episode) {
  const result = episode.result;
  pairs(document.getElementById("result"), [
    ["task", result.task_id], ["sample", result.sample], ["attempt", result.attempt],
    ["outcome", result.outcome], ["reward", number(result.reward)], ["passed", result.passed],
    ["end reason", result.end_reason], ["steps", result.steps], ["tokens", number(episode.tokens, 0)],
    ["episode time (s)", number(result.episode_s, 2)], ["agent / env time (s)",
      number(result.agent_s, 2) + " / " + number(result.env_s, 2)],
    ["reset", number(result.reset_latency_ms, 1) + " ms (" + plain(result.reset_kind) + ")"],
    ["agent", result.agent], ["backend", result.backend + (result.provider ? " (" + result.provider + ")" : "")],
    ["verification", result.verification], ["sandbox", result.sandbox_id],
    ["start digest", result.start_digest], ["snapshot digest", result.task_snapshot_digest],
    ["infrastructure failures", result.infra_failures],
  ]);
  const error = document.getElementById("error");
  error.textContent = result.error || "";
  error.hidden = !result.error;
  renderTrajectory(episode.trajectory);
  renderVerifier(episode.verifier);
  renderDiff(episode.diff);
  renderNetwork(episode.network);
  fileList(document.getElementById("files"), episode.files);
  document.getElementById("episode").hidden = false;
}

function renderTrajectory(trajectory) {
  const note = document.getElementById("steps-note");
  const steps = clear(document.getElementById("steps"));
  if (!trajectory) {
    document.getElementById("instruction").textContent = "(no trajectory recorded)";
    note.textContent = "no trajectory recorded for this episode";
    return;
  }
  document.getElementById("instruction").textContent = trajectory.instruction || "";
  const notes = [plain(trajectory.total_steps) + " step(s)"];
  if (trajectory.tokens !== null) notes.push(trajectory.tokens + " tokens");
  if (trajectory.truncated) notes.push("cut to fit: " + JSON.stringify(trajectory.truncated));
  note.textContent = notes.join("; ");
  trajectory.steps.forEach((step, index) => steps.append(renderStep(step, index + 1)));
}

function renderStep(step, number) {
  const head = el("div", { class: "step-head" }, "step " + number + " ");
  const facts = [];
  if (step.source !== "agent") facts.push(step.source);
  if (step.exit_code !== null && step.exit_code !== undefined && step.exit_code >= 0) facts.push("exit code " + step.exit_code);
  if (typeof step.duration_s === "number") facts.push(step.duration_s.toFixed(2) + " s");
  if (step.timed_out) facts.push("timed out");
  head.append(el("span", { class: "muted", text: facts.join(" · ") }));
  const item = el("li", { class: "step", "data-step": step.step_id }, head);
  if (step.message) {
    const who = step.model_name ? "model (" + step.model_name + ")" : "message";
    item.append(el("div", { class: "label", text: who }), el("pre", { class: "text message", text: step.message }));
  }
  if (step.tokens) {
    const tokens = Object.entries(step.tokens).map(([k, v]) => k.replace(/_/g, " ") + " " + v).join(", ");
    item.append(el("div", { class: "label tokens", text: "tokens: " + tokens }));
  }
  for (const call of step.calls) {
    item.append(el("div", { class: "label", text: "action (" + call.tool + ")" }),
      el("pre", { class: "text action", text: call.action }));
    if (call.output !== null && call.output !== undefined) {
      item.append(el("div", { class: "label", text: "output" }), el("pre", { class: "text output", text: call.output }));
    }
  }
  for (const output of step.outputs) {
    item.append(el("div", { class: "label", text: "output" }), el("pre", { class: "text output", text: output }));
  }
  return item;
}

function renderVerifier(verifier) {
  const verdict = verifier.verdict || {};
  const entries = verifier.verdict ? [
    ["reward", number(verdict.reward)], ["rewards", verdict.rewards], ["exit code", verdict.exit_code],
    ["time (s)", number(verdict.duration_s, 2)], ["timed out", verdict.timed_out], ["mode", verdict.mode],
    ["error", verdict.error], ["removed links", (verdict.removed_links || []).length ? verdict.removed_links : undefined],
    ["missing outputs", (verdict.missing_outputs || []).length ? verdict.missing_outputs : undefined],
    ["notes", (verdict.notes || []).length ? verdict.notes : undefined],
  ] : [["verdict", "no verdict recorded"]];
  pairs(document.getElementById("verdict"), entries);
  const output = document.getElementById("verifier-output");
  output.textContent = verifier.output === null ? "(no verifier output recorded)" : verifier.output || "(empty)";
}

function renderDiff(diff) {
  const box = clear(document.getElementById("diff"));
  if (!diff) {
    box.append(el("p", { class: "muted", text: "no end-state diff recorded" }));
    return;
  }
  if (diff.unavailable !== undefined) {
    box.append(el("p", { class: "muted", text: "end-state diff unavailable: " + diff.unavailable }));
    return;
  }
  const counts = ["added", "changed", "removed"].map((kind) => diff[kind + "_count"] + " " + kind);
  box.append(el("p", { text: counts.join(", ") + " (from the " + diff.source + ")" +
    (diff.truncated ? "; the list was cut" : "") }));
  for (const kind of ["added", "changed", "removed"]) {
    if (!diff[kind].length) continue;
    const more = diff[kind + "_count"] - diff[kind].length;
    box.append(el("h3", { text: kind + (more > 0 ? " (first " + diff[kind].length + ")" : "") }),
      el("ul", { class: "paths " + kind }, ...diff[kind].map((path) => el("li", { text: path }))));
  }
}

function renderNetwork(network) {
  const box = clear(document.getElementById("network"));
  if (!network) {
    box.append(el("p", { class: "muted", text: "no network audit recorded" }));
    return;
  }
  const summary = network.summary || {};
  const policy = summary.policy || {};
  const entries = Object.entries(policy).map(([phase, rule]) =>
    [phase + " policy", (rule || {}).network_mode + ((rule || {}).allowed_hosts || []).map((h) => " " + h).join("")]);
  for (const key of ["attempts", "allowed", "denied", "unreachable", "invalid", "bytes_up", "bytes_down", "dropped"]) {
    if (summary[key] !== undefined) entries.push([key.replace("_", " "), summary[key]]);
  }
  for (const [verdict, hosts] of Object.entries(summary.hosts || {})) entries.push([verdict + " hosts", hosts.join(", ")]);
  box.append(pairs(el("dl", { class: "pairs" }), entries));
  if (!network.connections.length) return;
  const columns = ["phase", "kind", "host", "port", "verdict", "rule", "bytes_up", "bytes_down", "error"];
  const more = network.connections_total - network.connections.length;
  box.append(el("h3", { text: "connections" + (more > 0 ? " (first " + network.connections.length + ")" : "") }),
    el("table", { class: "connections" },
      el("thead", {}, el("tr", {}, ...columns.map((c) => el("th", { text: c.replace("_", " ") })))),
      el("tbody", {}, ...network.connections.map((c) =>
        el("tr", {}, ...columns.map((key) => el("td", { text: plain(c[key]) })))))));
}

load();

// Helpers shared by the viewer's pages. Everything shown is built as DOM nodes whose text is set with
// textContent (or appended as Text nodes): text an agent wrote is never parsed as HTML.
"use strict";

const POLL_MS = 2000;

function el(tag, attributes, ...children) {
  const node = document.createElement(tag);
  for (const [name, value] of Object.entries(attributes || {})) {
    if (value === null || value === undefined || value === false) continue;
    if (name === "text") node.textContent = String(value);
    else if (name === "class") node.className = value;
    else node.setAttribute(name, String(value));
  }
  for (const child of children) {
    if (child !== null && child !== undefined) node.append(child instanceof Node ? child : String(child));
  }
  return node;
}

function clear(node) {
  node.replaceChildren();
  return node;
}

function fileUrl(path, version) {
  const encoded = String(path).split("/").map(encodeURIComponent).join("/");
  return "/files/" + encoded + (version ? "?v=" + encodeURIComponent(version) : "");
}

function episodeUrl(id) {
  return "/episode?id=" + encodeURIComponent(id);
}

function number(value, digits) {
  if (value === null || value === undefined || value === "") return "–";
  return typeof value === "number" ? value.toFixed(digits === undefined ? 3 : digits) : String(value);
}

function plain(value) {
  if (value === null || value === undefined) return "–";
  if (typeof value === "object") return JSON.stringify(value);
  return String(value);
}

function pairs(list, entries) {
  clear(list);
  for (const [name, value] of entries) {
    if (value === undefined) continue;
    list.append(el("dt", { text: name }), el("dd", { text: plain(value) }));
  }
  return list;
}

function showProblem(message) {
  const problem = document.getElementById("problem");
  problem.textContent = message || "";
  problem.hidden = !message;
}

async function getJSON(url) {
  const response = await fetch(url, { cache: "no-store" });
  const body = await response.json().catch(() => ({}));
  if (!response.ok) {
    const error = new Error(body.error || response.status + " " + response.statusText);
    error.status = response.status;
    throw error;
  }
  return body;
}

function fileList(list, files) {
  clear(list);
  for (const file of files) {
    const size = file.size === undefined ? "" : " (" + file.size + " bytes)";
    list.append(el("li", {}, el("a", { href: fileUrl(file.path, file.version), text: file.path }), size));
  }
}

// milvus-cdc dashboard: polls the /v1 REST resources; pause, resume and delete go through them.
// Plain browser JavaScript, no build step. Text from the API is only ever set as textContent.
// A daemon with tokens answers 401 until a token is entered; it is kept in this tab's
// sessionStorage (gone when the tab closes) and sent as "Authorization: Bearer <token>".
"use strict";

const REFRESH_MS = 2000;
const TOKEN_KEY = "milvus-cdc-token";
const state = { tasks: [], selected: null, refreshes: 0, confirmDelete: null };

const $ = (id) => document.getElementById(id);

function el(tag, attrs = {}, ...children) {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs)) {
    if (key === "class") node.className = value;
    else if (key.startsWith("data-")) node.setAttribute(key, value);
    else node[key] = value;
  }
  for (const child of children) {
    node.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return node;
}

const dash = "\u2014";
const seconds = (v) => (v === null || v === undefined ? dash : `${Number(v).toFixed(1)} s`);
const number = (v, digits = 0) =>
  v === null || v === undefined ? dash : Number(v).toLocaleString("en", {
    maximumFractionDigits: digits, minimumFractionDigits: digits });
const when = (unix) => (unix ? new Date(unix * 1000).toISOString().replace("T", " ").slice(0, 19) : dash);

class AuthError extends Error {}
// A request that went out before the token was changed: its answer says nothing now.
class Superseded extends Error {}

function authHeaders() {
  const token = sessionStorage.getItem(TOKEN_KEY);
  return token ? { Authorization: `Bearer ${token}` } : {};
}

function showLogin(visible) {
  $("login").hidden = !visible;
  $("signout").hidden = visible || !sessionStorage.getItem(TOKEN_KEY);
  if (visible) $("token").focus();
}

async function api(method, path) {
  const sent = sessionStorage.getItem(TOKEN_KEY);
  const headers = { Accept: "application/json", ...authHeaders() };
  const response = await fetch(path, { method, headers });
  if (response.status === 401) {
    // a token entered (or a sign-out) while the request was on its way: its answer is moot
    if (sessionStorage.getItem(TOKEN_KEY) !== sent) throw new Superseded("token changed");
    if (sent) sessionStorage.removeItem(TOKEN_KEY);
    showLogin(true);
    throw new AuthError(sent ? "the token was refused; enter another" : "enter an API token");
  }
  if (response.status === 204) return null;
  const body = await response.json().catch(() => ({}));
  if (!response.ok) {
    throw new Error(body.detail || body.message || `${method} ${path}: HTTP ${response.status}`);
  }
  return body;
}

function showMessage(text) {
  const box = $("message");
  box.textContent = text || "";
  box.hidden = !text;
}

function backfillText(backfill) {
  if (!backfill) return dash;
  if (typeof backfill.percent === "number") return `${backfill.percent.toFixed(0)}%`;
  return backfill.state || dash;
}

function lastError(task) {
  if (task.state !== "Failed") return "";
  const retry = task.retry;
  if (retry && retry.next_at) {
    return `${task.reason} (retry ${retry.attempts} at ${when(retry.next_at)})`;
  }
  return task.reason;
}

function actionButton(task, action, label, enabled) {
  const button = el("button", { type: "button", "data-action": action, disabled: !enabled }, label);
  button.addEventListener("click", (event) => {
    event.stopPropagation();
    act(task.task_id, action, button);
  });
  return button;
}

function renderTasks() {
  const body = $("tasks").querySelector("tbody");
  body.replaceChildren();
  for (const task of state.tasks) {
    const progress = task.progress || {};
    const deleteButton = actionButton(task, "delete", "Delete", true);
    deleteButton.classList.add("danger");
    if (state.confirmDelete === task.task_id) {
      deleteButton.textContent = "Confirm delete";
      deleteButton.classList.add("confirm");
    }
    const row = el(
      "tr",
      { class: "task", "data-task-id": task.task_id, "data-state": task.state },
      el("td", {}, el("code", {}, task.task_id)),
      el("td", { class: "state", "data-state": task.state }, task.state),
      el("td", { class: "num lag" }, seconds(progress.lag_seconds)),
      el("td", { class: "num rate" }, number(task.rows_per_second, 1)),
      el("td", { class: "num rows" }, number(progress.rows)),
      el("td", { class: "backfill" }, backfillText(task.backfill)),
      el("td", { class: "error" }, lastError(task)),
      el(
        "td",
        { class: "actions" },
        actionButton(task, "pause", "Pause", task.state !== "Paused"),
        actionButton(task, "resume", "Resume", task.state !== "Running"),
        deleteButton,
      ),
    );
    if (task.task_id === state.selected) row.classList.add("selected");
    row.addEventListener("click", () => select(task.task_id));
    body.append(row);
  }
  $("no-tasks").hidden = state.tasks.length > 0;
  $("task-count").textContent = `(${state.tasks.length})`;
}

function collectionsOf(task) {
  if (task.collection_infos) return task.collection_infos.map((c) => `default.${c.name}`);
  const names = [];
  for (const [db, infos] of Object.entries(task.db_collections || {})) {
    for (const info of infos) names.push(`${db}.${info.name}`);
  }
  return names;
}

function targetOf(task) {
  const kafka = task.kafka_connect_param;
  if (kafka) return `kafka://${kafka.address}/${kafka.topic}`;
  const target = task.milvus_connect_param || {};
  const address = target.uri || `${target.host}:${target.port}`;
  return task.target_cluster ? `${task.target_cluster} (${address})` : address;
}

// Disaster recovery: up to when the target holds every source write, the task's last
// switchover, failover and failback, and writes of stale clients on an old primary.
function recoveryFacts(progress) {
  const facts = [];
  const upTo = progress.consistent_up_to;
  // only a time tick read proves a figure: a source that has ticked no channel has none yet
  facts.push([
    "Consistent up to",
    upTo ? upTo.time.replace("T", " ").replace("Z", " UTC") : "not known yet (no time tick read)",
  ]);
  const switchover = progress.switchover;
  if (switchover) {
    const reverse = switchover.reverse_task_id ? ` · reverse task ${switchover.reverse_task_id}` : "";
    const why = switchover.reason ? ` · ${switchover.reason}` : "";
    facts.push(["Switchover", `${switchover.state}${reverse}${why}`]);
  }
  const failover = progress.failover;
  if (failover) {
    const rpo = failover.rpo_seconds === null || failover.rpo_seconds === undefined ? "" : ` · RPO ${seconds(failover.rpo_seconds)}`;
    facts.push(["Failover", `${failover.failed_over_at}${rpo}`]);
  }
  if (progress.failback) facts.push(["Failback", progress.failback.state]);
  const stale = progress.stale_writes;
  if (stale) {
    const where = Object.keys(stale.collections || {}).join(", ");
    facts.push([
      "Stale writes",
      stale.stale_rows
        ? `${number(stale.stale_rows)} row(s) on ${stale.watching} not written by this task (${where})`
        : `none seen on ${stale.watching}`,
    ]);
  }
  return facts;
}

function renderDetail(task, positions) {
  const section = $("detail");
  if (!task) {
    section.hidden = true;
    return;
  }
  section.hidden = false;
  section.setAttribute("data-task-id", task.task_id);
  $("detail-id").textContent = task.task_id;
  const badge = $("detail-state");
  badge.textContent = task.state;
  badge.setAttribute("data-state", task.state);
  const facts = [
    ["Source", task.source_cluster || "sourceConfig"],
    ["Target", targetOf(task)],
    ["Reason", task.reason || dash],
    ["Runs on", task.owner || dash],
    ["Created", when(task.created_at)],
    ["Updated", when(task.updated_at)],
    ["Replicate channel", (task.rpc_channel_info || {}).name || dash],
    ["Rows / bytes", task.progress ? `${number(task.progress.rows)} / ${number(task.progress.bytes)}` : dash],
  ];
  for (const mapping of task.name_mapping || []) {
    facts.push([`Database ${mapping.source_db}`, `-> ${mapping.target_db}`]);
  }
  facts.push(...recoveryFacts(task.progress || {}));
  $("detail-facts").replaceChildren(...facts.flatMap(([k, v]) => [el("dt", {}, k), el("dd", {}, v)]));
  $("detail-collections").replaceChildren(...collectionsOf(task).map((n) => el("li", {}, el("code", {}, n))));
  const channels = (task.progress && task.progress.channels) || [];
  $("detail-channels").querySelector("tbody").replaceChildren(
    ...channels.map((c) =>
      el(
        "tr",
        { "data-channel": c.channel },
        el("td", {}, el("code", {}, c.channel)),
        el("td", {}, c.state),
        el("td", { class: "num" }, number(c.rows)),
        el("td", { class: "num" }, number(c.bytes)),
        el("td", { class: "num" }, seconds(c.lag_seconds)),
      ),
    ),
  );
  $("no-channels").hidden = channels.length > 0;
  $("detail-positions").querySelector("tbody").replaceChildren(
    ...(positions || []).map((p) =>
      el(
        "tr",
        { "data-channel": p.channel_name },
        el("td", {}, el("code", {}, p.channel_name)),
        el("td", {}, p.backend),
        el("td", { class: "mono" }, p.msg_id),
        el("td", {}, p.time ? when(p.time / 1000) : dash),
      ),
    ),
  );
}

const PALETTE = ["#0969da", "#1f883d", "#9a6700", "#cf222e", "#8250df", "#1b7c83"];
const SVG = "http://www.w3.org/2000/svg";

// Lines over the last hour into a fixed-size SVG (no layout shift while it refreshes): each
// series is [name, [[time, value], ...]]; a null value breaks its line.
function drawChart(id, series, format, now, window) {
  const figure = $(id);
  const svg = figure.querySelector("svg");
  const values = series.flatMap(([, points]) => points.map(([, v]) => v)).filter((v) => v != null);
  const top = Math.max(1e-9, ...values) * 1.1;
  const lines = [];
  series.forEach(([name, points], index) => {
    let run = [];
    const flush = () => {
      if (run.length) {
        const line = document.createElementNS(SVG, "polyline");
        line.setAttribute("points", run.join(" "));
        line.setAttribute("stroke", PALETTE[index % PALETTE.length]);
        line.setAttribute("data-series", name);
        lines.push(line);
      }
      run = [];
    };
    for (const [at, value] of points) {
      if (value == null) { flush(); continue; }
      const x = Math.max(0, 600 * (1 - (now - at) / window));
      run.push(`${x.toFixed(1)},${(136 - 132 * (value / top)).toFixed(1)}`);
    }
    flush();
  });
  svg.replaceChildren(...lines);
  figure.querySelector(".chart-max").textContent = values.length ? `max ${format(Math.max(...values))}` : "no data yet";
  figure.querySelector(".legend").replaceChildren(
    ...(series.length > 1 ? series : []).map(([name], index) =>
      el("li", { style: `color: ${PALETTE[index % PALETTE.length]}` }, name)),
  );
}

function renderHistory(history) {
  const samples = (history && history.samples) || [];
  const now = Date.now() / 1000;
  // the hour the daemon keeps, or the span it has so far (a minute at least)
  const kept = (history && history.window_seconds) || 3600;
  const window = samples.length ? Math.min(kept, Math.max(60, now - samples[0].at)) : kept;
  const channels = [...new Set(samples.flatMap((s) => Object.keys(s.channels || {})))].sort();
  drawChart(
    "chart-lag",
    channels.map((ch) => [ch, samples.map((s) => [s.at, (s.channels || {})[ch] ?? null])]),
    seconds, now, window,
  );
  drawChart("chart-rate", [["rows/s", samples.map((s) => [s.at, s.rows_per_second])]],
    (v) => number(v, 1), now, window);
  $("chart-note").textContent = samples.length
    ? `(the last ${Math.round(window / 60)} min: ${samples.length} samples, every ${history.interval_seconds} s)`
    : "";
}

// The task's last state and owner changes, newest first.
function renderStates(history) {
  const states = ((history && history.states) || []).slice().reverse();
  $("detail-states").querySelector("tbody").replaceChildren(
    ...states.map((s) =>
      el(
        "tr",
        { "data-kind": s.kind },
        el("td", {}, when(s.at)),
        el("td", {}, s.kind === "owner" ? `runs on ${s.to}` : `${s.from || "created"} -> ${s.to}`),
        el("td", {}, s.reason || dash),
        el("td", {}, el("code", {}, s.by || dash)),
      ),
    ),
  );
  $("no-states").hidden = states.length > 0;
}

function progressBar(label, done, total) {
  const fraction = total ? Math.min(1, done / total) : 0;
  return el(
    "div", { class: "bar", "data-bar": label },
    el("span", {}, label),
    el("span", { class: "track" }, el("span", { class: "fill", style: `width: ${(100 * fraction).toFixed(1)}%` })),
    el("span", { class: "muted" }, `${number(done)} / ${number(total)}`),
  );
}

function renderProgressBars(task) {
  const bars = [];
  const backfill = task.backfill;
  if (backfill) bars.push(progressBar(`Backfill ${backfill.state}`, backfill.rows_done, backfill.rows_total));
  const verify = (task.progress || {}).verify;
  if (verify) bars.push(progressBar(`Verify ${verify.state}`, verify.ranges_done, verify.ranges_total));
  $("detail-progress").replaceChildren(...bars);
}

async function refreshDetail() {
  const task = state.tasks.find((t) => t.task_id === state.selected);
  if (!task) {
    state.selected = null;
    renderDetail(null);
    return;
  }
  const path = `/v1/tasks/${encodeURIComponent(task.task_id)}`;
  let positions = [];
  let history = null;
  try {
    positions = (await api("GET", `${path}/positions`)).positions;
    history = await api("GET", `${path}/history`);
  } catch (error) {
    positions = positions || [];
  }
  renderDetail(task, positions);
  renderHistory(history);
  renderStates(history);
  renderProgressBars(task);
}

// Which daemon this page talks to, and how many share its metastore.
async function refreshFleet() {
  try {
    const fleet = await api("GET", "/v1/fleet");
    const others = fleet.members.filter((m) => !m.self).map((m) => `${m.member_id} (${m.tasks})`);
    $("fleet").textContent = `daemon ${fleet.member_id}` + (others.length ? ` · with ${others.join(", ")}` : "");
  } catch (error) {
    $("fleet").textContent = "";
  }
}

async function refreshStatus() {
  const pill = $("daemon-status");
  try {
    const response = await fetch("/readyz");
    const body = await response.json();
    pill.setAttribute("data-status", body.status);
    pill.textContent = body.status === "ok" ? "ready" : body.status;
  } catch (error) {
    pill.setAttribute("data-status", "unavailable");
    pill.textContent = "unreachable";
  }
}

async function refresh() {
  try {
    const body = await api("GET", "/v1/tasks");
    state.tasks = body.tasks;
    renderTasks();
    await refreshDetail();
    $("updated").textContent = `updated ${new Date().toLocaleTimeString("en-GB")}`;
    if (!$("login").hidden) showLogin(false);
    if ($("message").textContent.startsWith("Cannot list tasks")) showMessage("");
  } catch (error) {
    if (!(error instanceof Superseded)) showMessage(`Cannot list tasks: ${error.message}`);
  }
  await refreshStatus();
  await refreshFleet();
  state.refreshes += 1;
  document.body.setAttribute("data-refreshes", String(state.refreshes));
}

async function act(taskId, action, button) {
  if (action === "delete" && state.confirmDelete !== taskId) {
    state.confirmDelete = taskId; // a second click confirms
    renderTasks();
    setTimeout(() => {
      if (state.confirmDelete === taskId) {
        state.confirmDelete = null;
        renderTasks();
      }
    }, 5000);
    return;
  }
  state.confirmDelete = null;
  button.disabled = true;
  const path = `/v1/tasks/${encodeURIComponent(taskId)}`;
  try {
    if (action === "delete") await api("DELETE", path);
    else await api("POST", `${path}/${action}`);
    showMessage("");
  } catch (error) {
    if (!(error instanceof Superseded)) showMessage(`${action} ${taskId}: ${error.message}`);
  }
  await refresh();
}

function select(taskId) {
  state.selected = taskId;
  renderTasks();
  refreshDetail();
}

$("login").addEventListener("submit", (event) => {
  event.preventDefault();
  const token = $("token").value.trim();
  if (!token) return;
  sessionStorage.setItem(TOKEN_KEY, token);
  $("token").value = "";
  showLogin(false);
  showMessage("");
  refresh();
});

$("signout").addEventListener("click", () => {
  sessionStorage.removeItem(TOKEN_KEY);
  state.tasks = [];
  renderTasks();
  renderDetail(null);
  showLogin(true);
});

window.cdcDashboard = { refresh, select, state };
refresh();
setInterval(refresh, REFRESH_MS);

// tiny VIZ: the page of a trace served by tiny.viz. Lists schedules and kernels, their passes, draws a pass's graph
// (laid out by dagre), lists the rules that fired, and draws PROFILE's spans as a timeline.
"use strict";

const state = { groups: [], groupId: null, group: null, step: null, side: "after", profile: null, scale: 1, all: false };
const DRAWN = 400; // nodes drawn at first (those nearest the root): dagre takes seconds over thousands
const $ = (id) => document.getElementById(id);
const SVG = "http://www.w3.org/2000/svg";

function el(tag, attrs = {}, ...children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) node.setAttribute(k, v);
  node.append(...children);
  return node;
}

function svgEl(tag, attrs = {}) {
  const node = document.createElementNS(SVG, tag);
  for (const [k, v] of Object.entries(attrs)) node.setAttribute(k, v);
  return node;
}

async function getJSON(url) {
  const response = await fetch(url);
  if (!response.ok) throw new Error(`${url}: ${response.status}`);
  return response.json();
}

// ---------------------------------------------------------------- schedules and kernels

async function loadGroups() {
  state.groups = await getJSON("/api/groups");
  const kernels = state.groups.filter((g) => g.kind === "kernel").length;
  $("status").textContent = `${state.groups.length - kernels} schedules, ${kernels} kernels`;
  renderGroups();
}

function renderGroups() {
  const filter = $("filter").value.toLowerCase();
  const list = $("groups");
  list.replaceChildren();
  for (const g of state.groups) {
    if (filter && !g.name.toLowerCase().includes(filter)) continue;
    const selected = g.id === state.groupId ? " selected" : "";
    const item = el("li", { class: `group ${g.kind}${selected}`, "data-id": g.id, "data-kind": g.kind },
      el("span", { class: "kind" }, g.kind), el("span", { class: "name" }, g.name));
    item.onclick = () => selectGroup(g.id);
    list.append(item);
  }
}

async function selectGroup(id) {
  state.groupId = id;
  state.all = false;
  state.group = await getJSON(`/api/group/${id}`);
  renderGroups();
  const g = state.group;
  $("group-title").textContent = g.name;
  const steps = $("steps");
  steps.replaceChildren();
  g.steps.forEach((s, i) => {
    const item = el("li", { class: "step", "data-index": i, "data-name": s.name },
      el("span", { class: "name" }, s.name), el("span", { class: "count" }, `${s.rules.length} rules`));
    item.onclick = () => selectStep(i);
    steps.append(item);
  });
  const info = g.info || {};
  const lines = [];
  if (info.renderer) lines.push(`renderer: ${info.renderer}`);
  if (info.global_size) lines.push(`global size: ${info.global_size}`, `local size: ${info.local_size}`);
  if (info.note) lines.push(info.note);
  $("info").textContent = lines.join("\n");
  const actions = info.actions ? `${info.actions.join("\n") || "(none)"}\n(chosen by ${info.chosen_by})` : "";
  $("actions").textContent = actions;
  $("source").textContent = info.source || "";
  if (g.steps.length) selectStep(0);
  else {
    $("rules").replaceChildren();
    $("graph").replaceChildren();
    $("graph-title").textContent = "(no passes)";
  }
}

function selectStep(i) {
  state.step = i;
  for (const item of $("steps").children) item.classList.toggle("selected", Number(item.dataset.index) === i);
  const s = state.group.steps[i];
  const rules = $("rules");
  rules.replaceChildren();
  for (const r of s.rules) {
    rules.append(el("li", { class: "rule" }, el("b", {}, r.rule), ` ${r.before} \u2192 ${r.after}`,
      el("code", {}, `${r.pattern}: ${r.code}`)));
  }
  if (!s.rules.length) rules.append(el("li", { class: "rule" }, "(none: a pass that is not rewrite rules, or no rule applied)"));
  showSide(s.before ? state.side : "after");
}

function showSide(side) {
  state.side = side;
  $("show-before").classList.toggle("active", side === "before");
  $("show-after").classList.toggle("active", side === "after");
  const s = state.group.steps[state.step];
  const graph = side === "before" && s.before ? s.before : s.after;
  const cut = graph.cut ? ` (the first ${graph.cut} nodes left out when recorded)` : "";
  const drawn = state.all ? graph.nodes : graph.nodes.slice(-DRAWN);
  const title = $("graph-title");
  title.textContent = `${s.name}: ${side === "before" && s.before ? "before" : "after"}, ` +
    `${graph.nodes.length} nodes${cut}`;
  if (drawn.length < graph.nodes.length) {
    title.append(`; drawn: the ${drawn.length} nearest the root `);
    const all = el("button", { id: "draw-all" }, `draw all ${graph.nodes.length}`);
    all.onclick = () => { state.all = true; showSide(state.side); };
    title.append(all);
  }
  const old = side === "after" && s.before ? new Set(s.before.nodes.map(signature)) : null;
  drawGraph($("graph"), { ...graph, nodes: drawn }, old);
}

function signature(node) {
  return `${node.op}|${node.dtype}|${node.arg}|${node.src.length}`;
}

function drawGraph(container, graph, old) {
  container.replaceChildren();
  if (!graph.nodes.length) return;
  const layout = new dagre.graphlib.Graph();
  layout.setGraph({ rankdir: "TB", nodesep: 14, ranksep: 26, marginx: 12, marginy: 12 });
  layout.setDefaultEdgeLabel(() => ({}));
  for (const node of graph.nodes) {
    const head = `${graph.linear ? node.id + " " : ""}${node.op} ${node.dtype}`;
    const lines = node.arg ? [head, node.arg.length > 46 ? node.arg.slice(0, 45) + "\u2026" : node.arg] : [head];
    const width = Math.max(...lines.map((l) => l.length)) * 6.8 + 14;
    layout.setNode(String(node.id), { width, height: lines.length * 14 + 8, lines, node });
  }
  for (const node of graph.nodes) {
    for (const s of node.src) if (layout.hasNode(String(s))) layout.setEdge(String(s), String(node.id));
  }
  dagre.layout(layout);
  const { width, height } = layout.graph();
  const svg = svgEl("svg", { viewBox: `0 0 ${width} ${height}`, "data-nodes": graph.nodes.length });
  const defs = svgEl("defs");
  const marker = svgEl("marker", { id: "arrow", viewBox: "0 0 10 10", refX: 10, refY: 5, markerWidth: 6,
    markerHeight: 6, orient: "auto" });
  marker.append(svgEl("path", { d: "M0,0 L10,5 L0,10 z", fill: "#9aa4ba" }));
  defs.append(marker);
  svg.append(defs);
  const view = svgEl("g", { class: "viewport" });
  for (const e of layout.edges()) {
    const points = layout.edge(e).points;
    view.append(svgEl("path", { class: "edge", d: "M" + points.map((p) => `${p.x},${p.y}`).join(" L") }));
  }
  for (const id of layout.nodes()) {
    const n = layout.node(id);
    const isNew = old !== null && !old.has(signature(n.node));
    const g = svgEl("g", { class: isNew ? "node new" : "node", "data-op": n.node.op,
      transform: `translate(${n.x - n.width / 2},${n.y - n.height / 2})` });
    const title = svgEl("title");
    title.textContent = `${n.node.op} ${n.node.dtype} ${n.node.arg}`;
    g.append(title, svgEl("rect", { width: n.width, height: n.height }));
    n.lines.forEach((line, i) => {
      const text = svgEl("text", { x: 7, y: 15 + i * 14 });
      text.textContent = line;
      g.append(text);
    });
    view.append(g);
  }
  svg.append(view);
  container.append(svg);
  // drawn at its own size (text readable), scrolled to the root at the bottom; ctrl + wheel zooms
  let zoom = 1;
  const size = () => { svg.setAttribute("width", width * zoom); svg.setAttribute("height", height * zoom); };
  size();
  container.scrollTop = container.scrollHeight;
  container.scrollLeft = (container.scrollWidth - container.clientWidth) / 2;
  container.onwheel = (event) => {
    if (!event.ctrlKey) return;
    event.preventDefault();
    zoom = Math.min(4, Math.max(0.05, zoom * (event.deltaY < 0 ? 1.2 : 1 / 1.2)));
    size();
  };
}

// ---------------------------------------------------------------- the profile's timeline

async function loadProfile() {
  state.profile = await getJSON("/api/profile");
  drawTimeline();
}

function drawTimeline() {
  const box = $("timeline");
  box.replaceChildren();
  const trace = state.profile;
  if (!trace) {
    box.append(el("p", { class: "empty" }, "No profile in this trace: run with PROFILE=1 as well as VIZ."));
    return;
  }
  const names = {};
  for (const e of trace.traceEvents) if (e.ph === "M" && e.name === "thread_name") names[e.tid] = e.args.name;
  const spans = trace.traceEvents.filter((e) => e.ph === "X");
  if (!spans.length) return;
  const start = Math.min(...spans.map((e) => e.ts));
  const end = Math.max(...spans.map((e) => e.ts + e.dur));
  const tids = Object.keys(names).map(Number);
  const row = 24, label = 140, width = Math.max(800, (box.clientWidth - label - 20) * state.scale);
  const perUs = width / Math.max(end - start, 1);
  const svg = svgEl("svg", { width: label + width + 10, height: tids.length * row + 30 });
  tids.forEach((tid, i) => {
    const text = svgEl("text", { class: "track", x: 4, y: i * row + 16 });
    text.textContent = names[tid];
    svg.append(text);
  });
  for (const e of spans) {
    const i = tids.indexOf(e.tid);
    const rect = svgEl("rect", { class: `span ${e.cat}`, x: label + (e.ts - start) * perUs, y: i * row + 3,
      width: Math.max(e.dur * perUs, 1), height: row - 6, "data-name": e.name });
    const title = svgEl("title");
    title.textContent = `${e.name} (${e.cat}) ${formatUs(e.dur)}`;
    rect.append(title);
    rect.onclick = () => {
      const args = Object.entries(e.args || {}).map(([k, v]) => `${k}=${v}`).join(" ");
      $("span-info").textContent = `${e.name}: ${e.cat} on ${names[e.tid]}, ${formatUs(e.dur)} ${args}`;
    };
    svg.append(rect);
  }
  const axis = svgEl("text", { class: "track", x: label, y: tids.length * row + 20 });
  axis.textContent = `${formatUs(end - start)} in all`;
  svg.append(axis);
  box.append(svg);
}

function formatUs(us) {
  return us >= 1000 ? `${(us / 1000).toFixed(3)} ms` : `${us.toFixed(1)} us`;
}

// ---------------------------------------------------------------- tabs

function showTab(name) {
  $("graphs-view").hidden = name !== "graphs";
  $("profile-view").hidden = name !== "profile";
  $("tab-graphs").classList.toggle("active", name === "graphs");
  $("tab-profile").classList.toggle("active", name === "profile");
  if (name === "profile") loadProfile();
}

$("tab-graphs").onclick = () => showTab("graphs");
$("tab-profile").onclick = () => showTab("profile");
$("show-before").onclick = () => state.group && showSide("before");
$("show-after").onclick = () => state.group && showSide("after");
$("filter").oninput = renderGroups;
$("zoom-in").onclick = () => { state.scale *= 2; drawTimeline(); };
$("zoom-out").onclick = () => { state.scale = Math.max(1, state.scale / 2); drawTimeline(); };
loadGroups().catch((error) => { $("status").textContent = `error: ${error.message}`; });

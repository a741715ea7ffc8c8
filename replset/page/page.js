// The live page: polls /page/data every second and draws the set. No build step, no library.
"use strict";

const POLL_MS = 1000;
const SVG = "http://www.w3.org/2000/svg";
const CATCHING_UP = new Set(["STARTUP", "STARTUP2", "RECOVERING", "ROLLBACK"]);

function stateClass(row) {
  if (!row.health) return "unreachable";
  if (row.stateStr === "PRIMARY" || row.stateStr === "SECONDARY") return row.stateStr;
  return CATCHING_UP.has(row.stateStr) ? "catching-up" : "unreachable";
}

function stateLabel(row) {
  return row.health ? row.stateStr : "unreachable";
}

function seconds(optime) {
  if (!optime || !optime.ts) return null;
  const ts = optime.ts.$timestamp || optime.ts;
  return ts.t + ts.i / 4294967296;
}

function optimeText(optime) {
  if (!optime || !optime.ts) return "–";
  const ts = optime.ts.$timestamp || optime.ts;
  return `${new Date(ts.t * 1000).toISOString().slice(11, 19)} #${ts.i} (t${optime.t})`;
}

function el(tag, attrs, text) {
  const node = document.createElementNS(SVG, tag);
  for (const [k, v] of Object.entries(attrs || {})) node.setAttribute(k, v);
  if (text !== undefined) node.textContent = text;
  return node;
}

function layout(members) {
  const cx = 320, cy = 215, r = members.length > 1 ? 140 : 0;
  const at = {};
  members.forEach((m, i) => {
    const angle = -Math.PI / 2 + (2 * Math.PI * i) / members.length;
    at[m.name] = { x: cx + r * Math.cos(angle), y: cy + r * Math.sin(angle) };
  });
  return at;
}

function drawGraph(data) {
  const members = data.status.members;
  const at = layout(members);
  const primary = members.find((m) => m.stateStr === "PRIMARY");
  const primaryAt = primary ? seconds(primary.optime) : null;
  const edges = document.getElementById("edges");
  const nodes = document.getElementById("members");
  edges.replaceChildren();
  nodes.replaceChildren();
  for (const m of members) {
    const source = m.syncSourceHost;
    if (!source || !at[source] || !m.health) continue;
    const a = at[m.name], b = at[source];
    const dx = b.x - a.x, dy = b.y - a.y, len = Math.hypot(dx, dy) || 1;
    const pad = 34;
    edges.appendChild(el("line", {
      class: "sync-edge", "data-from": m.name, "data-to": source,
      x1: a.x + (dx / len) * pad, y1: a.y + (dy / len) * pad,
      x2: b.x - (dx / len) * pad, y2: b.y - (dy / len) * pad,
    }));
    const lag = primaryAt !== null && seconds(m.optime) !== null ? Math.max(0, primaryAt - seconds(m.optime)) : null;
    // A round trip this member measured itself: on its own edges (heartbeat pings are symmetric).
    const other = m.self ? members.find((x) => x.name === source) : (at[source] && members.find((x) => x.name === source)?.self ? m : null);
    const ping = other && other.pingMs !== undefined ? `ping ${other.pingMs} ms` : null;
    const label = [ping, lag !== null ? `lag ${lag.toFixed(1)} s` : null].filter(Boolean).join(", ");
    edges.appendChild(el("text", { class: "edge-label", x: (a.x + b.x) / 2 + 8, y: (a.y + b.y) / 2 }, label));
  }
  for (const m of members) {
    const p = at[m.name];
    const g = el("g", {
      class: `member ${stateClass(m)}${m.self ? " self" : ""}`, "data-name": m.name, "data-state": stateLabel(m),
    });
    g.appendChild(el("circle", { cx: p.x, cy: p.y, r: 30 }));
    const above = p.y < 200;  // labels on the side away from the middle, where the arrows run
    g.appendChild(el("text", { class: "state", x: p.x, y: above ? p.y - 54 : p.y + 46 }, stateLabel(m)));
    g.appendChild(el("text", { x: p.x, y: above ? p.y - 38 : p.y + 62 }, m.name + (m.self ? " (answering)" : "")));
    nodes.appendChild(g);
  }
}

function drawTable(data) {
  const body = document.querySelector("#member-table tbody");
  const primary = data.status.members.find((m) => m.stateStr === "PRIMARY");
  const primaryAt = primary ? seconds(primary.optime) : null;
  body.replaceChildren();
  for (const m of data.status.members) {
    const lag = primaryAt !== null && seconds(m.optime) !== null && m.health
      ? `${Math.max(0, primaryAt - seconds(m.optime)).toFixed(1)} s` : "–";
    const cells = [m.name, stateLabel(m), optimeText(m.optime), optimeText(m.optimeDurable || m.optime), lag,
      m.syncSourceHost || "–", m.pingMs !== undefined ? `${m.pingMs} ms` : "–", m.lastHeartbeatMessage || ""];
    const tr = document.createElement("tr");
    tr.dataset.name = m.name;
    cells.forEach((text, i) => {
      const td = document.createElement("td");
      td.textContent = text;
      if (i === 1 && !m.health) td.className = "unreachable";
      tr.appendChild(td);
    });
    body.appendChild(tr);
  }
}

function drawSummary(data) {
  const s = data.status;
  document.getElementById("set-name").textContent = s.set;
  const window = data.oplog.windowSeconds;
  document.getElementById("summary").textContent =
    `term ${s.term} · commit point ${optimeText(s.optimes.lastCommittedOpTime)} · ` +
    `oplog ${data.oplog.entries.toLocaleString()} entries, window ${window === null ? "–" : window + " s"}`;
  document.getElementById("answered-by").textContent = `answered by ${data.me} (${s.members.find((m) => m.self)?.stateStr || "?"})`;
  const sync = document.getElementById("initial-sync");
  const progress = s.myState === 5 ? s.initialSyncStatus : null;  // STARTUP2: an initial sync under way
  sync.textContent = progress
    ? `initial sync: ${progress.approxTotalBytesCopied || 0} of ${progress.approxTotalDataSize || 0} bytes copied`
    : "";
  const list = document.getElementById("elections");
  list.replaceChildren();
  const current = s.members.find((m) => m.stateStr === "PRIMARY");
  if (current) {
    const li = document.createElement("li");
    const since = current.electionDate ? ` since ${current.electionDate.$date || current.electionDate}` : "";
    li.textContent = `now: ${current.name} is primary in term ${s.term}${since}`;
    list.appendChild(li);
  }
  for (const e of [...data.elections].reverse()) {
    const li = document.createElement("li");
    li.textContent = `term ${e.term}: this member (${e.primary}) won at ${e.at}`;
    list.appendChild(li);
  }
}

function drawParts(data) {
  const tables = data.partsTables || [];
  document.getElementById("parts-panel").hidden = tables.length === 0;
  const body = document.querySelector("#parts-table tbody");
  body.replaceChildren();
  for (const t of tables) {
    const tr = document.createElement("tr");
    for (const text of [t.table, t.activeParts, t.queue, t.postponed]) {
      const td = document.createElement("td");
      td.textContent = String(text);
      tr.appendChild(td);
    }
    body.appendChild(tr);
  }
}

async function poll() {
  const footer = document.getElementById("updated");
  try {
    const response = await fetch("/page/data", { cache: "no-store" });
    if (!response.ok) throw new Error(`HTTP ${response.status}`);
    const data = await response.json();
    if (data.status && data.status.members) {
      drawGraph(data);
      drawTable(data);
      drawSummary(data);
      drawParts(data);
    }
    footer.textContent = `updated ${new Date().toISOString().slice(11, 19)} UTC`;
    footer.className = "";
    document.body.dataset.updated = String(Date.now());
  } catch (err) {
    footer.textContent = `no answer from this member: ${err}`;
    footer.className = "stale";
  }
}

poll();
setInterval(poll, POLL_MS);

/* dashboard.js: trainmonitor's page (served as /dashboard.js: the
 * Content-Security-Policy allows no inline script).  Live over the
 * websocket /ws, polling /api/snapshot when there is none; charts drawn
 * on canvas from /api/history and the updates. */
"use strict";
const q = new URLSearchParams(location.search);
const token = q.get("token");
const withToken = (u) => token ? u + (u.includes("?") ? "&" : "?") + "token=" + encodeURIComponent(token) : u;
const $ = (id) => document.getElementById(id);
const fmt = (x, d = 1) => x === null || x === undefined || !isFinite(x) ? "–"
  : Math.abs(x) >= 1e6 ? (x / 1e6).toFixed(d) + "M" : Math.abs(x) >= 1e4 ? (x / 1e3).toFixed(d) + "k"
  : x.toFixed(d);
const dur = (s) => s === null || s < 0 ? "–" : s < 90 ? s.toFixed(1) + " s"
  : s < 5400 ? (s / 60).toFixed(1) + " min" : (s / 3600).toFixed(1) + " h";
let history = [];          // points, oldest first
let sortKey = "epoch", sortDir = -1, lastSnap = null;
const MAX_POINTS = 3600;   // what the charts keep in the page

function chart(id, series) {
  const c = $(id), dpr = window.devicePixelRatio || 1;
  const w = c.clientWidth, h = c.clientHeight;
  c.width = w * dpr; c.height = h * dpr;
  const g = c.getContext("2d");
  g.scale(dpr, dpr); g.clearRect(0, 0, w, h);
  if (history.length < 2) return;
  const t0 = history[0].t, t1 = history[history.length - 1].t || t0 + 1;
  const pad = 34, padR = series.length > 1 ? 36 : 0; /* right: a 2nd scale */
  /* Over half a day a clock time alone is ambiguous: the date too. */
  const when = (t) => t1 - t0 > 12 * 3600e3
    ? new Date(t).toLocaleString([], { month: "short", day: "numeric", hour: "2-digit", minute: "2-digit" })
    : new Date(t).toLocaleTimeString();
  g.font = "11px system-ui"; g.fillStyle = "#6b7385"; g.strokeStyle = "#e3e6ec";
  series.forEach((s, k) => {
    const ys = history.map((p) => p[s.key]).filter((v) => v !== null && isFinite(v));
    if (!ys.length) return;
    let lo = Math.min(0, ...ys), hi = Math.max(...ys); if (hi <= lo) hi = lo + 1;
    if (k === 0) {
      g.beginPath(); g.moveTo(pad, 4); g.lineTo(pad, h - 16); g.lineTo(w - padR, h - 16); g.stroke();
      g.fillText(fmt(hi), 0, 12); g.fillText(fmt(lo), 0, h - 18);
      g.fillText(when(t0), pad, h - 2);
      const r = when(t1); g.fillText(r, w - padR - g.measureText(r).width, h - 2);
    } else { /* each series has its own scale: this one's at the right, in its color */
      g.fillStyle = s.color;
      g.fillText(fmt(hi), w - padR + 4, 12); g.fillText(fmt(lo), w - padR + 4, h - 18);
      g.fillStyle = "#6b7385";
    }
    g.strokeStyle = s.color; g.lineWidth = 1.5; g.beginPath();
    let started = false;
    for (const p of history) {
      const v = p[s.key]; if (v === null || !isFinite(v)) { started = false; continue; }
      const x = pad + (w - pad - padR) * (p.t - t0) / (t1 - t0), y = 4 + (h - 20) * (1 - (v - lo) / (hi - lo));
      if (started) g.lineTo(x, y); else { g.moveTo(x, y); started = true; }
    }
    g.stroke(); g.strokeStyle = "#e3e6ec";
  });
}

function drawCharts() {
  chart("c-sps", [{ key: "samples_per_second", color: "#2f6fdb" }]);
  chart("c-loss", [{ key: "loss", color: "#c2410c" }]);
  chart("c-peers", [{ key: "peers", color: "#1e8a4c" }]);
  chart("c-round", [{ key: "round_s", color: "#7c3aed" }, { key: "granularity", color: "#0891b2" }]);
}

function renderRows(snap) {
  const now = snap.now ? snap.now.t : Date.now();
  const rows = snap.peers.slice().sort((a, b) => {
    const x = a[sortKey], y = b[sortKey];
    return (x === y ? 0 : x === null ? 1 : y === null ? -1 : x < y ? -1 : 1) * sortDir;
  });
  const tb = $("rows"); tb.textContent = "";
  const epoch = snap.now ? snap.now.epoch : null;
  let behind = 0, apart = 0;
  for (const p of rows) {
    const tr = document.createElement("tr"), age = (now - p.seen_ms) / 1000;
    /* More than one epoch behind the swarm, or its parameters apart from
     * the swarm's: it will reload the state. */
    if (epoch !== null && p.mode !== "aux" && p.epoch + 1 < epoch) {
      tr.className = "behind"; behind++;
    } else if (p.diverged) {
      tr.className = "behind"; tr.title = "out of line: stepped without its peers' round"; apart++;
    }
    /* The loss scale as a power of two; the batches it dropped in its
     * last epoch (overflows) in the cell's title. */
    const scale = p.loss_scale ? "2^" + Math.round(Math.log2(p.loss_scale)) : "–";
    const cells = [p.id.slice(0, 8), p.label, p.addr || "–", p.mode, p.epoch, fmt(p.samples_per_second, 0),
      fmt(p.loss, 4), scale, fmt(p.round_s, 2), p.group ?? "–", age < 1.5 ? "now" : dur(age) + " ago"];
    cells.forEach((v, i) => {
      const td = document.createElement("td"); td.textContent = v;
      if (i === 0) { td.className = "id"; td.title = p.id; }
      if (i === 7 && p.dropped) td.title = p.dropped + " batches dropped for overflow in its last epoch";
      if (i === 10 && age > 5) td.className = "stale";
      tr.appendChild(td);
    });
    tb.appendChild(tr);
  }
  $("peer-note").textContent = rows.length + (behind ? ", " + behind + " behind the swarm" : "") +
    (apart ? ", " + apart + " out of line" : "");
}

function render(snap) {
  lastSnap = snap;
  $("run").textContent = snap.run;
  const n = snap.now;
  if (n) {
    $("epoch").textContent = n.epoch;
    $("samples").textContent = fmt(n.samples, 0);
    $("target").textContent = n.target ? fmt(n.target, 0) : "?";
    $("progress").style.width = n.target ? Math.min(100, 100 * n.samples / n.target) + "%" : "0";
    $("eta").textContent = n.eta_s === null ? "" : n.eta_s === 0 ? "target reached" : "next epoch in " + dur(n.eta_s);
    $("sps").textContent = fmt(n.samples_per_second, 0);
    $("peers").textContent = n.peers;
    $("loss").textContent = fmt(n.loss, 4);
    $("round").textContent = fmt(n.round_s, 2);
    $("averaged").textContent = n.averaged === null ? "–" : fmt(100 * n.averaged, 1) + "%";
    $("gran").textContent = fmt(n.granularity, 1);
    $("noise").textContent = fmt(n.noise_scale, 0);
    if (!history.length || history[history.length - 1].t < n.t) {
      history.push(n); if (history.length > MAX_POINTS) history.shift();
    }
  }
  $("churn").textContent = snap.joined + " / " + snap.left;
  renderRows(snap);
  const ev = $("events"); ev.textContent = "";
  for (const e of snap.events.slice().reverse()) {
    const d = document.createElement("div");
    d.textContent = new Date(e.t).toLocaleTimeString() + "  " + e.text;
    d.className = "ev-" + e.type; /* join, leave, epoch, state, round, bad */
    ev.appendChild(d);
  }
  drawCharts();
}

/* The link matrix from /api/links: a row per sending bee, a column per
 * receiving one; each cell the rate (Mbit/s) over the round trip (ms),
 * colored by the rate among the matrix's own. */
function renderLinks(x) {
  const t = $("links"); t.textContent = "";
  const bees = x.bees, name = (b) => b.label || b.id.slice(0, 8);
  const at = new Map(x.links.map((l) => [l.from + " " + l.to, l]));
  const rates = x.links.map((l) => l.mbit).filter((v) => v !== null);
  const lo = Math.min(...rates), hi = Math.max(...rates);
  $("links-note").textContent = x.links.length
    ? x.links.length + " measured, Mbit/s / round trip ms, from the row's bee to the column's" : "none measured yet";
  if (!x.links.length) return;
  const head = document.createElement("tr");
  head.appendChild(document.createElement("th"));
  for (const b of bees) {
    const th = document.createElement("th"); th.textContent = name(b); th.title = b.id; head.appendChild(th);
  }
  t.appendChild(head);
  for (const from of bees) {
    const tr = document.createElement("tr"), th = document.createElement("th");
    th.textContent = name(from); th.title = from.id; th.className = "row"; tr.appendChild(th);
    for (const to of bees) {
      const td = document.createElement("td"), l = at.get(from.id + " " + to.id);
      if (from.id === to.id) { td.textContent = "·"; td.className = "self"; }
      else if (!l) { td.textContent = "–"; td.className = "cell"; }
      else {
        /* Round trips under 10 ms (a LAN, loopback) with their fraction. */
        const rtt = (x) => fmt(x, x !== null && x < 10 ? 2 : 0);
        td.textContent = fmt(l.mbit, 0) + " / " + rtt(l.rtt_ms);
        td.title = name(from) + " → " + name(to) + ": " + fmt(l.mbit, 1) + " Mbit/s, round trip " +
          fmt(l.rtt_ms, 2) + " ms, measured " + l.age_s + " s ago";
        const k = l.mbit === null ? null : hi > lo ? Math.min(9, Math.floor(10 * (l.mbit - lo) / (hi - lo))) : 5;
        td.className = "cell" + (k === null ? "" : " h" + k);
      }
      tr.appendChild(td);
    }
    t.appendChild(tr);
  }
}

async function pollLinks() {
  try { renderLinks(await load("/api/links")); } catch (e) { $("links-note").textContent = "–"; }
}

document.querySelectorAll("th").forEach((th) => th.addEventListener("click", () => {
  const k = th.dataset.k; sortDir = k === sortKey ? -sortDir : -1; sortKey = k;
  if (lastSnap) renderRows(lastSnap);
}));

async function load(url) {
  const r = await fetch(withToken(url), { cache: "no-store" });
  if (!r.ok) throw new Error(r.status + " " + r.statusText);
  return r.json();
}

async function poll() {   // when no websocket can be had
  try { render(await load("/api/snapshot")); $("conn").textContent = "polling"; }
  catch (e) { $("conn").textContent = "cannot reach the monitor: " + e.message; }
}

function connect() {
  const ws = new WebSocket(withToken((location.protocol === "https:" ? "wss://" : "ws://") + location.host + "/ws"),
                           "beed-monitor");
  let pollTimer = null;
  ws.onopen = () => { $("conn").textContent = "live"; $("conn").className = "live"; };
  ws.onmessage = (m) => { const x = JSON.parse(m.data); if (x.type === "snapshot") render(x.data); };
  ws.onclose = () => {
    $("conn").textContent = "reconnecting…"; $("conn").className = "";
    pollTimer = setInterval(poll, 2000);
    setTimeout(() => { clearInterval(pollTimer); connect(); }, 5000);
  };
}

load("/api/history?since=0&points=" + MAX_POINTS)
  .then((h) => { history = h; drawCharts(); }).catch(() => {}).finally(connect);
pollLinks(); setInterval(pollLinks, 5000);
window.addEventListener("resize", drawCharts);

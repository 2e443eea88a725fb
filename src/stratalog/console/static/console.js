// The Stratalog console: plain JavaScript over the JSON API under /api/ (console/routes.py).
// Views are chosen by the URL's hash (#/topics, #/topics/NAME, #/records?topic=T, #/groups/G);
// the metrics are polled every 2 s whatever the view, so the charts have a history to draw.
"use strict";

const POLL_MS = 2000;
const HISTORY = 90; // metric samples kept (3 minutes)
const samples = [];
let format = localStorage.getItem("stratalog.format") || "text";

// -- helpers ------------------------------------------------------------------------------------
function el(tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === null || v === undefined || v === false) continue;
    if (k.startsWith("on")) node.addEventListener(k.slice(2), v);
    else if (k === "class") node.className = v;
    else node.setAttribute(k, v === true ? "" : v);
  }
  for (const c of children.flat()) {
    if (c === null || c === undefined) continue;
    node.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
  return node;
}

function table(headers, rows, attrs) {
  const head = el("tr", {}, headers.map((h) => el("th", { class: h.num ? "num" : null }, h.label || h)));
  return el("table", attrs, el("thead", {}, head), el("tbody", {}, rows));
}

function num(n) {
  return n === null || n === undefined ? "–" : Number(n).toLocaleString("en-US");
}

function bytes(n) {
  if (n === null || n === undefined) return "–";
  const units = ["B", "KiB", "MiB", "GiB", "TiB"];
  let i = 0;
  while (Math.abs(n) >= 1024 && i < units.length - 1) { n /= 1024; i++; }
  return i === 0 ? `${Math.round(n)} B` : `${n.toFixed(1)} ${units[i]}`;
}

function when(ms) {
  if (ms === null || ms === undefined || ms < 0) return "–";
  return new Date(ms).toISOString().replace("T", " ").replace(/\.\d+Z$/, "Z");
}

async function api(path, body) {
  const init = body === undefined ? {} : {
    method: "POST",
    headers: { "content-type": "application/json" },
    body: JSON.stringify(body),
  };
  // From the origin and path, never the page's URL itself: opened as http://user:pw@host/,
  // a URL with credentials cannot be fetched (the browser sends the ones it took instead).
  const r = await fetch(new URL(`api/${path}`, location.origin + location.pathname), init);
  const text = await r.text();
  let doc;
  try { doc = JSON.parse(text); } catch { doc = { error: text.trim() }; }
  if (!r.ok) throw new Error(doc.error || `${r.status} ${r.statusText}`);
  return doc;
}

function notice(message, kind) {
  const n = document.getElementById("notice");
  n.textContent = message;
  n.className = kind;
  n.hidden = !message;
}

// Keys and values arrive as base64; shown as text, JSON or hex.
function decode(b64) {
  const bin = atob(b64);
  const out = new Uint8Array(bin.length);
  for (let i = 0; i < bin.length; i++) out[i] = bin.charCodeAt(i);
  return out;
}

function show(b64) {
  if (b64 === null || b64 === undefined) return el("span", { class: "muted" }, "null");
  const raw = decode(b64);
  if (format === "hex") {
    return el("pre", {}, Array.from(raw, (b) => b.toString(16).padStart(2, "0")).join(" "));
  }
  const text = new TextDecoder("utf-8").decode(raw);
  if (format === "json") {
    try { return el("pre", {}, JSON.stringify(JSON.parse(text), null, 2)); }
    catch { return el("pre", { class: "muted", title: "not JSON: shown as text" }, text); }
  }
  return el("pre", {}, text);
}

// -- views --------------------------------------------------------------------------------------
const views = {
  async overview(main) {
    const o = await api("overview");
    document.getElementById("cluster").textContent =
      `cluster ${o.cluster_id || "?"} · ${o.brokers.length} broker(s)`;
    const card = (label, value, cls) =>
      el("div", { class: "card" }, el("div", { class: "label" }, label),
        el("div", { class: `value ${cls || ""}` }, value));
    main.append(
      el("h2", {}, "Overview"),
      el("div", { class: "cards" },
        card("brokers", o.brokers.length),
        card("topics", o.topics),
        card("partitions", o.partitions),
        card("under-replicated", o.under_replicated, o.under_replicated ? "bad" : "good"),
        card("offline", o.offline, o.offline ? "bad" : "good")),
      el("h3", {}, "Brokers"),
      table(["broker", "address", "role", { label: "leaders", num: 1 },
        { label: "replicas", num: 1 }, { label: "out of sync", num: 1 }, "health"],
      o.brokers.map((b) => el("tr", { "data-broker": b.id },
        el("td", {}, b.id), el("td", {}, b.address),
        el("td", {}, b.controller ? "controller" : ""),
        el("td", { class: "num" }, b.leaders), el("td", { class: "num" }, b.replicas),
        el("td", { class: "num" }, b.out_of_sync),
        el("td", { class: b.health === "ok" ? "good" : "bad" }, b.health))),
      { id: "brokers-table" }),
    );
    const s = o.status;
    if (s) {
      const disk = s.disk;
      const hot = s.tiers.hot;
      const cold = s.tiers.cold;
      const m = s.migration;
      main.append(
        el("h3", {}, `Broker ${s.broker.node_id}: disk and tiers`),
        el("p", {},
          `up ${Math.round(s.broker.uptime_s)} s · fsync=${s.broker.fsync} · `,
          `layout=${s.broker.layout} · log dir `,
          el("span", { class: disk.log_dir.state === "online" ? "good" : "bad" }, disk.log_dir.state),
          ` · ${bytes(disk.free_bytes)} free`,
          disk.produce_refused ? el("span", { class: "bad" }, " · produce refused: disk full") : ""),
        table(["tier", "where", { label: "used", num: 1 }, "state"], [
          el("tr", {}, el("td", {}, "hot"), el("td", {}, hot.path),
            el("td", { class: "num" }, bytes(hot.used) + (hot.capacity ? ` of ${bytes(hot.capacity)}` : "")),
            el("td", { class: "good" }, "ok")),
          el("tr", {}, el("td", {}, "cold"), el("td", {}, cold ? cold.location : "none configured"),
            el("td", { class: "num" }, "–"),
            el("td", { class: cold && cold.error ? "bad" : "good" },
              cold ? (cold.error ? `unavailable: ${cold.error}` : "ok") : "–")),
        ], { id: "tiers-table" }),
        el("p", { id: "migration" },
          `migration: backlog ${bytes(m.backlog_bytes)}, ${bytes(m.rate_bytes_per_sec)}/s, `,
          `${num(m.migrated_segments)} segment(s) / ${bytes(m.migrated_bytes)} moved`,
          m.spilling_to_cold ? el("span", { class: "bad" }, " · hot tier full: writing to cold") : "",
          m.last_error ? el("span", { class: "bad" }, ` · ${m.last_error}`) : ""),
      );
    }
    main.append(el("h3", {}, "Live"), el("div", { class: "charts" },
      chartBox("throughput", "Throughput (bytes/s)", [["produced", "#2f5fb3"], ["fetched", "#d9822b"]]),
      chartBox("latency", "Produce latency (ms)", [["p50", "#1d7a46"], ["p99", "#b3261e"]]),
    ));
    drawCharts();
  },

  async topics(main, name) {
    if (name) return topicView(main, name);
    const topics = await api("topics");
    const create = el("form", { class: "inline", id: "create-topic" },
      el("label", {}, "name", el("input", { name: "name", required: true, size: 24 })),
      el("label", {}, "partitions", el("input", { name: "partitions", type: "number", min: 1, value: 1 })),
      el("label", {}, "replication factor",
        el("input", { name: "replication_factor", type: "number", min: -1, value: -1 })),
      el("label", {}, "configs (k=v, …)", el("input", { name: "configs", size: 30 })),
      el("button", { type: "submit" }, "Create topic"));
    create.addEventListener("submit", async (ev) => {
      ev.preventDefault();
      const f = new FormData(create);
      const configs = {};
      for (const pair of String(f.get("configs") || "").split(",")) {
        if (!pair.trim()) continue;
        const [k, ...v] = pair.split("=");
        configs[k.trim()] = v.join("=").trim();
      }
      try {
        await api("topics/create", {
          name: f.get("name"), partitions: Number(f.get("partitions")),
          replication_factor: Number(f.get("replication_factor")), configs,
        });
        notice(`topic ${f.get("name")} created`, "ok");
        route();
      } catch (e) { notice(e.message, "error"); }
    });
    const rows = topics.map((t) => el("tr", { "data-topic": t.name },
      el("td", {}, el("a", { href: `#/topics/${encodeURIComponent(t.name)}` }, t.name),
        t.internal ? el("span", { class: "muted" }, " (internal)") : ""),
      el("td", { class: "num" }, t.partitions), el("td", { class: "num" }, t.replication_factor),
      el("td", { class: `num ${t.under_replicated ? "bad" : ""}` }, t.under_replicated),
      el("td", { class: "num" }, num(t.records)),
      el("td", { class: "num" }, bytes(t.hot && t.hot.bytes)),
      el("td", { class: "num" }, bytes(t.cold && t.cold.bytes)),
      el("td", {}, when(oldest(t))), el("td", {}, when(newest(t))),
      el("td", {},
        el("a", { href: `#/records?topic=${encodeURIComponent(t.name)}` }, "records"), " ",
        t.internal ? "" : el("button", {
          class: "danger", "data-delete": t.name, onclick: () => deleteTopic(t.name),
        }, "Delete"))));
    main.append(el("h2", {}, "Topics"), create,
      table(["topic", { label: "partitions", num: 1 }, { label: "RF", num: 1 },
        { label: "under-replicated", num: 1 }, { label: "records", num: 1 },
        { label: "hot", num: 1 }, { label: "cold", num: 1 }, "oldest", "newest", ""],
      rows, { id: "topics-table" }));
  },

  async records(main, _arg, query) {
    const topics = (await api("topics")).map((t) => t.name);
    const topic = query.get("topic") || topics.find((t) => !t.startsWith("__")) || "";
    const form = el("form", { class: "inline", id: "records-form" },
      el("label", {}, "topic", el("select", { name: "topic" },
        topics.map((t) => el("option", { value: t, selected: t === topic }, t)))),
      el("label", {}, "partition",
        el("input", { name: "partition", type: "number", min: 0, value: query.get("partition") || 0 })),
      el("label", {}, "from offset",
        el("input", { name: "offset", type: "number", min: 0, value: query.get("offset") || "" })),
      el("label", {}, "or from time (UTC)",
        el("input", { name: "time", type: "datetime-local", step: 1, value: query.get("time") || "" })),
      el("label", {}, "records",
        el("input", { name: "limit", type: "number", min: 1, max: 500, value: query.get("limit") || 50 })),
      el("button", { type: "submit" }, "Show"));
    form.addEventListener("submit", (ev) => {
      ev.preventDefault();
      const f = new FormData(form);
      const q = new URLSearchParams();
      for (const k of ["topic", "partition", "offset", "time", "limit"]) if (f.get(k)) q.set(k, f.get(k));
      location.hash = `#/records?${q}`;
    });
    const formats = el("div", { class: "formats" }, "show keys and values as ",
      ["text", "json", "hex"].map((f) => el("button", {
        class: f === format ? "on" : "plain", "data-format": f,
        onclick: () => { format = f; localStorage.setItem("stratalog.format", f); route(); },
      }, f.toUpperCase())));
    main.append(el("h2", {}, "Records"), form, formats);
    if (!topic) return;
    const ask = new URLSearchParams({ topic, partition: query.get("partition") || 0,
      limit: query.get("limit") || 50 });
    if (query.get("time")) ask.set("timestamp", Date.parse(`${query.get("time")}Z`));
    else if (query.get("offset")) ask.set("offset", query.get("offset"));
    const page = await api(`records?${ask}`);
    const next = new URLSearchParams(query);
    next.delete("time");
    next.set("offset", page.next);
    main.append(
      el("p", { id: "records-range" },
        `${page.topic}-${page.partition}: offsets ${num(page.start)} to ${num(page.end)}; `,
        `${page.records.length} record(s) from ${num(page.from)} `,
        page.next < page.end ? el("a", { href: `#/records?${next}`, id: "next-page" }, "next page") : ""),
      table([{ label: "offset", num: 1 }, "timestamp", "key", "value", "headers"],
        page.records.map((r) => el("tr", { "data-offset": r.offset },
          el("td", { class: "num" }, r.offset), el("td", {}, when(r.timestamp)),
          el("td", { class: "key" }, show(r.key)), el("td", { class: "value" }, show(r.value)),
          el("td", {}, Object.entries(r.headers).map(([k, v]) => el("div", {}, `${k}: `, show(v)))))),
        { id: "records-table" }));
  },

  async groups(main, group) {
    if (group) return groupView(main, group);
    const groups = await api("groups");
    main.append(el("h2", {}, "Consumer groups"),
      groups.length ? table(["group", "state", "type", { label: "partitions", num: 1 },
        { label: "lag", num: 1 }],
      groups.map((g) => el("tr", { "data-group": g.group },
        el("td", {}, el("a", { href: `#/groups/${encodeURIComponent(g.group)}` }, g.group)),
        el("td", {}, g.state), el("td", {}, g.type), el("td", { class: "num" }, g.partitions),
        el("td", { class: "num lag" }, num(g.lag)))), { id: "groups-table" })
        : el("p", { class: "muted" }, "no consumer groups"));
  },
};

function oldest(t) {
  const xs = [t.hot, t.cold].map((x) => x && x.oldest_timestamp).filter((x) => x !== null && x !== undefined);
  return xs.length ? Math.min(...xs) : null;
}

function newest(t) {
  const xs = [t.hot, t.cold].map((x) => x && x.newest_timestamp).filter((x) => x !== null && x !== undefined);
  return xs.length ? Math.max(...xs) : null;
}

async function deleteTopic(name) {
  if (!confirm(`Delete topic ${name} and all its records?`)) return;
  try {
    await api("topics/delete", { name });
    notice(`topic ${name} deleted`, "ok");
    route();
  } catch (e) { notice(e.message, "error"); }
}

async function topicView(main, name) {
  const t = await api(`topics/${encodeURIComponent(name)}`);
  const tier = (label, x) => el("tr", {}, el("td", {}, label),
    el("td", { class: "num" }, bytes(x && x.bytes)), el("td", { class: "num" }, num(x && x.segments)),
    el("td", {}, when(x && x.oldest_timestamp)), el("td", {}, when(x && x.newest_timestamp)));
  main.append(
    el("h2", {}, `Topic ${t.name}`, t.internal ? el("span", { class: "muted" }, " (internal)") : ""),
    el("h3", {}, "Partitions"),
    table([{ label: "partition", num: 1 }, { label: "leader", num: 1 }, "replicas", "in-sync replicas",
      { label: "start", num: 1 }, { label: "end", num: 1 }, { label: "records", num: 1 }, ""],
    t.partitions.map((p) => el("tr", { "data-partition": p.partition },
      el("td", { class: "num" }, p.partition), el("td", { class: "num" }, p.leader),
      el("td", {}, p.replicas.join(", ")),
      el("td", { class: p.isr.length < p.replicas.length ? "bad" : "" }, p.isr.join(", ")),
      el("td", { class: "num" }, num(p.start)), el("td", { class: "num" }, num(p.end)),
      el("td", { class: "num" }, num(p.end - p.start)),
      el("td", {}, el("a", {
        href: `#/records?topic=${encodeURIComponent(t.name)}&partition=${p.partition}`,
      }, "browse")))), { id: "partitions-table" }),
    el("h3", {}, "Tiers"),
    table(["tier", { label: "bytes", num: 1 }, { label: "segments", num: 1 }, "oldest", "newest"],
      [tier("hot", t.hot), tier("cold", t.cold)], { id: "topic-tiers" }),
    el("h3", {}, "Configs"),
    table(["config", "value", "source"], Object.keys(t.configs).sort().map((k) => el("tr", {},
      el("td", {}, k), el("td", {}, t.configs[k].sensitive ? "(sensitive)" : String(t.configs[k].value)),
      el("td", { class: "muted" }, SOURCES[t.configs[k].source] || t.configs[k].source))),
    { id: "configs-table" }),
  );
}

const SOURCES = { 1: "topic", 2: "dynamic broker", 3: "dynamic default", 4: "static broker", 5: "default" };

async function groupView(main, group) {
  const g = await api(`groups/${encodeURIComponent(group)}`);
  const topics = [...new Set(g.offsets.map((o) => o.topic))];
  const reset = el("form", { class: "inline", id: "reset-offsets" },
    el("label", {}, "topic", el("select", { name: "topic" }, topics.map((t) => el("option", { value: t }, t)))),
    el("label", {}, "to", el("select", { name: "to" },
      ["earliest", "latest", "offset", "timestamp"].map((t) => el("option", { value: t }, t)))),
    el("label", {}, "offset", el("input", { name: "offset", type: "number", min: 0 })),
    el("label", {}, "time (UTC)", el("input", { name: "time", type: "datetime-local", step: 1 })),
    el("button", { type: "submit" }, "Reset offsets"));
  reset.addEventListener("submit", async (ev) => {
    ev.preventDefault();
    const f = new FormData(reset);
    const body = { group, topic: f.get("topic"), to: f.get("to") };
    if (body.to === "offset") body.offset = Number(f.get("offset"));
    if (body.to === "timestamp") body.timestamp = Date.parse(`${f.get("time")}Z`);
    try {
      const r = await api("groups/reset-offsets", body);
      notice(`group ${group}: ${Object.keys(r.offsets).length} offset(s) of ${r.topic} committed`, "ok");
      route();
    } catch (e) { notice(e.message, "error"); }
  });
  main.append(
    el("h2", {}, `Consumer group ${g.group}`),
    el("p", {}, `state ${g.state} · ${g.type || "?"} · assignor ${g.assignor || "–"} · total lag `,
      el("b", { id: "total-lag" }, num(g.lag))),
    el("h3", {}, "Members"),
    g.members.length ? table(["member", "client", "host", "partitions"], g.members.map((m) => el("tr", {},
      el("td", {}, m.member_id), el("td", {}, m.client_id), el("td", {}, m.host),
      el("td", {}, m.partitions.join(", ")))), { id: "members-table" })
      : el("p", { class: "muted", id: "members-table" }, "no members"),
    el("h3", {}, "Offsets and lag"),
    table(["topic", { label: "partition", num: 1 }, { label: "committed", num: 1 },
      { label: "end", num: 1 }, { label: "lag", num: 1 }, "member"],
    g.offsets.map((o) => el("tr", { "data-topic": o.topic, "data-partition": o.partition },
      el("td", {}, o.topic), el("td", { class: "num" }, o.partition),
      el("td", { class: "num committed" }, num(o.committed)), el("td", { class: "num end" }, num(o.end)),
      el("td", { class: "num lag" }, num(o.lag)), el("td", {}, o.member || "–"))), { id: "offsets-table" }),
    el("h3", {}, "Reset offsets (the group must have no members)"), reset,
  );
}

// -- live charts --------------------------------------------------------------------------------
function chartBox(id, title, series) {
  return el("div", { class: "chart" }, el("div", { class: "title" }, title),
    el("canvas", { id: `chart-${id}`, width: 460, height: 180 }),
    el("div", { class: "legend" }, series.map(([name, color]) =>
      el("span", { style: `color:${color}` }, `■ ${name}`))));
}

function quantile(prev, cur, q) {
  // From the differences of two cumulative histograms: the first bucket holding quantile q.
  const total = cur.count - prev.count;
  if (total <= 0) return null;
  for (let i = 0; i < cur.buckets.length; i++) {
    const d = cur.buckets[i][1] - (prev.buckets[i] ? prev.buckets[i][1] : 0);
    if (d >= q * total) return cur.buckets[i][0] * 1000;
  }
  return null;
}

function series() {
  const out = { produced: [], fetched: [], p50: [], p99: [] };
  for (let i = 1; i < samples.length; i++) {
    const a = samples[i - 1];
    const b = samples[i];
    const dt = b.time - a.time;
    if (dt <= 0 || !a.available || !b.available) continue;
    out.produced.push([b.time, (b.produced_bytes - a.produced_bytes) / dt]);
    out.fetched.push([b.time, (b.fetched_bytes - a.fetched_bytes) / dt]);
    out.p50.push([b.time, quantile(a.latency.produce, b.latency.produce, 0.5)]);
    out.p99.push([b.time, quantile(a.latency.produce, b.latency.produce, 0.99)]);
  }
  return out;
}

function drawChart(canvas, lines, unit) {
  const ctx = canvas.getContext("2d");
  const w = canvas.width;
  const h = canvas.height;
  const left = 64;
  const bottom = h - 20;
  ctx.clearRect(0, 0, w, h);
  ctx.font = "11px system-ui, sans-serif";
  const points = lines.flatMap(([pts]) => pts.filter((p) => p[1] !== null));
  const now = Date.now() / 1000;
  const t0 = now - HISTORY * POLL_MS / 1000;
  const max = Math.max(1e-9, ...points.map((p) => p[1])) * 1.15;
  ctx.strokeStyle = "#dde1e8";
  ctx.fillStyle = "#6b7385";
  for (let i = 0; i <= 4; i++) {
    const y = bottom - (bottom - 8) * i / 4;
    ctx.beginPath(); ctx.moveTo(left, y); ctx.lineTo(w - 4, y); ctx.stroke();
    ctx.fillText(unit(max * i / 4), 2, y + 4);
  }
  ctx.fillText(`last ${Math.round(HISTORY * POLL_MS / 60000)} min`, left, h - 4);
  for (const [pts, color] of lines) {
    ctx.strokeStyle = color;
    ctx.lineWidth = 2;
    ctx.beginPath();
    let started = false;
    for (const [t, v] of pts) {
      if (v === null) { started = false; continue; }
      const x = left + (w - 4 - left) * (t - t0) / (now - t0);
      const y = bottom - (bottom - 8) * v / max;
      if (started) ctx.lineTo(x, y); else ctx.moveTo(x, y);
      started = true;
    }
    ctx.stroke();
  }
  if (!points.length) ctx.fillText("waiting for traffic…", left + 10, 24);
}

function drawCharts() {
  const tp = document.getElementById("chart-throughput");
  const lat = document.getElementById("chart-latency");
  if (!tp || !lat) return;
  const s = series();
  drawChart(tp, [[s.produced, "#2f5fb3"], [s.fetched, "#d9822b"]], (v) => `${bytes(v)}/s`);
  drawChart(lat, [[s.p50, "#1d7a46"], [s.p99, "#b3261e"]], (v) => `${v.toFixed(1)} ms`);
}

async function poll() {
  try {
    samples.push(await api("metrics"));
    if (samples.length > HISTORY) samples.shift();
    drawCharts();
  } catch (e) {
    // the overview says what is wrong; the charts wait for the next sample
  }
  setTimeout(poll, POLL_MS);
}

// -- routing ------------------------------------------------------------------------------------
let routing = 0;

async function route() {
  const turn = ++routing;
  const hash = location.hash.replace(/^#\/?/, "") || "overview";
  const [path, query] = hash.split("?");
  const [view, ...rest] = path.split("/");
  const arg = rest.length ? decodeURIComponent(rest.join("/")) : "";
  for (const a of document.querySelectorAll("nav a")) {
    a.classList.toggle("active", a.dataset.view === view);
  }
  const main = el("main", { id: "main", "data-view": view });
  try {
    await (views[view] || views.overview)(main, arg, new URLSearchParams(query || ""));
  } catch (e) {
    main.append(el("p", { class: "bad", id: "view-error" }, e.message));
  }
  if (turn !== routing) return; // a later navigation took over
  // What a test waits for: the view drawn (data-ready), for which route and which turn.
  main.dataset.ready = "1";
  main.dataset.route = hash;
  main.dataset.turn = String(turn);
  document.getElementById("main").replaceWith(main);
}

window.addEventListener("hashchange", () => { notice(""); route(); });
route();
poll();

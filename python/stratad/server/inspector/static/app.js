// stratad inspector: a read-only single page over the daemon's /api endpoints.
//
// Every value shown comes from agents (session IDs, labels, states, task
// results, crystal texts), so nothing is ever put into the page as HTML: the
// `el` helper makes elements and turns every string into a text node. The
// Content-Security-Policy header forbids inline scripts and other origins.
//
// Pages (location.hash):
//   #/                              tenants
//   #/t/TENANT?q=TEXT               the tenant's sessions, searched
//   #/t/TENANT/s/SESSION?a=&b=&c=   a session: checkpoint tree, diff A->B, state of C,
//                                   cognitive state, tasks, agent state
//   #/t/TENANT/crystals             the tenant's crystals and their scores
//
// Times come from the API as ISO 8601 UTC strings (`created_at_iso`, and the
// structured state's own times) and are shown as they are.
"use strict";

const TOKEN_KEY = "stratad-inspector-token";
const LANGGRAPH_TYPE = "application/vnd.langgraph.checkpoint+";
const main = () => document.getElementById("main");

// -- DOM helpers ---------------------------------------------------------------------

function el(tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [name, value] of Object.entries(attrs || {})) {
    if (value === undefined || value === null || value === false) continue;
    if (name.startsWith("on")) node.addEventListener(name.slice(2), value);
    else if (name === "text") node.textContent = value;
    else node.setAttribute(name, value === true ? "" : String(value));
  }
  for (const child of children.flat(Infinity)) {
    if (child === undefined || child === null || child === false) continue;
    node.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return node;
}

// Replaces a node's children, leaving out the absent ones (null, undefined, false).
function fill(node, ...children) {
  node.replaceChildren(...children.filter((c) => c !== undefined && c !== null && c !== false));
}

function show(...nodes) {
  fill(main(), ...nodes);
}

function enc(part) {
  return encodeURIComponent(part);
}

function link(hash, text, attrs) {
  return el("a", { href: hash, ...(attrs || {}) }, text);
}

function sessionHash(tenant, session, params) {
  const query = new URLSearchParams(params || {}).toString();
  return `#/t/${enc(tenant)}/s/${enc(session)}${query ? "?" + query : ""}`;
}

// An ISO 8601 UTC time from the API (2026-11-27T18:31:02.517Z), as a <time> element.
function time(iso) {
  if (typeof iso !== "string" || !iso) return "";
  return el("time", { datetime: iso }, iso);
}

// Any time string (LangGraph's own `ts`, with +00:00) in the same UTC form.
function isoOf(text) {
  const parsed = new Date(text);
  return Number.isNaN(parsed.getTime()) ? String(text) : parsed.toISOString();
}

function bytes(n) {
  if (n < 1024) return `${n} B`;
  const units = ["KiB", "MiB", "GiB", "TiB"];
  let value = n;
  let unit = -1;
  while (value >= 1024 && unit < units.length - 1) {
    value /= 1024;
    unit += 1;
  }
  return `${value.toFixed(value < 10 ? 1 : 0)} ${units[unit]}`;
}

function pretty(value) {
  return JSON.stringify(value, null, 2);
}

function table(headers, rows, attrs) {
  return el(
    "table",
    attrs || {},
    el("thead", {}, el("tr", {}, headers.map((h) => el("th", {}, h)))),
    el("tbody", {}, rows),
  );
}

function labelChips(labels) {
  return el(
    "span",
    { class: "labels" },
    Object.entries(labels || {}).map(([k, v]) => el("span", { class: "chip" }, `${k}=${v}`)),
  );
}

function crumbs(...parts) {
  const nav = document.getElementById("crumbs");
  nav.replaceChildren(
    ...parts.flatMap((part, i) => (i ? [el("span", { class: "sep" }, "/"), part] : [part])),
  );
}

// -- the API -------------------------------------------------------------------------

class ApiError extends Error {
  constructor(status, reason, message) {
    super(message);
    this.status = status;
    this.reason = reason;
  }
}

async function api(path) {
  const headers = { Accept: "application/json" };
  const token = sessionStorage.getItem(TOKEN_KEY);
  if (token) headers.Authorization = `Bearer ${token}`;
  const response = await fetch(path, { headers, cache: "no-store" });
  let body = null;
  try {
    body = await response.json();
  } catch (_) {
    body = null;
  }
  if (!response.ok) {
    const error = (body && body.error) || {};
    throw new ApiError(response.status, error.reason || "", error.message || response.statusText);
  }
  return body;
}

function errorBox(error) {
  return el(
    "div",
    { class: "error", role: "alert", "data-testid": "error" },
    el("strong", {}, error.reason || "error"),
    " ",
    error.message,
  );
}

// A panel's request failed: sign in again on 401, else show the error in the panel.
function failed(panel, error, ...heading) {
  if (error instanceof ApiError && error.status === 401) loginForm(error);
  else fill(panel, ...heading, errorBox(error));
}

function loginForm(error) {
  const input = el("input", {
    id: "token",
    type: "password",
    autocomplete: "off",
    placeholder: "admin bearer token",
    required: true,
  });
  const form = el(
    "form",
    {
      class: "login",
      onsubmit: (event) => {
        event.preventDefault();
        sessionStorage.setItem(TOKEN_KEY, input.value.trim());
        render();
      },
    },
    el("h2", {}, "Sign in"),
    el(
      "p",
      {},
      "This daemon runs with authentication on. The inspector shows every tenant's data: " +
        "enter a bearer token of an identity with role admin. It is kept in this tab only " +
        "(sessionStorage) and sent with each request.",
    ),
    error && error.reason !== "MISSING_CREDENTIALS" ? errorBox(error) : null,
    input,
    el("button", { type: "submit" }, "Sign in"),
  );
  crumbs(link("#/", "tenants"));
  show(form);
  input.focus();
}

// -- pages ---------------------------------------------------------------------------

async function tenantsPage() {
  crumbs(link("#/", "tenants"));
  const data = await api("/api/tenants");
  const rows = data.tenants.map((t) =>
    el(
      "tr",
      { "data-testid": "tenant-row" },
      el("td", {}, link(`#/t/${enc(t.tenant)}`, t.tenant)),
      el("td", { class: "num" }, t.sessions),
      el("td", { class: "num" }, link(`#/t/${enc(t.tenant)}/crystals`, String(t.crystals))),
    ),
  );
  show(
    el("h1", {}, "Tenants"),
    rows.length
      ? table(["tenant", "sessions", "crystals"], rows)
      : el("p", { class: "muted" }, "No tenant has stored anything yet."),
  );
}

async function sessionsPage(tenant, params) {
  crumbs(link("#/", "tenants"), link(`#/t/${enc(tenant)}`, tenant));
  const query = params.get("q") || "";
  const search = el("input", {
    id: "search",
    type: "search",
    value: query,
    placeholder: "search session ID or label",
    "aria-label": "search sessions",
    "data-testid": "search",
  });
  const results = el("div", { id: "results" });
  let timer = 0;
  search.addEventListener("input", () => {
    clearTimeout(timer);
    timer = setTimeout(() => {
      const q = search.value;
      history.replaceState(null, "", `#/t/${enc(tenant)}${q ? "?q=" + enc(q) : ""}`);
      loadSessions(tenant, q, results);
    }, 200);
  });
  show(
    el("h1", {}, "Sessions of ", el("code", {}, tenant)),
    el(
      "p",
      {},
      search,
      " ",
      link(`#/t/${enc(tenant)}/crystals`, "crystals of this tenant", { class: "aside" }),
    ),
    results,
  );
  search.focus();
  await loadSessions(tenant, query, results);
}

async function loadSessions(tenant, query, results) {
  let data;
  try {
    data = await api(`/api/tenants/${enc(tenant)}/sessions?q=${enc(query)}`);
  } catch (error) {
    failed(results, error);
    return;
  }
  const rows = data.sessions.map((s) =>
    el(
      "tr",
      { "data-testid": "session-row", "data-session": s.session_id },
      el("td", {}, link(sessionHash(tenant, s.session_id), s.session_id, { class: "mono" })),
      el("td", {}, el("span", { class: `status ${s.status}` }, s.status), s.damaged ? " damaged" : ""),
      el("td", {}, labelChips(s.labels)),
      el("td", { class: "num" }, s.checkpoint_count),
      el("td", {}, s.forked_from ? "fork" : ""),
      el("td", {}, s.facets.join(", ")),
      el("td", {}, time(s.updated_at_iso)),
    ),
  );
  const summary = `${data.matched} of ${data.total} sessions` + (data.truncated ? " (first 1000 shown)" : "");
  fill(
    results,
    el("p", { class: "muted", "data-testid": "session-count" }, summary),
    table(["session", "status", "labels", "checkpoints", "origin", "structured state", "updated"], rows, {
      "data-testid": "sessions",
    }),
  );
}

async function sessionPage(tenant, sessionId, params) {
  crumbs(
    link("#/", "tenants"),
    link(`#/t/${enc(tenant)}`, tenant),
    link(sessionHash(tenant, sessionId), sessionId),
  );
  const base = `/api/tenants/${enc(tenant)}/sessions/${enc(sessionId)}`;
  const session = await api(base);
  const picked = { a: params.get("a") || "", b: params.get("b") || "", c: params.get("c") || "" };
  const diffPanel = el("section", { id: "diff", "data-testid": "diff" });
  const statePanel = el("section", { id: "state", "data-testid": "state" });
  const structuredPanel = el("section", { id: "structured" });
  show(
    el("h1", {}, "Session ", el("code", {}, session.session_id)),
    sessionSummary(tenant, session),
    el("h2", {}, "Checkpoint tree"),
    treeControls(tenant, session, picked),
    checkpointTree(tenant, session, picked),
    diffPanel,
    statePanel,
    structuredPanel,
  );
  const loads = [loadStructured(base, structuredPanel)];
  if (picked.a && picked.b) loads.push(loadDiff(base, picked, diffPanel));
  if (picked.c) loads.push(loadState(base, picked.c, statePanel));
  await Promise.all(loads);
}

function sessionSummary(tenant, s) {
  const rows = [
    ["status", el("span", { class: `status ${s.status}` }, s.status)],
    ["version", s.version],
    ["labels", labelChips(s.labels)],
    ["created", time(s.created_at_iso)],
    ["updated", time(s.updated_at_iso)],
    ["head", el("code", {}, s.head || "none")],
    ["checkpoints", s.checkpoints.length],
    ["retention", s.keep_last ? `keep last ${s.keep_last}` : "keep all"],
  ];
  if (s.forked_from) {
    const source = s.forked_from;
    rows.push([
      "forked from",
      source.session_id
        ? link(sessionHash(tenant, source.session_id, { c: source.checkpoint_id }), `${source.session_id} @ ${source.checkpoint_id}`, {
            "data-testid": "forked-from",
          })
        : `${source.checkpoint_id} (source deleted)`,
    ]);
  }
  if (s.damaged) rows.push(["damaged", el("span", { class: "error" }, s.damaged)]);
  return el("dl", { class: "summary" }, rows.map(([k, v]) => [el("dt", {}, k), el("dd", {}, v)]));
}

function treeControls(tenant, session, picked) {
  const compare = el(
    "button",
    {
      type: "button",
      id: "compare",
      "data-testid": "compare",
      onclick: () => {
        const a = document.querySelector('input[name="pick-a"]:checked');
        const b = document.querySelector('input[name="pick-b"]:checked');
        if (!a || !b) return;
        location.hash = sessionHash(tenant, session.session_id, { a: a.value, b: b.value });
      },
    },
    "Compare A → B",
  );
  return el(
    "p",
    { class: "muted" },
    "Pick checkpoint A and checkpoint B, then ",
    compare,
    ". Click an ID to see its state.",
  );
}

function checkpointTree(tenant, session, picked) {
  const byId = new Map(session.checkpoints.map((c) => [c.checkpoint_id, c]));
  const children = new Map();
  const roots = [];
  for (const cp of session.checkpoints) {
    if (cp.parent_id && byId.has(cp.parent_id)) {
      if (!children.has(cp.parent_id)) children.set(cp.parent_id, []);
      children.get(cp.parent_id).push(cp);
    } else {
      roots.push(cp);
    }
  }
  const forks = new Map();
  for (const fork of session.forks) {
    if (!forks.has(fork.checkpoint_id)) forks.set(fork.checkpoint_id, []);
    forks.get(fork.checkpoint_id).push(fork);
  }
  const item = (cp) => checkpointItem(tenant, session, cp, picked, forks.get(cp.checkpoint_id) || []);

  // As in a git graph: the oldest child continues the line at the same level,
  // every younger child starts an indented branch under its parent. A long
  // history reads as a list, and recursion depth is the number of branches.
  function branch(start, list) {
    let cp = start;
    while (cp) {
      const li = item(cp);
      list.append(li);
      const kids = (children.get(cp.checkpoint_id) || []).sort((x, y) => x.version - y.version);
      for (const kid of kids.slice(1)) {
        const sub = el("ul", { class: "branch", "data-testid": "branch" });
        li.append(sub);
        branch(kid, sub);
      }
      cp = kids[0];
    }
  }
  const tree = el("ul", { class: "tree", "data-testid": "tree" });
  for (const root of roots) {
    if (roots.length > 1) {
      const sub = el("ul", { class: "branch" });
      tree.append(el("li", { class: "line" }, sub));
      branch(root, sub);
    } else {
      branch(root, tree);
    }
  }
  if (!session.checkpoints.length) return el("p", { class: "muted" }, "No checkpoint yet.");
  return tree;
}

function checkpointItem(tenant, session, cp, picked, forks) {
  const id = cp.checkpoint_id;
  const radio = (name, checked) =>
    el("input", {
      type: "radio",
      name,
      value: id,
      checked,
      title: name === "pick-a" ? "A (before)" : "B (after)",
      "aria-label": `${name === "pick-a" ? "A" : "B"}: ${id}`,
      "data-testid": name,
    });
  const step = langGraphStep(cp);
  const badges = [
    id === session.head ? el("span", { class: "badge head" }, "HEAD") : null,
    step ? el("span", { class: "badge lg", "data-testid": "lg-step" }, step) : null,
    cp.name ? el("span", { class: "badge name" }, `name: ${cp.name}`) : null,
    cp.namespace ? el("span", { class: "badge" }, `ns: ${cp.namespace}`) : null,
    cp.pending_writes ? el("span", { class: "badge" }, `${cp.pending_writes} writes`) : null,
  ];
  const li = el(
    "li",
    { class: "node", "data-testid": "checkpoint", "data-checkpoint": id },
    el(
      "div",
      { class: "row" + (picked.c === id ? " viewed" : "") },
      radio("pick-a", picked.a === id),
      radio("pick-b", picked.b === id),
      link(sessionHash(tenant, session.session_id, { ...pickedParams(picked), c: id }), id, {
        class: "mono ckpt",
      }),
      badges,
      el("span", { class: "meta" }, time(cp.created_at_iso), ` · ${bytes(cp.size)} · stored ${bytes(cp.stored_bytes)}`),
    ),
  );
  if (forks.length) {
    li.append(
      el(
        "ul",
        { class: "forks" },
        forks.map((f) =>
          el(
            "li",
            { class: "fork", "data-testid": "fork", "data-session": f.session_id },
            "↳ forked into session ",
            link(sessionHash(tenant, f.session_id), f.session_id, { class: "mono" }),
            el("span", { class: "meta" }, time(f.created_at_iso), ` · ${f.checkpoint_count} checkpoints`),
          ),
        ),
      ),
    );
  }
  return li;
}

function isLangGraph(cp) {
  return (cp.content_type || "").startsWith(LANGGRAPH_TYPE);
}

// "LangGraph step 2 · loop" from the metadata StratadSaver stores with a checkpoint.
function langGraphStep(cp) {
  if (!isLangGraph(cp)) return "";
  const meta = cp.metadata || {};
  const step = typeof meta.step === "number" ? ` step ${meta.step}` : "";
  const source = typeof meta.source === "string" && meta.source ? ` · ${meta.source}` : "";
  return `LangGraph${step}${source}`;
}

function pickedParams(picked) {
  const params = {};
  if (picked.a) params.a = picked.a;
  if (picked.b) params.b = picked.b;
  return params;
}

async function loadDiff(base, picked, panel) {
  fill(panel, el("h2", {}, "Diff"), el("p", { class: "muted" }, "Loading…"));
  let data;
  try {
    data = await api(`${base}/diff?a=${enc(picked.a)}&b=${enc(picked.b)}`);
  } catch (error) {
    failed(panel, error, el("h2", {}, "Diff"));
    return;
  }
  const heading = el(
    "h2",
    {},
    "Diff ",
    el("code", {}, data.a.checkpoint_id),
    " → ",
    el("code", {}, data.b.checkpoint_id),
  );
  const states = data.states || { a: {}, b: {} };
  if (!data.comparable) {
    const side = (name, cp, state) =>
      el(
        "li",
        { "data-testid": "diff-why" },
        `${name}, ${bytes(cp.size)} (${cp.digest.slice(0, 16)}…): `,
        state.why || (state.encoding === "langgraph" ? "a decoded LangGraph checkpoint" : "JSON"),
      );
    fill(
      panel,
      heading,
      data.identical
        ? el("p", { "data-testid": "diff-summary" }, "The two states are identical.")
        : el(
            "div",
            { "data-testid": "diff-summary" },
            el("p", {}, "Not compared: the diff needs both states as JSON (a LangGraph checkpoint is decoded first)."),
            el("ul", {}, side("A", data.a, states.a), side("B", data.b, states.b)),
          ),
    );
    return;
  }
  const row = (c) =>
    el(
      "tr",
      { class: `op-${c.op}`, "data-testid": "diff-row", "data-op": c.op, "data-pointer": c.pointer },
      el("td", {}, el("span", { class: `op ${c.op}` }, c.op)),
      el("td", {}, el("code", {}, c.pointer || "(whole state)")),
      el("td", {}, c.before === undefined ? "" : el("pre", {}, c.before)),
      el("td", {}, c.after === undefined ? "" : el("pre", {}, c.after)),
    );
  // Two LangGraph checkpoints: what the graph holds (channel values, metadata) comes
  // first; LangGraph's own bookkeeping (versions, IDs, times) is folded away.
  const langGraph = states.a.encoding === "langgraph" && states.b.encoding === "langgraph";
  const under = (pointer, prefix) => pointer === prefix || pointer.startsWith(prefix + "/");
  const isBookkeeping = (c) =>
    langGraph && !under(c.pointer, "/checkpoint/channel_values") && !under(c.pointer, "/metadata");
  const primary = data.changes.filter((c) => !isBookkeeping(c));
  const bookkeeping = data.changes.filter(isBookkeeping);
  const count = data.changes.length;
  let summary = count ? `${count} change${count === 1 ? "" : "s"}${data.truncated ? " (first ones only)" : ""}` : "No change: the states are equal.";
  if (langGraph && count) {
    summary += ` between two decoded LangGraph checkpoints: ${primary.length} in channel values and metadata, ${bookkeeping.length} in LangGraph's bookkeeping.`;
  }
  fill(
    panel,
    heading,
    el("p", { "data-testid": "diff-summary" }, summary),
    primary.length ? table(["", "path", "A", "B"], primary.map(row), { class: "diff" }) : null,
    bookkeeping.length
      ? el(
          "details",
          { "data-testid": "diff-bookkeeping" },
          el("summary", {}, `LangGraph bookkeeping: ${bookkeeping.length} change${bookkeeping.length === 1 ? "" : "s"} (channel versions, IDs, times)`),
          table(["", "path", "A", "B"], bookkeeping.map(row), { class: "diff" }),
        )
      : null,
  );
}

async function loadState(base, checkpointId, panel) {
  fill(panel, el("h2", {}, "State"), el("p", { class: "muted" }, "Loading…"));
  let data;
  try {
    data = await api(`${base}/checkpoints/${enc(checkpointId)}`);
  } catch (error) {
    failed(panel, error, el("h2", {}, "State"));
    return;
  }
  const cp = data.checkpoint;
  const state = data.state;
  let body;
  if (state.encoding === "langgraph") body = langGraphView(state);
  else if (state.encoding === "json") body = el("pre", { class: "json", "data-testid": "state-json" }, pretty(state.value));
  else if (state.encoding === "text") body = el("pre", { "data-testid": "state-text" }, state.text);
  else if (state.encoding === "binary")
    body = el(
      "div",
      {},
      el(
        "p",
        { "data-testid": "state-opaque" },
        state.undecoded
          ? `Binary, ${bytes(state.size)}; first bytes in hex:`
          : `Opaque bytes, ${bytes(state.size)}: not JSON, not UTF-8 text and not a LangGraph checkpoint ` +
              `(content type ${cp.content_type || "none"}), so the inspector cannot decode them. First bytes in hex:`,
      ),
      el("pre", { class: "hex" }, state.hex),
    );
  else body = el("p", {}, `${bytes(state.size)}: larger than the ${bytes(state.limit)} the inspector decodes.`);
  const kind = state.encoding === "langgraph" ? `LangGraph checkpoint (${state.serde}), decoded` : state.encoding;
  fill(
    panel,
    el("h2", {}, "State of ", el("code", {}, cp.checkpoint_id)),
    el(
      "p",
      { class: "muted" },
      `${kind} · ${bytes(cp.size)} · ${cp.content_type || "no content type"} · digest ${cp.digest} · `,
      time(cp.created_at_iso),
    ),
    state.undecoded
      ? el("p", { class: "error", "data-testid": "state-undecoded" }, `A LangGraph checkpoint, not decoded: ${state.undecoded}. Shown as stored:`)
      : null,
    state.encoding !== "langgraph" && Object.keys(cp.metadata || {}).length
      ? el("details", {}, el("summary", {}, "metadata"), el("pre", {}, pretty(cp.metadata)))
      : null,
    body,
  );
}

// A decoded LangGraph checkpoint ({checkpoint, metadata, parent_checkpoint_id}, as
// `stratad ctl checkpoints show --decode langgraph` prints it): its messages as a
// transcript, its channel values and metadata, its pending writes.
function langGraphView(state) {
  const doc = state.value;
  const isObject = (v) => v !== null && typeof v === "object" && !Array.isArray(v);
  const checkpoint = isObject(doc) && isObject(doc.checkpoint) ? doc.checkpoint : null;
  const metadata = isObject(doc) && isObject(doc.metadata) ? doc.metadata : null;
  const parts = [];
  if (checkpoint) {
    const facts = [
      ["step", metadata && metadata.step],
      ["source", metadata && metadata.source],
      ["LangGraph ID", checkpoint.id],
      ["taken", checkpoint.ts ? time(isoOf(checkpoint.ts)) : null],
      ["parent", doc.parent_checkpoint_id],
      ["updated channels", Array.isArray(checkpoint.updated_channels) ? checkpoint.updated_channels.join(", ") : null],
    ].filter(([, v]) => v !== undefined && v !== null && v !== "");
    parts.push(el("dl", { class: "summary", "data-testid": "langgraph-summary" }, facts.map(([k, v]) => [el("dt", {}, k), el("dd", {}, v)])));
  }
  const messages = state.messages || [];
  parts.push(
    el("h3", {}, `Messages (${messages.length}${state.messages_truncated ? ", the first ones" : ""})`),
    messages.length
      ? el("ol", { class: "messages", "data-testid": "messages" }, messages.map(messageItem))
      : el("p", { class: "muted" }, "No message in the channel values."),
  );
  if (checkpoint) {
    parts.push(
      el("h3", {}, "Channel values"),
      el("pre", { class: "json", "data-testid": "state-channels" }, pretty(checkpoint.channel_values === undefined ? null : checkpoint.channel_values)),
    );
  }
  if (metadata) parts.push(el("h3", {}, "Metadata"), el("pre", { class: "json", "data-testid": "state-metadata" }, pretty(metadata)));
  const writes = state.pending_writes || [];
  if (writes.length) {
    const rows = writes.map((w) =>
      el(
        "tr",
        { "data-testid": "write-row", "data-channel": w.channel },
        el("td", {}, el("code", {}, w.channel)),
        el("td", {}, el("code", {}, w.task_path || w.task_id)),
        el("td", {}, "undecoded" in w ? el("span", { class: "muted" }, `not decoded: ${w.undecoded}`) : el("pre", { class: "json" }, pretty(w.value))),
      ),
    );
    parts.push(
      el("h3", {}, `Pending writes (${writes.length}${state.pending_writes_truncated ? ", the first ones" : ""})`),
      table(["channel", "task", "value"], rows, { "data-testid": "pending-writes" }),
    );
  }
  parts.push(
    el(
      "details",
      { open: !checkpoint },
      el("summary", {}, "Everything StratadSaver stored, decoded"),
      el("pre", { class: "json", "data-testid": "state-decoded" }, pretty(doc)),
    ),
  );
  return el("div", { class: "langgraph", "data-testid": "state-langgraph" }, parts);
}

function messageItem(m) {
  const kind = ["human", "ai", "system", "tool"].includes(m.type) ? m.type : "other";
  return el(
    "li",
    { class: `message ${kind}`, "data-testid": "message", "data-type": m.type },
    el(
      "div",
      { class: "who" },
      el("span", { class: "badge" }, m.role || m.type),
      m.name ? el("span", {}, m.name) : null,
      m.tool_call_id ? el("span", { class: "muted" }, `answers ${m.tool_call_id}`) : null,
      el("code", { class: "muted" }, m.pointer),
    ),
    typeof m.content === "string"
      ? el("pre", { class: "content" }, m.content)
      : el("pre", { class: "content json" }, pretty(m.content)),
    m.tool_calls ? el("details", { open: true }, el("summary", {}, "tool calls"), el("pre", { class: "json" }, pretty(m.tool_calls))) : null,
  );
}

async function loadStructured(base, panel) {
  let data;
  try {
    data = await api(`${base}/structured`);
  } catch (error) {
    failed(panel, error);
    return;
  }
  const parts = [];
  if (data.cognitive) {
    parts.push(
      el("h2", {}, "Cognitive state"),
      el(
        "div",
        { class: "facet", "data-testid": "cognitive" },
        Object.entries(data.cognitive).map(([layer, value]) =>
          el("details", { open: true }, el("summary", {}, layer), el("pre", { class: "json" }, pretty(value))),
        ),
      ),
    );
  }
  if (data.tasks) parts.push(el("h2", {}, "Tasks"), tasksView(data.tasks));
  if (data.agent) {
    parts.push(
      el("h2", {}, "Agent state"),
      el("pre", { class: "json facet", "data-testid": "agent" }, pretty(data.agent)),
    );
  }
  if (!parts.length) parts.push(el("p", { class: "muted" }, "No cognitive state, tasks or agent state."));
  fill(panel, ...parts);
}

function tasksView(facet) {
  const tasks = Object.entries(facet.tasks || {});
  const rows = tasks.map(([id, task]) =>
    el(
      "tr",
      { "data-testid": "task-row" },
      el("td", {}, el("code", {}, id)),
      el("td", {}, task.status || ""),
      el("td", {}, "result" in task ? el("pre", {}, pretty(task.result)) : ""),
      el("td", {}, time(task.updated_at)),
    ),
  );
  const globals = facet.global_state || {};
  return el(
    "div",
    { class: "facet", "data-testid": "tasks" },
    rows.length ? table(["task", "status", "result", "updated"], rows) : el("p", { class: "muted" }, "No task."),
    facet.truncated ? el("p", { class: "muted" }, `First 1000 of ${facet.task_count} tasks.`) : null,
    Object.keys(globals).length
      ? el("details", { open: true }, el("summary", {}, "global state"), el("pre", { class: "json" }, pretty(globals)))
      : null,
  );
}

async function crystalsPage(tenant) {
  crumbs(link("#/", "tenants"), link(`#/t/${enc(tenant)}`, tenant), link(`#/t/${enc(tenant)}/crystals`, "crystals"));
  const data = await api(`/api/tenants/${enc(tenant)}/crystals`);
  const stats = data.stats;
  const rows = data.crystals.map((c) =>
    el(
      "tr",
      { "data-testid": "crystal-row", "data-crystal": c.crystal_id },
      el("td", {}, el("code", {}, c.crystal_id)),
      el("td", {}, c.goal_template),
      el(
        "td",
        { class: "num", "data-testid": "effectiveness" },
        el("meter", { min: 0, max: 1, value: c.effectiveness }),
        " ",
        c.effectiveness.toFixed(3),
      ),
      el("td", { class: "num", "data-testid": "success-score" }, c.success_score.toFixed(3)),
      el("td", { class: "num" }, c.reuse_count),
      el("td", {}, c.tool_sequence.join(" → ")),
      el("td", {}, c.created_from ? link(sessionHash(tenant, c.created_from), c.created_from, { class: "mono" }) : ""),
      el("td", {}, time(c.created_at_iso)),
    ),
  );
  show(
    el("h1", {}, "Crystals of ", el("code", {}, tenant)),
    el(
      "p",
      { class: "muted", "data-testid": "crystal-stats" },
      `${stats.total_crystals} crystals (at most ${stats.max_crystals}), ${stats.effective_crystals} effective, ` +
        `${stats.total_reuses} reuses, average effectiveness ${stats.avg_effectiveness.toFixed(3)}`,
    ),
    rows.length
      ? table(["crystal", "goal template", "effectiveness", "success", "reuses", "tools", "from session", "created"], rows, {
          "data-testid": "crystals",
        })
      : el("p", { class: "muted" }, "No crystal."),
  );
}

// -- routing -------------------------------------------------------------------------

function parseHash() {
  const raw = location.hash.replace(/^#/, "") || "/";
  const cut = raw.indexOf("?");
  const path = cut < 0 ? raw : raw.slice(0, cut);
  const query = cut < 0 ? "" : raw.slice(cut + 1);
  const parts = path
    .split("/")
    .filter((p) => p)
    .map((p) => {
      try {
        return decodeURIComponent(p);
      } catch (_) {
        return p;
      }
    });
  return { parts, params: new URLSearchParams(query || "") };
}

async function render() {
  const { parts, params } = parseHash();
  document.getElementById("sign-out").hidden = !sessionStorage.getItem(TOKEN_KEY);
  try {
    if (parts.length === 0) await tenantsPage();
    else if (parts[0] === "t" && parts.length === 2) await sessionsPage(parts[1], params);
    else if (parts[0] === "t" && parts.length === 3 && parts[2] === "crystals") await crystalsPage(parts[1]);
    else if (parts[0] === "t" && parts.length === 4 && parts[2] === "s") await sessionPage(parts[1], parts[3], params);
    else show(el("h1", {}, "Not found"), el("p", {}, link("#/", "Back to the tenants")));
  } catch (error) {
    if (error instanceof ApiError && error.status === 401) {
      loginForm(error);
      return;
    }
    show(errorBox(error));
  }
}

window.addEventListener("hashchange", render);
window.addEventListener("DOMContentLoaded", () => {
  document.getElementById("sign-out").addEventListener("click", () => {
    sessionStorage.removeItem(TOKEN_KEY);
    render();
  });
  render();
});

// The run inspector: a page over the processor's JSON API (see README, "The run inspector").
//
// No framework and no build step. Every value shown comes from users (run ids, payloads,
// errors), so the DOM is built with createElement and text nodes only, never parsed as HTML.
"use strict";

(() => {
  const POLL_MS = 2000;
  const REQUEST_TIMEOUT_MS = 10000;
  const PAGE_SIZE = 50;
  const HISTORY_PAGE = 1000;
  const HISTORY_PAGES_PER_REFRESH = 10; // a long history arrives over several refreshes
  const TOKEN_KEY = "processor.inspector.token";
  const VALUE_CHARS = 200; // longer payloads are cut in tables (the API has them whole)
  // Fact fields shown in their own columns, or not worth a column of their own.
  const HEADER_FIELDS = new Set(["type", "run_id", "seq", "fact_key", "time_ms", "cause_id"]);
  const ATTEMPT_FIELDS = ["segment", "attempt", "generation"];
  const BOUNDARY_FIELDS = ["boundary", "interaction", "item_index", "target"];
  // The graph's drawing: one column per depth, one box per step (SVG user units).
  const NODE_W = 184;
  const NODE_H = 66;
  const COL_GAP = 40;
  const ROW_GAP = 18;
  const GRAPH_PAD = 8;
  const LABEL_CHARS = 28;

  // --- small DOM helpers -------------------------------------------------------------------

  const $ = (id) => document.getElementById(id);

  /** An element with attributes and children (strings become text nodes, never markup). */
  function el(tag, attrs, ...children) {
    const node = document.createElement(tag);
    for (const [name, value] of Object.entries(attrs || {})) {
      if (value !== null && value !== undefined && value !== false) {
        node.setAttribute(name, value === true ? "" : String(value));
      }
    }
    for (const child of children.flat()) {
      if (child === null || child === undefined) continue;
      node.append(child instanceof Node ? child : document.createTextNode(String(child)));
    }
    return node;
  }

  function cell(value, attrs) {
    return el("td", attrs, value === null || value === undefined ? "–" : value);
  }

  function formatTime(ms) {
    if (ms === null || ms === undefined) return "–";
    const date = new Date(Number(ms));
    if (Number.isNaN(date.getTime())) return String(ms);
    return date.toISOString().replace("T", " ").replace("Z", " UTC");
  }

  function timeEl(ms) {
    if (ms === null || ms === undefined) return "–";
    const date = new Date(Number(ms));
    if (Number.isNaN(date.getTime())) return String(ms);
    return el("time", { datetime: date.toISOString() }, formatTime(ms));
  }

  function shortValue(value) {
    const text = typeof value === "string" ? value : JSON.stringify(value);
    if (text === undefined) return String(value);
    return text.length > VALUE_CHARS ? `${text.slice(0, VALUE_CHARS)}…` : text;
  }

  function statusBadge(status) {
    return el("span", { class: `status status-${status}`, "data-testid": "status" }, status);
  }

  function runLink(runId) {
    return el("a", { href: `#run=${encodeURIComponent(runId)}`, class: "run-link" }, runId);
  }

  // --- the API -----------------------------------------------------------------------------

  class ApiError extends Error {
    constructor(status, code, detail) {
      super(detail || code || `HTTP ${status}`);
      this.status = status;
      this.code = code;
    }
  }

  function token() {
    try {
      return window.localStorage.getItem(TOKEN_KEY) || "";
    } catch (_) {
      return ""; // storage disabled: the page still works for the open routes
    }
  }

  /** GET an API route (relative, so the page works behind a path prefix) as JSON. */
  async function api(path, params) {
    const query = new URLSearchParams();
    for (const [name, value] of Object.entries(params || {})) {
      if (value !== null && value !== undefined && value !== "") query.set(name, String(value));
    }
    const url = query.toString() ? `${path}?${query}` : path;
    const headers = { Accept: "application/json" };
    if (token()) headers.Authorization = `Bearer ${token()}`;
    const abort = new AbortController();
    const timer = setTimeout(() => abort.abort(), REQUEST_TIMEOUT_MS);
    try {
      const response = await fetch(url, { headers, signal: abort.signal, cache: "no-store" });
      const body = await response.json().catch(() => ({}));
      if (!response.ok) throw new ApiError(response.status, body.error, body.detail);
      return body;
    } finally {
      clearTimeout(timer);
    }
  }

  // --- page state --------------------------------------------------------------------------

  /** Cursor paging: the cursors of the pages seen so far, and the page shown. */
  function pager() {
    return { cursors: [null], page: 0, next: null };
  }

  const state = {
    filters: {},
    runs: pager(),
    rejected: pager(),
    dlq: pager(),
    selected: null, // the run id whose timeline is shown
    history: { runId: null, facts: [], after: 0 },
    // The graph: the fact it is shown after (null: the latest, following the run live).
    graph: { runId: null, pinned: null, lastSeq: 0, shown: null, ticket: 0 },
    refreshing: false,
    again: false,
  };

  function selectedFromHash() {
    const match = /^#run=(.*)$/.exec(window.location.hash);
    if (!match) return null;
    try {
      return decodeURIComponent(match[1]) || null;
    } catch (_) {
      return null;
    }
  }

  // --- runs list ---------------------------------------------------------------------------

  function readFilters() {
    const since = $("filter-since").value;
    const until = $("filter-until").value;
    return {
      status: $("filter-status").value,
      pipeline: $("filter-pipeline").value.trim(),
      target: $("filter-target").value.trim(),
      since: since ? new Date(since).getTime() : "",
      until: until ? new Date(until).getTime() : "",
    };
  }

  function runRow(run) {
    const waiting = (run.waiting_on || []).join(", ");
    return el(
      "tr",
      { "data-testid": "run-row", "data-run-id": run.run_id, "data-status": run.status },
      el("td", {}, runLink(run.run_id)),
      cell(`${run.pipeline} v${run.pipeline_version}`),
      el("td", {}, statusBadge(run.status)),
      cell(run.phase),
      el("td", {}, timeEl(run.submitted_ms)),
      el("td", {}, timeEl(run.updated_ms)),
      cell(waiting || "–"),
      cell(run.partition),
    );
  }

  async function refreshRuns() {
    const runs = state.runs;
    const page = await api("api/runs", {
      ...state.filters,
      cursor: runs.cursors[runs.page],
      limit: PAGE_SIZE,
    });
    runs.next = page.next_cursor;
    $("runs-body").replaceChildren(...page.runs.map(runRow));
    $("runs-empty").hidden = page.runs.length > 0;
    $("runs-next").disabled = !runs.next;
    $("runs-first").disabled = runs.page === 0;
    // The API lists the partitions this processor owns: say which, as a page may be partial.
    const partitions = (page.partitions || []).join(", ") || "none";
    $("runs-page").textContent =
      `page ${runs.page + 1}, ${page.runs.length} runs, of partitions ${partitions} (this processor's)`;
  }

  // --- one run: summary and timeline -------------------------------------------------------

  function summaryItem(key, label, value) {
    return [
      el("dt", {}, label),
      el("dd", { "data-testid": `summary-${key}` }, value === null || value === undefined ? "–" : value),
    ];
  }

  function waitingText(waiting) {
    if (!waiting) return null;
    const counts = `${waiting.open} open, ${waiting.admitted} admitted, ${waiting.timed_out} timed out`;
    const items = waiting.itemized ? ` (${waiting.items} items)` : "";
    const deadline = waiting.next_deadline_ms ? `, next deadline ${formatTime(waiting.next_deadline_ms)}` : "";
    return `boundary ${waiting.boundary} (${waiting.kind})${items}: ${counts}${deadline}`;
  }

  function compensationText(comp) {
    if (!comp) return null;
    const step = comp.compensating_step === null ? "" : `, compensating step ${comp.compensating_step}`;
    return `remaining [${comp.remaining.join(", ")}]${step}; compensated ${shortValue(comp.compensated)}, skipped ${shortValue(comp.skipped)}, failed ${shortValue(comp.failed)}`;
  }

  function parentView(parent) {
    if (!parent) return null;
    return el("span", {}, runLink(parent.run_id), ` (depth ${parent.depth})`);
  }

  function scheduleText(schedule) {
    if (!schedule) return null;
    return `${schedule.schedule_id}, fire time ${formatTime(schedule.fire_ms)}`;
  }

  function childrenView(children) {
    if (!children || children.length === 0) return null;
    return el(
      "ul",
      { class: "children" },
      children.map((child) =>
        el("li", { "data-testid": "child" }, runLink(child.run_id), ` item ${child.item}: ${child.interaction}`),
      ),
    );
  }

  function renderSummary(run) {
    const error = run.error ? `${run.error_type || "error"} at step ${run.failed_step}: ${run.error}` : null;
    const stop = run.stop_reason ? `${run.stop_reason}${run.stop_detail ? `: ${run.stop_detail}` : ""}` : null;
    $("run-summary").replaceChildren(
      ...summaryItem("run-id", "Run id", run.run_id),
      ...summaryItem("pipeline", "Pipeline", `${run.pipeline} v${run.pipeline_version}`),
      ...summaryItem("parent", "Parent run", parentView(run.parent)),
      ...summaryItem("children", "Child runs", childrenView(run.children)),
      ...summaryItem("schedule", "Started by schedule", scheduleText(run.schedule)),
      ...summaryItem("status", "Status", statusBadge(run.status)),
      ...summaryItem("phase", "Phase", run.phase),
      ...summaryItem("attempt", "Segment · attempt", `${run.segment} · ${run.attempt} (generation ${run.generation}), next step ${run.next_step}`),
      ...summaryItem("execution", "Execution outcome", run.execution),
      ...summaryItem("recovery", "Recovery outcome", run.recovery),
      ...summaryItem("stop", "Stop reason", stop),
      ...summaryItem("waiting", "Waiting", waitingText(run.waiting)),
      ...summaryItem("sleeping", "Sleeping", run.sleeping ? `step ${run.sleeping.step} until ${formatTime(run.sleeping.wake_ms)}` : null),
      ...summaryItem("retry-reason", "Retry reason", run.retry_reason || null),
      ...summaryItem("compensation", "Compensation", compensationText(run.compensation)),
      ...summaryItem("error", "Error", error),
      ...summaryItem("result", "Result", run.result === null ? null : shortValue(run.result)),
      ...summaryItem("deadline", "Deadline", run.deadline_ms ? formatTime(run.deadline_ms) : null),
      ...summaryItem("created", "Created", timeEl(run.created_ms)),
      ...summaryItem("updated", "Updated", timeEl(run.updated_ms)),
    );
    const unknown = run.unknown_attempt;
    const banner = $("unknown-attempt");
    banner.hidden = !unknown;
    if (unknown) {
      const flag = unknown.kind === "compensate" ? " --compensation" : "";
      banner.replaceChildren(
        el("strong", {}, "Waiting for an operator: "),
        `the ${unknown.kind} attempt ${unknown.attempt} of segment ${unknown.segment} (step ${unknown.step}, generation ${unknown.generation}) has an unknown outcome. Resolve it with `,
        el("code", {}, `processor resolve ${run.run_id} --segment ${unknown.segment} --attempt ${unknown.attempt} --generation ${unknown.generation} --idempotency-key KEY${flag} (--succeed JSON | --fail ERROR | --retry)`),
      );
    }
  }

  function fieldsText(fact, names) {
    return names
      .filter((name) => fact[name] !== undefined && fact[name] !== null)
      .map((name) => `${name} ${shortValue(fact[name])}`)
      .join(" · ");
  }

  function factClass(type) {
    if (/Failed|TimedOut|Unknown/.test(type)) return "fact-bad";
    if (/Succeeded|Completed|Admitted|Resolved/.test(type)) return "fact-good";
    if (/Stop|Compensation/.test(type)) return "fact-stop";
    return "";
  }

  function factRow(fact) {
    const columns = new Set([...HEADER_FIELDS, ...ATTEMPT_FIELDS, ...BOUNDARY_FIELDS]);
    const details = el("ul", { class: "details" });
    for (const [name, value] of Object.entries(fact)) {
      if (columns.has(name) || value === null || value === undefined) continue;
      // Fields named *_ms are epoch milliseconds (deadlines, expiries): shown as times.
      const shown = name.endsWith("_ms") && typeof value === "number" ? formatTime(value) : shortValue(value);
      details.append(el("li", {}, el("span", { class: "field" }, name), " ", shown));
    }
    return el(
      "tr",
      {
        "data-testid": "fact-row",
        "data-fact-type": fact.type,
        "data-seq": fact.seq,
        class: `${factClass(fact.type)}${Number(fact.seq) === state.graph.shown ? " fact-current" : ""}`,
        title: "Show the graph as it was after this fact",
      },
      cell(fact.seq),
      el("td", {}, timeEl(fact.time_ms)),
      el("td", { class: "fact-type" }, fact.type),
      cell(fieldsText(fact, ATTEMPT_FIELDS) || "–"),
      cell(fieldsText(fact, BOUNDARY_FIELDS) || "–"),
      el("td", {}, details),
    );
  }

  /** Fetch the facts after the last one shown, a few pages at most per refresh. */
  async function refreshHistory(runId) {
    const history = state.history;
    if (history.runId !== runId) {
      state.history = { runId, facts: [], after: 0 };
      $("timeline-body").replaceChildren();
    }
    let more = false;
    for (let i = 0; i < HISTORY_PAGES_PER_REFRESH; i += 1) {
      const page = await api(`api/runs/${encodeURIComponent(runId)}/history`, {
        after: state.history.after,
        limit: HISTORY_PAGE,
      });
      if (state.history.runId !== runId) return; // another run was selected meanwhile
      for (const fact of page.facts) {
        state.history.facts.push(fact);
        state.history.after = Math.max(state.history.after, Number(fact.seq));
        $("timeline-body").append(factRow(fact));
      }
      more = page.next_after !== null && page.next_after !== undefined && page.facts.length > 0;
      if (!more) break;
    }
    const note = $("timeline-more");
    note.hidden = !more;
    note.textContent = more ? `${state.history.facts.length} facts so far; more arrive with the next refresh.` : "";
  }

  async function refreshDetail() {
    const runId = state.selected;
    $("detail-none").hidden = Boolean(runId);
    $("detail-body").hidden = !runId;
    if (!runId) {
      $("detail-none").textContent = "No run selected.";
      return;
    }
    $("detail-title").textContent = `Run ${runId}`;
    try {
      renderSummary(await api(`api/runs/${encodeURIComponent(runId)}`));
    } catch (exc) {
      if (!(exc instanceof ApiError) || exc.status !== 404) throw exc;
      $("detail-body").hidden = true;
      $("detail-none").hidden = false;
      $("detail-none").textContent = `No run with id ${runId}.`;
      return;
    }
    await Promise.all([refreshHistory(runId), refreshGraph(runId)]);
  }


  // --- one run: its graph, as of any fact -------------------------------------------------

  /** An SVG element, in the namespace of the page's own <svg> (no namespace URL here). */
  function svg(tag, attrs, ...children) {
    const node = document.createElementNS($("graph-svg").namespaceURI, tag);
    for (const [name, value] of Object.entries(attrs || {})) {
      if (value !== null && value !== undefined && value !== false) node.setAttribute(name, String(value));
    }
    for (const child of children.flat()) {
      if (child === null || child === undefined) continue;
      node.append(child instanceof Node ? child : document.createTextNode(String(child)));
    }
    return node;
  }

  function clip(text, chars) {
    const value = String(text);
    return value.length > chars ? `${value.slice(0, chars - 1)}…` : value;
  }

  /** What a node's box says under its name: its state and why. */
  function nodeLabel(node) {
    switch (node.state) {
      case "skipped": return `skipped: ${node.reason || "?"}`;
      case "not_run": return "not run (run ended)";
      case "failed": return `failed: ${node.error || node.error_type || "?"}`;
      case "caught": return `caught → ${node.catch}`;
      case "retry_wait": return `retry wait (attempt ${node.attempts || "?"})`;
      case "running": return node.attempts > 1 ? `running (attempt ${node.attempts})` : "running";
      default: break;
    }
    if (node.routes_taken && node.routes_taken.length) return `${node.state} → ${node.routes_taken.join(", ")}`;
    return node.state.replace("_", " ");
  }

  /** A fan-out's items: done (of the total), in flight, failed. */
  function progressText(p) {
    const parts = [`${p.done}/${p.total} done`];
    if (p.in_flight) parts.push(`${p.in_flight} in flight`);
    if (p.failed) parts.push(`${p.failed} failed`);
    return parts.join(", ");
  }

  /** A node's third line: its kind and rule, or a fan-out's progress once it runs. */
  function nodeDetail(node) {
    if (node.progress) return progressText(node.progress);
    const parts = [node.kind.replace("_", "-")];
    if (node.rule && node.rule !== "all_success") parts.push(node.rule);
    if (node.when) parts.push("when");
    if (node.handles) parts.push(`handles ${node.handles}`);
    if (node.fan_out) parts.push(`max ${node.fan_out.max_in_flight} at once`);
    return parts.join(" · ");
  }

  /** A fan-out's progress bar along the bottom of its box: done, in flight, failed. */
  function progressBar(p) {
    const total = Math.max(1, p.total);
    const [left, top, length, height] = [10, NODE_H - 8, NODE_W - 20, 4];
    const parts = [svg("rect", { x: left, y: top, width: length, height, class: "progress-track" })];
    let x = left;
    for (const [key, count] of [["done", p.done], ["in_flight", p.in_flight], ["failed", p.failed]]) {
      const width = length * (count / total);
      parts.push(svg("rect", { x, y: top, width, height, class: `progress-${key}` }));
      x += width;
    }
    return svg("g", { class: "progress" }, parts);
  }

  function nodeTitle(node) {
    const lines = [`${node.name} (step ${node.index}, ${node.kind}): ${node.state}`];
    if (node.phase) lines.push(`phase ${node.phase}`);
    if (node.needs.length) lines.push(`needs ${node.needs.join(", ")} (${node.rule})`);
    if (node.when) lines.push("runs only if its predicate holds on its input");
    if (node.reason) lines.push(`reason ${node.reason}`);
    if (node.error) lines.push(`${node.error_type || "error"}: ${node.error}`);
    if (node.attempts) lines.push(`attempts ${node.attempts}`);
    if (node.fan_out) lines.push(`fan-out: at most ${node.fan_out.max_in_flight} items at once`);
    if (node.progress) lines.push(`items: ${progressText(node.progress)} (of ${node.progress.total})`);
    return lines.join("\n");
  }

  /** Columns by depth, rows by step order within a column. */
  function layout(nodes) {
    const rows = new Map();
    const at = new Map();
    for (const node of nodes) {
      const row = rows.get(node.depth) || 0;
      rows.set(node.depth, row + 1);
      at.set(node.name, {
        x: GRAPH_PAD + node.depth * (NODE_W + COL_GAP),
        y: GRAPH_PAD + row * (NODE_H + ROW_GAP),
      });
    }
    const depth = Math.max(0, ...nodes.map((n) => n.depth));
    const tallest = Math.max(1, ...rows.values());
    return {
      at,
      width: 2 * GRAPH_PAD + (depth + 1) * NODE_W + depth * COL_GAP,
      height: 2 * GRAPH_PAD + tallest * NODE_H + (tallest - 1) * ROW_GAP,
    };
  }

  /** An edge from the right of one box to the left of another. One that skips columns
   * runs level with its source through them (their boxes are stacked from the top, so the
   * level of a lower box is often clear), then bends in the last gap. */
  function edgePath(from, to) {
    const x1 = from.x + NODE_W;
    const y1 = from.y + NODE_H / 2;
    const x2 = to.x - 4;
    const y2 = to.y + NODE_H / 2;
    const start = x2 - x1 > COL_GAP * 2 ? x2 - COL_GAP : x1;
    const bend = Math.max(16, (x2 - start) / 2);
    const level = start > x1 ? `L ${start} ${y1} ` : "";
    return `M ${x1} ${y1} ${level}C ${start + bend} ${y1}, ${x2 - bend} ${y2}, ${x2} ${y2}`;
  }

  function edgeEl(edge, at) {
    const taken = edge.taken === true ? "taken" : edge.taken === false ? "not-taken" : "open";
    return svg("path", {
      d: edgePath(at.get(edge.from), at.get(edge.to)),
      class: `edge edge-${edge.kind} edge-${taken}`,
      "marker-end": `url(#arrow-${taken !== "taken" ? "plain" : edge.kind === "catch" ? "catch" : "taken"})`,
      "data-testid": "graph-edge",
      "data-from": edge.from,
      "data-to": edge.to,
      "data-kind": edge.kind,
      "data-taken": taken,
    });
  }

  function nodeEl(node, at) {
    const { x, y } = at.get(node.name);
    const label = nodeLabel(node);
    return svg(
      "g",
      {
        class: `node node-${node.state}`,
        transform: `translate(${x} ${y})`,
        "data-testid": "graph-node",
        "data-name": node.name,
        "data-state": node.state,
        "data-kind": node.kind,
        "data-label": label,
        "data-progress": node.progress ? progressText(node.progress) : null,
      },
      svg("title", {}, nodeTitle(node)),
      svg("rect", { width: NODE_W, height: NODE_H, rx: 6 }),
      svg("text", { x: 10, y: 19, class: "node-name" }, clip(node.name, LABEL_CHARS - 4)),
      svg("text", { x: 10, y: 37, class: "node-label" }, clip(label, LABEL_CHARS)),
      svg("text", { x: 10, y: 53, class: "node-detail" }, clip(nodeDetail(node), LABEL_CHARS + 4)),
      node.progress ? progressBar(node.progress) : null,
    );
  }

  function arrow(id) {
    return svg(
      "marker",
      // In user units: a thick (taken) edge gets the same arrowhead as a thin one.
      { id, viewBox: "0 0 10 10", refX: 9, refY: 5, markerWidth: 10, markerHeight: 10, markerUnits: "userSpaceOnUse", orient: "auto" },
      svg("path", { d: "M 0 0 L 10 5 L 0 10 z", class: `arrow ${id}` }),
    );
  }

  function renderGraph(graph) {
    const { at, width, height } = layout(graph.nodes);
    const drawing = $("graph-svg");
    drawing.setAttribute("viewBox", `0 0 ${width} ${height}`);
    drawing.setAttribute("width", width);
    drawing.setAttribute("height", height);
    drawing.dataset.seq = graph.seq;
    drawing.dataset.status = graph.status;
    drawing.replaceChildren(
      svg("defs", {}, arrow("arrow-plain"), arrow("arrow-taken"), arrow("arrow-catch")),
      svg("g", { class: "edges" }, graph.edges.map((edge) => edgeEl(edge, at))),
      svg("g", { class: "nodes" }, graph.nodes.map((node) => nodeEl(node, at))),
    );
    const slider = $("graph-seq");
    slider.max = String(graph.last_seq);
    slider.value = String(graph.seq);
    const latest = graph.seq === graph.last_seq;
    $("graph-next").disabled = latest;
    $("graph-prev").disabled = graph.seq <= Number(slider.min);
    $("graph-latest").disabled = state.graph.pinned === null;
    const fact = graph.fact;
    $("graph-at").textContent =
      `fact ${fact.seq} of ${graph.last_seq}: ${fact.type} at ${formatTime(fact.time_ms)} · run ${graph.status}` +
      (state.graph.pinned === null ? " (live)" : "");
    for (const row of $("timeline-body").children) {
      row.classList.toggle("fact-current", Number(row.dataset.seq) === graph.seq);
    }
  }

  /** Fetch and draw the graph after the pinned fact (or the latest); a stale answer is dropped. */
  async function refreshGraph(runId) {
    const graph = state.graph;
    if (graph.runId !== runId) Object.assign(graph, { runId, pinned: null, lastSeq: 0 });
    graph.ticket += 1;
    const ticket = graph.ticket;
    let answer;
    try {
      answer = await api(`api/runs/${encodeURIComponent(runId)}/graph`, { at_seq: graph.pinned });
    } catch (exc) {
      // A run of a pipeline version this processor does not load has no graph here.
      if (!(exc instanceof ApiError) || exc.status === 401 || exc.status >= 500) throw exc;
      if (ticket !== graph.ticket) return;
      $("graph-body").hidden = true;
      $("graph-message").hidden = false;
      $("graph-message").textContent = `No graph: ${exc.message}`;
      return;
    }
    if (ticket !== graph.ticket || graph.runId !== runId) return; // a newer request is on its way
    graph.lastSeq = answer.last_seq;
    graph.shown = answer.seq;
    $("graph-body").hidden = false;
    $("graph-message").hidden = true;
    renderGraph(answer);
  }

  /** Show the graph after fact ``seq`` (the latest and live again at the last fact). */
  function showGraphAt(seq) {
    const graph = state.graph;
    if (!graph.runId) return;
    const last = graph.lastSeq || seq;
    const bounded = Math.min(Math.max(1, seq), last);
    graph.pinned = bounded >= last ? null : bounded;
    refreshGraph(graph.runId).catch(showError);
  }

  // --- pending interactions ----------------------------------------------------------------

  function copyButton(text) {
    const button = el("button", { type: "button", class: "copy", "aria-label": "Copy token" }, "Copy");
    button.addEventListener("click", () => {
      navigator.clipboard?.writeText(text).then(
        () => { button.textContent = "Copied"; },
        () => { button.textContent = "Select and copy"; },
      );
    });
    return button;
  }

  function requestRow(request) {
    return el(
      "tr",
      { "data-testid": "request-row", "data-run-id": request.run_id, "data-target": request.target },
      el("td", {}, runLink(request.run_id)),
      cell(request.boundary),
      cell(request.item_index),
      cell(request.kind),
      cell(request.target),
      el("td", {}, timeEl(request.deadline_ms)),
      el("td", { class: "token-cell" }, el("code", { "data-testid": "request-token" }, request.token), " ", copyButton(request.token)),
    );
  }

  async function refreshRequests() {
    const message = $("requests-message");
    if (!token()) {
      $("requests-body").replaceChildren();
      message.textContent = "Pending interactions show their resume tokens: enter the bearer token above to see them.";
      return;
    }
    try {
      const page = await api("api/requests");
      $("requests-body").replaceChildren(...page.requests.map(requestRow));
      message.textContent = page.requests.length ? "" : "No interaction is waiting.";
    } catch (exc) {
      if (!(exc instanceof ApiError) || exc.status !== 401) throw exc;
      $("requests-body").replaceChildren();
      message.textContent = `The bearer token was refused (${exc.message}).`;
    }
  }

  // --- rejected inputs and dead letters ----------------------------------------------------

  function rejectedRow(record) {
    return el(
      "tr",
      { "data-testid": "rejected-row", "data-reason": record.reason },
      el("td", {}, timeEl(record.rejected_ms || null)),
      cell(record.reason),
      cell(shortValue(record.detail)),
      cell(record.source),
      el("td", {}, record.run_id ? runLink(record.run_id) : "–"),
    );
  }

  function deadLetterRow(record) {
    return el(
      "tr",
      { "data-testid": "dlq-row", "data-run-id": record.run_id },
      el("td", {}, timeEl(record.failed_ms)),
      el("td", {}, record.run_id ? runLink(record.run_id) : "–"),
      cell(record.pipeline ? `${record.pipeline} v${record.pipeline_version}` : null),
      cell(record.step),
      cell(record.attempts),
      // An undecodable record has only its error.
      cell(record.error_type ? `${record.error_type}: ${shortValue(record.error)}` : shortValue(record.error)),
    );
  }

  async function refreshTopic(name, path, row) {
    const paging = state[name];
    const page = await api(path, { cursor: paging.cursors[paging.page], limit: PAGE_SIZE });
    paging.next = page.next_cursor;
    $(`${name}-body`).replaceChildren(...page.records.map(row));
    $(`${name}-empty`).hidden = page.records.length > 0;
    $(`${name}-next`).disabled = !paging.next;
    $(`${name}-first`).disabled = paging.page === 0;
  }

  // --- refresh loop ------------------------------------------------------------------------

  function showError(exc) {
    const banner = $("error-banner");
    banner.hidden = !exc;
    if (!exc) {
      banner.textContent = "";
    } else if (exc instanceof ApiError && exc.status === 401) {
      // Off loopback every API route needs the bearer token.
      banner.textContent = `The processor asks for the bearer token (PROCESSOR_HTTP_TOKEN): enter it above. ${exc.message}`;
    } else if (exc instanceof ApiError) {
      banner.textContent = `The processor answered ${exc.status}: ${exc.message}`;
    } else {
      banner.textContent = `Could not reach the processor: ${exc.message}`;
    }
  }

  /** Refresh every part once; one failing part does not stop the others. */
  async function refresh() {
    if (state.refreshing) {
      state.again = true; // a filter or a page changed mid-refresh: refresh once more after
      return;
    }
    state.refreshing = true;
    state.again = false;
    try {
      const parts = [
        refreshRuns(),
        refreshDetail(),
        refreshRequests(),
        refreshTopic("rejected", "api/rejected", rejectedRow),
        refreshTopic("dlq", "api/dlq", deadLetterRow),
      ];
      const failures = (await Promise.allSettled(parts)).filter((r) => r.status === "rejected");
      showError(failures.length ? failures[0].reason : null);
      const when = `${new Date().toISOString().slice(11, 19)} UTC`;
      $("live-status").textContent = failures.length ? `refresh failed at ${when}` : `updated ${when}`;
      document.body.dataset.refreshed = String(Date.now()); // lets a test wait for a refresh
    } finally {
      state.refreshing = false;
    }
    if (state.again) await refresh();
  }

  function poll() {
    if ($("live-toggle").checked && !document.hidden) refresh();
  }

  // --- wiring ------------------------------------------------------------------------------

  function showTokenState() {
    $("token-state").textContent = token() ? "token saved in this browser" : "no token";
  }

  function wirePager(name, reload) {
    const paging = state[name];
    $(`${name}-next`).addEventListener("click", () => {
      if (!paging.next) return;
      paging.cursors = paging.cursors.slice(0, paging.page + 1).concat([paging.next]);
      paging.page += 1;
      reload();
    });
    $(`${name}-first`).addEventListener("click", () => {
      Object.assign(paging, pager());
      reload();
    });
  }

  function wire() {
    $("token-form").addEventListener("submit", (event) => {
      event.preventDefault();
      const value = $("token-input").value.trim();
      try {
        if (value) window.localStorage.setItem(TOKEN_KEY, value);
      } catch (_) { /* storage disabled: nothing to keep */ }
      $("token-input").value = "";
      showTokenState();
      refresh();
    });
    $("token-clear").addEventListener("click", () => {
      try {
        window.localStorage.removeItem(TOKEN_KEY);
      } catch (_) { /* nothing kept */ }
      showTokenState();
      refresh();
    });
    $("run-filters").addEventListener("submit", (event) => {
      event.preventDefault();
      state.filters = readFilters();
      state.runs = pager();
      refresh();
    });
    $("run-filters").addEventListener("reset", () => {
      // The reset clears the fields after this handler: read them on the next turn.
      setTimeout(() => {
        state.filters = readFilters();
        state.runs = pager();
        refresh();
      }, 0);
    });
    $("run-search").addEventListener("submit", (event) => {
      event.preventDefault();
      const runId = $("search-run-id").value.trim();
      if (runId) window.location.hash = `run=${encodeURIComponent(runId)}`;
    });
    window.addEventListener("hashchange", () => {
      const runId = selectedFromHash();
      if (runId === null) return; // a link to a section, not to a run
      state.selected = runId;
      refresh().then(() => $("run-detail").scrollIntoView());
    });
    // Dragging the slider fires many input events: fetch for where it rests (80 ms). The
    // value is taken at the event: a live refresh drawn meanwhile moves the slider back.
    let sliding = null;
    $("graph-seq").addEventListener("input", () => {
      clearTimeout(sliding);
      const wanted = Number($("graph-seq").value);
      sliding = setTimeout(() => showGraphAt(wanted), 80);
    });
    $("graph-prev").addEventListener("click", () => showGraphAt(Number($("graph-seq").value) - 1));
    $("graph-next").addEventListener("click", () => showGraphAt(Number($("graph-seq").value) + 1));
    $("graph-latest").addEventListener("click", () => showGraphAt(state.graph.lastSeq));
    // A fact of the timeline shows the graph as it was right after it.
    $("timeline-body").addEventListener("click", (event) => {
      const row = event.target.closest("tr[data-seq]");
      if (row && !event.target.closest("a, button")) showGraphAt(Number(row.dataset.seq));
    });
    wirePager("runs", refresh);
    wirePager("rejected", refresh);
    wirePager("dlq", refresh);
    $("live-toggle").addEventListener("change", poll);
  }

  document.addEventListener("DOMContentLoaded", () => {
    wire();
    showTokenState();
    state.selected = selectedFromHash();
    state.filters = readFilters();
    refresh();
    setInterval(poll, POLL_MS);
  });
})();

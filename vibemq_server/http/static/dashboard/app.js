/* VibeMQ dashboard: one page, views routed by the URL's hash, every figure from /api/.
 *
 * Safety: every piece of broker data is inserted as text (textContent, text nodes,
 * setAttribute on inert attributes): no innerHTML anywhere, so a payload or header holding
 * markup is shown, never run. The page's Content-Security-Policy forbids inline scripts too.
 *
 * Load on the broker: one poller for the whole page. It runs the current view's refresh,
 * waits for it to finish, then waits POLL_MS (or LOAD_FACTOR times as long as the refresh
 * took, when that is longer: a big broker is asked less often) before the next one: never
 * more than one request in flight from polling. It stops while the tab is hidden, and backs
 * off (doubling, up to BACKOFF_MAX_MS) while requests fail.
 */
"use strict";
(() => {
  const POLL_MS = 3000;
  // wait at least this many times a refresh's duration: its share of the broker's time
  // stays under 1/LOAD_FACTOR per open tab, however many queues there are
  const LOAD_FACTOR = 20;
  const BACKOFF_MAX_MS = 60000;
  const REQUEST_TIMEOUT_MS = 10000;
  const AUTH_KEY = "vibemq.dashboard.auth";
  const DEPTH_POINTS = 300;
  // names that mark a dead-letter queue: orders.dlq (the default), orders-dead-letters, ...
  const DLQ_REGEX = "(?i)(^|[._-])(dlq|dead[._-]?letters?)([._-]|$)";
  const DLQ_TEST = /(^|[._-])(dlq|dead[._-]?letters?)([._-]|$)/i;

  // -- DOM: elements built from text, never from markup ------------------------------------

  function h(tag, attrs, ...children) {
    const el = document.createElement(tag);
    for (const [key, value] of Object.entries(attrs || {})) {
      if (value === null || value === undefined || value === false) continue;
      if (key === "class") el.className = value;
      else if (key.startsWith("on")) {
        // a handler is one of this script's functions, never a string (an inline handler)
        if (typeof value !== "function") throw new TypeError(`${key}: not a function`);
        el.addEventListener(key.slice(2), value);
      } else if (key === "value") el.value = value;
      else el.setAttribute(key, value === true ? "" : String(value));
    }
    add(el, children);
    return el;
  }

  function add(el, children) {
    for (const child of children.flat(Infinity)) {
      if (child === null || child === undefined || child === false) continue;
      el.append(child instanceof Node ? child : document.createTextNode(String(child)));
    }
    return el;
  }

  function clear(el) {
    while (el.firstChild) el.removeChild(el.firstChild);
    return el;
  }

  function fill(el, ...children) {
    return add(clear(el), children);
  }

  const $ = (id) => document.getElementById(id);

  // -- formatting ----------------------------------------------------------------------------

  const numberFormat = new Intl.NumberFormat();
  const rateFormat = new Intl.NumberFormat(undefined, { maximumFractionDigits: 1 });
  const fmtNum = (n) => (typeof n === "number" ? numberFormat.format(n) : "–");
  const fmtRate = (n) => (typeof n === "number" ? rateFormat.format(n) + "/s" : "–");

  function fmtBytes(n) {
    if (typeof n !== "number") return "–";
    const units = ["B", "KiB", "MiB", "GiB", "TiB"];
    let i = 0;
    while (n >= 1024 && i < units.length - 1) {
      n /= 1024;
      i++;
    }
    return (i ? n.toFixed(1) : String(n)) + " " + units[i];
  }

  function fmtDuration(seconds) {
    let s = Math.floor(seconds || 0);
    const d = Math.floor(s / 86400);
    s -= d * 86400;
    const hh = Math.floor(s / 3600);
    s -= hh * 3600;
    const mm = Math.floor(s / 60);
    s -= mm * 60;
    if (d) return `${d}d ${hh}h ${mm}m`;
    if (hh) return `${hh}h ${mm}m`;
    if (mm) return `${mm}m ${s}s`;
    return `${s}s`;
  }

  function fmtTime(iso) {
    if (!iso) return "–";
    const t = new Date(iso);
    return Number.isNaN(t.getTime()) ? String(iso) : t.toLocaleString();
  }

  // -- the API -------------------------------------------------------------------------------

  class ApiError extends Error {
    constructor(status, message) {
      super(message);
      this.status = status;
    }
  }

  function detailOf(data) {
    if (data && typeof data === "object" && typeof data.detail === "string") return data.detail;
    if (typeof data === "string" && data) return data.slice(0, 300);
    return "";
  }

  function basicToken(user, password) {
    const bytes = new TextEncoder().encode(`${user}:${password}`);
    let binary = "";
    for (const b of bytes) binary += String.fromCharCode(b);
    return btoa(binary);
  }

  const auth = {
    token: sessionStorage.getItem(AUTH_KEY),
    user: sessionStorage.getItem(AUTH_KEY + ".user"),
    set(user, token) {
      this.user = user;
      this.token = token;
      sessionStorage.setItem(AUTH_KEY, token);
      sessionStorage.setItem(AUTH_KEY + ".user", user);
      showSession();
    },
    forget() {
      this.user = this.token = null;
      sessionStorage.removeItem(AUTH_KEY);
      sessionStorage.removeItem(AUTH_KEY + ".user");
      showSession();
    },
  };

  /* One API call. credentials: "omit" keeps the browser from prompting on a 401 (the page
   * asks with its own form) and from sending anything but the Authorization header set here. */
  async function call(method, path, body, token = auth.token) {
    const headers = { Accept: "application/json" };
    if (token) headers.Authorization = "Basic " + token;
    const init = { method, headers, credentials: "omit", cache: "no-store" };
    if (body !== undefined) {
      headers["Content-Type"] = "application/json";
      init.body = JSON.stringify(body);
    }
    init.signal = AbortSignal.timeout(REQUEST_TIMEOUT_MS);
    let response;
    try {
      response = await fetch(path, init);
    } catch (err) {
      const why = err && err.name === "TimeoutError" ? "timed out" : "no answer";
      throw new ApiError(0, `The broker did not answer (${why}).`);
    }
    const text = await response.text();
    let data = null;
    if (text) {
      try {
        data = JSON.parse(text);
      } catch {
        data = text;
      }
    }
    if (!response.ok) {
      if (response.status === 401 && token === auth.token) needLogin();
      const detail = detailOf(data) || response.statusText;
      throw new ApiError(response.status, `${response.status}: ${detail}`);
    }
    return data;
  }

  const get = (path) => call("GET", path);

  /* Whether the broker serves an API path (its OpenAPI document, open and fetched once):
   * a view of an area this broker version lacks says so without a failing request. */
  let apiPaths = null;
  async function apiHas(path) {
    if (!apiPaths) {
      apiPaths = call("GET", "/api/openapi.json").then(
        (doc) => new Set(Object.keys((doc && doc.paths) || {})),
        () => null,
      );
    }
    const paths = await apiPaths;
    if (paths === null) {
      apiPaths = null; // try again next time; meanwhile ask the path itself
      return true;
    }
    return paths.has(path);
  }
  const q = (name) => encodeURIComponent(name);

  // -- banner: what happened, in words -------------------------------------------------------

  let bannerTimer = null;

  function say(text, kind = "ok", source = "action") {
    const banner = $("banner");
    clearTimeout(bannerTimer);
    banner.className = `banner ${kind}`;
    banner.dataset.source = source;
    fill(banner, 
      h("span", {}, text),
      h("button", { type: "button", class: "link", "aria-label": "dismiss", onclick: hush }, "×"),
    );
    banner.hidden = false;
    if (kind === "ok") bannerTimer = setTimeout(hush, 5000);
  }

  function hush() {
    $("banner").hidden = true;
  }

  function failed(err, source = "action") {
    if (err instanceof ApiError && err.status === 401) return; // the login form is shown
    say(err instanceof Error ? err.message : String(err), "error", source);
  }

  // -- the poller: one refresh at a time, paused while hidden, backing off on failures --------

  const poller = {
    task: null,
    timer: null,
    running: false,
    again: false,
    failures: 0,
    cost: 0, // ms the last successful refresh took
    paused: false,
    set(task) {
      this.task = task;
      this.failures = 0;
      this.now();
    },
    now() {
      clearTimeout(this.timer);
      this.timer = null;
      if (this.running) {
        this.again = true; // once the request in flight is answered
        return;
      }
      this.run();
    },
    async run() {
      if (!this.task) return;
      if (this.paused || document.hidden) {
        setLive(this.paused ? "off" : "idle");
        return;
      }
      const task = this.task;
      this.running = true;
      document.body.dataset.polling = "1"; // (tests wait for "0": a refresh is one or more calls)
      this.again = false;
      const started = performance.now();
      try {
        await task();
        this.cost = performance.now() - started;
        this.failures = 0;
        setLive(document.hidden ? "idle" : "ok"); // hidden while it was answered: paused now
        if ($("banner").dataset.source === "poll") hush(); // the broker answers again
      } catch (err) {
        this.failures++;
        setLive("error");
        if (err instanceof ApiError && err.status === 401) this.paused = true;
        else failed(err, "poll");
      } finally {
        this.running = false;
        document.body.dataset.polling = "0";
      }
      if (this.again || task !== this.task) this.now();
      else this.schedule();
    },
    schedule() {
      if (!this.task || this.paused || document.hidden) return;
      const delay = this.failures
        ? Math.min(BACKOFF_MAX_MS, POLL_MS * 2 ** this.failures)
        : Math.min(BACKOFF_MAX_MS, Math.max(POLL_MS, LOAD_FACTOR * this.cost));
      this.timer = setTimeout(() => {
        this.timer = null;
        this.run();
      }, delay);
    },
  };

  document.addEventListener("visibilitychange", () => {
    if (document.hidden) {
      clearTimeout(poller.timer);
      poller.timer = null;
      setLive("idle");
    } else {
      poller.now();
    }
  });

  function setLive(state) {
    const dot = $("live");
    dot.className = `dot ${state}`;
    dot.title = {
      ok: "live: updated every few seconds",
      error: "updates failing: retrying less often",
      idle: "paused while the tab is hidden",
      off: "paused: log in",
    }[state];
  }

  // -- login: basic auth sent by the page (kept for this tab only, in sessionStorage) ----------

  let loginShown = false;

  function needLogin() {
    if (loginShown) return;
    loginShown = true;
    poller.paused = true;
    const user = h("input", { id: "login-user", name: "username", autocomplete: "username", required: true });
    const password = h("input", {
      id: "login-password",
      name: "password",
      type: "password",
      autocomplete: "current-password",
      required: true,
    });
    const error = h("p", { class: "error-text", role: "alert" });
    const submit = h("button", { type: "submit", class: "primary" }, "Log in");
    const form = h(
      "form",
      { class: "login card", id: "login-form" },
      h("h2", {}, "Log in to VibeMQ"),
      h("p", { class: "muted" }, "A broker user with the administrator, management or monitoring tag (a token works as the password)."),
      h("label", { for: "login-user" }, "User"),
      user,
      h("label", { for: "login-password" }, "Password or token"),
      password,
      error,
      submit,
    );
    form.addEventListener("submit", async (event) => {
      event.preventDefault();
      submit.disabled = true;
      error.textContent = "";
      const token = basicToken(user.value, password.value);
      try {
        await call("GET", "/api/overview", undefined, token);
        auth.set(user.value, token);
        overlay.remove();
        loginShown = false;
        poller.paused = false;
        route();
      } catch (err) {
        error.textContent =
          err.status === 401 ? "Wrong user name or password." : err.message;
      } finally {
        submit.disabled = false;
      }
    });
    const overlay = h("div", { class: "overlay", id: "login" }, form);
    document.body.append(overlay);
    user.focus();
  }

  function showSession() {
    $("who").textContent = auth.user ? auth.user : "";
    $("logout").hidden = !auth.user;
  }

  $("logout").addEventListener("click", () => {
    auth.forget();
    poller.paused = true;
    needLogin();
  });

  // -- small widgets --------------------------------------------------------------------------

  /* A button that asks once more before it acts (no blocking confirm() dialog). */
  function confirmButton(label, confirmLabel, action, cls = "danger") {
    const button = h("button", { type: "button", class: cls }, label);
    let armed = null;
    button.addEventListener("click", async () => {
      if (!armed) {
        button.textContent = confirmLabel;
        button.classList.add("armed");
        armed = setTimeout(() => {
          armed = null;
          button.textContent = label;
          button.classList.remove("armed");
        }, 5000);
        return;
      }
      clearTimeout(armed);
      armed = null;
      button.textContent = label;
      button.classList.remove("armed");
      await runOnce(button, action);
    });
    return button;
  }

  /* A button whose action runs once at a time. */
  function actionButton(label, action, cls = "") {
    const button = h("button", { type: "button", class: cls }, label);
    button.addEventListener("click", () => runOnce(button, action));
    return button;
  }

  /* Run a button's action with the button disabled meanwhile; a failure is shown. */
  async function runOnce(button, action) {
    button.disabled = true;
    try {
      await action();
    } catch (err) {
      failed(err);
    } finally {
      button.disabled = false;
    }
  }

  function card(title, value, note, id) {
    return h(
      "div",
      { class: "stat", id },
      h("div", { class: "stat-title" }, title),
      h("div", { class: "stat-value" }, value),
      note ? h("div", { class: "stat-note" }, note) : null,
    );
  }

  /* A table of rows; `cls` "stack" shows each row as a block of labelled lines on a phone. */
  function table(columns, rows, empty = "Nothing here.", cls = null) {
    if (!rows.length) return h("p", { class: "muted empty" }, empty);
    return h(
      "div",
      { class: "table-wrap" },
      h(
        "table",
        { class: cls },
        h("thead", {}, h("tr", {}, columns.map((c) => h("th", { class: c.cls }, c.title)))),
        h(
          "tbody",
          {},
          rows.map((row) =>
            h("tr", {}, columns.map((c) => h("td", { class: c.cls, "data-label": c.title }, c.cell(row)))),
          ),
        ),
      ),
    );
  }

  function link(text, hash) {
    return h("a", { href: hash }, text);
  }

  const queueLink = (name) => link(name, "#/queues/" + q(name));

  // -- charts (uPlot, vendored; a note instead when it did not load) ---------------------------

  const COLORS = { published: "#2563eb", delivered: "#16a34a", acked: "#d97706", ready: "#7c3aed", unacked: "#db2777" };

  /* Time labels in the reader's locale: hh:mm, with seconds when ticks are under a minute. */
  function timeLabels(u, ticks, axis, space, step) {
    const opts = step < 60 ? { hour: "2-digit", minute: "2-digit", second: "2-digit" } : { hour: "2-digit", minute: "2-digit" };
    return ticks.map((t) => new Date(t * 1000).toLocaleTimeString([], opts));
  }

  // dots only while there are too few points for a line to tell much
  const fewPoints = (u, series, first, last) => last - first < 3;

  function makeChart(box, series, span) {
    if (typeof uPlot === "undefined") {
      box.append(h("p", { class: "muted" }, "Charts unavailable (uPlot did not load)."));
      return null;
    }
    const width = () => Math.max(200, box.clientWidth - 4);
    const chart = new uPlot(
      {
        width: width(),
        height: 200,
        // at least `span` seconds wide, ending at the last point: a young broker's chart is
        // not stretched over a few seconds
        scales: {
          x: { time: true, range: (u, min, max) => (max === null ? [Date.now() / 1000 - span, Date.now() / 1000] : [Math.min(min, max - span), max]) },
          y: { range: (u, min, max) => [0, Math.max(1, (max || 0) * 1.1)] },
        },
        series: [{}, ...series.map((s) => ({ label: s, stroke: COLORS[s], width: 2, points: { show: fewPoints } }))],
        axes: [{ stroke: "#64748b", space: 70, values: timeLabels }, { stroke: "#64748b", size: 56 }],
        legend: { live: false },
        cursor: { drag: { x: false, y: false } },
      },
      [[], ...series.map(() => [])],
      box,
    );
    const observer = new ResizeObserver(() => chart.setSize({ width: width(), height: 200 }));
    observer.observe(box);
    // one point is no line, and uPlot stretches a lone point's time axis over years: a
    // first point gets an empty one `span` before it
    chart.put = (data) => {
      if (data[0].length === 1) {
        data = data.map((col, i) => (i === 0 ? [col[0] - span, col[0]] : [null, col[0]]));
      }
      chart.setData(data);
    };
    chart.dispose = () => {
      observer.disconnect();
      chart.destroy();
    };
    return chart;
  }

  // -- views ------------------------------------------------------------------------------------
  // Each view draws its frame into main and returns its refresh (the poller's task) or null.
  // A refresh checks that its view is still the one shown before it draws (`alive()`).

  let generation = 0;
  let disposers = [];
  const depthSamples = { x: [], ready: [], unacked: [] };

  function viewOverview(main, alive) {
    const stats = h("div", { class: "stats", id: "overview-stats" });
    const rateBox = h("div", { class: "chart", id: "chart-rates" });
    const depthBox = h("div", { class: "chart", id: "chart-depth" });
    const deepest = h("div", { id: "deepest" });
    add(main, [
      h("h1", {}, "Overview"),
      stats,
      h(
        "div",
        { class: "charts" },
        h("section", { class: "card" }, h("h2", {}, "Message rates (per second)"), rateBox),
        h("section", { class: "card" }, h("h2", {}, "Queue depth (all queues)"), depthBox),
      ),
      h("section", { class: "card" }, h("h2", {}, "Deepest queues"), deepest),
    ]);
    const rates = makeChart(rateBox, ["published", "delivered", "acked"], 300);
    const depth = makeChart(depthBox, ["ready", "unacked"], 120);
    disposers.push(() => rates && rates.dispose(), () => depth && depth.dispose());

    return async () => {
      const o = await get("/api/overview");
      if (!alive()) return;
      const now = Date.now() / 1000;
      const r = o.rates.current;
      const protocols = Object.entries(o.connections.byProtocol || {})
        .map(([p, n]) => `${p} ${n}`)
        .join(", ");
      fill(stats, 
        card("Publish", fmtRate(r.published), null, "stat-publish"),
        card("Deliver", fmtRate(r.delivered), null, "stat-deliver"),
        card("Ack", fmtRate(r.acked), null, "stat-ack"),
        card("Ready", fmtNum(o.queues.ready), `in ${fmtNum(o.queues.count)} queues`, "stat-ready"),
        card("Unacked", fmtNum(o.queues.unacked), null, "stat-unacked"),
        card("Connections", fmtNum(o.connections.total), protocols || "none", "stat-connections"),
        card("Dropped", fmtRate(r.dropped), `dead-lettered ${fmtRate(r.deadLettered)}`, "stat-dropped"),
        card(
          "Memory",
          fmtBytes(o.memory.rssBytes),
          o.memory.publishersBlocked ? "over the watermark: publishers blocked" : `ready ${fmtBytes(o.memory.readyBytes)}`,
          "stat-memory",
        ),
        card("Journal", fmtBytes(o.journal.bytes), `${fmtNum(o.journal.segments)} segments, fsync ${o.journal.fsync}`, "stat-journal"),
        card("Uptime", fmtDuration(o.uptimeSeconds), `VibeMQ ${o.version}, ${o.phase}`, "stat-uptime"),
      );
      if (rates) {
        const series = o.rates.series || [];
        const x = series.map((p) => p.at);
        const cols = ["published", "delivered", "acked"].map((k) => series.map((p) => p[k]));
        x.push(now);
        cols.forEach((c, i) => c.push(r[["published", "delivered", "acked"][i]]));
        rates.put([x, ...cols]);
      }
      depthSamples.x.push(now);
      depthSamples.ready.push(o.queues.ready);
      depthSamples.unacked.push(o.queues.unacked);
      for (const k of ["x", "ready", "unacked"]) {
        if (depthSamples[k].length > DEPTH_POINTS) depthSamples[k].shift();
      }
      if (depth) depth.put([depthSamples.x, depthSamples.ready, depthSamples.unacked]);

      const top = await get("/api/queues?sort=messageCount&order=desc&pageSize=5");
      if (!alive()) return;
      fill(deepest, 
        table(
          [
            { title: "Queue", cell: (x) => queueLink(x.name) },
            { title: "Ready", cls: "num", cell: (x) => fmtNum(x.messageCount) },
            { title: "Unacked", cls: "num", cell: (x) => fmtNum(x.unackedCount) },
            { title: "Consumers", cls: "num", cell: (x) => fmtNum(x.subscriberCount) },
          ],
          top.items,
          "No queues yet.",
        ),
      );
    };
  }

  // the queues list's state lives as long as the page
  const listState = { page: 1, pageSize: 50, sort: "name", order: "asc", name: "", internal: false };

  const QUEUE_COLUMNS = [
    { key: "name", title: "Name", cell: (x) => queueLink(x.name) },
    { key: "messageCount", title: "Ready", cls: "num", cell: (x) => fmtNum(x.messageCount) },
    { key: "unackedCount", title: "Unacked", cls: "num", cell: (x) => fmtNum(x.unackedCount) },
    { key: "subscriberCount", title: "Consumers", cls: "num", cell: (x) => fmtNum(x.subscriberCount) },
    { key: "published", title: "Published", cls: "num", cell: (x) => fmtNum(x.stats.published) },
    { key: "delivered", title: "Delivered", cls: "num", cell: (x) => fmtNum(x.stats.delivered) },
    { key: "acked", title: "Acked", cls: "num", cell: (x) => fmtNum(x.stats.acked) },
    { key: "dropped", title: "Dropped", cls: "num", cell: (x) => fmtNum(x.stats.dropped) },
    { key: "deliveryMode", title: "Mode", cell: (x) => x.deliveryMode },
    { key: "durable", title: "Durable", cell: (x) => (x.durable ? "yes" : "no") },
  ];

  function createQueueForm(onCreated) {
    const name = h("input", { id: "new-queue-name", required: true, pattern: "[A-Za-z0-9_.\\-]+", maxlength: 256, placeholder: "orders" });
    const mode = h(
      "select",
      { id: "new-queue-mode" },
      ["", "RoundRobin", "FanOutWithAck", "FanOutWithoutAck", "PriorityBased"].map((m) => h("option", { value: m }, m || "(broker default)")),
    );
    const size = h("input", { id: "new-queue-size", type: "number", min: 1, placeholder: "default" });
    const ttl = h("input", { id: "new-queue-ttl", type: "number", min: 0, placeholder: "ms, 0 = none" });
    const overflow = h(
      "select",
      { id: "new-queue-overflow" },
      ["", "DropOldest", "DropNewest", "BlockPublisher", "RedirectToDlq"].map((m) => h("option", { value: m }, m || "(broker default)")),
    );
    const dlq = h("input", { id: "new-queue-dlq", type: "checkbox" });
    const durable = h("input", { id: "new-queue-durable", type: "checkbox" });
    const submit = h("button", { type: "submit", class: "primary", id: "new-queue-submit" }, "Create queue");
    const form = h(
      "form",
      { class: "card form-grid", id: "create-queue" },
      h("h2", { class: "span" }, "New queue"),
      h("label", { for: "new-queue-name" }, "Name"), name,
      h("label", { for: "new-queue-mode" }, "Delivery mode"), mode,
      h("label", { for: "new-queue-size" }, "Max messages"), size,
      h("label", { for: "new-queue-ttl" }, "Message TTL (ms)"), ttl,
      h("label", { for: "new-queue-overflow" }, "When full"), overflow,
      h("label", { for: "new-queue-dlq" }, "Dead-letter queue"), h("span", {}, dlq, " keep failed messages in <name>.dlq"),
      h("label", { for: "new-queue-durable" }, "Durable"), h("span", {}, durable, " kept in the journal across restarts"),
      h("div", { class: "span actions" }, submit),
    );
    form.addEventListener("submit", async (event) => {
      event.preventDefault();
      const body = { name: name.value.trim() };
      if (mode.value) body.deliveryMode = mode.value;
      if (size.value) body.maxQueueSize = Number(size.value);
      if (ttl.value) body.messageTtl = Number(ttl.value);
      if (overflow.value) body.overflowStrategy = overflow.value;
      if (dlq.checked) body.enableDeadLetterQueue = true;
      if (durable.checked) body.durable = true;
      submit.disabled = true;
      try {
        const made = await call("POST", "/api/queues", body);
        say(made.created ? `Queue ${made.name} created.` : `Queue ${made.name} exists already with these options.`);
        form.reset();
        onCreated(made.name);
      } catch (err) {
        failed(err);
      } finally {
        submit.disabled = false;
      }
    });
    return form;
  }

  function viewQueues(main, alive) {
    const filter = h("input", { id: "queue-filter", type: "search", placeholder: "Filter by name", value: listState.name, "aria-label": "filter by name" });
    const internal = h("input", { id: "queue-internal", type: "checkbox", checked: listState.internal });
    const pageSize = h(
      "select",
      { id: "queue-page-size", "aria-label": "queues per page" },
      [20, 50, 100, 250].map((n) => h("option", { value: n, selected: n === listState.pageSize }, `${n} per page`)),
    );
    const body = h("div", { id: "queue-table" }, h("p", { class: "muted" }, "Loading…"));
    const pager = h("div", { class: "pager", id: "queue-pager" });
    const formBox = h("div", { hidden: true });
    const toggle = h("button", { type: "button", class: "primary", id: "new-queue" }, "New queue");
    toggle.addEventListener("click", () => {
      formBox.hidden = !formBox.hidden;
      if (!formBox.hidden) $("new-queue-name").focus();
    });
    formBox.append(createQueueForm(() => poller.now()));
    let typing = null;
    filter.addEventListener("input", () => {
      clearTimeout(typing);
      typing = setTimeout(() => {
        listState.name = filter.value.trim();
        listState.page = 1;
        poller.now();
      }, 300);
    });
    internal.addEventListener("change", () => {
      listState.internal = internal.checked;
      listState.page = 1;
      poller.now();
    });
    pageSize.addEventListener("change", () => {
      listState.pageSize = Number(pageSize.value);
      listState.page = 1;
      poller.now();
    });
    add(main, [
      h("div", { class: "title-row" }, h("h1", {}, "Queues"), toggle),
      formBox,
      h(
        "div",
        { class: "toolbar" },
        filter,
        h("label", { class: "check" }, internal, " adapters' $ queues"),
        pageSize,
      ),
      body,
      pager,
    ]);

    function sortBy(key) {
      if (listState.sort === key) listState.order = listState.order === "asc" ? "desc" : "asc";
      else {
        listState.sort = key;
        listState.order = key === "name" ? "asc" : "desc";
      }
      listState.page = 1;
      poller.now();
    }

    function go(page) {
      listState.page = page;
      poller.now();
    }

    return async () => {
      const s = listState;
      const params = new URLSearchParams({ page: s.page, pageSize: s.pageSize, sort: s.sort, order: s.order });
      if (s.name) params.set("name", s.name);
      if (s.internal) params.set("internal", "true");
      const data = await get("/api/queues?" + params);
      if (!alive()) return;
      if (data.page > data.pages && data.total) {
        s.page = data.pages; // the list shrank under us
        poller.again = true;
        return;
      }
      const head = h(
        "tr",
        {},
        QUEUE_COLUMNS.map((c) => {
          const sorted = s.sort === c.key;
          const arrow = sorted ? (s.order === "asc" ? " ▲" : " ▼") : "";
          return h(
            "th",
            { class: c.cls, "aria-sort": sorted ? (s.order === "asc" ? "ascending" : "descending") : null },
            h("button", { type: "button", class: "sort", "data-sort": c.key, onclick: () => sortBy(c.key) }, c.title + arrow),
          );
        }),
      );
      const rows = data.items.map((x) =>
        h("tr", { "data-queue": x.name }, QUEUE_COLUMNS.map((c) => h("td", { class: c.cls, "data-label": c.title }, c.cell(x)))),
      );
      fill(body, 
        data.items.length
          ? h("div", { class: "table-wrap" }, h("table", { id: "queues" }, h("thead", {}, head), h("tbody", {}, rows)))
          : h("p", { class: "muted empty" }, s.name ? "No queue matches the filter." : "No queues yet."),
      );
      fill(pager, 
        h("button", { type: "button", id: "page-prev", disabled: data.page <= 1, onclick: () => go(data.page - 1) }, "‹ Previous"),
        h("span", { id: "page-info" }, `Page ${data.page} of ${data.pages} · ${fmtNum(data.total)} queues`),
        h("button", { type: "button", id: "page-next", disabled: data.page >= data.pages, onclick: () => go(data.page + 1) }, "Next ›"),
      );
    };
  }

  function parseHeaders(text) {
    if (!text.trim()) return {};
    let headers;
    try {
      headers = JSON.parse(text);
    } catch (err) {
      throw new Error(`Headers: not JSON (${err.message}).`);
    }
    if (!headers || typeof headers !== "object" || Array.isArray(headers)) {
      throw new Error('Headers: a JSON object of strings, e.g. {"source": "dashboard"}.');
    }
    for (const [k, v] of Object.entries(headers)) {
      if (typeof v !== "string") throw new Error(`Headers: the value of "${k}" must be a string.`);
    }
    return headers;
  }

  /* The publish form: on the Publish view (queue chosen in the form) or a queue's page. */
  function publishForm(fixedQueue, onPublished) {
    const queue = h("input", { id: "publish-queue", required: true, placeholder: "queue name", value: fixedQueue || "" });
    const encoding = h(
      "select",
      { id: "publish-encoding" },
      h("option", { value: "json" }, "JSON"),
      h("option", { value: "text" }, "text"),
      h("option", { value: "base64" }, "bytes (base64)"),
    );
    const payload = h("textarea", { id: "publish-payload", rows: 6, spellcheck: "false" });
    payload.value = '{\n  "hello": "world"\n}';
    const headers = h("textarea", { id: "publish-headers", rows: 2, spellcheck: "false", placeholder: '{"source": "dashboard"}' });
    const priority = h(
      "select",
      { id: "publish-priority" },
      ["", "low", "normal", "high", "critical"].map((p) => h("option", { value: p }, p || "(normal)")),
    );
    const result = h("p", { class: "muted", id: "publish-result", role: "status" });
    const submit = h("button", { type: "submit", class: "primary", id: "publish-submit" }, "Publish");
    const form = h(
      "form",
      { class: "card form-grid", id: "publish-form" },
      h("h2", { class: "span" }, fixedQueue ? "Publish a test message" : "Publish a message"),
      fixedQueue ? null : [h("label", { for: "publish-queue" }, "Queue"), queue],
      h("label", { for: "publish-encoding" }, "Payload as"), encoding,
      h("label", { for: "publish-payload" }, "Payload"), payload,
      h("label", { for: "publish-headers" }, "Headers (JSON)"), headers,
      h("label", { for: "publish-priority" }, "Priority"), priority,
      h("div", { class: "span actions" }, submit, result),
    );
    form.addEventListener("submit", async (event) => {
      event.preventDefault();
      const target = (fixedQueue || queue.value).trim();
      const body = { payloadEncoding: encoding.value };
      try {
        if (encoding.value === "json") {
          try {
            body.payload = JSON.parse(payload.value);
          } catch (err) {
            throw new Error(`Payload: not JSON (${err.message}); choose "text" to send it as it is.`);
          }
        } else body.payload = payload.value;
        body.headers = parseHeaders(headers.value);
      } catch (err) {
        say(err.message, "error");
        return;
      }
      if (priority.value) body.priority = priority.value;
      submit.disabled = true;
      try {
        const sent = await call("POST", `/api/queues/${q(target)}/messages`, body);
        result.textContent = `Published ${sent.id} to ${target} (${sent.outcome}).`;
        say(`Message published to ${target}.`);
        if (onPublished) onPublished();
      } catch (err) {
        result.textContent = "";
        failed(err);
      } finally {
        submit.disabled = false;
      }
    });
    return form;
  }

  function viewPublish(main, alive, arg) {
    add(main, [
      h("h1", {}, "Publish"),
      h("p", { class: "muted" }, "Publishes one message into a queue (and to the subscribers of its address on every protocol), as a native publish would."),
      publishForm(null, null),
    ]);
    if (arg) $("publish-queue").value = arg;
    return null;
  }

  function messageView(m) {
    const pretty = m.payloadEncoding === "json" ? JSON.stringify(m.payload, null, 2) : String(m.payload ?? "");
    const headerRows = Object.entries(m.headers || {});
    return h(
      "article",
      { class: "message", "data-id": m.id },
      h(
        "div",
        { class: "message-head" },
        h("code", { class: "message-id" }, m.id),
        h("span", { class: "badge" }, m.priority),
        m.redelivered ? h("span", { class: "badge warn" }, `redelivered ×${m.deliveryAttempts}`) : null,
        h("span", { class: "muted" }, `${fmtBytes(m.size)} · ${fmtTime(m.publishedAt)}`),
        m.expiresAt ? h("span", { class: "muted" }, `expires ${fmtTime(m.expiresAt)}`) : null,
      ),
      headerRows.length
        ? h(
            "table",
            { class: "headers" },
            h("tbody", {}, headerRows.map(([k, v]) => h("tr", {}, h("th", {}, k), h("td", {}, v)))),
          )
        : null,
      h("div", { class: "payload-label muted" }, `payload (${m.payloadEncoding})`),
      h("pre", { class: "payload" }, pretty),
    );
  }

  function viewQueue(main, alive, name) {
    const facts = h("div", { class: "stats", id: "queue-stats" });
    const options = h("div", { id: "queue-options" });
    const subscribers = h("div", { id: "queue-subscribers" });
    const messages = h("div", { id: "messages" });
    const browseInfo = h("span", { class: "muted", id: "browse-info" });
    const sendBackBox = h("span", {});
    const browse = { offset: 0, limit: 20 };
    let isDlq = DLQ_TEST.test(name);

    async function sendBack() {
      const moved = await call("POST", `/api/queues/${q(name)}/move`, {});
      const where = Object.entries(moved.moved).map(([k, n]) => `${n} to ${k}`).join(", ");
      say(`Sent back ${moved.total} message(s)${where ? ": " + where : ""}${moved.kept ? `; ${moved.kept} kept (no original queue, or it is missing or full)` : ""}.`);
      await loadMessages();
      poller.now();
    }

    function showSendBack() {
      clear(sendBackBox);
      if (isDlq) sendBackBox.append(confirmButton("Send back", "Send all back?", sendBack, "primary"));
    }

    async function loadMessages() {
      const page = await get(`/api/queues/${q(name)}/messages?offset=${browse.offset}&limit=${browse.limit}`);
      if (!alive()) return;
      if (page.messages.some((m) => m.headers && m.headers.originalQueue)) isDlq = true;
      showSendBack();
      const last = browse.offset + page.count;
      browseInfo.textContent = page.count
        ? `messages ${browse.offset + 1}–${last} of ${fmtNum(page.messageCount)} ready`
        : `${fmtNum(page.messageCount)} ready`;
      fill(messages, 
        page.count ? page.messages.map(messageView) : h("p", { class: "muted empty" }, "No ready messages."),
        h(
          "div",
          { class: "pager" },
          h("button", { type: "button", id: "browse-prev", disabled: browse.offset === 0, onclick: () => { browse.offset = Math.max(0, browse.offset - browse.limit); loadMessages().catch(failed); } }, "‹ Newer"),
          h("button", { type: "button", id: "browse-next", disabled: last >= page.messageCount, onclick: () => { browse.offset += browse.limit; loadMessages().catch(failed); } }, "Older ›"),
        ),
      );
    }

    const afterChange = async () => {
      await loadMessages();
      poller.now();
    };

    const purge = confirmButton("Purge", "Purge all ready messages?", async () => {
      const done = await call("DELETE", `/api/queues/${q(name)}/contents`);
      say(`Purged ${done.purged} message(s) from ${name}.`);
      browse.offset = 0;
      await afterChange();
    });
    purge.id = "purge";
    const remove = confirmButton("Delete queue", "Delete it and its messages?", async () => {
      await call("DELETE", `/api/queues/${q(name)}`);
      say(`Queue ${name} deleted.`);
      location.hash = "#/queues";
    });
    remove.id = "delete-queue";
    const refresh = actionButton("Refresh", loadMessages);
    refresh.id = "browse-refresh";

    add(main, [
      h("p", { class: "crumbs" }, link("Queues", "#/queues"), " / "),
      h("div", { class: "title-row" }, h("h1", { class: "queue-name" }, name), h("div", { class: "actions" }, sendBackBox, purge, remove)),
      facts,

      h(
        "section",
        { class: "card" },
        h("div", { class: "title-row" }, h("h2", {}, "Messages"), h("div", { class: "actions" }, browseInfo, refresh)),
        messages,
      ),
      h(
        "div",
        { class: "two" },
        h("section", { class: "card" }, h("h2", {}, "Options"), options),
        h("section", { class: "card" }, h("h2", {}, "Consumers"), subscribers),
      ),
      name.startsWith("$")
        ? null
        : h("details", { class: "card", id: "publish-here" }, h("summary", {}, "Publish a test message"), publishForm(name, afterChange)),
    ]);
    showSendBack();
    loadMessages().catch((err) => (err.status === 404 ? null : failed(err)));

    function gone() {
      fill(main, h("p", { class: "crumbs" }, link("Queues", "#/queues"), " / "), h("h1", {}, name), h("p", { class: "muted", id: "queue-missing" }, "There is no queue of this name (any more)."));
      if (alive()) poller.task = null; // nothing left to refresh
    }

    return async () => {
      let x;
      try {
        x = await get(`/api/queues/${q(name)}`);
      } catch (err) {
        if (err.status === 404 && alive()) return gone();
        throw err;
      }
      if (!alive()) return;
      fill(facts, 
        card("Ready", fmtNum(x.messageCount), `of at most ${fmtNum(x.maxSize)}`, "queue-ready"),
        card("Unacked", fmtNum(x.unackedCount)),
        card("Consumers", fmtNum(x.subscriberCount)),
        card("Memory", fmtBytes(x.memoryBytes)),
        card("Published", fmtNum(x.stats.published)),
        card("Delivered", fmtNum(x.stats.delivered)),
        card("Acked", fmtNum(x.stats.acked)),
        card("Redelivered", fmtNum(x.stats.redelivered)),
        card("Dead-lettered", fmtNum(x.stats.deadLettered)),
        card("Dropped", fmtNum(x.stats.dropped), `expired ${fmtNum(x.stats.expired)}`),
      );
      const rows = [
        ["Delivery mode", x.deliveryMode],
        ["Max messages", fmtNum(x.maxSize)],
        ["When full", x.overflowStrategy],
        ["Message TTL", x.messageTtl ? `${fmtNum(x.messageTtl)} ms` : "none"],
        ["Dead-letter queue", x.enableDeadLetterQueue ? (x.deadLetterQueueName ? queueLink(x.deadLetterQueueName) : "yes") : "off"],
        ["Max retries", fmtNum(x.maxRetryAttempts)],
        ["Ack timeout", `${fmtNum(x.ackTimeout)} ms`],
        ["Durable", x.durable ? "yes" : "no"],
        ["Created", fmtTime(x.createdAt)],
      ];
      fill(options, h("table", { class: "kv" }, h("tbody", {}, rows.map(([k, v]) => h("tr", {}, h("th", {}, k), h("td", {}, v))))));
      fill(subscribers, 
        table(
          [
            { title: "Subscription", cell: (s) => h("code", {}, s.id) },
            { title: "Prefetch", cls: "num", cell: (s) => (s.prefetch ? fmtNum(s.prefetch) : "unlimited") },
            { title: "Unacked", cls: "num", cell: (s) => fmtNum(s.unacked) },
          ],
          x.subscribers,
          "No consumers.",
        ),
      );
    };
  }

  const dlqState = { page: 1 };

  function viewDeadLetters(main, alive) {
    const body = h("div", { id: "dlq-table" }, h("p", { class: "muted" }, "Loading…"));
    const pager = h("div", { class: "pager" });
    add(main, [
      h("h1", {}, "Dead letters"),
      h(
        "p",
        { class: "muted" },
        "Queues whose name marks a dead-letter queue (orders.dlq, orders-dead-letters, …). " +
          "“Send back” moves each ready message to the queue its originalQueue header names; " +
          "a message without one, or whose queue is gone or full, stays.",
      ),
      body,
      pager,
    ]);

    return async () => {
      const params = new URLSearchParams({ regex: DLQ_REGEX, sort: "messageCount", order: "desc", pageSize: 50, page: dlqState.page });
      const data = await get("/api/queues?" + params);
      if (!alive()) return;
      fill(body, 
        table(
          [
            { title: "Queue", cell: (x) => queueLink(x.name) },
            { title: "Messages", cls: "num", cell: (x) => fmtNum(x.messageCount) },
            { title: "Received", cls: "num", cell: (x) => fmtNum(x.stats.published) },
            {
              title: "",
              cell: (x) =>
                x.messageCount
                  ? confirmButton("Send back", "Send all back?", async () => {
                      const moved = await call("POST", `/api/queues/${q(x.name)}/move`, {});
                      say(`Sent back ${moved.total} message(s) from ${x.name}${moved.kept ? `; ${moved.kept} kept` : ""}.`);
                      poller.now();
                    }, "primary")
                  : h("span", { class: "muted" }, "empty"),
            },
          ],
          data.items,
          "No dead-letter queues.",
          "stack",
        ),
      );
      fill(pager, 
        data.pages > 1
          ? [
              h("button", { type: "button", disabled: data.page <= 1, onclick: () => { dlqState.page--; poller.now(); } }, "‹ Previous"),
              h("span", {}, `Page ${data.page} of ${data.pages}`),
              h("button", { type: "button", disabled: data.page >= data.pages, onclick: () => { dlqState.page++; poller.now(); } }, "Next ›"),
            ]
          : null,
      );
    };
  }

  function viewConnections(main, alive) {
    const body = h("div", { id: "connection-table" }, h("p", { class: "muted" }, "Loading…"));
    add(main, [h("h1", {}, "Connections"), body]);
    const closing = new Set(); // rows whose close form is open survive a refresh

    function closeCell(c) {
      if (!closing.has(c.id)) {
        return h("button", { type: "button", class: "danger", "data-close": c.id, onclick: () => { closing.add(c.id); poller.now(); } }, "Close");
      }
      const reason = h("input", { class: "reason", placeholder: "reason the client is told", maxlength: 200, "aria-label": "reason" });
      const form = h(
        "form",
        { class: "inline", "data-close-form": c.id },
        reason,
        h("button", { type: "submit", class: "danger" }, "Close it"),
        h("button", { type: "button", class: "link", onclick: () => { closing.delete(c.id); poller.now(); } }, "cancel"),
      );
      form.addEventListener("submit", async (event) => {
        event.preventDefault();
        const why = reason.value.trim();
        try {
          await call("DELETE", `/api/connections/${q(c.id)}` + (why ? "?reason=" + q(why) : ""));
          say(`Connection ${c.id} closed.`);
        } catch (err) {
          failed(err);
        }
        closing.delete(c.id);
        poller.now();
      });
      return form;
    }

    return async () => {
      const list = await get("/api/connections");
      if (!alive()) return;
      // keep a half-typed reason: redraw only when no close form has focus
      if (document.activeElement && document.activeElement.classList.contains("reason")) return;
      fill(body, 
        table(
          [
            { title: "Id", cell: (c) => h("code", {}, c.id) },
            { title: "Protocol", cell: (c) => c.protocol || "…" },
            { title: "User", cell: (c) => c.user ?? "–" },
            { title: "Client", cell: (c) => c.client_id ?? "–" },
            { title: "Peer", cell: (c) => `${c.peer_host}:${c.peer_port}${c.tls ? " (TLS)" : ""}` },
            { title: "Since", cell: (c) => fmtTime(c.connected_at) },
            { title: "In", cls: "num", cell: (c) => fmtBytes(c.bytes_in) },
            { title: "Out", cls: "num", cell: (c) => fmtBytes(c.bytes_out) },
            { title: "Consumers", cls: "num", cell: (c) => fmtNum(c.consumers + c.subscriptions) },
            { title: "", cell: closeCell },
          ],
          list,
          "No client is connected.",
          "stack",
        ),
      );
      for (const id of closing) {
        const input = document.querySelector(`form[data-close-form="${CSS.escape(id)}"] input`);
        if (input) input.focus();
      }
    };
  }

  function viewUsers(main, alive) {
    const body = h("div", { id: "user-table" }, h("p", { class: "muted" }, "Loading…"));
    add(main, [h("h1", {}, "Users"), body]);
    return async () => {
      let data;
      try {
        if (!(await apiHas("/api/users"))) throw new ApiError(404, "no /api/users");
        data = await get("/api/users");
      } catch (err) {
        if (!alive()) return;
        if (err.status === 404 || err.status === 405) {
          fill(body, h("p", { class: "muted", id: "users-missing" }, "This broker has no users endpoint (/api/users). Users are managed with `vibemq-server users`."));
          poller.task = null; // nothing to poll
          return;
        }
        if (err.status === 403) {
          fill(body, h("p", { class: "muted" }, "Your user may not list users."));
          poller.task = null;
          return;
        }
        throw err;
      }
      if (!alive()) return;
      let users = Array.isArray(data) ? data : (data && (data.items || data.users)) || null;
      if (!users && data && typeof data === "object") {
        users = Object.entries(data).map(([name, u]) => ({ name, ...u })); // keyed by name
      }
      users = users || [];
      const keys = [];
      for (const u of users) for (const k of Object.keys(u)) if (!keys.includes(k)) keys.push(k);
      // tags as a list, permissions as "configure: .* · write: .* · read: .*"
      const show = (v) =>
        Array.isArray(v)
          ? v.join(", ") || "–"
          : v && typeof v === "object"
            ? Object.entries(v).map(([k, x]) => `${k}: ${typeof x === "object" ? JSON.stringify(x) : x}`).join(" · ")
            : v ?? "–";
      const title = (k) => k.charAt(0).toUpperCase() + k.slice(1);
      fill(body, table(keys.map((k) => ({ title: title(k), cell: (u) => show(u[k]) })), users, "No users.", "stack"));
    };
  }

  // -- routing ------------------------------------------------------------------------------

  const VIEWS = {
    "": ["overview", viewOverview],
    queues: ["queues", viewQueues],
    "dead-letters": ["dead-letters", viewDeadLetters],
    publish: ["publish", viewPublish],
    connections: ["connections", viewConnections],
    users: ["users", viewUsers],
  };

  function route() {
    const hash = location.hash.replace(/^#\/?/, "");
    const [head, ...rest] = hash.split("/");
    const arg = rest.length ? decodeURIComponent(rest.join("/")) : null;
    let [navKey, view] = VIEWS[head] || VIEWS[""];
    if (head === "queues" && arg) view = viewQueue;
    generation++;
    const mine = generation;
    for (const dispose of disposers) dispose();
    disposers = [];
    for (const a of document.querySelectorAll("#nav a")) {
      a.classList.toggle("active", a.dataset.view === navKey);
      if (a.dataset.view === navKey) a.setAttribute("aria-current", "page");
      else a.removeAttribute("aria-current");
    }
    const main = clear($("main"));
    const task = view(main, () => mine === generation, arg);
    poller.set(task);
    if (!task) setLive("ok");
  }

  window.addEventListener("hashchange", route);
  showSession();
  route();
})();

/* mqtthub live metrics: one websocket per page, numbers and uPlot charts.
 *
 * The page's root element <div data-live ...> names the socket (data-ws),
 * the scope ("cluster", "node" with data-node, or "tenant") and holds:
 *   [data-bind="totals.connections"][data-fmt="count|rate|bytes|bytesrate|pct|ms|duration|mem"]
 *   [data-chart="connections|messages|bytes|drops"]   live charts (last 5 minutes)
 *   [data-status]                                      live / reconnecting… / brokerd unreachable
 *   [data-nodes] tbody, [data-tenants] tbody, [data-alarms] list (re-rendered on every update)
 * History charts live in [data-history] fragments (swapped by htmx), their
 * data in a <script type="application/json"> (json_script) inside them.
 * Without JavaScript the pages still show the alarms and links.
 */
(function () {
  "use strict";

  // ------------------------------------------------------------ formatting

  function num(v, digits) {
    return Number(v).toLocaleString("en-US", { maximumFractionDigits: digits, minimumFractionDigits: 0 });
  }
  function short(v) {
    v = Number(v) || 0;
    var a = Math.abs(v);
    if (a >= 1e9) return num(v / 1e9, 2) + "G";
    if (a >= 1e6) return num(v / 1e6, 2) + "M";
    if (a >= 1e4) return num(v / 1e3, 1) + "k";
    if (a >= 100 || v === Math.round(v)) return num(v, 0);
    if (a >= 10) return num(v, 1);
    return num(v, 2);
  }
  function bytes(v) {
    v = Number(v) || 0;
    var units = ["B", "KiB", "MiB", "GiB", "TiB"], i = 0;
    while (Math.abs(v) >= 1024 && i < units.length - 1) { v /= 1024; i++; }
    return (i === 0 ? num(v, 0) : num(v, v >= 100 ? 0 : 1)) + " " + units[i];
  }
  function duration(s) {
    s = Math.floor(Number(s) || 0);
    var d = Math.floor(s / 86400), h = Math.floor(s % 86400 / 3600), m = Math.floor(s % 3600 / 60);
    if (d) return d + "d " + h + "h";
    if (h) return h + "h " + m + "m";
    if (m) return m + "m " + (s % 60) + "s";
    return (s % 60) + "s";
  }
  var FORMATS = {
    count: function (v) { return num(v, 0); },
    rate: function (v) { return short(v) + "/s"; },
    bytes: bytes,
    bytesrate: function (v) { return bytes(v) + "/s"; },
    pct: function (v) { return num(v, v < 10 ? 1 : 0) + "%"; },
    ms: function (v) {
      v = Number(v) * 1000;
      return (v < 1 ? num(v, 2) : v < 10 ? num(v, 1) : num(v, 0)) + " ms";
    },
    duration: duration,
    mem: bytes,
    text: function (v) { return String(v); }
  };
  function format(kind, v) {
    if (v === null || v === undefined || v === "" || (typeof v === "number" && isNaN(v))) return "—";
    return (FORMATS[kind] || FORMATS.count)(v);
  }
  function pick(obj, path) {
    var parts = path.split(".");
    for (var i = 0; i < parts.length; i++) {
      if (obj === null || obj === undefined) return undefined;
      obj = obj[parts[i]];
    }
    return obj;
  }
  function esc(s) {
    return String(s).replace(/[&<>"']/g, function (c) {
      return { "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;" }[c];
    });
  }
  function ago(t) {
    var s = Math.max(0, Date.now() / 1000 - t);
    if (s < 60) return "just now";
    if (s < 3600) return Math.floor(s / 60) + " min ago";
    if (s < 86400) return Math.floor(s / 3600) + " h ago";
    return Math.floor(s / 86400) + " d ago";
  }

  // ------------------------------------------------------------ charts

  var COLORS = { a: "#4f46e5", b: "#06b6d4", c: "#f59e0b", d: "#dc2626" };
  // chart kind -> series: [label, index in a live point, colour, format]
  var CHARTS = {
    connections: [["connections", 1, COLORS.a, "count"]],
    messages: [["in", 2, COLORS.a, "rate"], ["out", 3, COLORS.b, "rate"]],
    bytes: [["in", 4, COLORS.a, "bytesrate"], ["out", 5, COLORS.b, "bytesrate"]],
    drops: [["dropped", 6, COLORS.d, "rate"]]
  };
  // history JSON keys of the same charts
  var HISTORY = {
    connections: ["connections"], messages: ["msgs_in", "msgs_out"], bytes: ["bytes_in", "bytes_out"],
    drops: ["drops"]
  };

  function axisValues(fmt) {
    return function (u, splits) {
      return splits.map(function (v) {
        // a fraction of a byte is no label ("0 B, 1 B, 1 B" on an empty chart)
        if (fmt === "bytesrate") return v === Math.round(v) ? bytes(v) : "";
        if (fmt === "count") return v === Math.round(v) ? short(v) : "";
        return short(v);
      });
    };
  }

  function pad(n) { return (n < 10 ? "0" : "") + n; }
  var MONTHS = ["Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec"];
  // x-axis labels: seconds on the live charts, minutes or days on the history charts
  function timeLabels(step) {
    return function (u, splits) {
      return splits.map(function (t) {
        var d = new Date(t * 1000);
        if (!step) return pad(d.getHours()) + ":" + pad(d.getMinutes()) + ":" + pad(d.getSeconds());
        if (step >= 3600 && d.getHours() === 0) return MONTHS[d.getMonth()] + " " + d.getDate();
        return pad(d.getHours()) + ":" + pad(d.getMinutes());
      });
    };
  }
  function when(t) {
    if (t === null || t === undefined) return "";
    var d = new Date(t * 1000);
    return MONTHS[d.getMonth()] + " " + d.getDate() + ", " + pad(d.getHours()) + ":" + pad(d.getMinutes()) + ":" + pad(d.getSeconds());
  }

  function isolated(u, seriesIdx) {
    var ys = u.data[seriesIdx], out = [];
    for (var i = 0; i < ys.length; i++) {
      if (ys[i] !== null && ys[i] !== undefined && (i === 0 || ys[i - 1] === null) && (i === ys.length - 1 || ys[i + 1] === null)) out.push(i);
    }
    return out;
  }

  // the legend shows the latest values when the pointer is not over the chart (it read "—" until hovered)
  function showLatest(u) {
    if (u.cursor.idx !== null && u.cursor.idx !== undefined) return;
    var xs = u.data[0];
    for (var i = (xs ? xs.length : 0) - 1; i >= 0; i--) {
      for (var s = 1; s < u.data.length; s++) {
        if (u.data[s][i] !== null && u.data[s][i] !== undefined) { u.setLegend({ idx: i }, false); return; }
      }
    }
  }

  function makeChart(el, kind, data, opts) {
    opts = opts || {};
    var defs = CHARTS[kind];
    var width = Math.max(200, el.clientWidth || el.parentNode.clientWidth || 400);
    var series = [{ label: "at", value: function (u, v) { return when(v); } }];
    defs.forEach(function (d, i) {
      series.push({
        label: d[0], stroke: d[2], width: i ? 1.5 : 1.75, dash: i ? [5, 3] : undefined,
        fill: i ? undefined : d[2] + "1a", spanGaps: false,
        // live: lines only; history: a dot where a point stands alone between gaps
        points: opts.step ? { show: true, size: 5, fill: d[2], filter: isolated } : { show: false },
        value: function (u, v) { return format(d[3], v); }
      });
    });
    var axisFont = "11px system-ui, -apple-system, 'Segoe UI', sans-serif";
    var u = new uPlot({
      width: width, height: opts.height || 170,
      padding: [10, 28, 0, 0],           // room for half of the last x label
      cursor: { points: { size: 6 }, drag: { x: false, y: false } },
      legend: { show: true, live: true },
      scales: {
        // live charts show a fixed window (the last 5 minutes), filling from the right
        x: opts.window ? { time: true, range: function (u, min, max) { return [max - opts.window, max]; } } : { time: true },
        y: { range: function (u, min, max) { return [0, Math.max((max || 0) * 1.15, defs[0][3] === "count" ? 2 : 1)]; } }
      },
      axes: [
        { stroke: "#64748b", grid: { stroke: "#eef2f7", width: 1 }, ticks: { stroke: "#e2e8f0", width: 1, size: 4 },
          font: axisFont, space: opts.step ? 60 : 70, values: timeLabels(opts.step) },
        { stroke: "#64748b", grid: { stroke: "#eef2f7", width: 1 }, ticks: { show: false }, size: 60, font: axisFont,
          space: 28, values: axisValues(defs[0][3]) }
      ],
      series: series,
      hooks: { setData: [showLatest], setCursor: [showLatest] }
    }, data, el);
    showLatest(u);
    el._uplot = u;
    return u;
  }

  function resizeAll(root) {
    (root || document).querySelectorAll("[data-chart], [data-history-chart]").forEach(function (el) {
      if (el._uplot) el._uplot.setSize({ width: Math.max(200, el.clientWidth), height: el._uplot.height });
    });
  }
  var resizeTimer = null;
  window.addEventListener("resize", function () {
    clearTimeout(resizeTimer);
    resizeTimer = setTimeout(function () { resizeAll(); }, 150);
  });

  // ------------------------------------------------------------ live page

  function LivePage(root) {
    this.root = root;
    this.scope = root.getAttribute("data-scope");
    this.node = root.getAttribute("data-node");
    this.wsPath = root.getAttribute("data-ws");
    this.points = [];
    this.maxPoints = 300;
    this.window = 300;                     // seconds shown by the live charts
    this.charts = {};
    this.retry = 0;
    this.resigned = 0;                     // sockets opened again after a 4401, no hello yet
    this.lastUpdate = 0;
    this.connect();
    var self = this;
    setInterval(function () { self.watchdog(); }, 1000);
  }

  LivePage.prototype.status = function (state, text) {
    document.querySelectorAll("[data-status]").forEach(function (el) {
      el.className = "live-status live-" + state;
      el.querySelector(".live-text").textContent = text;
    });
    this.root.classList.toggle("is-stale", state !== "live");
  };

  LivePage.prototype.connect = function () {
    var self = this;
    var url = (location.protocol === "https:" ? "wss://" : "ws://") + location.host + this.wsPath +
      (this.node ? "?node=" + encodeURIComponent(this.node) : "");
    this.status("connecting", this.retry ? "reconnecting…" : "connecting…");
    var ws;
    try { ws = new WebSocket(url); } catch (e) { this.reconnect(); return; }
    this.ws = ws;
    var opened = false;
    ws.onopen = function () { opened = true; self.retry = 0; };
    ws.onmessage = function (ev) {
      var msg;
      try { msg = JSON.parse(ev.data); } catch (e) { return; }
      if (msg.type === "hello") { self.resigned = 0; self.hello(msg); }
      else if (msg.type === "update") self.update(msg);
    };
    ws.onclose = function (ev) {
      // 4401: the session the socket was opened with is gone -- signed out, or given a new key: Django
      // keeps a user who changed their password (here or in another tab) signed in under a new one, its
      // cookie coming with the answer to the change, which may arrive after the socket was closed. A few
      // sockets with the browser's cookie of then (1, 2, 3 s later): one opened, the page is live again;
      // all refused at the handshake, it was signed out
      if (ev.code === 4401 || (self.resigned && !opened)) {
        if (self.resigned < 3) {
          self.resigned += 1;
          self.status("connecting", "checking the session…");
          setTimeout(function () { self.connect(); }, 1000 * self.resigned);
          return;
        }
        self.status("down", "signed out — reload");
        return;
      }
      if (ev.code === 4403) {
        self.status("down", "not allowed");
        return;
      }
      self.reconnect();
    };
    ws.onerror = function () { /* onclose follows */ };
  };

  LivePage.prototype.reconnect = function () {
    var self = this;
    this.retry += 1;
    var delay = Math.min(10000, 500 * Math.pow(2, Math.min(this.retry, 5)));
    this.status("reconnecting", "reconnecting…");
    setTimeout(function () { self.connect(); }, delay);
  };

  LivePage.prototype.watchdog = function () {
    // no update for a while on an open socket: say so (the hub or brokerd is slow)
    if (this.lastUpdate && Date.now() - this.lastUpdate > 5000 && this.ws && this.ws.readyState === 1) {
      this.status("reconnecting", "waiting for data…");
    }
  };

  LivePage.prototype.hello = function (msg) {
    this.window = Math.max(60, this.maxPoints * (msg.interval || 1));
    var series = this.scope === "node" ? (msg.node_series || []) : (msg.series || []);
    this.points = series.slice(-this.maxPoints);
    this.redrawCharts();
    if (msg.latest) this.update(msg.latest, true);
    else this.status("connecting", "waiting for data…");
  };

  LivePage.prototype.subject = function (msg) {
    if (this.scope !== "node") return msg;
    var node = this.node;
    return (msg.nodes || []).filter(function (n) { return n.node === node; })[0] || { node: node, health: "missing" };
  };

  LivePage.prototype.update = function (msg, fromHello) {
    this.lastUpdate = Date.now();
    if (msg.state === "unreachable") {
      this.status("down", "brokerd unreachable");
      this.renderAlarms(msg.alarms || []);
      return;
    }
    var subject = this.subject(msg);
    if (this.scope === "node" && !subject.totals) {
      this.status("down", "node " + subject.health);
    } else {
      this.status("live", "live");
    }
    // numbers
    this.root.querySelectorAll("[data-bind]").forEach(function (el) {
      var v = pick(subject, el.getAttribute("data-bind"));
      var text = format(el.getAttribute("data-fmt") || "count", v);
      if (el.textContent !== text) {
        el.textContent = text;
        el.classList.remove("tick");
        void el.offsetWidth;
        el.classList.add("tick");
      }
    });
    this.root.querySelectorAll("[data-progress]").forEach(function (el) {
      var parts = el.getAttribute("data-progress").split("/");
      var used = Number(pick(subject, parts[0])) || 0, limit = Number(pick(subject, parts[1]));
      var bar = el.querySelector("span");
      if (!limit) { el.hidden = true; return; }
      el.hidden = false;
      var pct = Math.min(100, 100 * used / limit);
      bar.style.width = pct + "%";
      el.classList.toggle("high", pct >= 90);
      el.title = Math.round(pct) + "%";
    });
    document.querySelectorAll("[data-health]").forEach(function (el) {
      var h = subject.health || "ok";
      el.className = "badge " + (h === "ok" ? "badge-green" : h === "fenced" ? "badge-amber" : "badge-red");
      el.textContent = h;
    });
    // charts
    var point = subject.point;
    if (point && !fromHello) {
      var last = this.points[this.points.length - 1];
      if (!last || last[0] < point[0]) {
        this.points.push(point);
        if (this.points.length > this.maxPoints) this.points.shift();
      }
      this.redrawCharts();
    } else if (point && fromHello && !this.points.length) {
      this.points.push(point);
      this.redrawCharts();
    }
    if (this.scope === "cluster") {
      this.renderNodes(msg.nodes || []);
      this.renderTenants(msg.tenants || [], msg.tenants_total || 0);
    }
    this.renderAlarms(msg.alarms || []);
    var at = document.querySelector("[data-updated]");
    if (at && msg.at) at.textContent = new Date(msg.at * 1000).toLocaleTimeString();
  };

  LivePage.prototype.redrawCharts = function () {
    var self = this;
    this.root.querySelectorAll("[data-chart]").forEach(function (el) {
      var kind = el.getAttribute("data-chart");
      var defs = CHARTS[kind];
      var data = [self.points.map(function (p) { return p[0]; })];
      defs.forEach(function (d) { data.push(self.points.map(function (p) { return p[d[1]]; })); });
      if (el._uplot) el._uplot.setData(data);
      else makeChart(el, kind, data, { window: self.window });
    });
  };

  function healthBadge(h) {
    var cls = h === "ok" ? "badge-green" : h === "fenced" ? "badge-amber" : "badge-red";
    return '<span class="badge ' + cls + '">' + esc(h) + "</span>";
  }

  LivePage.prototype.renderNodes = function (nodes) {
    var tbody = this.root.querySelector("[data-nodes]");
    if (!tbody) return;
    var base = tbody.getAttribute("data-node-url");
    if (!nodes.length) {
      tbody.innerHTML = '<tr><td colspan="11" class="muted">No node reported.</td></tr>';
      return;
    }
    // the workers of a host (brokerd --workers N) under a row of their host
    var workers = {};
    nodes.forEach(function (n) { if (n.worker !== null && n.worker !== undefined) workers[n.host] = (workers[n.host] || 0) + 1; });
    nodes = nodes.slice().sort(function (a, b) {
      var ha = a.host || a.node, hb = b.host || b.node;
      return ha < hb ? -1 : ha > hb ? 1 : (Number(a.worker) || 0) - (Number(b.worker) || 0);
    });
    var seen = {};
    tbody.innerHTML = nodes.map(function (n) {
      var head = "";
      if (workers[n.host] && !seen[n.host]) {
        seen[n.host] = true;
        head = '<tr class="host-row" data-host="' + esc(n.host) + '"><td colspan="11"><span class="strong">' + esc(n.host) +
          '</span> <span class="muted">· host, ' + workers[n.host] + " worker" + (workers[n.host] === 1 ? "" : "s") + "</span></td></tr>";
      }
      var label = workers[n.host] ? "worker " + esc(String(n.worker)) + ' <span class="muted">' + esc(n.node) + "</span>" : esc(n.node);
      var link = (workers[n.host] ? '<span class="indent"></span>' : "") + '<a class="strong" href="' + esc(base.replace("__node__", encodeURIComponent(n.node))) + '">' + label + "</a>";
      if (!n.totals) {
        return head + "<tr><td>" + link + "</td><td>" + healthBadge(n.health) + '</td><td colspan="9" class="muted">no figures (the node does not answer)</td></tr>';
      }
      var lag = Number(n.loop_lag) || 0;
      return head + "<tr><td>" + link + "</td><td>" + healthBadge(n.health) + "</td>" +
        '<td class="nowrap">' + format("duration", n.uptime) + "</td>" +
        '<td class="num">' + format("count", n.totals.connections) + "</td>" +
        '<td class="num">' + format("rate", n.rates.msgs_in) + "</td>" +
        '<td class="num">' + format("rate", n.rates.msgs_out) + "</td>" +
        '<td class="num' + (lag > 0.1 ? " warn" : "") + '">' + format("ms", n.loop_lag) + "</td>" +
        '<td class="num">' + format("pct", n.cpu) + "</td>" +
        '<td class="num">' + format("mem", n.memory_rss) + "</td>" +
        '<td class="num">' + format("ms", n.p50) + "</td>" +
        '<td class="num">' + format("ms", n.p99) + "</td></tr>";
    }).join("");
  };

  LivePage.prototype.renderTenants = function (tenants, total) {
    var tbody = this.root.querySelector("[data-tenants]");
    if (!tbody) return;
    var base = tbody.getAttribute("data-tenant-url");
    var foot = this.root.querySelector("[data-tenants-total]");
    if (foot) foot.textContent = total > tenants.length ? "The " + tenants.length + " busiest of " + total + " tenants." : total + " tenant" + (total === 1 ? "" : "s") + " with traffic or connections.";
    if (!tenants.length) {
      tbody.innerHTML = '<tr><td colspan="6" class="muted">No tenant has connected yet.</td></tr>';
      return;
    }
    tbody.innerHTML = tenants.map(function (t) {
      var quota = t.max_connections;
      var bar = '<span class="muted">no limit</span>';
      if (quota) {
        var pct = Math.min(100, 100 * t.connections / quota);
        bar = '<div class="progress' + (pct >= 90 ? " high" : "") + '" title="' + Math.round(pct) + '% of ' + quota + '"><span style="width:' + pct + '%"></span></div>';
      }
      var anonymous = t.anonymous ? ' <span class="badge badge-blue" title="Clients that connect without a user name land in this tenant">anonymous clients</span>' : "";
      return '<tr><td><a class="strong" href="' + esc(base.replace("__slug__", encodeURIComponent(t.slug))) + '">' + esc(t.slug) + "</a>" + anonymous + "</td>" +
        '<td class="num">' + format("count", t.connections) + (quota ? ' <span class="muted">/ ' + format("count", quota) + "</span>" : "") + "</td>" +
        "<td>" + bar + "</td>" +
        '<td class="num">' + format("rate", t.rates.msgs_in) + "</td>" +
        '<td class="num">' + format("rate", t.rates.msgs_out) + "</td>" +
        '<td class="num' + (t.rates.drops > 0 ? " warn" : "") + '">' + format("rate", t.rates.drops) + "</td></tr>";
    }).join("");
  };

  LivePage.prototype.renderAlarms = function (alarms) {
    this.root.querySelectorAll("[data-alarms]").forEach(function (box) {
      var kindFilter = box.getAttribute("data-alarm-kind");
      var subject = box.getAttribute("data-alarm-subject");
      var list = alarms.filter(function (a) {
        return (!kindFilter || a.kind === kindFilter) && (!subject || a.subject === subject);
      });
      var key = JSON.stringify(list.map(function (a) { return a.id; }));
      if (box._key === key) return;
      box._key = key;
      var ul = box.querySelector("[data-alarm-list]");
      var empty = box.querySelector("[data-alarm-empty]");
      box.classList.toggle("has-alarms", list.length > 0);
      if (empty) empty.hidden = list.length > 0;
      ul.innerHTML = list.map(function (a) {
        return '<li class="alarm alarm-' + esc(a.kind) + '"><span class="alarm-icon">!</span><div><div class="alarm-msg">' + esc(a.message) +
          '</div><div class="alarm-meta">' + esc(a.kind_label) + " · raised " + ago(a.raised_at) + "</div></div></li>";
      }).join("");
      var count = box.querySelector("[data-alarm-count]");
      if (count) {
        count.textContent = list.length;
        count.className = "badge plain " + (list.length ? "badge-red" : "badge-gray");
      }
    });
  };

  // ------------------------------------------------------------ history (htmx fragments)

  function drawHistory() {
    document.querySelectorAll("[data-history]").forEach(function (box) {
      var script = box.querySelector('script[type="application/json"]');
      if (!script || box._drawn) return;
      box._drawn = true;
      var data;
      try { data = JSON.parse(script.textContent); } catch (e) { return; }
      box.querySelectorAll("[data-history-chart]").forEach(function (el) {
        var kind = el.getAttribute("data-history-chart");
        var rows = [data.t];
        HISTORY[kind].forEach(function (k) { rows.push(data[k]); });
        if (el._uplot) { el._uplot.destroy(); el._uplot = null; }
        el.innerHTML = "";
        makeChart(el, kind, rows, { height: 150, step: data.step });
      });
    });
  }

  document.addEventListener("DOMContentLoaded", function () {
    document.querySelectorAll("[data-live]").forEach(function (root) { root._live = new LivePage(root); });
    drawHistory();
  });
  // a range tab swapped the fragment (outerHTML: the event's target is the old one)
  document.addEventListener("htmx:afterSettle", function () { drawHistory(); });
})();

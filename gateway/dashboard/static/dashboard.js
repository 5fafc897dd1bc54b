/* Pointsman dashboard: vanilla JS and hand-drawn SVG charts (no library, nothing from another origin).
 *
 * Reads GET /dashboard/api/summary?window=<s> every 5 s. When the gateway has keys configured the API
 * needs an admin key: the login form keeps it in this tab's sessionStorage and sends it as
 * "Authorization: Bearer"; it never goes into a URL.
 */
(function () {
  "use strict";

  var KEY_STORAGE = "pointsman.adminKey";
  var REFRESH_MS = 5000;
  var PALETTE = ["#2f6fdf", "#f08c2e", "#1f9d55", "#8e5bd6", "#d64545", "#17a2b8", "#b58900", "#e05fa3",
    "#5c6f91", "#7cb342"];
  var SVG = "http://www.w3.org/2000/svg";
  var state = { data: null, timer: null, mixBy: "models", colors: {}, inFlight: false };

  function $(id) { return document.getElementById(id); }

  function el(tag, attrs, text) {
    var node = document.createElement(tag);
    if (attrs) { for (var k in attrs) { if (attrs[k] !== undefined && attrs[k] !== null) { node.setAttribute(k, attrs[k]); } } }
    if (text !== undefined && text !== null) { node.textContent = String(text); }
    return node;
  }

  function svg(tag, attrs) {
    var node = document.createElementNS(SVG, tag);
    for (var k in attrs) { node.setAttribute(k, attrs[k]); }
    return node;
  }

  function clear(node) { while (node.firstChild) { node.removeChild(node.firstChild); } }

  // --- formatting -------------------------------------------------------------------------------------

  function fmtInt(n) { return n === null || n === undefined ? "–" : Math.round(n).toLocaleString("en-US"); }

  function fmtUsd(v) {
    if (v === null || v === undefined || isNaN(v)) { return "–"; }
    if (v === 0) { return "$0"; }
    var a = Math.abs(v);
    if (a >= 100) { return "$" + v.toFixed(0); }
    if (a >= 1) { return "$" + v.toFixed(2); }
    if (a >= 0.01) { return "$" + v.toFixed(4); }
    var digits = Math.min(12, 2 - Math.floor(Math.log10(a)));
    return "$" + v.toFixed(digits);
  }

  function fmtUsdAxis(max) {
    // One number of decimals for every tick of an axis that goes up to about ``max``.
    var top = niceMax(max);
    var digits = top >= 100 ? 0 : Math.max(2, 2 - Math.floor(Math.log10(top / 4)));
    return function (v) { return v === 0 ? "$0" : "$" + v.toFixed(Math.min(digits, 10)); };
  }

  function fmtMs(v) {
    if (v === null || v === undefined) { return "–"; }
    if (v >= 10000) { return (v / 1000).toFixed(1) + " s"; }
    if (v >= 1000) { return (v / 1000).toFixed(2) + " s"; }
    if (v >= 10) { return v.toFixed(0) + " ms"; }
    return v.toFixed(1) + " ms";
  }

  function fmtPct(v, digits) {
    if (v === null || v === undefined) { return "–"; }
    return (v * 100).toFixed(digits === undefined ? 1 : digits) + "%";
  }

  function fmtTime(t, withSeconds) {
    var d = new Date(t * 1000);
    var hh = String(d.getHours()).padStart(2, "0"), mm = String(d.getMinutes()).padStart(2, "0");
    var s = hh + ":" + mm;
    return withSeconds ? s + ":" + String(d.getSeconds()).padStart(2, "0") : s;
  }

  function fmtAxisTime(t, span) {
    var d = new Date(t * 1000);
    if (span > 2 * 86400) { return (d.getMonth() + 1) + "/" + d.getDate() + " " + fmtTime(t); }
    return fmtTime(t, span <= 600);
  }

  function colorFor(name) {
    if (!(name in state.colors)) {
      var used = Object.keys(state.colors).length;
      state.colors[name] = PALETTE[used % PALETTE.length];
    }
    return state.colors[name];
  }

  // --- charts -----------------------------------------------------------------------------------------

  function niceMax(v) {
    if (!(v > 0)) { return 1; }
    var p = Math.pow(10, Math.floor(Math.log10(v)));
    var steps = [1, 2, 2.5, 5, 10];
    for (var i = 0; i < steps.length; i++) { if (steps[i] * p >= v) { return steps[i] * p; } }
    return 10 * p;
  }

  function frame(container, t, yMax, yFmt) {
    clear(container);
    var w = Math.max(container.clientWidth, 200), h = Math.max(container.clientHeight, 120);
    var m = { l: 64, r: 12, t: 8, b: 22 };
    var root = svg("svg", { viewBox: "0 0 " + w + " " + h, preserveAspectRatio: "none", role: "img" });
    var axis = svg("g", { "class": "axis" });
    root.appendChild(axis);
    var iw = w - m.l - m.r, ih = h - m.t - m.b;
    var n = t.length;
    var x = function (i) { return m.l + (n <= 1 ? iw / 2 : (i + 0.5) * iw / n); };
    var y = function (v) { return m.t + ih - (v / yMax) * ih; };
    for (var k = 0; k <= 4; k++) {
      var v = yMax * k / 4, yy = y(v);
      axis.appendChild(svg("line", { x1: m.l, x2: w - m.r, y1: yy, y2: yy, stroke: k === 0 ? "#cfd4dc" : "#eef0f3" }));
      var label = svg("text", { x: m.l - 6, y: yy + 4, "text-anchor": "end" });
      label.textContent = yFmt(v);
      axis.appendChild(label);
    }
    var span = n > 1 ? t[n - 1] - t[0] : 60;
    var ticks = Math.min(6, n);
    for (var j = 0; j < ticks; j++) {
      var idx = Math.round(j * (n - 1) / Math.max(1, ticks - 1));
      var anchor = ticks > 1 && j === 0 ? "start" : (ticks > 1 && j === ticks - 1 ? "end" : "middle");
      var tx = svg("text", { x: anchor === "start" ? m.l : (anchor === "end" ? w - m.r : x(idx)), y: h - 6, "text-anchor": anchor });
      tx.textContent = fmtAxisTime(t[idx], span);
      axis.appendChild(tx);
    }
    container.appendChild(root);
    return { root: root, x: x, y: y, iw: iw, ih: ih, m: m, w: w, h: h, n: n, slot: iw / Math.max(1, n) };
  }

  function empty(container, message) {
    clear(container);
    container.appendChild(el("div", { "class": "empty" }, message));
  }

  function hover(container, f, t, rowsAt) {
    var tip = $("tooltip");
    var overlay = svg("rect", { x: f.m.l, y: f.m.t, width: f.iw, height: f.ih, fill: "transparent" });
    var guide = svg("line", { y1: f.m.t, y2: f.m.t + f.ih, stroke: "#9aa3b2", "stroke-dasharray": "3 3", visibility: "hidden" });
    f.root.appendChild(guide);
    f.root.appendChild(overlay);
    overlay.addEventListener("mousemove", function (ev) {
      var box = f.root.getBoundingClientRect();
      var px = (ev.clientX - box.left) * (f.w / box.width);
      var i = Math.max(0, Math.min(f.n - 1, Math.floor((px - f.m.l) / f.slot)));
      guide.setAttribute("x1", f.x(i)); guide.setAttribute("x2", f.x(i)); guide.setAttribute("visibility", "visible");
      clear(tip);
      tip.appendChild(el("div", null, fmtTime(t[i], true)));
      rowsAt(i).forEach(function (r) {
        var row = el("div", { "class": "row" });
        var name = el("span", null, r[0]);
        row.appendChild(name); row.appendChild(el("b", null, r[1]));
        tip.appendChild(row);
      });
      tip.hidden = false;
      tip.style.left = (ev.clientX + 14) + "px";
      tip.style.top = (ev.clientY + 10) + "px";
    });
    overlay.addEventListener("mouseleave", function () { tip.hidden = true; guide.setAttribute("visibility", "hidden"); });
  }

  function niceCount(v) {
    // 4 grid steps of a whole, round size: 1, 2, 5, 10, 20, 25, 50, ...
    var need = Math.max(1, Math.ceil(v / 4)), p = 1;
    while (true) {
      var steps = p >= 10 ? [1, 2, 2.5, 5] : [1, 2, 5];
      for (var i = 0; i < steps.length; i++) { if (steps[i] * p >= need) { return 4 * steps[i] * p; } }
      p *= 10;
    }
  }

  function stackedBars(container, t, series, yFmt) {
    var totals = t.map(function (_, i) { return series.reduce(function (s, x) { return s + (x.values[i] || 0); }, 0); });
    var max = Math.max.apply(null, totals.concat([0]));
    if (max === 0) { empty(container, "No requests in this window yet."); return; }
    var f = frame(container, t, niceCount(max), yFmt);
    var bw = Math.max(1, f.slot * 0.78);
    for (var i = 0; i < t.length; i++) {
      var base = 0;
      series.forEach(function (s) {
        var v = s.values[i] || 0;
        if (v <= 0) { return; }
        var y0 = f.y(base), y1 = f.y(base + v);
        f.root.appendChild(svg("rect", { x: f.x(i) - bw / 2, y: y1, width: bw, height: Math.max(0.5, y0 - y1), fill: s.color }));
        base += v;
      });
    }
    hover(container, f, t, function (i) {
      return series.filter(function (s) { return s.values[i]; }).map(function (s) { return [s.name, yFmt(s.values[i])]; })
        .concat([["total", yFmt(totals[i])]]);
    });
  }

  function lines(container, t, series, yFmt, opts) {
    opts = opts || {};
    var all = [];
    series.forEach(function (s) { s.values.forEach(function (v) { if (v !== null && v !== undefined) { all.push(v); } }); });
    if (!all.length) { empty(container, opts.emptyMessage || "No data in this window yet."); return; }
    var f = frame(container, t, opts.yMax || niceMax(Math.max.apply(null, all)), opts.axisFmt || yFmt);
    series.forEach(function (s) {
      var d = "", area = "", pen = false, firstX = null, lastX = null;
      s.values.forEach(function (v, i) {
        if (v === null || v === undefined) { pen = false; return; }
        var px = f.x(i).toFixed(1), py = f.y(v).toFixed(1);
        d += (pen ? " L " : " M ") + px + " " + py;
        if (s.fill) { area += (firstX === null ? "M " + px + " " + f.y(0).toFixed(1) + " L " : " L ") + px + " " + py; if (firstX === null) { firstX = px; } lastX = px; }
        pen = true;
      });
      if (s.fill && firstX !== null) {
        f.root.appendChild(svg("path", { d: area + " L " + lastX + " " + f.y(0).toFixed(1) + " Z", fill: s.color, "fill-opacity": "0.12", stroke: "none" }));
      }
      var attrs = { d: d, fill: "none", stroke: s.color, "stroke-width": s.width || 2, "stroke-linejoin": "round" };
      if (s.dash) { attrs["stroke-dasharray"] = "6 4"; }
      f.root.appendChild(svg("path", attrs));
      s.values.forEach(function (v, i) {
        if (v !== null && v !== undefined && (t.length <= 30 || isolated(s.values, i))) {
          f.root.appendChild(svg("circle", { cx: f.x(i), cy: f.y(v), r: 2.5, fill: s.color }));
        }
      });
    });
    hover(container, f, t, function (i) {
      return series.map(function (s) { return [s.name, s.values[i] === null || s.values[i] === undefined ? "–" : yFmt(s.values[i])]; });
    });
  }

  function isolated(values, i) {
    var prev = i > 0 ? values[i - 1] : null, next = i < values.length - 1 ? values[i + 1] : null;
    return (prev === null || prev === undefined) && (next === null || next === undefined);
  }

  function legend(node, items) {
    clear(node);
    items.forEach(function (it) {
      var span = el("span");
      var sw = el("span", { "class": it.dash ? "dash" : "sw" });
      if (it.dash) { sw.style.borderColor = it.color; } else { sw.style.background = it.color; }
      span.appendChild(sw);
      span.appendChild(document.createTextNode(it.label));
      node.appendChild(span);
    });
  }

  function cumulative(values) {
    var s = 0;
    return values.map(function (v) { s += v || 0; return s; });
  }

  // --- panels -----------------------------------------------------------------------------------------

  function renderKpis(d) {
    var tot = d.totals;
    $("kpi-requests").textContent = fmtInt(tot.requests);
    $("kpi-requests-sub").textContent = "last " + windowLabel(d.window) + " · " + fmtInt(tot.prompt_tokens + tot.completion_tokens) + " tokens";
    $("kpi-errors").textContent = fmtInt(tot.errors) + (tot.requests ? " (" + fmtPct(tot.error_rate) + ")" : "");
    $("kpi-errors").className = "value" + (tot.errors ? " bad" : "");
    $("kpi-errors-sub").textContent = "5xx / broken streams · " + fmtInt(tot.rejected) + " rejected (4xx)";
    $("kpi-cost").textContent = fmtUsd(tot.cost_usd);
    var saved = tot.savings_share;
    $("kpi-cost-sub").textContent = "always-strong " + fmtUsd(tot.baseline_cost_usd) +
      (saved === null ? "" : " · saved " + fmtPct(saved));
    $("kpi-cost-sub").className = "sub" + (saved > 0 ? " good" : "");
    var p50 = fmtMs(tot.latency_p50_ms), p95 = fmtMs(tot.latency_p95_ms);
    if (/ ms$/.test(p50) && / ms$/.test(p95)) { p50 = p50.slice(0, -3); }  // "3.6 · 169 ms" fits the card
    $("kpi-latency").textContent = p50 + " · " + p95;
    $("kpi-latency-sub").textContent = "mean " + fmtMs(tot.latency_mean_ms) + " · p99 " + fmtMs(tot.latency_p99_ms);
    $("kpi-cache").textContent = tot.cache_lookups ? fmtPct(tot.cache_hit_rate) : "–";
    $("kpi-cache-sub").textContent = tot.cache_lookups
      ? fmtInt(tot.cache_hits) + " hits of " + fmtInt(tot.cache_lookups) + " lookups"
      : "no cache lookups recorded";
    var r = d.router;
    $("router-version").textContent = r ? r.version : "none";
    $("router-version").title = r ? r.directory : "";
    $("router-sub").textContent = r ? (r.reloads + " reload" + (r.reloads === 1 ? "" : "s") +
      (r.reload_failures ? " · " + r.reload_failures + " failed" : "") + " since start") : "no learned router in use";
  }

  function windowLabel(s) {
    if (s >= 86400) { return (s / 86400) + (s === 86400 ? " day" : " days"); }
    if (s >= 3600) { return (s / 3600) + (s === 3600 ? " hour" : " hours"); }
    return (s / 60) + " min";
  }

  function renderMix(d) {
    var src = d.series[state.mixBy];
    var names = Object.keys(src).sort(function (a, b) { return sum(src[b]) - sum(src[a]) || (a < b ? -1 : 1); });
    var series = names.map(function (n) { return { name: n, values: src[n], color: colorFor((state.mixBy === "models" ? "m:" : "r:") + n) }; });
    stackedBars($("chart-mix"), d.series.t, series, fmtInt);
    legend($("legend-mix"), series.map(function (s) {
      return { label: s.name + " · " + fmtInt(sum(s.values)) + " (" + fmtPct(sum(s.values) / Math.max(1, d.totals.requests), 0) + ")", color: s.color };
    }));
  }

  function sum(a) { return a.reduce(function (s, v) { return s + (v || 0); }, 0); }

  function renderCost(d) {
    var t = d.series.t;
    var actual = cumulative(d.series.cost_usd), base = cumulative(d.series.baseline_cost_usd);
    var any = d.totals.requests > 0;
    lines($("chart-cost"), t, any ? [
      { name: "always-strong", values: base, color: "#d64545", dash: true },
      { name: "actual", values: actual, color: "#1f9d55", fill: true }
    ] : [], fmtUsd, { emptyMessage: "No requests in this window yet.", axisFmt: fmtUsdAxis(Math.max(base[base.length - 1] || 0, actual[actual.length - 1] || 0)) });
    legend($("legend-cost"), [
      { label: "actual " + fmtUsd(d.totals.cost_usd), color: "#1f9d55" },
      { label: "always-strong " + fmtUsd(d.totals.baseline_cost_usd), color: "#d64545", dash: true }
    ]);
  }

  function renderLatency(d) {
    lines($("chart-latency"), d.series.t, [
      { name: "p95", values: d.series.latency_p95_ms, color: "#8e5bd6" },
      { name: "p50", values: d.series.latency_p50_ms, color: "#2f6fdf", fill: true }
    ], fmtMs, { emptyMessage: "No answered requests in this window yet." });
    legend($("legend-latency"), [
      { label: "p50 " + fmtMs(d.totals.latency_p50_ms), color: "#2f6fdf" },
      { label: "p95 " + fmtMs(d.totals.latency_p95_ms), color: "#8e5bd6" }
    ]);
  }

  function renderErrors(d) {
    var series = [
      { name: "errors (5xx, broken streams)", values: d.series.errors, color: "#d64545" },
      { name: "rejected (4xx)", values: d.series.rejected, color: "#f0b429" }
    ];
    if (!d.totals.errors && !d.totals.rejected) {
      empty($("chart-errors"), d.totals.requests ? "No errors in this window." : "No requests in this window yet.");
    } else {
      stackedBars($("chart-errors"), d.series.t, series, fmtInt);
    }
    legend($("legend-errors"), [
      { label: "errors " + fmtInt(d.totals.errors), color: "#d64545" },
      { label: "rejected " + fmtInt(d.totals.rejected), color: "#f0b429" }
    ]);
  }

  function renderCache(d) {
    lines($("chart-cache"), d.series.t, [{ name: "hit rate", values: d.series.cache_hit_rate, color: "#17a2b8", fill: true }],
      function (v) { return fmtPct(v, 0); },
      { yMax: 1, emptyMessage: "No cache lookups in this window (no route has the semantic cache on, or nothing was looked up)." });
    legend($("legend-cache"), d.totals.cache_lookups
      ? [{ label: "hit rate " + fmtPct(d.totals.cache_hit_rate) + " of " + fmtInt(d.totals.cache_lookups) + " lookups", color: "#17a2b8" }]
      : []);
  }

  function renderRoutes(d) {
    var body = $("routes-table").tBodies[0];
    clear(body);
    if (!d.routes.length) {
      var tr = el("tr"); var td = el("td", { colspan: 9, "class": "none" }, "No requests in this window yet.");
      tr.appendChild(td); body.appendChild(tr); return;
    }
    d.routes.forEach(function (r) {
      var tr = el("tr");
      tr.appendChild(el("td", null, r.route));
      tr.appendChild(el("td", { "class": "num" }, fmtInt(r.requests)));
      var mix = el("td");
      var bar = el("div", { "class": "mixbar" });
      var names = Object.keys(r.models).sort(function (a, b) { return r.models[b] - r.models[a]; });
      names.forEach(function (n) {
        var seg = el("span", { title: n + ": " + r.models[n] });
        seg.style.width = (100 * r.models[n] / r.requests) + "%";
        seg.style.background = colorFor("m:" + n);
        bar.appendChild(seg);
      });
      mix.appendChild(bar);
      mix.appendChild(el("div", { "class": "mixlabel" }, names.map(function (n) {
        return n + " " + fmtPct(r.models[n] / r.requests, 0);
      }).join(" · ")));
      tr.appendChild(mix);
      tr.appendChild(el("td", { "class": "num" + (r.errors ? " bad" : "") }, fmtInt(r.errors)));
      tr.appendChild(el("td", { "class": "num" + (r.rejected ? " warn" : "") }, fmtInt(r.rejected)));
      tr.appendChild(el("td", { "class": "num" }, fmtUsd(r.cost_usd)));
      tr.appendChild(el("td", { "class": "num" }, fmtUsd(r.baseline_cost_usd)));
      tr.appendChild(el("td", { "class": "mono" }, r.baseline_model || "(own cost)"));
      var share = r.baseline_cost_usd ? 1 - r.cost_usd / r.baseline_cost_usd : null;
      tr.appendChild(el("td", { "class": "num" + (share > 0 ? " good" : "") }, share === null ? "–" : fmtPct(share)));
      body.appendChild(tr);
    });
  }

  var STATUS_CLASS = { running: "run", paused: "off", scheduled: "warn", ended: "off" };

  function renderExperiments(d) {
    var box = $("experiments");
    clear(box);
    if (!d.experiments.length) { box.appendChild(el("div", { "class": "none" }, "No experiments registered.")); return; }
    d.experiments.forEach(function (x) {
      var card = el("div", { "class": "exp", "data-experiment": x.name });
      var head = el("div", { "class": "exp-head" });
      head.appendChild(el("span", { "class": "name" }, x.name));
      head.appendChild(el("span", { "class": "badge " + (STATUS_CLASS[x.status] || "off") }, x.status));
      head.appendChild(el("span", { "class": "muted small" }, "route " + x.route + " · assigned by " + (x.key || "?") +
        (x.description ? " · " + x.description : "")));
      card.appendChild(head);
      var table = el("table", { "class": "table" });
      var hr = el("tr");
      ["Arm", "Kind", "Share", "Served", "Errors", "Cost", "Mean cost", "State"].forEach(function (h, i) {
        hr.appendChild(el("th", { "class": i >= 2 && i <= 6 ? "num" : null }, h));
      });
      var thead = el("thead"); thead.appendChild(hr); table.appendChild(thead);
      var tb = el("tbody");
      x.arms.forEach(function (a) {
        var tr = el("tr");
        tr.appendChild(el("td", null, a.name + (a.control ? " (control)" : "")));
        tr.appendChild(el("td", { "class": "mono" }, (a.shadow ? "shadow " : "") + (a.kind || "") + (a.model ? " → " + a.model : "")));
        tr.appendChild(el("td", { "class": "num" }, a.shadow ? "–" : fmtPct(a.weight, 0)));
        tr.appendChild(el("td", { "class": "num" }, fmtInt(a.requests)));
        tr.appendChild(el("td", { "class": "num" + (a.errors ? " bad" : "") }, fmtInt(a.errors)));
        tr.appendChild(el("td", { "class": "num" }, fmtUsd(a.cost_usd)));
        tr.appendChild(el("td", { "class": "num" }, fmtUsd(a.mean_cost_usd)));
        var st = el("td");
        st.appendChild(a.stopped
          ? el("span", { "class": "badge err", title: "stopped " + new Date(a.stopped.at * 1000).toLocaleString() }, "stopped: " + a.stopped.reason)
          : el("span", { "class": "badge ok" }, a.shadow ? "shadowing" : "serving"));
        tr.appendChild(st);
        tb.appendChild(tr);
      });
      table.appendChild(tb);
      card.appendChild(table);
      box.appendChild(card);
    });
  }

  function signalChips(r) {
    var chips = [];
    Object.keys(r.signals || {}).forEach(function (name) {
      var v = r.signals[name], text;
      if (typeof v === "number") { text = name + " " + (Math.abs(v) < 10 ? v.toFixed(3) : v.toFixed(0)); }
      else if (Array.isArray(v)) { if (!v.length) { return; } text = name + ": " + v.join(", "); }
      else if (v && typeof v === "object") {
        var best = Object.keys(v).sort(function (a, b) { return v[b] - v[a]; })[0];
        text = name + ": " + (best === undefined ? "–" : best + " " + v[best]);
      } else if (v === true || v === false) { if (!v) { return; } text = name; }
      else if (v === null || v === "") { return; }
      else { text = name + ": " + v; }
      chips.push({ text: text, cls: "chip" });
    });
    (r.rules || []).forEach(function (rule) { chips.push({ text: "rule " + (typeof rule === "string" ? rule : JSON.stringify(rule)), cls: "chip rule" }); });
    if (r.cache_hit !== null && r.cache_hit !== undefined) { chips.push({ text: r.cache_hit ? "cache hit" : "cache miss", cls: r.cache_hit ? "chip hit" : "chip" }); }
    if (r.workflow) { chips.push({ text: "workflow " + r.workflow, cls: "chip" }); }
    if (r.shadow_of) { chips.push({ text: "shadow decision", cls: "chip rule" }); }
    return chips;
  }

  function renderRecent(d) {
    var body = $("recent-table").tBodies[0];
    clear(body);
    if (!d.recent.length) {
      var tr0 = el("tr"); tr0.appendChild(el("td", { colspan: 8, "class": "none" }, "No decisions recorded yet."));
      body.appendChild(tr0); return;
    }
    d.recent.forEach(function (r) {
      var tr = el("tr", { "data-request-id": r.request_id });
      tr.appendChild(el("td", { "class": "mono", title: r.request_id }, fmtTime(r.created_at, true)));
      tr.appendChild(el("td", null, r.route || "(direct)"));
      tr.appendChild(el("td", { "class": "mono" }, r.model || "–"));
      var ok = r.status >= 200 && r.status < 400 && r.outcome === "ok";
      var st = el("td");
      st.appendChild(el("span", { "class": "badge " + (ok ? "ok" : (r.status >= 400 && r.status < 500 ? "warn" : "err")),
        title: r.error_type || r.outcome }, r.status + (r.outcome !== "ok" ? " " + r.outcome : "")));
      tr.appendChild(st);
      tr.appendChild(el("td", { "class": "num" }, fmtMs(r.latency_ms)));
      tr.appendChild(el("td", { "class": "num" }, fmtUsd(r.cost_usd)));
      tr.appendChild(el("td", { "class": "mono" }, r.arm ? (r.experiment + "/" + r.arm) : ""));
      var why = el("td", { "class": "why" });
      why.appendChild(el("div", { "class": "reason" }, (r.policy ? "[" + r.policy + "] " : "") + (r.reason || "")));
      var chips = el("div", { "class": "chips" });
      signalChips(r).forEach(function (c) { chips.appendChild(el("span", { "class": c.cls }, c.text)); });
      if (chips.childNodes.length) { why.appendChild(chips); }
      tr.appendChild(why);
      body.appendChild(tr);
    });
  }

  function render() {
    var d = state.data;
    if (!d) { return; }
    renderKpis(d);
    renderMix(d);
    renderCost(d);
    renderLatency(d);
    renderErrors(d);
    renderCache(d);
    renderRoutes(d);
    renderExperiments(d);
    renderRecent(d);
    document.body.setAttribute("data-rendered", String(d.now));
  }

  // --- data and auth ----------------------------------------------------------------------------------

  function setStatus(text, isError) {
    var s = $("status");
    s.textContent = text;
    s.className = "status" + (isError ? " err" : "");
  }

  function showLogin(message) {
    $("main").hidden = true;
    $("login").hidden = false;
    $("logout").hidden = true;
    $("login-error").textContent = message || "";
    $("login-key").focus();
    setStatus("sign in", false);
  }

  function load() {
    if (state.inFlight) { return; }
    state.inFlight = true;
    var headers = { "Accept": "application/json" };
    var key = sessionStorage.getItem(KEY_STORAGE);
    if (key) { headers["Authorization"] = "Bearer " + key; }
    fetch("/dashboard/api/summary?window=" + encodeURIComponent($("window").value), { headers: headers, cache: "no-store", credentials: "omit" })
      .then(function (resp) {
        return resp.json().catch(function () { return {}; }).then(function (body) { return { resp: resp, body: body }; });
      })
      .then(function (r) {
        if (r.resp.status === 401 || r.resp.status === 403) {
          sessionStorage.removeItem(KEY_STORAGE);
          var msg = r.body && r.body.error ? r.body.error.message : "admin key required";
          showLogin(key ? msg : "");
          return;
        }
        if (!r.resp.ok) {
          setStatus("error " + r.resp.status + ": " + (r.body.error ? r.body.error.message : ""), true);
          return;
        }
        state.data = r.body;
        $("login").hidden = true;
        $("main").hidden = false;
        $("logout").hidden = !key;
        render();
        setStatus("updated " + fmtTime(r.body.now, true), false);
      })
      .catch(function (err) { setStatus("cannot reach the gateway (" + err.message + ")", true); })
      .then(function () { state.inFlight = false; });
  }

  function schedule() {
    if (state.timer) { clearInterval(state.timer); state.timer = null; }
    if ($("autorefresh").checked) { state.timer = setInterval(function () { if (!$("main").hidden) { load(); } }, REFRESH_MS); }
  }

  document.addEventListener("DOMContentLoaded", function () {
    $("login-form").addEventListener("submit", function (ev) {
      ev.preventDefault();
      var key = $("login-key").value.trim();
      if (!key) { return; }
      sessionStorage.setItem(KEY_STORAGE, key);
      $("login-key").value = "";
      $("login-error").textContent = "";
      load();
    });
    $("logout").addEventListener("click", function () {
      sessionStorage.removeItem(KEY_STORAGE);
      state.data = null;
      showLogin("");
    });
    $("window").addEventListener("change", load);
    $("autorefresh").addEventListener("change", schedule);
    Array.prototype.forEach.call(document.querySelectorAll("#mix-by button"), function (b) {
      b.addEventListener("click", function () {
        state.mixBy = b.getAttribute("data-by");
        Array.prototype.forEach.call(document.querySelectorAll("#mix-by button"), function (o) { o.className = o === b ? "on" : ""; });
        if (state.data) { renderMix(state.data); }
      });
    });
    var resizeTimer = null;
    window.addEventListener("resize", function () { clearTimeout(resizeTimer); resizeTimer = setTimeout(render, 150); });
    schedule();
    load();
  });
})();

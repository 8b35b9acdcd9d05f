/* bertscope explorer: vanilla JavaScript, no dependencies, nothing fetched.
 *
 * Reads the JSON in #bs-data (format "bertscope-explorer/1", written by bertscope.experiments.explorer) and
 * draws three views of the selected sentence on canvases: the head view, the model view and the query-key
 * view. Every string from the data reaches the page through textContent, an <option>'s text or a canvas'
 * fillText: never as markup.
 *
 * Data codes (see data.py): a map [layer, head, query, key] is uint8 in a zlib stream, stored key-major
 * [layer, head, key, query], value = lo + byte/255 * (hi - lo) with lo/hi per (layer, head); queries and keys are int8 [2, layer, head, n, d_head], value =
 * byte * scale with one scale per (q|k, layer, head, dimension).
 */
(function () {
  "use strict";

  var ROW = 16; // px per token in the head and query-key views (matches .bs-tok height)
  var HV_WIDTH = 200; // width of the head view's line canvas
  var THUMB = 64; // thumbnail resolution (bins per side, at most)
  var BUCKETS = 32; // opacity levels for line drawing (one path per level and head)
  var MIN_ALPHA_ALL = 1 / 64; // with every row drawn, fainter lines are skipped (invisible anyway)
  var DPR = Math.min(2, window.devicePixelRatio || 1);
  // Sentence pairs: which query -> key segments the head view draws ("AB": queries in A, keys in B).
  var SEG_FILTERS = [["all", "all tokens"], ["AB", "A \u2192 B"], ["BA", "B \u2192 A"], ["AA", "A \u2192 A"], ["BB", "B \u2192 B"]];

  function $(id) { return document.getElementById(id); }
  function el(tag, cls, text) {
    var e = document.createElement(tag);
    if (cls) e.className = cls;
    if (text !== undefined) e.textContent = text;
    return e;
  }
  function size(canvas, width, height) { // resize only when needed: a resize reallocates the backing store
    var w = Math.round(width * DPR), h = Math.round(height * DPR);
    if (canvas.width !== w || canvas.height !== h) { canvas.width = w; canvas.height = h; }
    canvas.style.width = width + "px";
    canvas.style.height = height + "px";
  }
  function fmt(v) { return (Math.abs(v) >= 100 ? v.toFixed(1) : v.toFixed(3)); }

  // ------------------------------------------------------------------------------------------ decoding
  function bytesFromBase64(s) {
    if (typeof Uint8Array.fromBase64 === "function") return Uint8Array.fromBase64(s);
    var bin = atob(s), out = new Uint8Array(bin.length);
    for (var i = 0; i < bin.length; i++) out[i] = bin.charCodeAt(i);
    return out;
  }
  function floats(s) {
    var b = bytesFromBase64(s), view = new DataView(b.buffer, b.byteOffset, b.byteLength);
    var out = new Float32Array(b.byteLength / 4);
    for (var i = 0; i < out.length; i++) out[i] = view.getFloat32(4 * i, true);
    return out;
  }
  function inflate(b64) {
    var stream = new Blob([bytesFromBase64(b64)]).stream().pipeThrough(new DecompressionStream("deflate"));
    return new Response(stream).arrayBuffer().then(function (buf) { return new Uint8Array(buf); });
  }
  function decodeMap(enc, layers, heads, n) {
    return inflate(enc.data).then(function (code) {
      if (code.length !== layers * heads * n * n) throw new Error("map has " + code.length + " values, expected " + layers * heads * n * n);
      return { layers: layers, heads: heads, n: n, code: code, lo: floats(enc.lo), hi: floats(enc.hi) };
    });
  }
  function mapValue(m, l, h, i, j) {
    var b = l * m.heads + h;
    return m.lo[b] + m.code[(b * m.n + j) * m.n + i] / 255 * (m.hi[b] - m.lo[b]); // stored key-major
  }
  function decodeQK(enc, layers, heads, n) {
    return inflate(enc.data).then(function (raw) {
      var scale = floats(enc.scale), d = raw.length / (2 * layers * heads * n);
      if (scale.length !== 2 * layers * heads * d || d !== Math.floor(d)) throw new Error("query/key data has the wrong size");
      return { code: new Int8Array(raw.buffer, raw.byteOffset, raw.length), scale: scale, layers: layers, heads: heads, n: n, d: d };
    });
  }
  function qkVector(qk, which, l, h, i) { // which: 0 = query, 1 = key; returns d_head floats
    var b = (which * qk.layers + l) * qk.heads + h, off = (b * qk.n + i) * qk.d;
    var v = new Float32Array(qk.d);
    for (var t = 0; t < qk.d; t++) v[t] = qk.code[off + t] * qk.scale[b * qk.d + t]; // one scale per dimension
    return v;
  }

  // ------------------------------------------------------------------------------------------ colours
  function hslToRgb(h, s, l) {
    var a = s * Math.min(l, 1 - l);
    function f(n) { var k = (n + h / 30) % 12; return Math.round(255 * (l - a * Math.max(-1, Math.min(k - 3, 9 - k, 1)))); }
    return [f(0), f(8), f(4)];
  }
  function headColour(h, heads) { return heads === 1 ? [31, 111, 235] : hslToRgb((360 * h) / heads, 0.75, 0.45); }
  function css(rgb) { return "rgb(" + rgb[0] + "," + rgb[1] + "," + rgb[2] + ")"; }

  // ------------------------------------------------------------------------------------------ state
  var payload, methods, state, cache = {}, ticket = 0;
  var api = { ready: false, readyMs: null, renders: { head: 0, model: 0, qk: 0 }, lastHeadDrawMs: null };
  window.bertscopeExplorer = api;

  function method() { for (var i = 0; i < methods.length; i++) if (methods[i].id === state.method) return methods[i]; return methods[0]; }
  function sentence() { return payload.sentences[state.sentence]; }
  function getMap(s, id) {
    var key = s + "/" + id;
    if (!cache[key]) {
      var m = methods.filter(function (x) { return x.id === id; })[0];
      cache[key] = decodeMap(payload.sentences[s].maps[id], m.layers, m.heads, payload.sentences[s].tokens.length);
    }
    return cache[key];
  }
  function getQK(s) {
    var key = s + "/qk", sent = payload.sentences[s];
    if (!sent.qk) return Promise.resolve(null);
    if (!cache[key]) cache[key] = decodeQK(sent.qk, sent.qk.layers, sent.qk.heads, sent.tokens.length);
    return cache[key];
  }
  var current = { map: null, qk: null, att: null }; // decoded data of the sentence on screen

  function activeRows() {
    if (state.selected.length) return state.selected.slice();
    if (state.hover !== null) return [state.hover];
    return null;
  }
  function segOk(i, j) { // does the segment filter let the line query i -> key j through?
    var segs = sentence().segments;
    if (!segs || state.seg === "all") return true;
    return segs[i] === (state.seg[0] === "A" ? 0 : 1) && segs[j] === (state.seg[1] === "A" ? 0 : 1);
  }
  function segmentMass() { // mean over the selected heads and the queries of one segment of their weight on the other
    var segs = sentence().segments, m = current.map;
    if (!segs || !m) return null;
    var out = { ab: 0, ba: 0 };
    [["ab", 0, 1], ["ba", 1, 0]].forEach(function (w) {
      var rows = [], total = 0;
      for (var i = 0; i < m.n; i++) if (segs[i] === w[1]) rows.push(i);
      if (!rows.length || !state.heads.length) return;
      state.heads.forEach(function (h) {
        var r = rowSums(rows, h);
        for (var j = 0; j < m.n; j++) if (segs[j] === w[2]) total += r[j];
      });
      out[w[0]] = total / (rows.length * state.heads.length);
    });
    return out;
  }
  function updateSegments() {
    var segs = sentence().segments, box = $("bs-seg-summary"), root = $("bs-headview");
    var mass = segmentMass();
    root.dataset.seg = segs ? state.seg : "";
    if (!mass) { box.hidden = true; delete root.dataset.segAb; delete root.dataset.segBa; return; }
    root.dataset.segAb = mass.ab.toFixed(5);
    root.dataset.segBa = mass.ba.toFixed(5);
    var nA = segs.filter(function (x) { return x === 0; }).length;
    box.hidden = false;
    box.textContent = "Sentence pair: segment A is " + nA + " tokens, B " + (segs.length - nA) + " (marked blue / orange). " +
      method().label + ", layer " + state.layer + ", mean over " + state.heads.length + " head(s): a token of A puts " +
      fmt(mass.ab) + " on B; a token of B puts " + fmt(mass.ba) + " on A.";
  }
  function tokenLabel(i) { return "'" + sentence().tokens[i] + "'"; }
  function setHover(text) { $("bs-hover").textContent = text; }

  // ------------------------------------------------------------------------------------------ controls
  function fillSelect(select, labels, value) {
    select.replaceChildren();
    labels.forEach(function (label, i) {
      var o = el("option", null, label);
      o.value = String(i);
      select.appendChild(o);
    });
    select.value = String(value);
  }
  function renderControls() {
    var m = method();
    fillSelect($("bs-layer"), Array.from({ length: m.layers }, function (_, l) { return String(l); }), state.layer);
    var box = $("bs-heads");
    box.replaceChildren();
    for (var h = 0; h < m.heads; h++) {
      var sw = el("span", "bs-swatch", m.heads > 1 ? String(h) : "");
      sw.style.background = css(headColour(h, m.heads));
      sw.dataset.head = String(h);
      sw.title = m.heads > 1 ? "head " + h + " of the chosen layer (click: toggle; double-click: only this head)" : m.label;
      box.appendChild(sw);
    }
    updateSwatches();
  }
  function updateSwatches() {
    Array.prototype.forEach.call($("bs-heads").children, function (sw) {
      sw.classList.toggle("bs-on", state.heads.indexOf(Number(sw.dataset.head)) >= 0);
    });
  }

  // ------------------------------------------------------------------------------------------ head view
  function renderTokens() {
    var tokens = sentence().tokens, segs = sentence().segments;
    [["bs-queries", "q"], ["bs-keys", "k"]].forEach(function (pair) {
      var col = $(pair[0]);
      col.replaceChildren();
      var frag = document.createDocumentFragment();
      tokens.forEach(function (t, i) {
        var d = el("div", "bs-tok", t);
        d.dataset.i = String(i);
        d.dataset.side = pair[1];
        if (/^\[[A-Z]+\]$/.test(t) || /^<\/?s>$/.test(t)) d.classList.add("bs-special");
        if (segs) d.classList.add(segs[i] ? "bs-seg-b" : "bs-seg-a");
        frag.appendChild(d);
      });
      col.appendChild(frag);
    });
    updateTokenClasses();
  }
  function updateTokenClasses() {
    var left = $("bs-queries").children;
    for (var i = 0; i < left.length; i++) {
      left[i].classList.toggle("bs-selected", state.selected.indexOf(i) >= 0);
      left[i].classList.toggle("bs-hovered", state.hover === i);
    }
  }
  function rowSums(rows, h) { // sum over `rows` of map[layer, h, row, :]
    var m = current.map, n = m.n, out = new Float64Array(n);
    rows.forEach(function (i) { for (var j = 0; j < n; j++) out[j] += mapValue(m, state.layer, h, i, j); });
    return out;
  }
  function drawHeadView() {
    var t0 = performance.now();
    var m = current.map, n = m.n, meth = method(), canvas = $("bs-hv-canvas");
    var height = n * ROW;
    size(canvas, HV_WIDTH, height);
    var ctx = canvas.getContext("2d");
    ctx.setTransform(DPR, 0, 0, DPR, 0, 0);
    ctx.clearRect(0, 0, HV_WIDTH, height);
    var rows = activeRows(), all = rows === null;
    if (all) rows = Array.from({ length: n }, function (_, i) { return i; });
    // Every row of a long sentence: only the clear lines (each costs raster time; faint ones are invisible).
    var minAlpha = all ? MIN_ALPHA_ALL * Math.max(1, n / 64) : 1 / 255, vmax = meth.vmax || 1;
    ctx.lineWidth = 1.5;
    state.heads.forEach(function (h) {
      var paths = new Array(BUCKETS);
      rows.forEach(function (i) {
        var y0 = (i + 0.5) * ROW;
        for (var j = 0; j < n; j++) {
          var a = Math.min(1, Math.abs(mapValue(m, state.layer, h, i, j)) / vmax);
          if (a < minAlpha || !segOk(i, j)) continue;
          var b = Math.min(BUCKETS - 1, Math.floor(a * BUCKETS));
          if (!paths[b]) paths[b] = new Path2D();
          paths[b].moveTo(2, y0);
          paths[b].lineTo(HV_WIDTH - 2, (j + 0.5) * ROW);
        }
      });
      ctx.strokeStyle = css(headColour(h, meth.heads));
      for (var b = 0; b < BUCKETS; b++) {
        if (!paths[b]) continue;
        ctx.globalAlpha = (b + 1) / BUCKETS;
        ctx.stroke(paths[b]);
      }
    });
    ctx.globalAlpha = 1;
    // Keys: background by the summed weight of the active rows (mean over the selected heads).
    var keys = $("bs-keys").children;
    var sums = null;
    if (!all && state.heads.length) {
      sums = new Float64Array(n);
      state.heads.forEach(function (h) { var r = rowSums(rows, h); for (var j = 0; j < n; j++) sums[j] += Math.abs(r[j]) / state.heads.length; });
    }
    var top = sums ? Math.max.apply(null, Array.from(sums)) || 1 : 1;
    for (var j = 0; j < keys.length; j++) keys[j].style.background = sums ? "rgba(31,111,235," + (0.6 * sums[j] / top).toFixed(3) + ")" : "";
    var root = $("bs-headview");
    root.dataset.layer = String(state.layer);
    root.dataset.heads = state.heads.join(",");
    root.dataset.method = state.method;
    root.dataset.rows = all ? "all" : rows.join(",");
    api.renders.head += 1;
    api.lastHeadDrawMs = performance.now() - t0;
  }
  function describeKey(j) {
    var rows = activeRows(), m = current.map;
    var which = rows === null ? "all " + m.n + " queries" : rows.map(tokenLabel).join(" + ");
    var parts = state.heads.map(function (h) {
      var r = rows === null ? Array.from({ length: m.n }, function (_, i) { return i; }) : rows;
      return (method().heads > 1 ? "H" + h + " " : "") + fmt(rowSums(r, h)[j]);
    });
    setHover(method().label + ", layer " + state.layer + ": " + which + " -> " + tokenLabel(j) + " (key " + j + "): " + parts.join("  "));
  }
  function describeQuery(i) {
    var m = current.map, parts = state.heads.map(function (h) {
      var best = 0, bv = -Infinity;
      for (var j = 0; j < m.n; j++) { var v = mapValue(m, state.layer, h, i, j); if (v > bv) { bv = v; best = j; } }
      return (method().heads > 1 ? "H" + h + " " : "") + "max " + fmt(bv) + " -> " + tokenLabel(best);
    });
    setHover(method().label + ", layer " + state.layer + ": query " + tokenLabel(i) + " (" + i + "): " + parts.join("  "));
  }

  // ------------------------------------------------------------------------------------------ model view
  function thumbnail(m, l, h) {
    var n = m.n, r = Math.min(n, THUMB), acc = new Float32Array(r * r), bin = new Int32Array(n);
    for (var i = 0; i < n; i++) bin[i] = Math.floor((i * r) / n);
    var b = l * m.heads + h, lo = m.lo[b], step = (m.hi[b] - m.lo[b]) / 255, code = m.code, base = b * n * n, top = 0;
    var rowBase = new Int32Array(n), k;
    for (i = 0; i < n; i++) rowBase[i] = bin[i] * r;
    if (lo === 0) { // non-negative map: the largest code is the largest value (integer work only)
      var best = new Uint8Array(r * r);
      for (var j = 0; j < n; j++) { // key-major: one key's column at a time
        var col = bin[j], off = base + j * n;
        for (i = 0; i < n; i++) { k = rowBase[i] + col; if (code[off + i] > best[k]) best[k] = code[off + i]; }
      }
      for (k = 0; k < acc.length; k++) acc[k] = best[k] * step;
    } else {
      for (j = 0; j < n; j++) {
        col = bin[j]; off = base + j * n;
        for (i = 0; i < n; i++) {
          var v = Math.abs(lo + code[off + i] * step);
          k = rowBase[i] + col;
          if (v > acc[k]) acc[k] = v;
        }
      }
    }
    for (k = 0; k < acc.length; k++) if (acc[k] > top) top = acc[k];
    var canvas = el("canvas", "bs-thumb");
    canvas.width = r;
    canvas.height = r;
    var ctx = canvas.getContext("2d"), img = ctx.createImageData(r, r), rgb = headColour(h, m.heads);
    for (k = 0; k < acc.length; k++) {
      var t = top > 0 ? acc[k] / top : 0;
      img.data[4 * k] = Math.round(255 - t * (255 - rgb[0]));
      img.data[4 * k + 1] = Math.round(255 - t * (255 - rgb[1]));
      img.data[4 * k + 2] = Math.round(255 - t * (255 - rgb[2]));
      img.data[4 * k + 3] = 255;
    }
    ctx.putImageData(img, 0, 0);
    canvas.dataset.layer = String(l);
    canvas.dataset.head = String(h);
    return canvas;
  }
  function renderModelView() {
    var m = current.map, grid = $("bs-grid"), meth = method();
    grid.replaceChildren();
    grid.style.gridTemplateColumns = "auto repeat(" + m.heads + ", 60px)";
    grid.appendChild(el("span", "bs-axis", ""));
    for (var h = 0; h < m.heads; h++) grid.appendChild(el("span", "bs-axis", m.heads > 1 ? "H" + h : meth.label));
    for (var l = 0; l < m.layers; l++) {
      grid.appendChild(el("span", "bs-axis", "L" + l));
      for (h = 0; h < m.heads; h++) grid.appendChild(thumbnail(m, l, h));
    }
    updateThumbs();
    api.renders.model += 1;
  }
  function updateThumbs() {
    Array.prototype.forEach.call($("bs-grid").querySelectorAll(".bs-thumb"), function (c) {
      c.classList.toggle("bs-active", Number(c.dataset.layer) === state.layer && state.heads.indexOf(Number(c.dataset.head)) >= 0);
    });
  }

  // ------------------------------------------------------------------------------------------ query-key view
  var QK = { label: 110, gap: 14, num: 70, bar: 90 };
  function qkLayout(d) {
    var cell = Math.max(3, Math.min(8, Math.floor(256 / d)));
    var kx = QK.label, px = kx + d * cell + QK.gap, sx = px + d * cell + QK.gap, bx = sx + QK.num;
    return { cell: cell, kx: kx, px: px, sx: sx, bx: bx, width: bx + QK.bar + 60, top: 2 * ROW + 6 };
  }
  function qkModel() { // the numbers the view draws, for the focused query token and head
    var qk = current.qk, n = qk.n, l = state.layer, h = state.qkHead, i = state.focus === null ? 0 : state.focus;
    var q = qkVector(qk, 0, l, h, i), ks = [], dots = new Float64Array(n), top = -Infinity;
    for (var j = 0; j < n; j++) {
      var k = qkVector(qk, 1, l, h, j), s = 0;
      for (var t = 0; t < qk.d; t++) s += q[t] * k[t];
      ks.push(k);
      dots[j] = s / Math.sqrt(qk.d);
      if (dots[j] > top) top = dots[j];
    }
    var probs = new Float64Array(n), z = 0;
    for (j = 0; j < n; j++) { probs[j] = Math.exp(dots[j] - top); z += probs[j]; }
    for (j = 0; j < n; j++) probs[j] /= z;
    return { i: i, l: l, h: h, q: q, ks: ks, dots: dots, probs: probs };
  }
  function diverging(v, scale) { // blue for positive, orange for negative: [r, g, b]
    var t = Math.min(1, Math.abs(v) / (scale || 1)), c = v >= 0 ? [31, 111, 235] : [230, 120, 20];
    return [255 - t * (255 - c[0]), 255 - t * (255 - c[1]), 255 - t * (255 - c[2])];
  }
  function cells(ctx, rows, d, scale, x, y, cell) { // rows of d values, one pixel each, drawn scaled up
    var off = document.createElement("canvas");
    off.width = d;
    off.height = rows.length;
    var octx = off.getContext("2d"), img = octx.createImageData(d, rows.length), px = img.data;
    rows.forEach(function (row, j) {
      for (var t = 0; t < d; t++) {
        var c = diverging(row[t], scale), p = 4 * (j * d + t);
        px[p] = c[0]; px[p + 1] = c[1]; px[p + 2] = c[2]; px[p + 3] = 255;
      }
    });
    octx.putImageData(img, 0, 0);
    ctx.imageSmoothingEnabled = false;
    ctx.drawImage(off, x, y, d * cell, rows.length * ROW);
  }
  function drawQKView() {
    var canvas = $("bs-qk-canvas"), msg = $("bs-qk-message"), att = methods.filter(function (x) { return x.id === "attention"; })[0];
    if (!current.qk) {
      canvas.hidden = true;
      msg.hidden = false;
      msg.textContent = "Queries and keys were not embedded for this sentence (explore(..., qk=True) embeds them for every sentence).";
      $("bs-qk-title").textContent = "";
      return;
    }
    canvas.hidden = false;
    msg.hidden = true;
    var qk = current.qk, n = qk.n, d = qk.d, L = qkLayout(d), r = qkModel(), tokens = sentence().tokens;
    $("bs-qk-title").textContent = "(attention, L" + r.l + "H" + r.h + ", query " + tokenLabel(r.i) + "; click a token on the left to change it)";
    var height = L.top + n * ROW + 4;
    size(canvas, L.width, height);
    var ctx = canvas.getContext("2d");
    ctx.setTransform(DPR, 0, 0, DPR, 0, 0);
    ctx.clearRect(0, 0, L.width, height);
    ctx.font = "12px system-ui, sans-serif";
    ctx.textBaseline = "middle";
    var vs = 0, ps = 0, t, j, products = [];
    for (t = 0; t < d; t++) vs = Math.max(vs, Math.abs(r.q[t]));
    r.ks.forEach(function (k) {
      var p = new Float32Array(d);
      for (var u = 0; u < d; u++) { p[u] = k[u] * r.q[u]; vs = Math.max(vs, Math.abs(k[u])); ps = Math.max(ps, Math.abs(p[u])); }
      products.push(p);
    });
    ctx.fillStyle = "#222";
    ctx.fillText("q " + tokenLabel(r.i), 2, ROW / 2, QK.label - 4);
    cells(ctx, [r.q], d, vs, L.kx, 0, L.cell);
    ctx.fillStyle = "#555";
    ctx.fillText("k (per key)", L.kx, ROW * 1.5 + 2);
    ctx.fillText("q \u00d7 k", L.px, ROW * 1.5 + 2);
    ctx.fillText("q\u00b7k/\u221ad", L.sx, ROW * 1.5 + 2);
    ctx.fillText("softmax", L.bx, ROW * 1.5 + 2);
    cells(ctx, r.ks, d, vs, L.kx, L.top, L.cell);
    cells(ctx, products, d, ps, L.px, L.top, L.cell);
    // Cell borders: white lines between the columns and between the rows.
    ctx.strokeStyle = "#fff";
    ctx.lineWidth = 1;
    var grid = new Path2D();
    [L.kx, L.px].forEach(function (x0) {
      for (var u = 0; u <= d; u++) {
        var x = x0 + u * L.cell - 0.5;
        grid.moveTo(x, L.top); grid.lineTo(x, height); // keys' rows, not the header text
        if (x0 === L.kx) { grid.moveTo(x, 0); grid.lineTo(x, ROW); } // the query's row
      }
    });
    for (j = 0; j <= n; j++) { grid.moveTo(L.kx, L.top + j * ROW + 0.5); grid.lineTo(L.px + d * L.cell, L.top + j * ROW + 0.5); }
    ctx.stroke(grid);
    ctx.fillStyle = "#1f6feb";
    for (j = 0; j < n; j++) ctx.fillRect(L.bx, L.top + j * ROW + 2, Math.max(0.5, r.probs[j] * QK.bar), ROW - 4);
    ctx.fillStyle = "#222";
    for (j = 0; j < n; j++) {
      var y = L.top + j * ROW + ROW / 2;
      if (j === r.i) ctx.fillStyle = "#1f6feb";
      ctx.fillText(tokens[j], 2, y, QK.label - 6);
      if (j === r.i) ctx.fillStyle = "#222";
      ctx.fillText(r.dots[j].toFixed(2), L.sx, y, QK.num - 4);
      ctx.fillText(r.probs[j].toFixed(3), L.bx + QK.bar + 4, y);
    }
    canvas.dataset.query = String(r.i);
    canvas.dataset.head = String(r.h);
    canvas.dataset.layer = String(r.l);
    api.renders.qk += 1;
    api.qk = { query: r.i, layer: r.l, head: r.h, dots: Array.from(r.dots), softmax: Array.from(r.probs), hasAttention: !!att };
  }
  function describeQK(x, y) {
    if (!current.qk) return;
    var L = qkLayout(current.qk.d), r = qkModel(), j = Math.floor((y - L.top) / ROW), d = current.qk.d;
    var t = -1;
    if (x >= L.kx && x < L.kx + d * L.cell) t = Math.floor((x - L.kx) / L.cell);
    if (x >= L.px && x < L.px + d * L.cell) t = Math.floor((x - L.px) / L.cell);
    if (y < ROW && t >= 0) return setHover("q" + tokenLabel(r.i) + "[" + t + "] = " + fmt(r.q[t]));
    if (j < 0 || j >= current.qk.n) return;
    var head = "L" + r.l + "H" + r.h + ", query " + tokenLabel(r.i) + " -> key " + tokenLabel(j) + ": ";
    if (t >= 0 && x < L.px) return setHover(head + "k[" + t + "] = " + fmt(r.ks[j][t]));
    if (t >= 0) return setHover(head + "q[" + t + "] \u00d7 k[" + t + "] = " + fmt(r.q[t] * r.ks[j][t]));
    var stored = current.att ? "  (attention in the data: " + fmt(mapValue(current.att, r.l, r.h, r.i, j)) + ")" : "";
    setHover(head + "q\u00b7k/\u221ad = " + fmt(r.dots[j]) + ", softmax = " + fmt(r.probs[j]) + stored);
  }

  // ------------------------------------------------------------------------------------------ latent view
  // payload.latents = {dictionary, site, site_out, kind, d_sae, ids, vmax}; each sentence's latents[j][i] is
  // latent ids[j]'s activation at token i. A token's background is its value / vmax (the largest over the page).
  var LATENT_RGB = "230, 97, 1";
  function latentColour(v, vmax) {
    var a = vmax > 0 ? Math.max(0, Math.min(1, v / vmax)) : 0;
    return a > 0 ? "rgba(" + LATENT_RGB + ", " + a.toFixed(3) + ")" : "transparent";
  }
  function setupLatents() {
    var L = payload.latents;
    $("bs-latentview").hidden = !L;
    if (!L) return;
    fillSelect($("bs-latent"), L.ids.map(function (id) { return "latent " + id; }), 0);
    $("bs-latent").disabled = L.ids.length < 2;
    var where = L.kind === "sae" ? L.site : L.site + " \u2192 " + (L.site_out || "?") + " (" + L.kind.replace("_", " ") + ")";
    $("bs-lt-where").textContent = "(dictionary " + L.dictionary + ", " + L.d_sae + " latents, reads " + where + ")";
    $("bs-latent").addEventListener("change", function (e) { state.latent = Number(e.target.value); renderLatents(); });
    $("bs-lt-tokens").addEventListener("mouseover", function (e) {
      var i = e.target.dataset && e.target.dataset.i;
      if (i === undefined) return;
      i = Number(i);
      setHover("latent " + L.ids[state.latent] + " at " + tokenLabel(i) + " (" + i + ") = " + fmt(sentence().latents[state.latent][i]));
    });
  }
  function renderLatents() {
    var L = payload.latents;
    if (!L) return;
    var j = state.latent, vmax = L.vmax[j], values = sentence().latents[j], box = $("bs-lt-tokens");
    box.replaceChildren();
    var frag = document.createDocumentFragment();
    sentence().tokens.forEach(function (t, i) {
      var span = el("span", "bs-lt", t);
      span.dataset.i = String(i);
      span.dataset.value = String(values[i]);
      span.style.backgroundColor = latentColour(values[i], vmax);
      span.title = t + ": " + fmt(values[i]);
      frag.appendChild(span);
    });
    box.appendChild(frag);
    $("bs-lt-bar").style.background = "linear-gradient(to right, " + latentColour(0, 1) + ", rgba(" + LATENT_RGB + ", 1))";
    $("bs-lt-max").textContent = vmax > 0 ? fmt(vmax) : "0 (latent " + L.ids[j] + " does not fire on these sentences)";
    api.latent = { id: L.ids[j], vmax: vmax, values: Array.from(values) };
  }

  // ------------------------------------------------------------------------------------------ flow
  function redraw() {
    var t0 = performance.now();
    drawHeadView(); updateThumbs(); updateSwatches(); updateTokenClasses(); updateSegments();
    var t1 = performance.now();
    drawQKView();
    api.redrawMs = { head: t1 - t0, qk: performance.now() - t1 };
  }
  function load() { // decode what the current sentence and method need, then draw everything
    var mine = ++ticket, s = state.sentence, startedAt = performance.now();
    var hasAtt = methods.some(function (x) { return x.id === "attention"; });
    return Promise.all([getMap(s, state.method), getQK(s), hasAtt ? getMap(s, "attention") : Promise.resolve(null)])
      .then(function (got) {
        if (mine !== ticket) return;
        current = { map: got[0], qk: got[1], att: got[2] };
        var m = method();
        state.layer = Math.min(state.layer, m.layers - 1);
        state.heads = state.heads.filter(function (h) { return h < m.heads; });
        if (!state.heads.length) state.heads = Array.from({ length: m.heads }, function (_, h) { return h; });
        if (current.qk) state.qkHead = Math.min(state.qkHead, current.qk.heads - 1);
        fillSelect($("bs-qk-head"), current.qk ? Array.from({ length: current.qk.heads }, function (_, h) { return String(h); }) : [], state.qkHead);
        var t = [performance.now()];
        $("bs-text").textContent = sentence().text;
        if (!sentence().segments) state.seg = "all";
        $("bs-seg-box").hidden = !sentence().segments;
        $("bs-segments").value = state.seg;
        renderControls();
        renderTokens();
        renderLatents();
        t.push(performance.now());
        renderModelView();
        t.push(performance.now());
        redraw();
        t.push(performance.now());
        api.timings = { decodeMs: t[0] - startedAt, tokensMs: t[1] - t[0], modelViewMs: t[2] - t[1], drawMs: t[3] - t[2] };
      });
  }
  function fail(err) {
    var msg = $("bs-message");
    msg.hidden = false;
    msg.textContent = "Could not show this explorer: " + (err && err.message ? err.message : String(err));
    console.error(err);
  }

  function wire() {
    $("bs-sentence").addEventListener("change", function (e) {
      state.sentence = Number(e.target.value);
      state.selected = [];
      state.hover = null;
      state.focus = null;
      load().catch(fail);
    });
    $("bs-method").addEventListener("change", function (e) {
      state.method = methods[Number(e.target.value)].id;
      state.heads = [];
      load().catch(fail);
    });
    $("bs-layer").addEventListener("change", function (e) { state.layer = Number(e.target.value); redraw(); });
    $("bs-segments").addEventListener("change", function (e) { state.seg = e.target.value; redraw(); });
    $("bs-qk-head").addEventListener("change", function (e) { state.qkHead = Number(e.target.value); drawQKView(); });
    $("bs-all-heads").addEventListener("click", function () {
      state.heads = Array.from({ length: method().heads }, function (_, h) { return h; });
      redraw();
    });
    $("bs-clear").addEventListener("click", function () { state.selected = []; state.focus = null; redraw(); });
    var heads = $("bs-heads");
    heads.addEventListener("click", function (e) {
      var h = e.target.dataset && e.target.dataset.head;
      if (h === undefined) return;
      h = Number(h);
      var at = state.heads.indexOf(h);
      if (at >= 0) state.heads.splice(at, 1); else state.heads.push(h);
      state.heads.sort(function (a, b) { return a - b; });
      if (method().heads > 1 && current.qk) state.qkHead = h;
      redraw();
      $("bs-qk-head").value = String(state.qkHead);
    });
    heads.addEventListener("dblclick", function (e) {
      var h = e.target.dataset && e.target.dataset.head;
      if (h === undefined) return;
      state.heads = [Number(h)];
      redraw();
    });
    var queries = $("bs-queries"), keys = $("bs-keys");
    queries.addEventListener("click", function (e) {
      var i = e.target.dataset && e.target.dataset.i;
      if (i === undefined) return;
      i = Number(i);
      var at = state.selected.indexOf(i);
      if (at >= 0) state.selected.splice(at, 1); else state.selected.push(i);
      state.focus = at >= 0 ? (state.selected.length ? state.selected[state.selected.length - 1] : null) : i;
      redraw();
    });
    queries.addEventListener("mouseover", function (e) {
      var i = e.target.dataset && e.target.dataset.i;
      if (i === undefined) return;
      state.hover = Number(i);
      describeQuery(state.hover);
      if (!state.selected.length) drawHeadView();
      updateTokenClasses();
    });
    queries.addEventListener("mouseleave", function () {
      state.hover = null;
      if (!state.selected.length) drawHeadView();
      updateTokenClasses();
    });
    keys.addEventListener("mouseover", function (e) {
      var j = e.target.dataset && e.target.dataset.i;
      if (j !== undefined) describeKey(Number(j));
    });
    var grid = $("bs-grid");
    grid.addEventListener("click", function (e) {
      var c = e.target;
      if (!c.classList.contains("bs-thumb")) return;
      var t0 = performance.now();
      state.layer = Number(c.dataset.layer);
      state.heads = [Number(c.dataset.head)];
      if (current.qk) state.qkHead = Math.min(Number(c.dataset.head), current.qk.heads - 1);
      $("bs-layer").value = String(state.layer);
      $("bs-qk-head").value = String(state.qkHead);
      redraw();
      api.lastClickMs = performance.now() - t0; // click handled and every view redrawn
      api.lastClickPaintMs = null;
      requestAnimationFrame(function () { setTimeout(function () { api.lastClickPaintMs = performance.now() - t0; }, 0); });
    });
    grid.addEventListener("mousemove", function (e) {
      var c = e.target;
      if (!c.classList.contains("bs-thumb")) return;
      var rect = c.getBoundingClientRect(), n = current.map.n;
      var i = Math.min(n - 1, Math.floor(((e.clientY - rect.top) / rect.height) * n));
      var j = Math.min(n - 1, Math.floor(((e.clientX - rect.left) / rect.width) * n));
      var l = Number(c.dataset.layer), h = Number(c.dataset.head);
      setHover(method().label + (method().heads > 1 ? ", L" + l + "H" + h : ", layer " + l) + ": " + tokenLabel(i) + " (" + i + ") -> " + tokenLabel(j) + " (" + j + ") = " + fmt(mapValue(current.map, l, h, i, j)) + (n > THUMB ? "  (thumbnail pixels show the max of " + Math.ceil(n / THUMB) + "x" + Math.ceil(n / THUMB) + " cells)" : ""));
    });
    $("bs-qk-canvas").addEventListener("mousemove", function (e) {
      var rect = e.target.getBoundingClientRect();
      describeQK(e.clientX - rect.left, e.clientY - rect.top);
    });
  }

  // Test and scripting hooks: read decoded values the way the views do.
  api.mapRow = function (s, id, l, h, i) {
    return getMap(s, id).then(function (m) { var out = []; for (var j = 0; j < m.n; j++) out.push(mapValue(m, l, h, i, j)); return out; });
  };
  api.segmentMass = function () { return segmentMass(); };
  api.qkVector = function (s, which, l, h, i) {
    return getQK(s).then(function (qk) { return qk ? Array.from(qkVector(qk, which, l, h, i)) : null; });
  };

  function start() {
    try {
      payload = JSON.parse($("bs-data").textContent);
      if (payload.format !== "bertscope-explorer/1") throw new Error("unknown data format " + payload.format);
      if (typeof DecompressionStream !== "function") throw new Error("this browser has no DecompressionStream (needs Chrome 80+, Firefox 113+, Safari 16.4+)");
      methods = payload.methods;
      state = { sentence: 0, method: methods[0].id, layer: 0, heads: [], selected: [], hover: null, focus: null, qkHead: 0, seg: "all", latent: 0 };
      SEG_FILTERS.forEach(function (f) { var o = el("option", null, f[1]); o.value = f[0]; $("bs-segments").appendChild(o); });
      api.state = state;
      api.payload = payload;
      $("bs-model").textContent = payload.model && payload.model.name ? payload.model.name : "";
      fillSelect($("bs-sentence"), payload.sentences.map(function (s, i) {
        var text = s.text.length > 90 ? s.text.slice(0, 87) + "..." : s.text;
        return i + ": " + text + " (" + s.tokens.length + " tokens)";
      }), 0);
      fillSelect($("bs-method"), methods.map(function (m) { return m.label; }), 0);
      $("bs-method").disabled = methods.length < 2;
      wire();
      setupLatents();
    } catch (err) {
      fail(err);
      return;
    }
    load().then(function () {
      api.ready = true;
      api.readyMs = performance.now();
      requestAnimationFrame(function () { setTimeout(function () { api.readyPaintMs = performance.now(); }, 0); });
      document.documentElement.setAttribute("data-bs-ready", "1");
    }).catch(fail);
  }
  start();
})();

// The explorer's pair view: hover a token of one text, the other text's tokens are coloured by the attribution
// of that token pair. Reads the JSON payload of #sp-data; every string goes into the page through textContent.
(function () {
  "use strict";
  var data = JSON.parse(document.getElementById("sp-data").textContent);
  var pairSel = document.getElementById("sp-pair");
  var methodSel = document.getElementById("sp-method");
  var boxA = document.getElementById("sp-a");
  var boxB = document.getElementById("sp-b");
  var hover = document.getElementById("sp-hover");
  var scores = document.getElementById("sp-scores");
  document.getElementById("sp-title").textContent = data.title || "";

  function option(sel, value, text) {
    var o = document.createElement("option");
    o.value = String(value);
    o.textContent = text;
    sel.appendChild(o);
  }
  data.pairs.forEach(function (p, n) {
    option(pairSel, n, "pair " + p.id + ": " + p.a + "  |  " + p.b);
  });
  data.methods.forEach(function (m) { option(methodSel, m, m); });

  function color(v, vmax) {
    var t = vmax > 0 ? Math.max(-1, Math.min(1, v / vmax)) : 0;
    var a = Math.abs(t).toFixed(3);
    return t >= 0 ? "rgba(214, 39, 40, " + a + ")" : "rgba(31, 119, 180, " + a + ")";
  }
  function fmt(v) { return (v >= 0 ? "+" : "") + v.toFixed(4); }

  function current() {
    var p = data.pairs[Number(pairSel.value)];
    return { pair: p, m: p.matrices[methodSel.value] };
  }
  function clear() {
    [boxA, boxB].forEach(function (box) {
      Array.prototype.forEach.call(box.children, function (el) {
        el.style.background = "";
        el.classList.remove("sp-hovered");
        el.removeAttribute("data-value");
      });
    });
  }
  function show(side, index) {
    var c = current();
    if (!c.m) { return; }
    clear();
    var mine = side === "a" ? boxA : boxB;
    var other = side === "a" ? boxB : boxA;
    var tokens = side === "a" ? c.pair.tokens_a : c.pair.tokens_b;
    var others = side === "a" ? c.pair.tokens_b : c.pair.tokens_a;
    mine.children[index].classList.add("sp-hovered");
    var values = others.map(function (_, j) { return side === "a" ? c.m.values[index][j] : c.m.values[j][index]; });
    var parts = [];
    values.forEach(function (v, j) {
      var el = other.children[j];
      el.style.background = color(v, c.m.vmax);
      el.setAttribute("data-value", String(v));
      parts.push(others[j] + " " + fmt(v));
    });
    var total = values.reduce(function (s, v) { return s + v; }, 0);
    hover.textContent = "text " + side + " token '" + tokens[index] + "' with each token of text " +
      (side === "a" ? "b" : "a") + " (sum " + fmt(total) + "): " + parts.join(", ");
  }
  function tokensInto(box, tokens, specials, side) {
    while (box.firstChild) { box.removeChild(box.firstChild); }
    tokens.forEach(function (t, i) {
      var el = document.createElement("span");
      el.className = "sp-tok" + (specials[i] ? " sp-special" : "");
      el.textContent = t;
      el.setAttribute("data-side", side);
      el.setAttribute("data-index", String(i));
      el.addEventListener("mouseenter", function () { show(side, i); });
      box.appendChild(el);
    });
  }
  function draw() {
    var c = current();
    tokensInto(boxA, c.pair.tokens_a, c.pair.special_a, "a");
    tokensInto(boxB, c.pair.tokens_b, c.pair.special_b, "b");
    var text = "gold " + (c.pair.gold === null ? "n/a" : c.pair.gold) + "; model cosine " + c.pair.score.toFixed(4);
    if (c.m) {
      text += "; " + methodSel.value + ": target " + c.m.target.toFixed(4) + ", error (sum - target) " +
        c.m.error.toExponential(2);
    } else {
      text += "; " + methodSel.value + " was not run on this pair";
    }
    scores.textContent = text;
    hover.textContent = "Hover over a token: the tokens of the other text are coloured by its attribution to each of them (red raises the similarity, blue lowers it).";
  }
  pairSel.addEventListener("change", draw);
  methodSel.addEventListener("change", draw);
  if (data.pairs.length) { draw(); }
})();

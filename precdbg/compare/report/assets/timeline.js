/* precdbg compare report: the timeline of errors per direction.
   Inlined by precdbg/compare/report/html.py into one function scope with the other
   assets/*.js, in the order of html._SCRIPTS. */
  // ------------------------------------------------------------------ timeline
  function drawTimeline() {
    var box = document.getElementById('timeline');
    box.textContent = '';
    var rows = byFile[state.model.key] || [];
    DIRS.forEach(function (d) {
      var pts = rows.filter(function (i) {   // tensors only: a non-tensor argument has no error to plot
        return s(R, 'direction', i) === d[0] && R.err[i] !== null && s(R, 'dtype_a', i).slice(0, 3) !== 'py.';
      })
        .sort(function (a, b) { return R.seq[a] - R.seq[b]; });
      if (!pts.length) return;
      var bad = pts.filter(function (i) { return s(R, 'status', i) === 'diverged'; }).length;
      box.appendChild(el('h3', { text: 'Step ' + state.step + ', rank ' + state.rank + ' \u2014 ' + d[1] + ': ' + pts.length + ' records, ' + bad + ' beyond tolerance' }));
      var plot = el('div', { cls: 'plot' }), canvas = el('canvas'), tip = el('div', { cls: 'tip' });
      plot.appendChild(canvas); plot.appendChild(tip); box.appendChild(plot);
      plotErrors(canvas, tip, pts);
    });
    if (!box.children.length) box.appendChild(el('p', { cls: 'muted', text: 'No records with an error in this step and rank.' }));
  }
  function plotErrors(canvas, tip, pts) {
    var W = Math.max(600, canvas.parentNode.clientWidth || 1000), H = 214, dpr = window.devicePixelRatio || 1;
    canvas.width = W * dpr; canvas.height = H * dpr; canvas.style.height = H + 'px';
    var g = canvas.getContext('2d');
    g.scale(dpr, dpr);
    var L = 52, T = 22, PW = W - L - 12, PH = H - T - 40;
    var lg = function (v) { return Math.log10(Math.max(v, 1e-12)); };
    var top = 1;
    pts.forEach(function (i) { if (R.err[i] < 1e300) top = Math.max(top, Math.ceil(lg(R.err[i]))); });
    top = Math.min(top, 12);
    var lo = -12;
    var X = function (k) { return L + (pts.length < 2 ? PW / 2 : k * PW / (pts.length - 1)); };
    var Y = function (v) { return T + (top - Math.min(Math.max(lg(v), lo), top)) * PH / (top - lo); };
    g.fillStyle = '#fff'; g.fillRect(0, 0, W, H);
    g.font = '10px sans-serif'; g.fillStyle = '#5f6670'; g.strokeStyle = '#eef0f3'; g.lineWidth = 1;
    for (var e = lo; e <= top; e += 3) {
      var y = Y(Math.pow(10, e)); g.beginPath(); g.moveTo(L, y); g.lineTo(L + PW, y); g.stroke();
      g.fillText(e === lo ? '\u2264 1e' + e : '1e' + e, 4, y + 3);
    }
    g.fillText('execution order \u2192', L, H - 4);
    legend(g, L + PW, 12);
    var bands = moduleBands(pts), here = F && state.step === F.step && state.rank === F.rank;
    bands.forEach(function (b, k) {      // the model's top-level modules (or layers) along the axis
      var x0 = k === 0 ? L : (X(b.from - 1) + X(b.from)) / 2, x1 = k === bands.length - 1 ? L + PW : (X(b.to) + X(b.to + 1)) / 2;
      var mine = here && b.key && b.key === culpritBand(pts);
      if (mine) { g.fillStyle = 'rgba(214,39,40,0.08)'; g.fillRect(x0, T, x1 - x0, PH); }
      else if (b.key && k % 2) { g.fillStyle = 'rgba(90,100,120,0.06)'; g.fillRect(x0, T, x1 - x0, PH); }
      g.strokeStyle = '#c9ced6'; g.beginPath(); g.moveTo(x0, T + PH); g.lineTo(x0, T + PH + 7); g.stroke();
      var text = b.key, w = g.measureText(text).width;
      if (text && w + 6 < x1 - x0) {
        g.font = mine ? 'bold 10px sans-serif' : '10px sans-serif'; g.fillStyle = mine ? '#b00020' : '#5f6670';
        g.fillText(text, (x0 + x1 - g.measureText(text).width) / 2, T + PH + 12);
        g.font = '10px sans-serif';
      }
    });
    canvas.setAttribute('data-bands', JSON.stringify(bands.map(function (b) {
      return { key: b.key, from: b.from, to: b.to, culprit: !!(here && b.key && b.key === culpritBand(pts)) };
    })));
    g.fillStyle = '#5f6670';
    var cx = null, cy = null, cls = [];
    var band = Math.max(1.5, Math.min(4, PW / pts.length));
    pts.forEach(function (i, k) {                 // consequences: shaded bands
      if (s(R, 'status', i) === 'diverged' && !isCulpritRow(i)) { g.fillStyle = 'rgba(255,159,28,0.09)'; g.fillRect(X(k) - band / 2, T, band, PH); }
    });
    var xs = pts.map(function (i, k) { return X(k); }), ys = pts.map(function (i) { return Y(R.err[i]); });
    pts.forEach(function (i, k) {
      var badRow = s(R, 'status', i) === 'diverged';
      if (badRow && isCulpritRow(i)) { cls.push(k); return; }
      g.fillStyle = badRow ? '#ff9f1c' : '#2e86c1';
      g.beginPath(); g.arc(xs[k], ys[k], badRow ? 2.6 : 1.8, 0, 7); g.fill();
    });
    g.strokeStyle = 'rgba(60,60,60,0.85)'; g.lineWidth = 1.2; g.setLineDash([5, 4]); g.beginPath();   // tolerance of each record
    var pen = false, lastTol = null;     // exact records (integers: tolerance 0) are stepped over
    pts.forEach(function (i, k) {
      if (!R.tol[i]) return;
      var y = Y(R.tol[i]); if (pen) g.lineTo(X(k), y); else g.moveTo(X(k), y); pen = true; lastTol = R.tol[i];
    });
    g.stroke(); g.setLineDash([]);
    cls.forEach(function (k) {
      cx = xs[k]; cy = ys[k];
      g.strokeStyle = 'rgba(214,39,40,0.6)'; g.lineWidth = 1; g.setLineDash([3, 3]);
      g.beginPath(); g.moveTo(cx, T); g.lineTo(cx, T + PH); g.stroke(); g.setLineDash([]);
      g.fillStyle = '#d62728'; g.strokeStyle = '#fff'; g.lineWidth = 1.5;
      g.beginPath(); g.arc(cx, cy, 5.5, 0, 7); g.fill(); g.stroke();
    });
    if (cx !== null) {
      var label = 'first divergence: ' + (F.name_a || F.name_b);
      g.font = 'bold 12px sans-serif'; g.fillStyle = '#b00020';
      var tw = g.measureText(label).width, lx = Math.min(Math.max(cx + 8, L), L + PW - tw), ly = cy > T + 16 ? cy - 9 : cy + 18;
      g.fillStyle = 'rgba(255,255,255,0.85)'; g.fillRect(lx - 3, ly - 11, tw + 6, 15);
      g.fillStyle = '#b00020'; g.fillText(label, lx, ly);
    }
    function nearest(ev) {
      var rect = canvas.getBoundingClientRect(), mx = ev.clientX - rect.left, my = ev.clientY - rect.top;
      var k0 = Math.max(0, Math.round((mx - L) / PW * (pts.length - 1))), best = -1, bd = 100;
      var span = Math.max(3, Math.ceil(8 * (pts.length - 1) / PW));
      for (var k = Math.max(0, k0 - span); k <= Math.min(pts.length - 1, k0 + span); k++) {
        var dd = Math.abs(xs[k] - mx) + Math.abs(ys[k] - my) * 0.5;
        if (dd < bd) { bd = dd; best = k; }
      }
      return { k: best, x: mx, y: my };
    }
    canvas.addEventListener('mousemove', function (ev) {
      var hit = nearest(ev);
      if (hit.k < 0) { tip.style.display = 'none'; return; }
      var i = pts[hit.k];
      tip.textContent = s(R, 'name_a', i) + '  ' + s(R, 'role', i) + ' ' + R.arg_index[i] + '  error ' + fmt(R.err[i]) +
        ' (tolerance ' + fmt(R.tol[i]) + ')' + (s(R, 'module', i) ? '  in ' + s(R, 'module', i) : '');
      tip.style.display = 'block';
      tip.style.left = Math.min(hit.x + 12, canvas.clientWidth - tip.offsetWidth - 4) + 'px';
      tip.style.top = (hit.y + 14) + 'px';
    });
    canvas.addEventListener('mouseleave', function () { tip.style.display = 'none'; });
    canvas.addEventListener('click', function (ev) {
      var hit = nearest(ev);
      if (hit.k >= 0) { var n = nodeOfRow(pts[hit.k]); if (n) reveal(n); }
    });
  }
  function legend(g, right, y) {    // in the top margin, right-aligned: never over the points
    var items = [['line', 'tolerance'], ['#2e86c1', 'within'], ['#ff9f1c', 'beyond tolerance'], ['#d62728', 'first divergence']];
    g.font = '10px sans-serif';
    var x = right - items.reduce(function (t, it) { return t + 22 + g.measureText(it[1]).width; }, 0);
    items.forEach(function (it) {
      if (it[0] === 'line') {
        g.strokeStyle = 'rgba(60,60,60,0.85)'; g.lineWidth = 1.2; g.setLineDash([5, 4]);
        g.beginPath(); g.moveTo(x, y - 3); g.lineTo(x + 14, y - 3); g.stroke(); g.setLineDash([]);
      } else { g.fillStyle = it[0]; g.beginPath(); g.arc(x + 7, y - 3, 3, 0, 7); g.fill(); }
      g.fillStyle = '#5f6670'; g.fillText(it[1], x + 17, y);
      x += 22 + g.measureText(it[1]).width;
    });
  }
  // The band of a module path: its path up to its first numbered part (a layer: blocks.3), else
  // its first part (wte, ln_f); a wrapper holding the whole model (model.*) is looked through.
  function bandOf(path, wrapper) {
    if (!path) return '';
    var parts = path.split('.'), skip = wrapper && parts[0] === wrapper && parts.length > 1 ? 1 : 0;
    for (var k = skip; k < Math.min(parts.length, skip + 3); k++) if (/^\d+$/.test(parts[k])) return parts.slice(0, k + 1).join('.');
    return parts.slice(0, skip + 1).join('.');
  }
  function wrapperOf(pts) {
    var first = null, one = true;
    pts.forEach(function (i) { var p = s(R, 'module', i); if (!p) return; var f = p.split('.')[0]; if (first === null) first = f; else if (f !== first) one = false; });
    return one ? first : null;
  }
  function culpritBand(pts) { return F ? bandOf(F.module || '', wrapperOf(pts)) : null; }
  // runs of points in one band: {key, from, to} (indices into pts); the calls outside every module
  // after the backward (gradient clipping) and the optimizer's are a band each (model.js lateGroup)
  function moduleBands(pts) {
    var wrapper = wrapperOf(pts), out = [], after = lastBackward(state.model.key);
    pts.forEach(function (i, k) {
      var path = s(R, 'module', i), last = out[out.length - 1], late = lateGroup(i, after);
      var key = late ? LATE_GROUPS[late].band : bandOf(path, wrapper);
      if (last && last.key === key) last.to = k; else out.push({ key: key, from: k, to: k });
    });
    return out;
  }
  function nodeOfRow(i) {
    var found = null;
    (function walk(n) { if (found) return; if (n.rows.indexOf(i) >= 0) { found = n; return; } n.children.forEach(walk); })(state.model.root);
    return found;
  }


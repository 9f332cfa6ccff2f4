/* precdbg compare report: draws the page from the JSON in #precdbg-data (see html_report.py).
   No libraries, no network. Tree nodes are built per (step, rank) on demand and their children
   are put in the DOM only when expanded, so a 10,000-record, 8-rank compare stays responsive. */
(function () {
  'use strict';
  var D = JSON.parse(document.getElementById('precdbg-data').textContent);
  var S = D.strings, R = D.rows, U = D.unmatched, F = D.first_divergence;
  [R, U].forEach(function (t) {       // a column of one value throughout is stored as the value
    Object.keys(t).forEach(function (c) {
      if (c !== 'count' && !Array.isArray(t[c])) { var v = t[c]; t[c] = new Array(t.count).fill(v); }
    });
  });
  var STATES = [['match', 'matches'], ['culprit', 'first divergence'],
    ['contains', 'contains the first divergence'], ['consequence', 'diverges after it'],
    ['only', 'only on one side'], ['none', 'not compared']];
  var DIRS = [['forward', 'forward'], ['backward', 'backward (dx, dw)'],
    ['none', 'parameters at the start of the step']];
  var state = { step: null, rank: null, model: null, selected: null };

  function s(table, column, i) { return S[table[column][i]]; }
  function el(tag, attrs, children) {
    var e = document.createElement(tag);
    if (attrs) {
      for (var k in attrs) {
        if (k === 'text') e.textContent = attrs[k];
        else if (k === 'cls') e.className = attrs[k];
        else if (k.slice(0, 2) === 'on') e.addEventListener(k.slice(2), attrs[k]);
        else e.setAttribute(k, attrs[k]);
      }
    }
    (children || []).forEach(function (c) {
      if (c !== null && c !== undefined) e.appendChild(typeof c === 'string' ? document.createTextNode(c) : c);
    });
    return e;
  }
  function fmt(v) {
    if (v === null || v === undefined) return '';
    if (typeof v !== 'number') return String(v);
    if (v >= 1e308) return 'inf';
    if (v <= -1e308) return '-inf';
    if (v === 0 || Number.isInteger(v) && Math.abs(v) < 1e7) return String(v);
    var a = Math.abs(v);
    return (a >= 1e-3 && a < 1e5) ? String(Number(v.toPrecision(5))) : v.toExponential(3);
  }
  function uniq(arr) { return Array.from(new Set(arr)).sort(function (a, b) { return a - b; }); }

  // ------------------------------------------------------------------ rows by step and rank
  var byFile = {};
  for (var i = 0; i < R.count; i++) {
    var key = R.step[i] + '/' + R.rank[i];
    (byFile[key] || (byFile[key] = [])).push(i);
  }
  var steps = uniq(R.step), ranks = uniq(R.rank);
  function culpritKey() { return F ? (F.name_a || F.name_b) : null; }
  function isCulpritRow(i) {
    return !!F && R.step[i] === F.step && R.rank[i] === F.rank &&
      s(R, 'name_a', i) === F.name_a && s(R, 'name_b', i) === F.name_b;
  }

  // ------------------------------------------------------------------ the model for one file
  function treeRows(side, key) {
    var of = D.tree_of[side] || {};
    var k = of[key];
    if (k === undefined) { var any = Object.keys(of); k = any.length ? of[any[0]] : undefined; }
    return k === undefined ? null : D.trees[k];
  }
  function parentPath(path) { var d = path.lastIndexOf('.'); return d < 0 ? '' : path.slice(0, d); }

  function buildModel(step, rank) {
    var key = step + '/' + rank, nodes = {}, all = [];
    function make(path, cls, leaf) {
      var n = { path: path, cls: cls || '', leaf: !!leaf, children: [], leafMap: {}, rows: [],
        unmatched: [], parent: null, pathB: null, clsB: null, side: null, name: '', nameB: '',
        status: 'none', bad: 0, subBad: 0, onPath: false, expanded: false, firstSeq: Infinity };
      all.push(n);
      return n;
    }
    function link(n, parent) { n.parent = parent; parent.children.push(n); }
    var root = nodes[''] = make('', '');
    var ta = treeRows('a', key), tb = treeRows('b', key), clsB = {};
    if (tb) tb.path.forEach(function (p, j) { clsB[p] = tb.cls[j]; });
    if (ta) {
      ta.path.forEach(function (p, j) { if (p === '') root.cls = ta.cls[j]; else nodes[p] = make(p, ta.cls[j]); });
      ta.path.forEach(function (p, j) { if (p !== '') link(nodes[p], module(ta.parent[j] === p ? parentPath(p) : ta.parent[j])); });
    }
    function module(path) {
      var n = nodes[path];
      if (!n) { n = nodes[path] = make(path, ''); link(n, module(parentPath(path))); }
      return n;
    }
    function leafOf(m, name, kind) {
      var lk = kind + '|' + name, leaf = m.leafMap[lk];
      if (!leaf) { leaf = m.leafMap[lk] = make(m.path, '', true); leaf.name = name; leaf.kind = kind; link(leaf, m); }
      return leaf;
    }
    (byFile[key] || []).forEach(function (i) {
      var m = module(s(R, 'module', i)), kind = s(R, 'kind', i), n;
      if (kind === 'module') { n = m; n.pathB = s(R, 'module_b', i); }
      else { n = leafOf(m, s(R, 'name_a', i), kind); n.nameB = s(R, 'name_b', i); }
      n.rows.push(i);
      n.firstSeq = Math.min(n.firstSeq, R.seq[i]);
      if (s(R, 'status', i) === 'diverged') n.bad++;
      if (isCulpritRow(i)) n.culprit = true;
    });
    var byPathB = {};
    all.forEach(function (n) { if (!n.leaf && n.pathB !== null) byPathB[n.pathB] = n; });
    for (var j = 0; j < U.count; j++) {
      if (U.step[j] !== step || U.rank[j] !== rank) continue;
      var side = s(U, 'side', j), path = s(U, 'module', j), kind = s(U, 'kind', j), name = s(U, 'name', j);
      var m = side === 'a' ? module(path) : (byPathB[path] ||
        (nodes[path] && (nodes[path].pathB === null || nodes[path].pathB === path) ? nodes[path] : onlyB(path)));
      var n = kind === 'module' ? m : leafOf(m, name, kind);
      n.unmatched.push(j);
      if (F && F.step === step && F.rank === rank && !F[side === 'a' ? 'name_b' : 'name_a'] && name === culpritKey()) n.culprit = true;
    }
    function onlyB(path) {
      var k2 = '\u0000b:' + path;
      if (!nodes[k2]) { nodes[k2] = make(path, clsB[path] || ''); nodes[k2].side = 'b'; link(nodes[k2], root); }
      return nodes[k2];
    }
    // candidate paths of containers (no records of their own) from their children's
    (function inferB(n) {
      n.children.forEach(inferB);
      if (n.pathB !== null || n.leaf) return;
      n.children.some(function (c) {
        if (c.leaf || c.pathB === null) return false;
        var rel = c.path.slice(n.path ? n.path.length + 1 : 0);
        if (c.pathB === rel) { n.pathB = ''; return true; }
        if (c.pathB.slice(-rel.length - 1) === '.' + rel) { n.pathB = c.pathB.slice(0, -rel.length - 1); return true; }
        return false;
      });
    })(root);
    if (tb) {  // modules of the candidate that nothing in the baseline maps to
      var known = {};
      all.forEach(function (n) { if (!n.leaf) known[n.pathB !== null ? n.pathB : n.path] = true; });
      tb.path.forEach(function (p, j) { if (!known[p] && p !== '') { onlyB(p).cls = tb.cls[j]; } });
    }
    var culprit = null;
    (function finish(n) {
      n.children.forEach(finish);
      n.children.sort(function (a, b) { return (a.leaf - b.leaf) || (a.leaf ? a.firstSeq - b.firstSeq : 0); });
      if (!n.leaf && n.side !== 'b') {
        var pb = n.pathB !== null ? n.pathB : n.path;
        n.clsB = clsB[pb] !== undefined ? clsB[pb] : null;
        if (tb && clsB[pb] === undefined && !n.rows.length && n.path !== '') n.side = 'a';
      }
      n.subBad = n.bad + n.children.reduce(function (t, c) { return t + c.subBad; }, 0);
      if (n.culprit) { n.status = 'culprit'; culprit = culprit || n; }
      else if (n.bad) n.status = 'consequence';
      else if (n.rows.length) n.status = 'match';
      else if (n.unmatched.length || n.side) n.status = 'only';
      else if (n.subBad) n.status = 'consequence';     // a container: as what it holds
      else n.status = n.children.some(function (c) { return c.status === 'match'; }) ? 'match' : 'none';
    })(root);
    if (F && F.kind === 'module' && culprit && culprit.leaf) culprit = culprit.parent;
    for (var p = culprit && culprit.parent; p; p = p.parent) {
      p.onPath = true; p.expanded = true;
      if (p.status === 'consequence' || p.status === 'none' || p.status === 'match') p.status = 'contains';
    }
    root.expanded = true;
    return { root: root, culprit: culprit, key: key };
  }

  // ------------------------------------------------------------------ tree view
  var CHUNK = 400;
  function nodeLabel(n) {
    if (n.leaf) return n.name || n.nameB;
    if (n.path === '') return '(model)';
    return n.side === 'b' ? n.path : n.path.slice(n.path.lastIndexOf('.') + 1);
  }
  function renderNode(n) {
    var li = el('li');
    var hasKids = n.children.length > 0;
    var tw = el('span', { cls: 'tw', text: hasKids ? (n.expanded ? '\u25be' : '\u25b8') : '' });
    var alt = null;
    if (n.leaf && n.nameB && n.nameB !== n.name) alt = '\u2194 ' + n.nameB;
    if (!n.leaf && n.side === 'b') alt = 'candidate only';
    else if (!n.leaf && n.side === 'a') alt = 'baseline only';
    else if (!n.leaf && ((n.pathB !== null && n.pathB !== n.path) || (n.clsB && n.clsB !== n.cls)))
      alt = '\u2194 ' + (n.pathB !== null && n.pathB !== n.path ? (n.pathB || '(root)') + ' ' : '') + (n.clsB || '');
    var badge = (hasKids && !n.expanded && n.subBad) ? el('span', { cls: 'badge', text: n.subBad + ' differ' }) : null;
    var row = el('div', { cls: 'node st-' + n.status + (n.leaf ? ' leaf' : '') + (state.selected === n ? ' selected' : ''),
      title: (n.leaf ? n.name : (n.path || '(root)')) + ' \u2014 ' + stateText(n.status),
      'data-path': n.path, 'data-name': n.leaf ? n.name : '', 'data-status': n.status }, [
      tw, el('span', { cls: 'dot' }), el('span', { cls: 'label', text: nodeLabel(n) }),
      n.cls ? el('span', { cls: 'cls', text: n.cls }) : null, alt ? el('span', { cls: 'alt', text: alt }) : null, badge]);
    n.el = row;
    row.addEventListener('click', function (ev) {
      if (hasKids && (ev.target === tw || state.selected === n)) toggle(n, li);
      select(n);
    });
    li.appendChild(row);
    if (hasKids && n.expanded) li.appendChild(renderChildren(n));
    return li;
  }
  function renderChildren(n) {
    var ul = el('ul');
    var shown = 0;
    function more() {
      n.children.slice(shown, shown + CHUNK).forEach(function (c) { ul.appendChild(renderNode(c)); });
      shown = Math.min(n.children.length, shown + CHUNK);
      if (shown < n.children.length) {
        var li = el('li', {}, [el('button', { cls: 'link', text: 'show ' + Math.min(CHUNK, n.children.length - shown) + ' more of ' + (n.children.length - shown),
          onclick: function () { ul.removeChild(li); more(); } })]);
        ul.appendChild(li);
      }
    }
    more();
    return ul;
  }
  function toggle(n, li) {
    n.expanded = !n.expanded;
    var fresh = renderNode(n);
    li.parentNode.replaceChild(fresh, li);
  }
  function stateText(st) { for (var k = 0; k < STATES.length; k++) if (STATES[k][0] === st) return STATES[k][1]; return st; }

  // ------------------------------------------------------------------ details of a node
  function statsCell(i, stat) {
    return el('td', {}, [fmt(R[stat + '_a'][i]), el('br'), el('span', { cls: 'b', text: fmt(R[stat + '_b'][i]) })]);
  }
  function recordsTable(rows) {
    var head = el('tr', {}, ['entry', 'role', 'dtype', 'shape', 'min', 'max', 'mean', 'norm', 'error', 'tolerance', ''].map(function (h, k) {
      return el('th', { cls: k < 4 ? 'l' : '', text: h });
    }));
    var t = el('table', { cls: 'recs' }, [head]);
    rows.slice().sort(function (a, b) { return R.seq[a] - R.seq[b]; }).forEach(function (i) {
      var bad = s(R, 'status', i) === 'diverged', arg = s(R, 'dtype_a', i).slice(0, 3) === 'py.';
      t.appendChild(el('tr', { cls: isCulpritRow(i) && bad ? 'culprit' : (bad ? 'bad' : '') }, [
        el('td', { cls: 'l mono', title: s(R, 'name_b', i) }, [s(R, 'name_a', i)]),
        el('td', { cls: 'l', text: s(R, 'role', i) + ' ' + R.arg_index[i] }),
        el('td', { cls: 'l' }, [s(R, 'dtype_a', i), el('br'), el('span', { cls: 'b', text: s(R, 'dtype_b', i) })]),
        el('td', { cls: 'l' }, [s(R, 'shape_a', i), el('br'), el('span', { cls: 'b', text: s(R, 'shape_b', i) })]),
        statsCell(i, 'min'), statsCell(i, 'max'), statsCell(i, 'mean'), statsCell(i, 'norm'),
        el('td', { text: arg ? '' : fmt(R.err[i]) }), el('td', { text: arg ? '' : fmt(R.tol[i]) }),
        el('td', { text: bad ? 'differs' : 'ok' })]));
    });
    return t;
  }
  function culpritBox(withLink) {
    if (!F) return null;
    var ev = F.evidence || {};
    var box = el('div', { cls: 'culprit-box', id: withLink ? 'culprit-summary' : null }, [
      el('div', { cls: 'names mono', text: (F.name_a || '\u2013') + '  \u2194  ' + (F.name_b || '\u2013') }),
      el('div', { cls: 'muted', text: 'step ' + F.step + ', rank ' + F.rank + ', ' + F.direction + ' ' + F.kind +
        (F.module ? ', module ' + F.module : '') + (F.op ? ', op ' + F.op : '') + (F.role ? ', ' + F.role : '') }),
      el('div', { cls: 'why' }, [el('b', { text: 'Why: ' }), F.reason || ''])]);
    var items = [];
    [['inputs_bad', 'input that differs'], ['outputs_bad', 'differs']].forEach(function (pair) {
      (ev[pair[0]] || []).forEach(function (x) {
        var m = x.metrics || {};
        var shown = ['norm_a', 'norm_b', 'mean_a', 'mean_b', 'err', 'tol', 'cosine'].filter(function (k) { return m[k] !== undefined && m[k] !== null; })
          .map(function (k) { return k + ' ' + fmt(m[k]); }).join(', ');
        items.push(x.role + ' ' + x.arg_index + ' ' + pair[1] + (x.why || '') + (shown ? ': ' + shown : ''));
      });
    });
    (ev.arguments_bad || []).forEach(function (x) { items.push('argument ' + x.key + ': ' + x.a + ' vs ' + x.b); });
    if (ev.inputs_agreeing) items.push(ev.inputs_agreeing + ' input(s) agree');
    var calls = ev.calls_in_one_run_only || {};
    Object.keys(calls).forEach(function (who) { items.push('only the ' + who + ' calls ' + calls[who].join(', ')); });
    if (items.length) box.appendChild(el('ul', {}, items.map(function (t) { return el('li', { text: t }); })));
    if (F.chain && F.chain.length) {
      box.appendChild(el('div', { cls: 'why' }, [el('b', { text: 'How it was traced:' })]));
      box.appendChild(el('ol', {}, F.chain.map(function (c) {
        return el('li', { text: (c.text || '') + (c.name_a ? ' [' + c.name_a + (c.name_b && c.name_b !== c.name_a ? ' \u2194 ' + c.name_b : '') + ', step ' + c.step + ']' : '') });
      })));
    }
    if (withLink) box.appendChild(el('button', { cls: 'link', text: 'show it in the model tree', onclick: showCulprit }));
    return box;
  }
  function select(n) {
    if (state.selected && state.selected.el) state.selected.el.classList.remove('selected');
    state.selected = n;
    if (n.el) n.el.classList.add('selected');
    var box = document.getElementById('details');
    box.textContent = '';
    box.appendChild(el('h3', { cls: 'mono', text: n.leaf ? n.name : (n.path || '(model root)') }));
    var kv = el('div', { cls: 'kv' });
    function pair(k, v) { if (v) { kv.appendChild(el('div', { text: k })); kv.appendChild(el('div', { text: v })); } }
    pair('state', stateText(n.status) + (n.onPath ? ' (on the path to the first divergence)' : ''));
    if (!n.leaf) { pair('class', n.cls + (n.clsB && n.clsB !== n.cls ? '  \u2194 candidate ' + n.clsB : ''));
      if (n.pathB !== null && n.pathB !== n.path) pair('candidate path', n.pathB || '(root)'); }
    else { pair('module', n.path || '(root)'); if (n.nameB && n.nameB !== n.name) pair('candidate', n.nameB); }
    if (n.subBad) pair('records beyond tolerance', n.bad + ' here, ' + n.subBad + ' in this subtree');
    box.appendChild(kv);
    if (n.status === 'culprit') box.appendChild(culpritBox(false));
    if (n.rows.length) {
      box.appendChild(el('h4', { text: 'Records (baseline above, candidate below)' }));
      box.appendChild(recordsTable(n.rows));
    } else if (!n.unmatched.length) {
      box.appendChild(el('p', { cls: 'muted', text: n.leaf ? 'No compared records.' :
        'No records of this module itself (containers are not hooked, or the dump level leaves modules out); open it for its calls.' }));
    }
    if (n.unmatched.length) {
      box.appendChild(el('h4', { text: 'Records without a counterpart' }));
      box.appendChild(el('ul', {}, n.unmatched.slice(0, 50).map(function (j) {
        return el('li', { cls: 'mono', text: 'only in the ' + (s(U, 'side', j) === 'a' ? 'baseline' : 'candidate') + ': ' +
          s(U, 'name', j) + ' (' + s(U, 'role', j) + ' ' + U.arg_index[j] + ')' });
      })));
    }
    var bad = [];
    (function walk(c) { c.children.forEach(function (k) { if (k.bad && bad.length < 25) bad.push(k); walk(k); }); })(n);
    if (bad.length && !n.leaf) {
      box.appendChild(el('h4', { text: 'Inside it, beyond tolerance (first ' + bad.length + ')' }));
      box.appendChild(el('ul', {}, bad.map(function (k) {
        return el('li', {}, [el('button', { cls: 'link mono', text: (k.leaf ? k.name : k.path) + ' (' + stateText(k.status) + ')', onclick: function () { reveal(k); } })]);
      })));
    }
  }
  function reveal(n) {
    for (var p = n.parent; p; p = p.parent) p.expanded = true;
    drawTree();
    select(n);
    var box = document.getElementById('tree');
    if (n.el) box.scrollTop = Math.max(0, n.el.offsetTop - box.clientHeight / 2);
  }
  function inView(e, box) {   // drawn, and inside the scrolled tree pane
    if (!e || !e.offsetParent) return false;
    var r = e.getBoundingClientRect(), b = box.getBoundingClientRect();
    return r.width > 0 && r.height > 0 && r.top >= b.top && r.bottom <= b.bottom;
  }
  function showCulprit() {
    if (F && (state.step !== F.step || state.rank !== F.rank)) setFile(F.step, F.rank);
    if (state.model.culprit) reveal(state.model.culprit);
  }

  // ------------------------------------------------------------------ timeline
  function drawTimeline() {
    var box = document.getElementById('timeline');
    box.textContent = '';
    var rows = byFile[state.model.key] || [];
    DIRS.forEach(function (d) {
      var pts = rows.filter(function (i) { return s(R, 'direction', i) === d[0] && R.err[i] !== null; })
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
    var W = Math.max(600, canvas.parentNode.clientWidth || 1000), H = 190, dpr = window.devicePixelRatio || 1;
    canvas.width = W * dpr; canvas.height = H * dpr; canvas.style.height = H + 'px';
    var g = canvas.getContext('2d');
    g.scale(dpr, dpr);
    var L = 52, T = 12, PW = W - L - 12, PH = H - T - 22;
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
    g.fillText('execution order \u2192', L, H - 6);
    var cx = null, cy = null, cls = [];
    pts.forEach(function (i, k) {                 // consequences: shaded bands
      if (s(R, 'status', i) === 'diverged' && !isCulpritRow(i)) { g.fillStyle = 'rgba(255,159,28,0.13)'; g.fillRect(X(k) - 2, T, 4, PH); }
    });
    g.strokeStyle = '#555'; g.setLineDash([5, 4]); g.beginPath();   // tolerance of each record
    var pen = false, lastTol = null;     // exact records (integers: tolerance 0) break the line
    pts.forEach(function (i, k) {
      if (!R.tol[i]) { pen = false; return; }
      var y = Y(R.tol[i]); if (pen) g.lineTo(X(k), y); else g.moveTo(X(k), y); pen = true; lastTol = R.tol[i];
    });
    g.stroke(); g.setLineDash([]);
    if (lastTol !== null) { g.fillStyle = '#555'; g.fillText('tolerance', L + PW - 52, Y(lastTol) - 4); }
    var xs = pts.map(function (i, k) { return X(k); }), ys = pts.map(function (i) { return Y(R.err[i]); });
    pts.forEach(function (i, k) {
      var badRow = s(R, 'status', i) === 'diverged';
      if (badRow && isCulpritRow(i)) { cls.push(k); return; }
      g.fillStyle = badRow ? '#ff9f1c' : '#2e86c1';
      g.beginPath(); g.arc(xs[k], ys[k], badRow ? 2.6 : 1.8, 0, 7); g.fill();
    });
    cls.forEach(function (k) {
      cx = xs[k]; cy = ys[k];
      g.fillStyle = '#d62728'; g.strokeStyle = '#fff'; g.lineWidth = 1.5;
      g.beginPath(); g.arc(cx, cy, 5.5, 0, 7); g.fill(); g.stroke();
    });
    if (cx !== null) {
      var label = 'first divergence: ' + (F.name_a || F.name_b);
      g.font = 'bold 12px sans-serif'; g.fillStyle = '#b00020';
      var tw = g.measureText(label).width, lx = Math.min(Math.max(cx + 8, L), L + PW - tw);
      g.fillText(label, lx, cy > T + 16 ? cy - 9 : cy + 18);
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
  function nodeOfRow(i) {
    var found = null;
    (function walk(n) { if (found) return; if (n.rows.indexOf(i) >= 0) { found = n; return; } n.children.forEach(walk); })(state.model.root);
    return found;
  }

  // ------------------------------------------------------------------ page
  function drawTree() {
    var box = document.getElementById('tree');
    box.textContent = '';
    var ul = el('ul');
    ul.appendChild(renderNode(state.model.root));
    box.appendChild(ul);
  }
  function setFile(step, rank) {
    state.step = step; state.rank = rank; state.selected = null;
    if (window.history && history.replaceState) {
      try { history.replaceState(null, '', '#step=' + step + '&rank=' + rank); } catch (e) { /* file:// in some browsers */ }
    }
    document.getElementById('step-select').value = String(step);
    document.getElementById('rank-select').value = String(rank);
    state.model = buildModel(step, rank);
    drawTree();
    drawTimeline();
    var det = document.getElementById('details');
    det.textContent = '';
    det.appendChild(el('p', { cls: 'muted', text: 'Click a node of the tree, or a point of the timeline, for its records.' }));
  }
  function page() {
    var app = document.getElementById('app');
    var verdict = D.verdict === 'diverged' ? 'DIVERGED' : 'MATCH';
    var nbad = 0;
    for (var k = 0; k < R.count; k++) if (s(R, 'status', k) === 'diverged') nbad++;
    app.appendChild(el('header', {}, [
      el('h1', {}, [el('span', { cls: 'verdict ' + (D.verdict === 'diverged' ? 'diverged' : 'match'), text: verdict }),
        'precdbg compare' + (F ? ': first divergence at ' + (F.name_a || F.name_b) : '')]),
      el('div', { cls: 'runs', text: 'baseline ' + D.baseline.path + ' (' + (D.baseline.framework || '?') + ')   \u2194   candidate ' +
        D.candidate.path + ' (' + (D.candidate.framework || '?') + ')' }),
      el('div', { cls: 'runs', text: R.count + ' record pairs compared in ' + steps.length + ' step(s) and ' + ranks.length +
        ' rank(s), ' + nbad + ' beyond tolerance, ' + D.unmatched_count + ' without counterpart' })]));
    var main = el('main');
    app.appendChild(main);
    if (D.setup && D.setup.length) {
      main.appendChild(el('h2', { text: 'Set-up differences (precdbg check)' }));
      main.appendChild(el('ul', { cls: 'setup', id: 'setup' }, D.setup.map(function (f) {
        return el('li', {}, [el('span', { cls: 'sev sev-' + f.severity, text: f.severity }), f.message]);
      })));
    }
    if (F) { main.appendChild(el('h2', { text: 'First divergence' })); main.appendChild(culpritBox(true)); }
    var stepSel = el('select', { id: 'step-select', onchange: function () { setFile(+stepSel.value, state.rank); } },
      steps.map(function (v) { return el('option', { value: String(v), text: String(v) }); }));
    var rankSel = el('select', { id: 'rank-select', onchange: function () { setFile(state.step, +rankSel.value); } },
      ranks.map(function (v) { return el('option', { value: String(v), text: String(v) }); }));
    main.appendChild(el('div', { cls: 'controls' }, [el('label', {}, ['Step ', stepSel]), el('label', {}, ['Rank ', rankSel]),
      el('div', { cls: 'legend' }, STATES.map(function (st) {
        return el('span', { cls: 'st-' + st[0] }, [el('span', { cls: 'swatch dot', style: 'border-radius:50%' }), st[1]]);
      }))]));
    main.appendChild(el('h2', { text: 'Model (baseline module tree; the candidate\u2019s names beside where they differ)' }));
    main.appendChild(el('div', { cls: 'panes' }, [el('div', { cls: 'tree', id: 'tree' }), el('div', { cls: 'details', id: 'details' })]));
    main.appendChild(el('h2', { text: 'Relative error along execution order (log scale)' }));
    main.appendChild(el('div', { cls: 'timeline', id: 'timeline' }));
    var notes = (D.notes || []).concat(D.setup_notes || []);
    main.appendChild(el('details', { cls: 'text' }, [el('summary', { text: 'Text report' + (notes.length ? ' and notes' : '') }),
      el('pre', { text: D.summary_text })]));
    if (!steps.length) { document.getElementById('tree').appendChild(el('p', { text: 'Nothing was compared.' })); return; }
    var asked = /step=(\d+)&rank=(\d+)/.exec(location.hash || ''), start = F ? [F.step, F.rank] : [steps[0], ranks[0]];
    if (asked && byFile[asked[1] + '/' + asked[2]]) start = [+asked[1], +asked[2]];
    setFile(start[0], start[1]);
    document.body.setAttribute('data-file', state.step + '/' + state.rank);
    if (state.model.culprit) {
      reveal(state.model.culprit);
      document.body.setAttribute('data-culprit', inView(state.model.culprit.el, document.getElementById('tree')) ? 'visible' : 'hidden');
    } else {
      document.body.setAttribute('data-culprit', !F ? 'none' :
        (state.step === F.step && state.rank === F.rank ? 'missing' : 'elsewhere'));
    }
  }
  page();
})();

/* precdbg compare report: the data and the model of one step/rank file.
   Inlined by precdbg/compare/html_report.py into one function scope with the other
   report_assets/*.js, in the order of html_report._SCRIPTS. */
/* The page is drawn from the JSON in #precdbg-data (see html_report.py). No libraries, no
   network. Tree nodes are built per (step, rank) on demand and their children are put in the DOM
   only when expanded, so a 10,000-record, 8-rank compare stays responsive. */
  var began = window.performance ? performance.now() : 0;
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
        if (attrs[k] === null || attrs[k] === undefined) continue;
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

  function nodeOrder(n) { return n.group ? 2 : n.leaf ? 1 : 0; }   // modules, calls, then folded calls
  function callOf(name) { return name.replace(/\.\d+\.(forward|backward)$/, ''); }
  function lastBackward(key) {
    var last = -Infinity;
    (byFile[key] || []).forEach(function (i) { if (s(R, 'direction', i) === 'backward') last = Math.max(last, R.seq[i]); });
    return last;
  }
  // The group a call outside every module folds into: 'optimizer' for the calls made inside
  // optimizer.step() (phase optimizer: captured with include_optimizer), 'after_backward' for the
  // others after the step's last backward record (gradient clipping: dozens of Tensor.to, norm,
  // mul_ calls); null for the rest. `last` is lastBackward(...) of the record's step and rank.
  var LATE_GROUPS = {
    after_backward: { band: 'after the backward', row: '(clipping, after the backward)',
      label: 'after the backward (clipping)' },
    optimizer: { band: 'optimizer', row: '(optimizer step)', label: 'the optimizer step' }
  };
  function lateGroup(i, last) {
    if (s(R, 'module', i) !== '' || s(R, 'kind', i) !== 'api') return null;
    if (s(R, 'phase', i) === 'optimizer') return 'optimizer';
    return s(R, 'direction', i) === 'forward' && R.seq[i] > last ? 'after_backward' : null;
  }
  // Each group of late calls (see lateGroup) folds into one node at the root; inside it, each run
  // of three or more calls of one API folds into one node too ('Tensor.to \u00d7 24').
  function foldLateCalls(root, key, make, link) {
    var last = lastBackward(key), members = { after_backward: [], optimizer: [] };
    root.children.forEach(function (c) {
      if (!c.leaf || c.kind !== 'api' || !c.rows.length) return;
      var kind = lateGroup(c.rows[0], last);
      if (kind && c.rows.every(function (i) { return lateGroup(i, last) === kind; })) members[kind].push(c);
    });
    function group(kind, label, calls, parent) {
      var g = make('', '');
      g.group = kind; g.label = label; g.firstSeq = calls.length ? calls[0].firstSeq : Infinity;
      calls.forEach(function (c) { c.parent = g; g.children.push(c); });
      link(g, parent);
      return g;
    }
    Object.keys(LATE_GROUPS).forEach(function (kind) {
      var late = members[kind].sort(function (a, b) { return a.firstSeq - b.firstSeq; });
      if (late.length < 2) return;
      root.children = root.children.filter(function (c) { return late.indexOf(c) < 0; });
      var folded = group(kind, LATE_GROUPS[kind].label + ': ' + late.length + ' calls', [], root);
      folded.firstSeq = late[0].firstSeq;
      for (var k = 0; k < late.length;) {
        var j = k;
        while (j < late.length && callOf(late[j].name) === callOf(late[k].name)) j++;
        if (j - k >= 3) group('run', callOf(late[k].name) + ' \u00d7 ' + (j - k), late.slice(k, j), folded);
        else late.slice(k, j).forEach(function (c) { link(c, folded); });
        k = j;
      }
    });
  }

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
      // a culprit without a pair (only in one run, or two calls of other names: a structural
      // verdict) is marked at the baseline's record, or the candidate's where the baseline has none
      if (F && F.step === step && F.rank === rank && name === (side === 'a' ? F.name_a : F.name_b) &&
          (side === 'a' || !F.name_a)) n.culprit = true;
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
    foldLateCalls(root, key, make, link);
    var culprit = null;
    (function finish(n) {
      n.children.forEach(finish);
      if (!n.group) n.children.sort(function (a, b) { return nodeOrder(a) - nodeOrder(b) || (a.leaf || a.group ? a.firstSeq - b.firstSeq : 0); });
      if (!n.leaf && n.side !== 'b' && !n.group) {
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


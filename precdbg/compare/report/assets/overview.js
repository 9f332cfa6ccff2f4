/* precdbg compare report: the per-module overview, a heat map of error over tolerance.
   Inlined by precdbg/compare/report/html.py into one function scope with the other
   assets/*.js, in the order of html._SCRIPTS. */
  // ------------------------------------------------------------------ overview
  // One row per module (the calls outside every module after the backward, and the optimizer's, as
  // a row each: model.js lateGroup), one
  // column per step and direction: forward, backward (dx), dw (the parameters' gradients). A cell
  // holds the worst error / tolerance of the module's records there (tensors only; an exact record,
  // tolerance 0, that differs counts as 1e9), on the selected rank. The culprit's cell is marked.
  var OV_DIRS = [['fwd', 'forward'], ['bwd', 'backward (dx)'], ['dw', 'parameter gradients (dw)']];
  var LATE = '\u0000';                // prefixes a late group's id in a row's path
  var overview = { sort: 'order' };
  function ratioOf(i) {
    var e = R.err[i], t = R.tol[i];
    if (e === null || s(R, 'dtype_a', i).slice(0, 3) === 'py.') return null;
    return t > 0 ? e / t : (e > 0 ? 1e9 : 0);
  }
  function columnOf(i) {
    var kind = s(R, 'kind', i), dir = s(R, 'direction', i);
    if (kind === 'param_grad') return 'dw';
    if (kind === 'param') return null;
    return dir === 'forward' ? 'fwd' : dir === 'backward' ? 'bwd' : null;
  }
  function overviewData(rank) {
    var mods = {}, list = [];
    steps.forEach(function (step) {
      var key = step + '/' + rank, last = lastBackward(key);
      (byFile[key] || []).forEach(function (i) {
        var col = columnOf(i), r = ratioOf(i);
        if (!col || r === null) return;
        var path = s(R, 'module', i);
        var late = lateGroup(i, last);
        if (late) path = LATE + late;
        var m = mods[path];
        if (!m) { m = mods[path] = { path: path, cells: {}, first: Infinity, worst: 0, culprit: null }; list.push(m); }
        m.first = Math.min(m.first, step * 1e12 + R.seq[i]);
        var c = step + '|' + col;
        m.cells[c] = Math.max(m.cells[c] === undefined ? 0 : m.cells[c], r);
        m.worst = Math.max(m.worst, r);
        if (isCulpritRow(i)) m.culprit = c;
      });
    });
    return list;
  }
  function heat(r) {     // within tolerance: shades of green; beyond: orange to red
    if (r <= 1) { var a = Math.max(0, Math.min(1, (Math.log10(Math.max(r, 1e-6)) + 6) / 6)); return 'rgba(46,139,87,' + (0.08 + 0.32 * a).toFixed(2) + ')'; }
    var b = Math.min(1, Math.log10(r) / 3);
    return 'rgb(' + Math.round(255 - 41 * b) + ',' + Math.round(200 - 161 * b) + ',' + Math.round(120 - 80 * b) + ')';
  }
  function ratioText(r) { return r >= 1e9 ? 'exact' : r >= 100 ? r.toExponential(0) : String(Number(r.toPrecision(2))); }
  function drawOverview() {
    var box = document.getElementById('overview');
    box.textContent = '';
    var list = overviewData(state.rank).filter(function (m) { return Object.keys(m.cells).length; });
    if (overview.sort === 'worst') list.sort(function (a, b) { return b.worst - a.worst || a.first - b.first; });
    else list.sort(function (a, b) { return a.first - b.first; });
    var cols = Object.create(null);          // the directions some module has, per step
    list.forEach(function (m) { Object.keys(m.cells).forEach(function (c) { cols[c] = true; }); });
    var dirs = OV_DIRS.filter(function (d) { return steps.some(function (st) { return cols[st + '|' + d[0]]; }); });
    var sortBtn = el('button', { cls: 'link', id: 'overview-sort', text: overview.sort === 'worst' ? 'in execution order' : 'worst first',
      onclick: function () { overview.sort = overview.sort === 'worst' ? 'order' : 'worst'; drawOverview(); } });
    box.appendChild(el('p', { cls: 'muted' }, ['Worst error \u00f7 tolerance of each module\u2019s records, rank ' + state.rank +
      ' (above 1: beyond tolerance; \u25c6 the first divergence). Click a cell for the module in the tree. Sort: ', sortBtn]));
    var head1 = el('tr', {}, [el('th', { cls: 'l', rowspan: '2', text: 'module' })].concat(steps.map(function (st) {
      return el('th', { colspan: String(dirs.length), cls: 'stepcol', text: 'step ' + st });
    })));
    var head2 = el('tr', {}, [].concat.apply([], steps.map(function () {
      return dirs.map(function (d, k) { return el('th', { cls: k === 0 ? 'stepcol' : '', title: d[1], text: d[0] }); });
    })));
    var table = el('table', { cls: 'heat', id: 'overview-table' }, [head1, head2]);
    list.forEach(function (m) {
      var late = m.path.charAt(0) === LATE ? m.path.slice(1) : null;
      var depth = late || m.path === '' ? 0 : m.path.split('.').length - 1;
      var name = late ? LATE_GROUPS[late].row : m.path === '' ? '(model)' : m.path;
      var tr = el('tr', { cls: m.culprit ? 'culprit' : '', 'data-module': late || m.path }, [
        el('td', { cls: 'l mono name', style: overview.sort === 'order' ? 'padding-left:' + (5 + 10 * depth) + 'px' : null, text: name })]);
      steps.forEach(function (st) {
        dirs.forEach(function (d, k) {
          var c = st + '|' + d[0], r = m.cells[c];
          var td = el('td', { cls: 'cell' + (k === 0 ? ' stepcol' : '') + (m.culprit === c ? ' culprit' : '') + (r > 1 ? ' bad' : ''),
            title: name + ', step ' + st + ', ' + d[1] + (r === undefined ? ': no records' : ': error / tolerance ' + ratioText(r)),
            'data-ratio': r === undefined ? null : String(r), 'data-step': String(st), 'data-dir': d[0],
            text: r === undefined ? '' : (m.culprit === c ? '\u25c6 ' : '') + ratioText(r) });
          if (r !== undefined) td.style.background = heat(r);
          td.addEventListener('click', function () { openModule(m.path, st); });
          tr.appendChild(td);
        });
      });
      table.appendChild(tr);
    });
    box.appendChild(el('div', { cls: 'heat-wrap' }, [table]));
  }
  function showView(which) {
    document.getElementById('panes').style.display = which === 'tree' ? '' : 'none';
    document.getElementById('overview').style.display = which === 'overview' ? '' : 'none';
    document.getElementById('view-tree').className = which === 'tree' ? 'on' : '';
    document.getElementById('view-overview').className = which === 'overview' ? 'on' : '';
    document.body.setAttribute('data-view', which);
    if (which === 'overview') drawOverview();
  }
  function openModule(path, step) {
    if (step !== state.step) setFile(step, state.rank);
    showView('tree');
    var found = null;
    (function walk(n) {
      if (found) return;
      var late = path.charAt(0) === LATE ? path.slice(1) : null;
      if (late ? n.group === late : (!n.leaf && !n.group && n.side !== 'b' && n.path === path)) { found = n; return; }
      n.children.forEach(walk);
    })(state.model.root);
    if (found) reveal(found);
  }

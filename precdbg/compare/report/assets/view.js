/* precdbg compare report: the tree view and a node's details.
   Inlined by precdbg/compare/html_report.py into one function scope with the other
   report_assets/*.js, in the order of html_report._SCRIPTS. */
  // ------------------------------------------------------------------ tree view
  var CHUNK = 400;
  function nodeLabel(n) {
    if (n.leaf) return n.name || n.nameB;
    if (n.group) return n.label;
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
      alt = '\u2194 ' + [n.pathB !== null && n.pathB !== n.path ? (n.pathB || '(root)') : '',
        n.clsB && n.clsB !== n.cls ? n.clsB : ''].filter(Boolean).join(' ');
    var badge = (hasKids && !n.expanded && n.subBad) ? el('span', { cls: 'badge', text: n.subBad + ' differ inside', title: n.subBad + ' records in this subtree are beyond tolerance' }) : null;
    var row = el('div', { cls: 'node st-' + n.status + (n.leaf ? ' leaf' : '') + (state.selected === n ? ' selected' : ''),
      title: (n.leaf ? n.name : n.group ? n.label : (n.path || '(root)')) + ' \u2014 ' + stateText(n.status),
      'data-path': n.path, 'data-name': n.leaf ? n.name : '', 'data-group': n.group || null, 'data-status': n.status }, [
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
  function breakable(name) {   // an entry name that may wrap after each dot
    var out = [];
    name.split('.').forEach(function (part, k, all) { out.push(part + (k < all.length - 1 ? '.' : '')); if (k < all.length - 1) out.push(el('wbr')); });
    return out;
  }
  function recordsTable(rows) {
    var head = el('tr', {}, ['entry', 'role', 'dtype', 'shape', 'min', 'max', 'mean', 'norm', 'error', 'tolerance', ''].map(function (h, k) {
      return el('th', { cls: k < 4 ? 'l' : '', text: h });
    }));
    var t = el('table', { cls: 'recs' }, [head]);
    rows.slice().sort(function (a, b) { return R.seq[a] - R.seq[b]; }).forEach(function (i) {
      var bad = s(R, 'status', i) === 'diverged', arg = s(R, 'dtype_a', i).slice(0, 3) === 'py.';
      t.appendChild(el('tr', { cls: isCulpritRow(i) && bad ? 'culprit' : (bad ? 'bad' : '') }, [
        el('td', { cls: 'l mono name', title: s(R, 'name_b', i) }, breakable(s(R, 'name_a', i))),
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
        (F.module ? ', module ' + F.module : '') + (F.op ? ', op ' + F.op : '') + (F.role ? ', ' + F.role : '') +
        (F.when ? ', ' + F.when : '') }),
      el('div', { cls: 'why' }, [el('b', { text: 'Why: ' }), F.reason || ''])]);
    var sites = F.call_site || {};
    Object.keys(sites).forEach(function (label) {
      box.appendChild(el('div', { cls: 'muted mono', text: 'called at ' + sites[label] + ' (' + label + ')' }));
    });
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
        var where = c.name_a || c.name_b ? el('button', { cls: 'link mono', onclick: function () { showEntry(c); },
          text: (c.name_a || c.name_b) + (c.name_b && c.name_a && c.name_b !== c.name_a ? ' \u2194 ' + c.name_b : '') + ', step ' + c.step }) : null;
        return el('li', {}, [(c.text || '') + ' ', where ? '[' : null, where, where ? ']' : null]);
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
    box.appendChild(el('h3', { cls: 'mono', text: n.leaf ? n.name : n.group ? n.label : (n.path || '(model root)') }));
    var kv = el('div', { cls: 'kv' });
    function pair(k, v) { if (v) { kv.appendChild(el('div', { text: k })); kv.appendChild(el('div', { text: v })); } }
    pair('state', stateText(n.status) + (n.onPath ? ' (on the path to the first divergence)' : ''));
    if (!n.leaf) { pair('class', n.cls + (n.clsB && n.clsB !== n.cls ? '  \u2194 candidate ' + n.clsB : ''));
      if (n.pathB !== null && n.pathB !== n.path) pair('candidate path', n.pathB || '(root)'); }
    else { pair('module', n.path || '(root)'); if (n.nameB && n.nameB !== n.name) pair('candidate', n.nameB); }
    if (n.subBad) pair('records beyond tolerance', n.bad + ' here, ' + n.subBad + ' in this subtree');
    box.appendChild(kv);
    if (n.status === 'culprit') box.appendChild(culpritBox(false));
    var own = n.rows;
    if (n.group) (function all(g) { g.children.forEach(function (c) { own = own.concat(c.rows); all(c); }); })(n);
    if (!n.leaf) {   // a module's parameters (value at the start, dw) belong with its records
      n.children.forEach(function (c) { if (c.leaf && (c.kind === 'param' || c.kind === 'param_grad')) own = own.concat(c.rows); });
    }
    if (own.length) {
      box.appendChild(el('h4', { text: 'Records (baseline above, candidate below)' }));
      box.appendChild(recordsTable(own));
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
  function showEntry(c) {
    if (c.step !== state.step || c.rank !== state.rank) setFile(c.step, c.rank);
    var found = null;
    (function walk(n) {
      if (found) return;
      if (n.rows.some(function (i) { return s(R, 'name_a', i) === c.name_a && s(R, 'name_b', i) === c.name_b; })) { found = n; return; }
      n.children.forEach(walk);
    })(state.model.root);
    if (found) reveal(found);
  }
  function showCulprit() {
    if (F && (state.step !== F.step || state.rank !== F.rank)) setFile(F.step, F.rank);
    if (state.model.culprit) reveal(state.model.culprit);
  }


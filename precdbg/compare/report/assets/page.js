/* precdbg compare report: the page, the step/rank selectors; starts everything.
   Inlined by precdbg/compare/report/html.py into one function scope with the other
   assets/*.js, in the order of html._SCRIPTS. */
  // ------------------------------------------------------------------ page
  function drawTree() {
    var box = document.getElementById('tree');
    box.textContent = '';
    var ul = el('ul');
    ul.appendChild(renderNode(state.model.root));
    box.appendChild(ul);
  }
  function setFile(step, rank) {
    if (!byFile[step + '/' + rank]) {    // this step was not compared on this rank: its first rank
      var other = ranks.filter(function (r) { return byFile[step + '/' + r]; });
      if (other.length) rank = other[0];
    }
    state.step = step; state.rank = rank; state.selected = null;
    if (window.history && history.replaceState) {
      try { history.replaceState(null, '', '#step=' + step + '&rank=' + rank); } catch (e) { /* file:// in some browsers */ }
    }
    document.getElementById('step-select').value = String(step);
    document.getElementById('rank-select').value = String(rank);
    state.model = buildModel(step, rank);
    drawTree();
    drawTimeline();
    if (document.body.getAttribute('data-view') === 'overview') drawOverview();
    var det = document.getElementById('details');
    det.textContent = '';
    det.appendChild(el('p', { cls: 'muted', text: 'Click a node of the tree, or a point of the timeline, for its records.' }));
  }
  function page() {
    var app = document.getElementById('app');
    var verdict = D.verdict === 'diverged' ? 'DIVERGED' : D.verdict === 'incomplete' ? 'INCOMPLETE' : 'MATCH';
    var nbad = 0;
    for (var k = 0; k < R.count; k++) if (s(R, 'status', k) === 'diverged') nbad++;
    app.appendChild(el('header', {}, [
      el('h1', {}, [el('span', { cls: 'verdict ' + (D.verdict === 'diverged' ? 'diverged' : D.verdict === 'incomplete' ? 'incomplete' : 'match'), text: verdict }),
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
    var notes = (D.notes || []).concat(D.setup_notes || []);
    if (notes.length) {
      main.appendChild(el('ul', { cls: 'notes', id: 'notes' }, notes.map(function (n) {
        return el('li', {}, [el('span', { cls: 'sev sev-info', text: 'note' }),
          String(n && n.text !== undefined ? n.text : n)]);
      })));
    }
    var stepSel = el('select', { id: 'step-select', onchange: function () { setFile(+stepSel.value, state.rank); } },
      steps.map(function (v) { return el('option', { value: String(v), text: String(v) }); }));
    var rankSel = el('select', { id: 'rank-select', onchange: function () { setFile(state.step, +rankSel.value); } },
      ranks.map(function (v) { return el('option', { value: String(v), text: String(v) }); }));
    main.appendChild(el('div', { cls: 'controls' }, [el('label', {}, ['Step ', stepSel]), el('label', {}, ['Rank ', rankSel]),
      el('div', { cls: 'legend' }, STATES.map(function (st) {
        return el('span', { cls: 'st-' + st[0] }, [el('span', { cls: 'swatch dot', style: 'border-radius:50%' }), st[1]]);
      }))]));
    main.appendChild(el('div', { cls: 'views' }, [el('h2', { text: 'Model' }),
      el('button', { id: 'view-tree', cls: 'on', text: 'module tree', title: 'the baseline\u2019s module tree; the candidate\u2019s names beside where they differ',
        onclick: function () { showView('tree'); } }),
      el('button', { id: 'view-overview', text: 'overview by module', title: 'each module\u2019s worst error over tolerance per step and direction',
        onclick: function () { showView('overview'); } })]));
    main.appendChild(el('div', { cls: 'panes', id: 'panes' }, [el('div', { cls: 'tree', id: 'tree' }), el('div', { cls: 'details', id: 'details' })]));
    main.appendChild(el('div', { cls: 'overview', id: 'overview', style: 'display:none' }));
    main.appendChild(el('h2', { text: 'Relative error along execution order (log scale)' }));
    main.appendChild(el('div', { cls: 'timeline', id: 'timeline' }));
    main.appendChild(el('details', { cls: 'text' }, [el('summary', { text: 'Text report (as precdbg compare prints it)' }),
      el('pre', { text: D.summary_text })]));
    if (!steps.length) { document.getElementById('tree').appendChild(el('p', { text: 'Nothing was compared.' })); return; }
    var asked = /step=(\d+)&rank=(\d+)/.exec(location.hash || ''), start = F ? [F.step, F.rank] : [steps[0], ranks[0]];
    if (asked && byFile[asked[1] + '/' + asked[2]]) start = [+asked[1], +asked[2]];
    setFile(start[0], start[1]);
    document.body.setAttribute('data-file', state.step + '/' + state.rank);
    if (window.performance) document.body.setAttribute('data-render-ms', String(Math.round(performance.now() - began)));
    if (state.model.culprit) {
      reveal(state.model.culprit);
      document.body.setAttribute('data-culprit', inView(state.model.culprit.el, document.getElementById('tree')) ? 'visible' : 'hidden');
    } else {
      document.body.setAttribute('data-culprit', !F ? 'none' :
        (state.step === F.step && state.rank === F.rank ? 'missing' : 'elsewhere'));
    }
  }
  page();

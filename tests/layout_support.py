"""Measure a page's layout in a live browser (tests/browser_support.py): how tall it is, the
blank vertical gaps between what it shows, and which tables are cut off on the right.

`measure(browser)` runs MEASURE_JS (a function of a CSS selector) in the open page and returns a dict:
  height          document height (CSS px)
  page_overflow   scrollWidth - clientWidth of the document (> 0: the page scrolls sideways)
  gaps            the blank vertical stretches, largest first, each {"top", "height", "after"}:
                  rows of the page (the full width) where nothing is drawn (no text, canvas,
                  control), content hidden by a scrolling box counted as not drawn; "after" names
                  the element holding the last content above the gap
  boxes           per visible panel matched by `boxes`: {"id", "height", "blank"}, the blank
                  height (px) between its content's end and its bottom edge
  tables          per visible table: {"id", "overflow"}, how far (px) it reaches past the right
                  edge of the box that clips it (its scrolling ancestor, else the window)
"""
from __future__ import annotations

import json
from typing import Any, Dict

MEASURE_JS = r"""(BOXES) => {
  const doc = document.documentElement, sx = window.scrollX, sy = window.scrollY;
  function clips(e) {            // ancestors that cut off what overflows them
    const out = [];
    for (let p = e.parentElement; p && p !== doc; p = p.parentElement) {
      const cs = getComputedStyle(p);
      if (cs.overflowX !== 'visible' || cs.overflowY !== 'visible') out.push(p);
    }
    return out;
  }
  function clipped(r, e) {
    let top = r.top, bottom = r.bottom;
    for (const p of clips(e)) {
      const b = p.getBoundingClientRect();
      top = Math.max(top, b.top + p.clientTop);
      bottom = Math.min(bottom, b.top + p.clientTop + p.clientHeight);
    }
    return bottom > top ? [top + sy, bottom + sy] : null;
  }
  const spans = [];
  const walker = document.createTreeWalker(document.body, NodeFilter.SHOW_TEXT);
  for (let t = walker.nextNode(); t; t = walker.nextNode()) {
    if (!t.textContent.trim() || !t.parentElement || t.parentElement.closest('script,style,noscript')) continue;
    const range = document.createRange(); range.selectNodeContents(t);
    for (const r of range.getClientRects()) {
      if (r.width < 1 || r.height < 1) continue;
      const c = clipped(r, t.parentElement);
      if (c) spans.push([c[0], c[1], t.parentElement]);
    }
  }
  for (const e of document.querySelectorAll('canvas, select, button, input, .dot, .cell')) {
    const r = e.getBoundingClientRect();
    if (r.width < 1 || r.height < 1) continue;
    const c = clipped(r, e);
    if (c) spans.push([c[0], c[1], e]);
  }
  spans.sort((a, b) => a[0] - b[0]);
  const gaps = [];
  let reach = 0, last = null;
  for (const [top, bottom, e] of spans) {
    if (top > reach + 0.5) gaps.push({top: Math.round(reach), height: Math.round(top - reach),
      after: last ? (last.id || (last.closest('[id]') || {}).id || last.tagName) : 'top'});
    if (bottom > reach) { reach = bottom; last = e; }
  }
  gaps.push({top: Math.round(reach), height: Math.round(doc.scrollHeight - reach), after: 'end'});
  gaps.sort((a, b) => b.height - a.height);
  const tables = [];
  for (const t of document.querySelectorAll('table')) {
    const r = t.getBoundingClientRect();
    if (r.width < 1 || r.height < 1) continue;
    let right = doc.clientWidth;
    for (const p of clips(t)) {
      const cs = getComputedStyle(p);
      if (cs.overflowX === 'visible') continue;
      const b = p.getBoundingClientRect();
      right = Math.min(right, b.left + p.clientLeft + p.clientWidth - parseFloat(cs.paddingRight));
    }
    tables.push({id: t.id || t.className || (t.closest('[id]') || {}).id || 'table',
      overflow: Math.round(r.right - right)});
  }
  const boxes = [];
  for (const b of document.querySelectorAll(BOXES)) {
    const r = b.getBoundingClientRect();
    if (r.width < 1 || r.height < 1) continue;
    let bottom = r.top + sy + b.clientTop;
    for (const [, end, e] of spans) if (b.contains(e)) bottom = Math.max(bottom, end);
    boxes.push({id: b.id, height: Math.round(r.height), blank: Math.round(r.bottom + sy - bottom)});
  }
  return {height: doc.scrollHeight, boxes: boxes, width: doc.clientWidth,
          page_overflow: doc.scrollWidth - doc.clientWidth, gaps: gaps.slice(0, 6), tables: tables};
}"""


def measure(browser: Any, boxes: str = "#tree, #details, #overview") -> Dict[str, Any]:
    """MEASURE_JS's answer for the page open in `browser`; `boxes`: a CSS selector of the
    panels whose blank space below their content is measured."""
    return browser.js(f"({MEASURE_JS})({json.dumps(boxes)})")

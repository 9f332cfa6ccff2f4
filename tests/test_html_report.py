"""The HTML report of `precdbg compare --html`: the data embedded in the page against the JSON
report of the same compare, the module trees against the dumps, and the page as a real browser
draws it (headless Chromium when `chromium` is on PATH, skipped otherwise: the culprit's node is
open, visible, highlighted and selected; the screenshot shows it in the culprit's colour; driven
through tests/browser_support.py, a click lists a node's records, the rank selector redraws the
tree, hovering the timeline names its records). PRECDBG_SCREENSHOT_DIR=DIR keeps the screenshot.

Dumps: the tiny seeded GPT of compare_support, a clean baseline against the GELU-tanh defect,
each with its rank-0 files also copied as rank 1 (the same records under another rank), so the
page has two ranks to choose from.
"""
from __future__ import annotations

import glob
import json
import math
import os
import re
import shutil
import subprocess
from html.parser import HTMLParser
from typing import Any, Dict, List, Tuple

import h5py
import pytest

import compare_support as cs
from precdbg import open_dump
from precdbg.compare.report.html import ROW_NUMBER_COLUMNS, ROW_STRING_COLUMNS
from precdbg.storage.step_checks import reseal

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
CULPRIT = "Functional.gelu.1.forward"    # the second GELU call: blocks.1
CULPRIT_MODULE = "blocks.1.mlp.act"


def _with_rank_1(root: str) -> str:
    """Copy every step's rank0.h5 to rank1.h5 (its rank attribute rewritten): a 2-rank dump."""
    for path in glob.glob(os.path.join(root, "step*", "rank0.h5")):
        copy = os.path.join(os.path.dirname(path), "rank1.h5")
        shutil.copyfile(path, copy)
        with h5py.File(copy, "r+") as handle:
            handle.attrs["rank"] = 1
        reseal(copy)                   # an edit on purpose: sealed again
    return root


@pytest.fixture(scope="module")
def report(tmp_path_factory) -> Dict[str, Any]:
    """`precdbg compare base gelu_tanh --json --html` run once: the paths and both outputs."""
    root = tmp_path_factory.mktemp("html")
    base = _with_rank_1(cs.dump_gpt(str(root / "base")))
    cand = _with_rank_1(cs.dump_gpt(str(root / "gelu"), defect="gelu_tanh"))
    out = {"json": str(root / "report.json"), "html": str(root / "report.html")}
    proc = cs.run_cli("compare", base, cand, "--json", out["json"], "--html", out["html"])
    assert proc.returncode == 1, proc.stdout + proc.stderr
    with open(out["json"], encoding="utf-8") as handle:
        result = json.load(handle)
    with open(out["html"], encoding="utf-8") as handle:
        page = handle.read()
    return {"root": str(root), "base": base, "cand": cand, "result": result, "page": page,
            "html": out["html"]}


def _embedded(page: str) -> Dict[str, Any]:
    found = re.search(r'<script type="application/json" id="precdbg-data">(.*?)</script>', page,
                      re.S)
    assert found, "the page holds no #precdbg-data element"
    return json.loads(found.group(1))


def _same_number(a: Any, b: Any) -> bool:
    if a is None or b is None:
        return a is None and b is None
    return math.isclose(float(a), float(b), rel_tol=1e-5, abs_tol=1e-300)


# =========================================================================== plain checks
def test_page_is_self_contained(report):
    page = report["page"]
    assert page.startswith("<!doctype html>") and page.rstrip().endswith("</html>")
    assert "http://" not in page and "https://" not in page
    assert not re.search(r"<(script|img|iframe)[^>]*\ssrc=|<link\b", page), \
        "the page loads something from outside itself"


def test_embedded_rows_are_the_json_report_rows(report):
    data, result = _embedded(report["page"]), report["result"]
    strings, rows = data["strings"], data["rows"]
    assert rows["count"] == len(result["rows"]) > 0
    for column, values in rows.items():     # a column of one value is stored as that value
        if column != "count" and not isinstance(values, list):
            rows[column] = [values] * rows["count"]
    assert {r["rank"] for r in result["rows"]} == {0, 1}
    for k, row in enumerate(result["rows"]):
        for column in ROW_STRING_COLUMNS:
            got = strings[rows[column][k]]
            if column.startswith("shape_"):
                want = "x".join(map(str, row[column])) if row[column] else "scalar"
            elif column == "module_b":
                want = row.get("module_b", row["module"])
            else:
                want = str(row[column])
            assert got == want, (k, column, got, want)
        for column in ROW_NUMBER_COLUMNS:
            assert _same_number(rows[column][k], row.get(column)), \
                (k, column, rows[column][k], row.get(column))


def test_embedded_verdict_culprit_and_setup_are_the_json_report(report):
    data, result = _embedded(report["page"]), report["result"]
    assert data["verdict"] == result["verdict"] == "diverged"
    assert data["first_divergence"] == result["first_divergence"]
    assert data["first_divergence"]["name_a"] == CULPRIT
    assert data["first_divergence"]["module"] == CULPRIT_MODULE
    assert data["setup"] == result["setup"]
    assert data["consequences"] == result["consequences"]
    assert data["unmatched_count"] == result["unmatched_count"]
    assert data["unmatched"]["count"] == len(result["unmatched"])


def test_embedded_module_trees_are_the_dumps(report):
    data = _embedded(report["page"])
    for side, path in (("a", report["base"]), ("b", report["cand"])):
        with open_dump(path) as dump:
            for rank in (0, 1):
                tree = data["trees"][data["tree_of"][side][f"0/{rank}"]]
                want = dump.modules(step=0, rank=rank)
                assert list(zip(tree["path"], tree["cls"], tree["parent"])) == want
    # both runs have the same tree, so the page stores it once
    assert len(data["trees"]) == 1


def test_page_without_its_dumps_still_renders_from_the_records(report, tmp_path):
    from precdbg.compare.report.html import page_data, render_html
    moved = dict(report["result"], baseline={"path": str(tmp_path / "gone"), "framework": ""})
    page = render_html(moved, trees={})
    data = _embedded(page)
    assert data["trees"] == [] and data["rows"]["count"] == len(moved["rows"])
    assert page_data(moved, {})["first_divergence"]["name_a"] == CULPRIT


# =========================================================================== in a browser
class _Nodes(HTMLParser):
    """Every tree node (div.node) of a dumped DOM, and the body's attributes."""

    def __init__(self) -> None:
        super().__init__()
        self.nodes: List[Dict[str, str]] = []
        self.body: Dict[str, str] = {}

    def handle_starttag(self, tag: str, attrs: List[Tuple[str, Any]]) -> None:
        found = {k: v or "" for k, v in attrs}
        if tag == "body":
            self.body = found
        elif tag == "div" and "node" in found.get("class", "").split():
            self.nodes.append(found)


def _chromium(profile: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
         "--no-first-run", "--hide-scrollbars", f"--user-data-dir={profile}",
         "--window-size=1400,1100", "--virtual-time-budget=5000", *args],
        capture_output=True, text=True, timeout=120)


@pytest.mark.skipif(CHROMIUM is None, reason="chromium is not on PATH (apt-get install chromium)")
def test_browser_opens_the_tree_at_the_culprit(report, tmp_path):
    url = "file://" + os.path.abspath(report["html"])
    proc = _chromium(str(tmp_path / "profile"), "--dump-dom", url)
    assert proc.returncode == 0, proc.stderr[-2000:]
    dom = _Nodes()
    dom.feed(proc.stdout)
    assert dom.body.get("data-culprit") == "visible", \
        f"the page reports the culprit's node as {dom.body.get('data-culprit')!r}"
    culprits = [n for n in dom.nodes if n.get("data-status") == "culprit"]
    assert [n["data-name"] for n in culprits] == [CULPRIT], culprits
    assert {"st-culprit", "selected"} <= set(culprits[0]["class"].split())
    assert culprits[0]["data-path"] == CULPRIT_MODULE
    # the path from the root to the culprit is open: every enclosing module is drawn, marked
    drawn = {n["data-path"]: n["data-status"] for n in dom.nodes if not n.get("data-name")}
    for path in ("", "blocks", "blocks.1", "blocks.1.mlp", CULPRIT_MODULE):
        assert drawn.get(path) == "contains", (path, drawn.get(path))
    # lazily drawn: what lies under a closed node is not in the DOM (blocks.0 is closed)
    assert drawn.get("blocks.0") == "consequence"
    assert not [n for n in dom.nodes if n["data-path"].startswith("blocks.0.")]


@pytest.mark.skipif(CHROMIUM is None, reason="chromium is not on PATH (apt-get install chromium)")
def test_browser_screenshot_shows_the_culprit_highlighted(report, tmp_path):
    image = pytest.importorskip("PIL.Image")
    shot = str(tmp_path / "report.png")
    proc = _chromium(str(tmp_path / "profile"), f"--screenshot={shot}",
                     "file://" + os.path.abspath(report["html"]))
    assert proc.returncode == 0 and os.path.isfile(shot), proc.stderr[-2000:]
    with image.open(shot) as img:
        pixels = img.convert("RGB")
        width, height = pixels.size
        colours = pixels.getcolors(width * height)
    counts = {rgb: n for n, rgb in colours}
    highlight = counts.get((0xfd, 0xe2, 0xe2), 0)   # the culprit node's background
    red = sum(n for rgb, n in counts.items()
              if abs(rgb[0] - 0xd6) < 12 and abs(rgb[1] - 0x27) < 12 and abs(rgb[2] - 0x28) < 12)
    assert highlight > 1000, f"culprit highlight: {highlight} pixels"
    assert red > 100, f"culprit red: {red} pixels"
    keep = os.environ.get("PRECDBG_SCREENSHOT_DIR")
    if keep:   # for a person to look at
        os.makedirs(keep, exist_ok=True)
        shutil.copyfile(shot, os.path.join(keep, "report.png"))


def _dom_of(url: str, profile: str) -> _Nodes:
    proc = _chromium(profile, "--dump-dom", url)
    assert proc.returncode == 0, proc.stderr[-2000:]
    dom = _Nodes()
    dom.feed(proc.stdout)
    dom.text = proc.stdout
    return dom


@pytest.mark.skipif(CHROMIUM is None, reason="chromium is not on PATH (apt-get install chromium)")
def test_browser_opens_another_rank_from_the_address(report, tmp_path):
    dom = _dom_of("file://" + os.path.abspath(report["html"]) + "#step=0&rank=1",
                  str(tmp_path / "profile"))
    assert dom.body.get("data-file") == "0/1"
    # the first divergence is named on rank 0; rank 1 shows the same records as later ones
    assert dom.body.get("data-culprit") == "elsewhere"
    statuses = {n["data-path"]: n["data-status"] for n in dom.nodes if not n.get("data-name")}
    assert "culprit" not in statuses.values() and statuses.get("blocks") == "consequence"
    assert re.search(r'<option value="1" selected', dom.text) or \
        re.search(r'id="rank-select"', dom.text)


@pytest.mark.skipif(CHROMIUM is None, reason="chromium is not on PATH (apt-get install chromium)")
def test_browser_shows_the_chain_that_led_to_the_culprit(report, tmp_path):
    from precdbg.compare.report.html import write_html
    result = json.loads(json.dumps(report["result"]))
    first = result["first_divergence"]
    first["chain"] = [
        {"name_a": "Tensor.add.4.forward", "name_b": "Tensor.add.4.forward", "step": 0, "rank": 0,
         "text": "reads the output of blocks.1.mlp.proj, which differs while its inputs agree"},
        {"name_a": first["name_a"], "name_b": first["name_b"], "step": 0, "rank": 0,
         "text": "differs while its inputs agree <b>here</b>"}]
    page = str(tmp_path / "chain.html")
    write_html(result, page)
    dom = _dom_of("file://" + page, str(tmp_path / "profile"))
    assert dom.body.get("data-culprit") == "visible"
    drawn = re.sub(r"<script\b.*?</script>", "", dom.text, flags=re.S)
    for link in first["chain"]:
        # drawn as text (escaped): in the summary, the culprit's details and the text report
        assert drawn.count(link["text"].replace("<", "&lt;").replace(">", "&gt;")) == 3, \
            link["text"]


@pytest.mark.skipif(CHROMIUM is None, reason="chromium is not on PATH (apt-get install chromium)")
def test_browser_draws_a_match_all_green(report, tmp_path):
    from precdbg.compare import compare_dumps
    from precdbg.compare.report.html import write_html
    result = compare_dumps(report["base"], report["base"])
    assert result["verdict"] == "match"
    page = str(tmp_path / "match.html")
    write_html(result, page)
    dom = _dom_of("file://" + page, str(tmp_path / "profile"))
    assert dom.body.get("data-culprit") == "none"
    statuses = {n["data-status"] for n in dom.nodes}
    assert statuses <= {"match", "none"} and "match" in statuses, statuses
    assert ">MATCH<" in dom.text


@pytest.mark.skipif(CHROMIUM is None, reason="chromium is not on PATH (apt-get install chromium)")
def test_browser_shows_the_candidates_names_beside(report, tmp_path):
    # the candidate holds its blocks as `layers`; a mapping file pairs them
    cand = cs.dump_gpt(str(tmp_path / "layers"), model="layers")
    mapping = tmp_path / "map.yaml"
    mapping.write_text("modules:\n  layers: blocks\n", encoding="utf-8")
    page = str(tmp_path / "mapped.html")
    proc = cs.run_cli("compare", report["base"], cand, "--map", str(mapping), "--step", "0",
                      "--rank", "0", "--html", page)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    dom = _dom_of("file://" + page, str(tmp_path / "profile"))
    drawn = re.sub(r"<script\b.*?</script>", "", dom.text, flags=re.S)
    beside = dict(re.findall(r'<div class="node[^"]*"[^>]*data-path="([^"]*)" data-name=""[^>]*>'
                             r'(?:(?!</div>).)*?<span class="alt">([^<]*)</span>', drawn))
    assert beside.get("blocks") == "\u2194 layers" and beside.get("") == "\u2194 LayersGPT", beside
    statuses = {n["data-path"]: n["data-status"] for n in dom.nodes if not n["data-name"]}
    # the root's records pair with nothing (GPT vs LayersGPT): one side each; the rest match
    assert statuses.pop("") == "only"
    assert set(statuses.values()) == {"match"}, statuses


# =========================================================================== clicking and hovering
@pytest.fixture
def browser(report, tmp_path):
    from browser_support import Browser
    with Browser(str(tmp_path / "profile")) as live:
        live.open("file://" + os.path.abspath(report["html"]),
                  ready="document.body.dataset.culprit")
        yield live


_NODE = "document.querySelector('#tree .node[data-path=\"{}\"][data-name=\"{}\"]')"


@pytest.mark.skipif(CHROMIUM is None, reason="chromium is not on PATH (apt-get install chromium)")
def test_browser_click_shows_a_modules_records(browser):
    fc = _NODE.format("blocks.1.mlp.fc", "")
    assert browser.js(f"{fc}.dataset.status") == "consequence"
    browser.js(f"{fc}.click()")
    assert browser.js("document.querySelector('#details h3').textContent") == "blocks.1.mlp.fc"
    rows = browser.js("Array.from(document.querySelectorAll('#details table.recs tr'))"
                      ".slice(1).map(r => Array.from(r.cells).map(c => c.innerText))")
    entries = {row[0] for row in rows}
    assert entries == {"Module.blocks.1.mlp.fc.Linear.forward.0",
                       "Module.blocks.1.mlp.fc.Linear.backward.0",
                       "Param.blocks.1.mlp.fc.weight", "Param.blocks.1.mlp.fc.bias",
                       "Param.blocks.1.mlp.fc.weight.grad", "Param.blocks.1.mlp.fc.bias.grad"}, \
        entries
    # inputs, outputs, dy, dx, the parameters at the start and their gradients (dw)
    roles = {row[1].split()[0] for row in rows}
    assert roles == {"input", "output", "grad_output", "grad_input", "param", "param_grad"}, roles
    # both runs' statistics: baseline above, candidate below, in each statistics cell
    norm = rows[0][7].split("\n")
    assert len(norm) == 2 and all(float(v) > 0 for v in norm), rows[0]
    # a second click on the selected node opens it: its calls and parameters appear
    browser.js(f"{fc}.click()")
    names = browser.js("Array.from(document.querySelectorAll("
                       "'#tree .node[data-path=\"blocks.1.mlp.fc\"]')).map(n => n.dataset.name)")
    assert "Param.blocks.1.mlp.fc.weight.grad" in names, names
    assert any(n.startswith("Functional.linear.") for n in names), names


@pytest.mark.skipif(CHROMIUM is None, reason="chromium is not on PATH (apt-get install chromium)")
def test_browser_rank_selector_redraws_the_tree(browser):
    assert browser.js("document.querySelectorAll('#tree .node.st-culprit').length") == 1
    browser.js("(s => { s.value = '1'; s.dispatchEvent(new Event('change')); })"
               "(document.getElementById('rank-select'))")
    assert browser.js("document.querySelectorAll('#tree .node.st-culprit').length") == 0
    assert browser.js("location.hash") == "#step=0&rank=1"
    assert browser.js("document.querySelector('#timeline h3').textContent") \
        .startswith("Step 0, rank 1")
    browser.js("document.querySelector('#culprit-summary button.link').click()")
    assert browser.js("document.getElementById('rank-select').value") == "0"
    assert browser.js("document.querySelector('#tree .node.selected').dataset.name") == CULPRIT


@pytest.mark.skipif(CHROMIUM is None, reason="chromium is not on PATH (apt-get install chromium)")
def test_browser_hover_names_the_records_of_the_timeline(browser):
    # sweep the mouse along the forward plot: the tooltip names the records it passes
    names = browser.js("""(() => {
        const canvas = document.querySelector('#timeline canvas');
        const tip = canvas.parentNode.querySelector('.tip');
        const box = canvas.getBoundingClientRect(), seen = new Set();
        for (let x = box.left; x < box.right; x += 1) {
          for (const y of [box.top + 20, box.top + box.height / 2, box.bottom - 25]) {
            canvas.dispatchEvent(new MouseEvent('mousemove', {clientX: x, clientY: y}));
            if (tip.style.display === 'block') seen.add(tip.textContent.split('  ')[0]);
          }
        }
        return Array.from(seen);
    })()""")
    assert CULPRIT in names, sorted(names)[:20]
    assert len(names) > 50, len(names)


@pytest.mark.skipif(CHROMIUM is None, reason="chromium is not on PATH (apt-get install chromium)")
def test_browser_opens_the_tree_at_a_culprit_without_a_pair(report, tmp_path):
    # another module class at blocks.1.mlp.act (TanhGELU for GELU, as transformers'
    # NewGELUActivation): a structural verdict between two records of other names, neither with
    # a counterpart; the tree still opens at it
    cand = cs.dump_gpt(str(tmp_path / "formula"), defect="gelu_class")
    page = str(tmp_path / "formula.html")
    out = str(tmp_path / "formula.json")
    proc = cs.run_cli("compare", report["base"], cand, "--rank", "0", "--html", page,
                      "--json", out)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    with open(out, encoding="utf-8") as handle:
        first = json.load(handle)["first_divergence"]
    assert first["name_a"] and first["name_b"] and first["name_a"] != first["name_b"], first
    assert first["module"] == CULPRIT_MODULE, first
    dom = _dom_of("file://" + page, str(tmp_path / "profile"))
    assert dom.body.get("data-culprit") == "visible", dom.body.get("data-culprit")
    culprits = [n for n in dom.nodes if n.get("data-status") == "culprit"]
    assert len(culprits) == 1 and culprits[0]["data-path"] == CULPRIT_MODULE, culprits
    assert culprits[0]["data-name"] in ("", first["name_a"]), culprits

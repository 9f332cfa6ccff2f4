"""The HTML report's layout in headless Chromium at 1280 and 1920 px wide (skipped without
`chromium` on PATH): the page fits its content (no panel with a large blank stretch, no blank
band across the page, no table cut off on the right), the per-module overview is one click from
the tree and marks the culprit, the calls after the backward (gradient clipping) fold into one
node and the optimizer's calls into another, and the timelines carry the model's layer bands with
the culprit's band marked.

Screenshots of each width (the page, and the page showing the overview) are taken through the
DevTools pipe and checked for the culprit's colours; PRECDBG_SCREENSHOT_DIR=DIR keeps them for a
person to look at.

Dumps: the tiny seeded GPT of compare_support, 2 steps, trained with gradient clipping
(`clip_grad_norm_(foreach=False)`: a `Tensor.to` call per parameter, as in users' scripts) and
SGD with momentum captured inside its step (`include_optimizer`: per-parameter `mul_`/`add_`
calls on the CPU), a clean baseline against the GELU-tanh defect.
"""
from __future__ import annotations

import os
import shutil
from typing import Any, Dict

import pytest

import compare_support as cs

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
pytestmark = pytest.mark.skipif(CHROMIUM is None,
                                reason="chromium is not on PATH (apt-get install chromium)")
WIDTHS = (1280, 1920)
HEIGHT = 1800          # the window the issue measured in: tall enough to show dead space
MAX_GAP = 80           # px: the largest blank band across the page (headings' margins: ~50)
MAX_BLANK = 60         # px: the largest blank stretch at the bottom of a panel
CULPRIT = "Functional.gelu.1.forward"
CULPRIT_MODULE = "blocks.1.mlp.act"


def _dump(path: str, defect: Any = None) -> str:
    import torch
    import torch.nn.functional as F
    from precdbg_examples.gpt_torch import GPT, make_batches
    from precdbg_pt import PrecisionDebugger
    cfg = cs.tiny_config()
    torch.manual_seed(cs.SEED)
    net = GPT(cfg)
    opt = torch.optim.SGD(net.parameters(), lr=0.1, momentum=0.9)
    batches = list(make_batches(cfg, batch_size=cs.BATCH, steps=2))
    if defect:
        opt = cs.DEFECTS[defect](net, opt, batches)
    dbg = PrecisionDebugger(dump_path=path, level="mix", include_optimizer=True)
    for x, y in batches:
        dbg.start(net)
        logits = net(x)
        F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1)).backward()
        torch.nn.utils.clip_grad_norm_(net.parameters(), 0.5, foreach=False)
        opt.step()
        opt.zero_grad(set_to_none=True)
        dbg.stop()
        dbg.step()
    assert dbg.close() and not dbg.failures
    return path


@pytest.fixture(scope="module")
def page(tmp_path_factory) -> str:
    root = tmp_path_factory.mktemp("layout")
    base = _dump(str(root / "base"))
    cand = _dump(str(root / "gelu"), defect="gelu_tanh")
    html = str(root / "report.html")
    proc = cs.run_cli("compare", base, cand, "--html", html)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    return html


def _open(page: str, profile: str, width: int):
    from browser_support import Browser
    browser = Browser(profile, width=width, height=HEIGHT)
    browser.open("file://" + page, ready="document.body.dataset.culprit")
    return browser


def _assert_fits(m: Dict[str, Any], width: int) -> None:
    assert m["width"] == width and m["page_overflow"] <= 0, m
    assert m["tables"] and all(t["overflow"] <= 0 for t in m["tables"]), m["tables"]
    assert m["gaps"][0]["height"] <= MAX_GAP, m["gaps"]
    assert m["boxes"] and all(b["blank"] <= MAX_BLANK for b in m["boxes"]), m["boxes"]


def _culprit_pixels(path: str) -> Dict[str, int]:
    image = pytest.importorskip("PIL.Image")
    with image.open(path) as img:
        rgb = img.convert("RGB")
        counts = {c: n for n, c in rgb.getcolors(rgb.size[0] * rgb.size[1])}
    red = sum(n for c, n in counts.items()
              if abs(c[0] - 0xd6) < 12 and abs(c[1] - 0x27) < 12 and abs(c[2] - 0x28) < 12)
    return {"highlight": counts.get((0xfd, 0xe2, 0xe2), 0), "red": red,
            "width": rgb.size[0], "height": rgb.size[1]}


def _keep(path: str) -> None:
    keep = os.environ.get("PRECDBG_SCREENSHOT_DIR")
    if keep:
        os.makedirs(keep, exist_ok=True)
        shutil.copyfile(path, os.path.join(keep, os.path.basename(path)))


@pytest.mark.parametrize("width", WIDTHS)
def test_page_fits_its_content(page, tmp_path, width):
    from layout_support import measure
    with _open(page, str(tmp_path / "profile"), width) as browser:
        m = measure(browser)
        _assert_fits(m, width)
        assert {b["id"] for b in m["boxes"]} == {"tree", "details"}
        # the records table of the culprit (shown at load) has its last column inside its panel
        assert browser.js("document.querySelectorAll('#details table.recs tr').length") > 1
        shot = str(tmp_path / f"report-{width}.png")
        browser.screenshot(shot)
    px = _culprit_pixels(shot)
    assert px["width"] == width and abs(px["height"] - m["height"]) <= 2, (px, m["height"])
    assert px["highlight"] > 1000 and px["red"] > 100, px
    _keep(shot)


@pytest.mark.parametrize("width", WIDTHS)
def test_overview_is_one_click_from_the_tree(page, tmp_path, width):
    from layout_support import measure
    with _open(page, str(tmp_path / "profile"), width) as browser:
        browser.js("document.getElementById('view-overview').click()")
        assert browser.js("document.body.dataset.view") == "overview"
        assert browser.js("document.getElementById('panes').offsetHeight") == 0
        m = measure(browser)
        _assert_fits(m, width)
        assert [t["id"] for t in m["tables"]] == ["overview-table"]
        cells = browser.js("""Array.from(document.querySelectorAll('#overview-table tr[data-module]'))
            .map(r => [r.dataset.module, Array.from(r.querySelectorAll('td.cell')).map(c =>
              [c.dataset.step, c.dataset.dir, c.dataset.ratio === undefined ? null : +c.dataset.ratio,
               c.classList.contains('culprit')])])""")
        shot = str(tmp_path / f"overview-{width}.png")
        browser.screenshot(shot)
        # a click on the culprit's cell opens the tree at the culprit's module
        browser.js("document.querySelector('#overview-table td.cell.culprit').click()")
        assert browser.js("document.body.dataset.view") == "tree"
        assert browser.js("document.querySelector('#tree .node.selected').dataset.path") \
            == CULPRIT_MODULE
    rows = dict(cells)
    # every direction of both steps is a column; the culprit's cell is the forward of step 0
    assert {(c[0], c[1]) for c in rows["blocks.1.mlp.fc"]} == \
        {(st, d) for st in ("0", "1") for d in ("fwd", "bwd", "dw")}
    marked = [(module, c[0], c[1]) for module, cs_ in rows.items() for c in cs_ if c[3]]
    assert marked == [(CULPRIT_MODULE, "0", "fwd")], marked
    culprit = next(c for c in rows[CULPRIT_MODULE] if c[3])
    assert culprit[2] > 1
    # upstream of the culprit, in step 0's forward, everything is within tolerance
    for module in ("wte", "wpe", "blocks.0.ln_1", "blocks.0.attn", "blocks.0.mlp.act"):
        fwd = [c[2] for c in rows[module] if c[:2] == ["0", "fwd"]]
        assert fwd and fwd[0] <= 1, (module, fwd)
    # the clipping calls after the backward are one row, the optimizer's calls another
    assert "after_backward" in rows and "optimizer" in rows, list(rows)
    assert not [m for m in rows if m.startswith("\0")], list(rows)
    px = _culprit_pixels(shot)
    assert px["red"] > 30, px      # the culprit cell's outline
    _keep(shot)


def _folded(browser, group: str):
    """The folded node `group` opened: its children (group, name) and the records its details list."""
    node = f"document.querySelector('#tree .node[data-group=\"{group}\"]')"
    browser.js(f"{node}.click(); {node}.click()")       # select, then open it
    inside = browser.js(f"""Array.from(document.querySelectorAll(
        '#tree .node[data-group=\"{group}\"] + ul > li > .node'))
        .map(n => [n.dataset.group || '', n.dataset.name])""")
    names = browser.js("Array.from(document.querySelectorAll('#details table.recs tr'))"
                       ".slice(1).map(r => r.cells[0].innerText.replace(/\\s/g, ''))")
    return inside, names


def test_clipping_and_optimizer_calls_fold_into_one_node_each(page, tmp_path):
    with _open(page, str(tmp_path / "profile"), WIDTHS[0]) as browser:
        root = browser.js("""Array.from(document.querySelector('#tree > ul > li > ul').children)
            .map(li => li.querySelector('.node')).map(n => [n.dataset.name, n.dataset.group || ''])""")
        groups = [g for _, g in root if g]
        assert groups == ["after_backward", "optimizer"], root
        # none of the calls after the backward is drawn at the root any more
        assert not [n for n, g in root if n.startswith(("Tensor.to.", "Tensor.add_.",
                                                        "Tensor.mul_."))], root
        inside, names = _folded(browser, "after_backward")
        assert [name for group, name in inside if group == "run"], inside
        # its details list the records of every call it holds: a Tensor.to per parameter
        assert sum(n.startswith("Tensor.to.") for n in names) >= 2 * 10, names[:10]
        assert not [n for n in names if n.startswith("Tensor.add_.")], names   # clipping: mul_
        inside, names = _folded(browser, "optimizer")
        assert inside, inside
        # SGD with momentum: a momentum buffer update and a parameter update per parameter
        assert sum(n.startswith("Tensor.add_.") for n in names) >= 2 * 10, names[:10]
        assert not [n for n in names if n.startswith("Tensor.to.")], names


def test_timelines_carry_layer_bands_and_the_culprit(page, tmp_path):
    with _open(page, str(tmp_path / "profile"), WIDTHS[0]) as browser:
        bands = browser.js("""Array.from(document.querySelectorAll('#timeline canvas'))
            .map(c => JSON.parse(c.dataset.bands))""")
    forward = bands[0]
    keys = [b["key"] for b in forward if b["key"]]
    # the layers in execution order, each one band; the culprit's layer marked
    assert [k for k in keys if k.startswith("blocks.")] == ["blocks.0", "blocks.1"], keys
    assert keys[0] == "wte" and keys[-2:] == ["after the backward", "optimizer"], keys
    assert keys.index("lm_head") == len(keys) - 3, keys
    assert [b["key"] for b in forward if b["culprit"]] == ["blocks.1"], forward
    backward = [b["key"] for b in bands[1] if b["key"].startswith("blocks.")]
    assert backward == ["blocks.1", "blocks.0"], backward

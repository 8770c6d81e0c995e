"""The plan page (``prog.explain(html=)``, ``tg explain --html``): one self-contained page
that parses, with a table row and an SVG box per step, no URL, and every name escaped."""

import shutil
from html.parser import HTMLParser

import numpy as np
import pytest

import tensor_graphs as tg
from tensor_graphs.cli import main
from tensor_graphs.runtime.plan_html import producers_of, render, step_layers


class Page(HTMLParser):
    """Collects what the tests check: step rows, step boxes, script text, attributes."""

    def __init__(self):
        super().__init__()
        self.stack, self.rows, self.boxes, self.ops, self.layers = [], [], [], 0, []
        self.scripts, self.attrs, self.text = 0, [], []
        self.in_steps = False

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        self.attrs += [(tag, k, v or "") for k, v in attrs]
        classes = (a.get("class") or "").split()
        if tag == "table" and a.get("id") == "steps":
            self.in_steps = True
        if tag == "tr" and self.in_steps and "data-step" in a:
            self.rows.append(int(a["data-step"]))
        if tag == "g" and "step" in classes:
            self.boxes.append(int(a["data-step"]))
        if tag == "rect" and "op" in classes:
            self.ops += 1
        if tag == "tr" and "layer" in classes:
            self.layers.append(a["data-layer"])
        if tag == "script":
            self.scripts += 1

    def handle_endtag(self, tag):
        if tag == "table":
            self.in_steps = False

    def handle_data(self, data):
        self.text.append(data)


def parse(page: str) -> Page:
    p = Page()
    p.feed(page)
    p.close()
    return p


def assert_offline(page: str, parsed: Page) -> None:
    """Nothing the page shows is fetched: no scheme-bearing URL, no src/href at all, and
    url(...) only to a fragment of the page itself."""
    assert "http://" not in page and "https://" not in page and "//cdn" not in page
    assert not [a for a in parsed.attrs if a[1] in ("src", "href", "xlink:href")]
    for chunk in page.split("url(")[1:]:
        assert chunk.startswith("#")


def block(seq: int = 8):
    from tensor_graphs.demo import transformer_block

    return transformer_block(), {"batch": 1, "seq": seq}


def test_page_of_a_program_holds_every_step_once():
    g, dims = block()
    prog = tg.compile(g, db=":memory:", bounds=dims)
    page = render(prog.plan, device_name=prog.device_name)
    parsed = parse(page)
    n = len(prog.plan.steps)
    assert sorted(parsed.rows) == list(range(n))
    assert sorted(parsed.boxes) == list(range(n))
    assert parsed.scripts == 1
    assert_offline(page, parsed)
    # the layers are the block's weight prefixes, in plan order
    assert parsed.layers == ["ln1", "attn", "ln2", "mlp"]
    for s in prog.plan.steps:
        assert s.kernel.name in page


def test_fused_and_generated_kernels_are_groups_of_their_ops():
    x = tg.input("x", (64, 64))
    y = tg.exp(tg.tanh(x * 2.0 + 1.0)) * x
    prog = tg.compile(y, db=":memory:")
    fused = [s for s in prog.plan.steps if len(s.nodes) > 1]
    assert fused, prog.explain()  # the elementwise chain is one generated kernel
    parsed = parse(render(prog.plan))
    assert parsed.ops == sum(min(len(s.nodes), 8) + (len(s.nodes) > 8) for s in fused)


def test_hostile_names_are_escaped():
    evil = "<script>alert(1)</script>"
    quote = "a' onmouseover='alert(2)"
    x = tg.input(evil, (4, 8))
    w = tg.weight(f"{quote}.0.w", (8, 8))
    prog = tg.compile(tg.tanh(x @ w), db=":memory:")
    page = render(prog.plan, title=evil, notes=(evil,))
    parsed = parse(page)
    assert parsed.scripts == 1  # only the page's own
    assert "<script>alert" not in page
    assert all(not k.startswith("on") for _, k, _ in parsed.attrs)
    assert f"{quote}.0" in parsed.layers  # the layer name survives as text, not as markup
    assert evil in "".join(parsed.text)


def test_layers_follow_the_weights_and_flow_to_steps_without_weights():
    x = tg.input("x", (4, 8))
    h = x
    for i in range(3):
        h = tg.tanh(h @ tg.weight(f"blocks.{i}.w", (8, 8))) * 2.0
    prog = tg.compile(h, db=":memory:", backends=("numpy",))
    layers = step_layers(prog.plan, producers_of(prog.plan))
    assert set(layers) == {"blocks.0", "blocks.1", "blocks.2"}
    assert layers == sorted(layers)  # each step lands in the block it computes


def test_explain_html_with_feeds_fills_measured_times(tmp_path):
    x = tg.input("x", (32, 32))
    w = tg.weight("w", (32, 32))
    prog = tg.compile(tg.tanh(x @ w), db=":memory:")
    prog.bind(w=np.eye(32, dtype=np.float32))
    path = tmp_path / "plan.html"
    text = prog.explain(html=path, feeds={"x": np.ones((32, 32), np.float32)}, runs=2)
    assert "total:" in text
    page = path.read_text()
    parsed = parse(page)
    assert sorted(parsed.rows) == list(range(len(prog.plan.steps)))
    assert "measured: median of 2 calls" in page
    # every per-call step has a measured time (the '-' cell is for none)
    assert page.count("data-v='-1'") == sum(s.static for s in prog.plan.steps)


def test_tg_explain_html_writes_the_page(tmp_path, capsys):
    out = tmp_path / "block.html"
    assert main(["explain", "block", "--dim", "seq=8", "--db", ":memory:",
                 "--html", str(out)]) == 0
    assert "total:" in capsys.readouterr().out
    parsed = parse(out.read_text())
    assert parsed.rows and sorted(parsed.rows) == sorted(parsed.boxes)


def test_tg_explain_html_refuses_stdout(capsys):
    assert main(["explain", "block", "--db", ":memory:", "--html", "-"]) == 2
    assert "give a file path" in capsys.readouterr().err


BROWSERS = ("chromium", "chromium-browser", "google-chrome", "firefox")


def test_page_renders_in_a_headless_browser(tmp_path):
    browser = next((shutil.which(b) for b in BROWSERS if shutil.which(b)), None)
    if browser is None:
        pytest.skip(f"no browser installed (looked for {', '.join(BROWSERS)}): the page is "
                    "checked by html.parser only")
    import subprocess

    g, dims = block()
    prog = tg.compile(g, db=":memory:", bounds=dims)
    path = tmp_path / "plan.html"
    prog.explain(html=path)
    if "firefox" in browser:
        pytest.skip("firefox has no --dump-dom: the DOM check needs chromium")
    dom = subprocess.run([browser, "--headless", "--no-sandbox", "--disable-gpu",
                          "--dump-dom", path.as_uri()], capture_output=True, text=True,
                         timeout=120).stdout
    parsed = parse(dom)
    assert sorted(parsed.rows) == list(range(len(prog.plan.steps)))
    assert sorted(parsed.boxes) == list(range(len(prog.plan.steps)))
    shot = tmp_path / "shot.png"
    subprocess.run([browser, "--headless", "--no-sandbox", "--disable-gpu",
                    f"--screenshot={shot}", "--window-size=1200,900", path.as_uri()],
                   capture_output=True, timeout=120)
    image = pytest.importorskip("matplotlib.image").imread(str(shot))
    assert image.std() > 0.01, "the screenshot is blank"  # boxes, text and table drawn

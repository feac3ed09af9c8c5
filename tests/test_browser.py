"""The pages in a real browser: Debian's Chromium, headless, driven by Playwright.

The app runs in a thread on a free loopback port. Each test loads a page, works its controls
and checks what it shows against the JSON API; screenshots go to artifacts/screenshots/
(git-ignored), at 1280×800 and at a projector's 1920×1080.
"""

from __future__ import annotations

import json
import re
import socket
import threading
import time
from pathlib import Path

import httpx
import os

import pytest

pytestmark = pytest.mark.browser

CHROMIUM = Path("/usr/bin/chromium")
ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
        "--disable-component-update", "--disable-sync", "--no-first-run"]
SHOTS = Path(__file__).resolve().parent.parent / "artifacts" / "screenshots"

playwright_api = pytest.importorskip("playwright.sync_api")


@pytest.fixture(scope="module")
def server():
    import uvicorn

    from modelcut.web.app import create_app

    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    srv = uvicorn.Server(uvicorn.Config(create_app(), log_level="warning"))
    th = threading.Thread(target=srv.run, kwargs={"sockets": [sock]}, daemon=True)
    th.start()
    deadline = time.monotonic() + 20
    while not srv.started:
        assert time.monotonic() < deadline, "server did not start"
        time.sleep(0.02)
    yield f"http://127.0.0.1:{port}"
    srv.should_exit = True
    th.join(timeout=10)
    sock.close()


@pytest.fixture(scope="module")
def browser():
    if not CHROMIUM.exists():
        if os.environ.get("CI"):  # CI installs it (make test): a missing browser there is a failure
            pytest.fail("Debian's chromium is missing on CI: /usr/bin/chromium")
        pytest.skip("Debian's chromium is not installed (apt-get install chromium; make test does it)")
    with playwright_api.sync_playwright() as p:
        b = p.chromium.launch(executable_path=str(CHROMIUM), args=ARGS)
        yield b
        b.close()


@pytest.fixture
def page(browser):
    ctx = browser.new_context(viewport={"width": 1280, "height": 800})
    pg = ctx.new_page()
    errors: list[str] = []
    pg.on("pageerror", lambda e: errors.append(str(e)))
    pg.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
    pg.errors = errors
    yield pg
    ctx.close()


def shot(pg, name: str) -> None:
    SHOTS.mkdir(parents=True, exist_ok=True)
    pg.screenshot(path=str(SHOTS / f"{name}.png"), full_page=True)


def api(server, path, body=None):
    if body is None:
        return httpx.get(server + path, timeout=60).json()
    return httpx.post(server + path, json=body, timeout=60).json()


def time_now(pg) -> float:
    return float(pg.get_attribute("#player", "data-t"))


# Text boxes of every visible text node and SVG <text>, and the pairs that overlap.
OVERLAPS = """() => {
  const boxes = [];
  const walker = document.createTreeWalker(document.body, NodeFilter.SHOW_TEXT);
  while (walker.nextNode()) {
    const n = walker.currentNode;
    if (!n.textContent.trim()) continue;
    const el = n.parentElement;
    if (!el || el.closest('option, script, style, title, .mc-tip, details:not([open]) > :not(summary)')) continue;
    const st = getComputedStyle(el);
    if (st.visibility === 'hidden' || st.display === 'none') continue;
    // A sticky header cell covers the rows that scroll under it, the explorer's sticky button row
    // the form's fields that scroll under it.
    const cell = el.closest('thead th, .search-actions');
    const sticky = !!cell && getComputedStyle(cell).position === 'sticky';
    // The part of the text a scrolling box lets through.
    let clip = {left: -1e9, top: -1e9, right: 1e9, bottom: 1e9};
    for (let a = el; a && a !== document.body; a = a.parentElement) {
      const o = getComputedStyle(a);
      if (o.overflowX !== 'visible' || o.overflowY !== 'visible') {
        const c = a.getBoundingClientRect();
        clip = {left: Math.max(clip.left, c.left), top: Math.max(clip.top, c.top),
                right: Math.min(clip.right, c.right), bottom: Math.min(clip.bottom, c.bottom)};
      }
    }
    const range = document.createRange();
    range.selectNodeContents(n);
    for (const r of range.getClientRects()) {
      const v = {left: Math.max(r.left, clip.left), top: Math.max(r.top, clip.top),
                 right: Math.min(r.right, clip.right), bottom: Math.min(r.bottom, clip.bottom)};
      if (v.right - v.left > 1 && v.bottom - v.top > 1) boxes.push([v, n.textContent.trim(), sticky]);
    }
  }
  const out = [];
  for (let i = 0; i < boxes.length; i++) for (let j = i + 1; j < boxes.length; j++) {
    const [a, ta, sa] = boxes[i], [b, tb, sb] = boxes[j];
    if (sa !== sb) continue;   // a sticky header (or button row) painted over what scrolls under it
    const w = Math.min(a.right, b.right) - Math.max(a.left, b.left);
    const h = Math.min(a.bottom, b.bottom) - Math.max(a.top, b.top);
    if (w > 2 && h > 3) out.push(ta + ' | ' + tb);
  }
  return {count: boxes.length, overlaps: out};
}"""


def assert_no_overlapping_text(pg):
    res = pg.evaluate(OVERLAPS)
    assert res["count"] > 20
    assert not res["overlaps"], res["overlaps"][:5]


def canvas_ink(pg, selector: str) -> int:
    """How many pixels of a canvas are drawn (not transparent)."""
    return pg.evaluate("""(sel) => {
      const c = document.querySelector(sel);
      const d = c.getContext('2d').getImageData(0, 0, c.width, c.height).data;
      let n = 0;
      for (let i = 3; i < d.length; i += 4) if (d[i] > 0) n++;
      return n;
    }""", selector)


# --- the pipeline page ----------------------------------------------------------------------------

def test_landing_page_shows_the_timeline_and_the_api_s_bubble(server, page):
    page.goto(server + "/?schedule=interleaved&devices=4&microbatches=8&chunks=2")
    page.wait_for_selector("[data-testid=bubble]")
    ans = api(server, "/api/simulate", {"schedule": "interleaved", "devices": 4, "microbatches": 8, "chunks": 2})
    assert ans["bubble"] == 0.1875
    assert float(page.get_attribute("[data-testid=bubble]", "data-value")) == ans["bubble"]
    assert page.inner_text("[data-testid=bubble]") == "0.1875"
    assert float(page.get_attribute("[data-testid=bubble-closed]", "data-value")) == ans["closed_form_bubble"]
    box = page.locator("canvas[data-testid=timeline]").bounding_box()
    assert box["width"] > 600 and box["height"] > 4 * 30
    page.focus("#player")
    page.keyboard.press("End")  # stop the opening animation at the end of the step
    assert time_now(page) == ans["makespan"]
    assert canvas_ink(page, "canvas[data-testid=timeline]") > 50_000
    assert canvas_ink(page, "canvas[data-testid=memory]") > 10_000
    legend = page.inner_text("[data-testid=legend]")
    assert "idle" in legend and "Micro-batch" in legend and "forward" in legend
    assert not page.errors
    shot(page, "pipeline-1280x800")
    assert_no_overlapping_text(page)


def test_the_animation_advances_pauses_steps_and_scrubs(server, page):
    page.goto(server + "/?schedule=1f1b&devices=4&microbatches=8")
    page.wait_for_selector("[data-testid=bubble]")
    t0 = time_now(page)
    page.wait_for_timeout(600)
    t1 = time_now(page)
    assert t1 > t0, "autoplay advances simulated time"
    assert page.get_attribute("#player", "data-playing") == "true"
    page.click("[data-testid=play]")
    paused = time_now(page)
    page.wait_for_timeout(300)
    assert time_now(page) == paused and page.get_attribute("#player", "data-playing") == "false"
    ans = api(server, "/api/simulate", {"schedule": "1f1b", "devices": 4, "microbatches": 8})
    events = sorted({0.0, *(o["start"] for o in ans["ops"]), *(o["end"] for o in ans["ops"])})
    page.click("text=Step ›")
    assert time_now(page) == min(e for e in events if e > paused + 1e-9)
    page.click("text=« Start")
    assert time_now(page) == 0
    page.fill(".mc-scrub", "500")  # half way
    assert time_now(page) == pytest.approx(ans["makespan"] / 2, rel=1e-3)
    page.select_option(".mc-speed", "4")
    page.click("[data-testid=play]")
    page.wait_for_timeout(400)
    assert time_now(page) > ans["makespan"] / 2
    assert re.search(r"[?&]speed=4", page.url)


def test_changing_inputs_resimulates_and_the_url_reproduces_the_view(server, page):
    page.goto(server + "/")
    page.wait_for_selector("[data-testid=bubble]")
    page.select_option("#schedule", "1f1b")
    assert page.is_disabled("#chunks")
    page.fill("#devices", "8")
    page.fill("#microbatches", "16")
    page.fill("#ratio", "1:3")
    page.fill("#p2p", "0.1")
    ans = api(server, "/api/simulate", {"schedule": "1f1b", "devices": 8, "microbatches": 16, "forward": 1,
                                        "backward": 3, "p2p": 0.1})
    page.wait_for_function("v => document.querySelector('[data-testid=bubble]').dataset.value == v",
                           arg=str(ans["bubble"]))
    assert "—" in page.inner_text("[data-testid=bubble-closed]")  # sends cost time: no closed form
    assert page.inner_text("#title").startswith("1f1b · p = 8 devices · m = 16")
    url = page.url
    for part in ("schedule=1f1b", "devices=8", "microbatches=16", "forward=1", "backward=3", "p2p=0.1"):
        assert part in url
    page.goto(url)
    page.wait_for_selector("[data-testid=bubble]")
    assert page.get_attribute("[data-testid=bubble]", "data-value") == str(ans["bubble"])
    assert page.input_value("#ratio") == "1:3"
    page.select_option("#schedule", "zbv")
    page.fill("#ratio", "1:1:1")
    zbv = api(server, "/api/simulate", {"schedule": "zbv", "devices": 8, "microbatches": 16, "forward": 1,
                                        "backward": 1, "weight": 1, "p2p": 0.1})
    page.wait_for_function("v => document.querySelector('[data-testid=bubble]').dataset.value == v",
                           arg=str(zbv["bubble"]))
    assert "weight gradient" in page.inner_text("[data-testid=legend]")
    assert not page.errors


def test_bad_and_oversize_inputs_show_the_server_s_message(server, page):
    page.goto(server + "/?schedule=1f1b&devices=4&microbatches=8")
    page.wait_for_selector("[data-testid=bubble]")
    page.fill("#ratio", "1:two")
    page.wait_for_selector("[data-testid=error]:not(:empty)")
    assert "ratio" in page.inner_text("[data-testid=error]")
    page.fill("#ratio", "1:2")
    page.wait_for_selector("[data-testid=error]:empty", state="attached")
    page.fill("#devices", "1000")
    page.fill("#microbatches", "1000")
    page.wait_for_function("() => document.querySelector('[data-testid=error]').textContent.includes('limit')")
    assert "1,000,000 ops" in page.inner_text("[data-testid=error]")


def test_projector_view_is_readable(server, browser):
    ctx = browser.new_context(viewport={"width": 1920, "height": 1080})
    pg = ctx.new_page()
    pg.goto(server + "/?schedule=interleaved&devices=4&microbatches=8&chunks=2&t=1000")
    pg.wait_for_selector("[data-testid=bubble]")
    pg.wait_for_timeout(200)
    size = pg.evaluate("parseFloat(getComputedStyle(document.documentElement).fontSize)")
    assert size >= 18  # larger type on big screens
    shot(pg, "pipeline-1920x1080")
    assert_no_overlapping_text(pg)
    ctx.close()


# --- the explorer and the published runs ----------------------------------------------------------

EXPLORE = {"model": "gpt-1.7b", "gpu": "a100-sxm4-80gb", "gpus": 8, "seq": 2048, "global_batch_tokens": 131072,
           "top": 20, "schedules": ["1f1b", "interleaved", "zb-h1", "zbv"], "allow_tp_across_nodes": False}


def test_explorer_lists_layouts_and_animates_the_picked_one(server, page):
    page.goto(server + "/explorer?model=gpt-1.7b&gpu=a100-sxm4-80gb&gpus=8&seq=2048&tokens=131072&top=20")
    page.wait_for_selector("[data-testid=layouts] tbody tr")
    ans = api(server, "/api/explore", EXPLORE)
    rows = page.locator("[data-testid=layouts] tbody tr")
    assert rows.count() == len(ans["layouts"]) > 1
    first = ans["layouts"][0]
    assert f"{first['tp']}·{first['cp']}·{first['pp']}·{first['dp']}" in rows.nth(0).inner_text()
    # the schedule column names a schedule only where there is a pipeline to run it
    for i, x in enumerate(ans["layouts"]):
        cell = rows.nth(i).locator("td").nth(2).inner_text()
        assert cell == ("\u2014" if x["pp"] == 1 else x["schedule"] + (f", last {x['last_layers']}" if x["last_layers"] else ""))
    assert {x["pp"] == 1 for x in ans["layouts"]} == {True, False}   # both kinds shown
    gap = ans["why"]["step_time_s"][1] - ans["why"]["step_time_s"][0]
    assert ("beats the runner-up" if gap > 1e-9 else "ties with the runner-up") in page.inner_text("#why")
    shot(page, "explorer-1280x800")
    assert_no_overlapping_text(page)
    stages = "svg[aria-label='memory of each pipeline stage against the limit']"
    # one column a pipeline stage, and none without a pipeline (the memory bar is that device)
    assert page.locator(stages).count() == (0 if first["pp"] == 1 else 1)
    # Pick a layout with a pipeline, see its mesh, animate it.
    k = next(i for i, x in enumerate(ans["layouts"]) if x["pp"] > 1)
    pick = ans["layouts"][k]
    rows.nth(k).click()
    page.wait_for_selector("[data-testid=mesh] .gpu")
    assert page.locator(stages + " rect").count() == pick["pp"]
    assert page.locator("[data-testid=mesh] .gpu").count() == 8  # one node of eight A100s
    page.click("[data-testid=animate]")
    page.wait_for_selector("[data-testid=bubble]")
    assert f"schedule={pick['schedule']}" in page.url and f"devices={pick['pp']}" in page.url
    sim = api(server, "/api/simulate", {"schedule": pick["schedule"], "devices": pick["pp"],
                                        "microbatches": pick["microbatches"], "chunks": pick["vpp"]})
    assert page.get_attribute("[data-testid=bubble]", "data-value") == str(sim["bubble"])
    assert not page.errors


def test_explorer_reads_an_uploaded_config_and_refuses_a_bad_one(server, page, tmp_path):
    page.goto(server + "/explorer?model=gpt-1.7b&gpu=a100-sxm4-80gb&gpus=8&seq=2048&tokens=131072")
    page.wait_for_selector("[data-testid=layouts] tbody tr")
    bad = tmp_path / "config.json"
    bad.write_text('{"architectures": ["BertModel"]}')
    page.set_input_files("#config", str(bad))
    page.wait_for_selector("[data-testid=error]:not(:empty)")
    assert "unknown architecture 'BertModel'" in page.inner_text("[data-testid=error]")
    good = tmp_path / "small.json"
    good.write_text('{"architectures": ["LlamaForCausalLM"], "_name_or_path": "tiny-llama", "hidden_size": 1024, '
                    '"num_hidden_layers": 8, '
                    '"num_attention_heads": 16, "num_key_value_heads": 4, "intermediate_size": 4096, '
                    '"vocab_size": 32000}')
    page.set_input_files("#config", str(good))
    page.wait_for_function("() => document.querySelector('#title').textContent.startsWith('tiny-llama on 8 ×')")
    assert page.locator("[data-testid=layouts] tbody tr").count() >= 1
    assert page.locator("#model option:checked").inner_text() == "uploaded: tiny-llama (8 layers)"


def _search_at(page, precision: str, recipe: str) -> dict:
    """Pick a precision (the recipe select opens for FP8) and a recipe, search: the body the page sent."""
    page.select_option("#precision", precision)
    assert not page.is_disabled("#recipe")
    page.select_option("#recipe", recipe)
    with page.expect_request("**/api/explore/stream") as req:
        page.click("#go")
    return req.value.post_data_json


def test_explorer_takes_the_stack_and_the_precision_and_refuses_fp8_on_an_a100(server, page):
    """The form's stack and precision go to the API as the JSON fields of the same names (FP8's
    recipe only with fp8), the answer names them, the URL keeps them; FP8 on an A100 is one line."""
    page.goto(server + "/explorer?model=gpt-1.7b&gpu=h100-sxm5-80gb&gpus=8&seq=2048&tokens=131072&top=5")
    page.wait_for_selector("[data-testid=layouts] tbody tr")
    assert page.is_disabled("#recipe")
    # the form offers what the API takes, from GET /api/catalog: no second list in the page
    cat = httpx.get(server + "/api/catalog").json()
    # each precision the API takes, and both 16-bit and FP8 side by side (the request's precisions)
    assert page.eval_on_selector_all("#precision option", "os => os.map(o => o.value)") == [*cat["precisions"],
                                                                                             "bf16,fp8"]
    # the recipes are the chosen stack's FP8 library's: Transformer Engine's for the default, torchao's for
    # torchtitan's fsdp-compile (rowwise among them), Transformer Engine's again for nemo
    recipes = lambda: page.eval_on_selector_all("#recipe option", "os => os.map(o => o.value)")
    assert recipes() == ["", *cat["framework_fp8_recipes"][cat["default_framework"]]]
    page.select_option("#framework", "fsdp-compile")
    assert recipes() == ["", *cat["framework_fp8_recipes"]["fsdp-compile"]] and "rowwise" in recipes()
    assert set(recipes()[1:]) <= set(cat["fp8_recipes"])
    boxes = page.eval_on_selector_all("input[name=schedule]", "bs => bs.map(b => [b.value, b.checked])")
    assert boxes == [[sc["name"], sc["explored_by_default"]] for sc in cat["schedules"]]
    page.select_option("#framework", "nemo")
    assert "rowwise" not in recipes()
    sent = _search_at(page, "fp8", "current")
    assert (sent["framework"], sent["precision"], sent["fp8_recipe"]) == ("nemo", "fp8", "current")
    page.wait_for_function("() => document.querySelector('[data-testid=stack]')"
                           " && document.querySelector('[data-testid=stack]').textContent.includes('fp8')")
    assert page.inner_text("[data-testid=stack]") == "Stack: nemo; matrix products in fp8, current scaling."
    assert "framework=nemo" in page.url and "precision=fp8" in page.url and "recipe=current" in page.url
    ans = api(server, "/api/explore", {"model": "gpt-1.7b", "gpu": "h100-sxm5-80gb", "gpus": 8, "seq": 2048,
                                       "global_batch_tokens": 131072, "top": 5, "framework": "nemo",
                                       "precision": "fp8", "fp8_recipe": "current"})
    first = page.locator("[data-testid=layouts] tbody tr").first.get_attribute("data-rank")
    assert first == "1" and ans["precision"] == "fp8" and ans["layouts"][0]["rank"] == 1
    page.select_option("#gpu", "a100-sxm4-80gb")
    page.click("#go")
    page.wait_for_selector("[data-testid=error]:not(:empty)")
    err = page.inner_text("[data-testid=error]")
    assert "fp8 needs FP8 tensor cores" in err and "\n" not in err.strip()
    assert not page.errors


def test_the_explorer_holds_the_gpu_to_a_power_limit_and_keeps_it_in_its_link(server, page):
    """A power limit goes to the API as ``<gpu>@<watts>w``, the answer names the held GPU, the link
    keeps it and a reload restores the field; a GPU without a measured draw offers no limit, and a
    limit above the datasheet's is one line."""
    page.goto(server + "/explorer?model=gpt-1.7b&gpu=h100-sxm5-80gb&gpus=8&seq=2048&tokens=131072&top=5")
    page.wait_for_selector("[data-testid=layouts] tbody tr")
    assert not page.is_disabled("#watts") and page.get_attribute("#watts", "placeholder").startswith("700")
    page.fill("#watts", "500")
    with page.expect_request("**/api/explore/stream") as req:
        page.click("#go")
    assert req.value.post_data_json["gpu"] == "h100-sxm5-80gb@500w"
    page.wait_for_function("() => document.getElementById('title').textContent.includes('@500w')")
    assert "gpu=h100-sxm5-80gb%40500w" in page.url
    page.reload()
    page.wait_for_selector("[data-testid=layouts] tbody tr")
    assert page.input_value("#gpu") == "h100-sxm5-80gb" and page.input_value("#watts") == "500"
    page.fill("#watts", "900")
    page.click("#go")
    page.wait_for_selector("[data-testid=error]:not(:empty)")
    err = page.inner_text("[data-testid=error]")
    assert "above its 700 W limit" in err and "\n" not in err.strip()
    page.select_option("#gpu", "a100-sxm4-80gb")
    assert page.is_disabled("#watts") and page.input_value("#watts") == ""
    assert page.errors and all("status of 422" in e for e in page.errors)   # the refused request's own line


def test_a_link_may_name_the_stack_as_its_users_do(server, page):
    """framework=torchtitan in a link selects the preset it names (fsdp-compile), whose FP8 library's
    recipes (torchao's) the recipe select then offers; the search runs on that preset."""
    with page.expect_request("**/api/explore/stream") as req:
        page.goto(server + "/explorer?model=gpt-1.7b&gpu=h100-sxm5-80gb&gpus=8&seq=2048&tokens=131072&top=5"
                  "&framework=torchtitan&precision=fp8&recipe=rowwise")
    assert req.value.post_data_json["framework"] == "fsdp-compile"
    assert req.value.post_data_json["fp8_recipe"] == "rowwise"
    assert page.input_value("#framework") == "fsdp-compile" and page.input_value("#recipe") == "rowwise"
    page.wait_for_selector("[data-testid=layouts] tbody tr")
    assert "rowwise" in page.inner_text("[data-testid=stack]")
    assert not page.errors


def test_the_explorer_page_names_a_count_above_the_peak(server, page):
    """Mistral 7B at 131,072 tokens: the first-ranked layout's TFLOP/s per GPU (the table's column, a
    convention's count) is above the H100's peak; the page shows the answer's note saying why, as the
    API gives it."""
    page.goto(server + "/explorer?model=mistral-7b&gpu=h100-sxm5-80gb&gpus=16&seq=131072&tokens=2097152&top=1"
              "&framework=fsdp")
    page.wait_for_selector("[data-testid=layouts] tbody tr")
    ans = api(server, "/api/explore", {"model": "mistral-7b", "gpu": "h100-sxm5-80gb", "gpus": 16, "seq": 131072,
                                       "global_batch_tokens": 2097152, "top": 1, "framework": "fsdp"})
    note = [n for n in ans["notes"] if "above the" in n]
    assert len(note) == 1 and ans["layouts"][0]["tflops_per_gpu"] > 989
    assert note[0] in page.inner_text("#summary")
    assert not page.errors


def test_explorer_compares_precisions_side_by_side(server, page):
    """bf16 and fp8 side by side: the page sends precisions (FP8's recipe with it), shows each one's
    best layout as the API ranks it, and the fastest precision's ranking below; the URL keeps it."""
    page.goto(server + "/explorer?model=gpt-1.7b&gpu=h100-sxm5-80gb&gpus=8&seq=2048&tokens=131072&top=5")
    page.wait_for_selector("[data-testid=layouts] tbody tr")
    sent = _search_at(page, "bf16,fp8", "delayed")
    assert sent["precisions"] == ["bf16", "fp8"] and sent["fp8_recipe"] == "delayed" and "precision" not in sent
    page.wait_for_selector("[data-testid=precisions] tbody tr")
    ans = api(server, "/api/explore", {"model": "gpt-1.7b", "gpu": "h100-sxm5-80gb", "gpus": 8, "seq": 2048,
                                       "global_batch_tokens": 131072, "top": 5, "precisions": ["bf16", "fp8"],
                                       "fp8_recipe": "delayed"})
    rows = page.eval_on_selector_all("[data-testid=precisions] tbody tr", "rs => rs.map(r => r.dataset.precision)")
    assert rows == ans["precisions"] == ["bf16", "fp8"]
    for i, search in enumerate(ans["searches"]):
        step = page.inner_text(f"[data-testid=precisions] tbody tr:nth-child({i + 1}) td:nth-child(3)")
        assert step == f"{search['layouts'][0]['step_time_s']:.3f} s"
    fastest = ans["searches"][ans["precisions"].index(ans["fastest"])]
    page.wait_for_function("() => document.querySelector('[data-testid=stack]').textContent.includes"
                           f"('{ans['fastest']}')")
    assert page.locator("[data-testid=layouts] tbody tr").count() == len(fastest["layouts"])
    assert "precision=bf16%2Cfp8" in page.url or "precision=bf16,fp8" in page.url
    assert not page.errors


def test_published_runs_page_plots_the_validation_table(server, page):
    page.goto(server + "/runs")
    page.wait_for_selector("[data-testid=runs] tbody tr")
    ans = api(server, "/api/runs")
    assert page.locator("[data-testid=runs] tbody tr").count() == len(ans["runs"])
    assert page.locator("[data-testid=plot] svg g[data-run]").count() == len(ans["runs"])
    worst = max((r for r in ans["runs"] if not r["fitted"]), key=lambda r: abs(r["error_pct"]))
    assert f"{abs(worst['error_pct']):.1f} %" in page.inner_text("[data-testid=plot]")
    shot(page, "runs-1280x800")
    assert_no_overlapping_text(page)
    # the plot's key: published, predicted, a swatch a family; text that wraps at any width
    families = list(dict.fromkeys(r["family"] for r in ans["runs"]))
    keys = page.eval_on_selector_all("[data-testid=plot-legend] > span", "ss => ss.map(s => s.textContent)")
    assert keys == ["published", "predicted (colour: family)", *families]
    page.set_viewport_size({"width": 420, "height": 900})
    page.wait_for_timeout(300)
    assert_no_overlapping_text(page)
    assert not page.errors


# --- the offline export ---------------------------------------------------------------------------

def test_offline_export_plays_without_a_server(browser, tmp_path):
    from modelcut.cli import main

    out = tmp_path / "zbv.html"
    assert main(["simulate", "-s", "zbv", "-p", "4", "-m", "8", "--forward", "1", "--backward", "1",
                 "--weight", "1", "--html", str(out)]) == 0
    ctx = browser.new_context(viewport={"width": 1280, "height": 800})
    pg = ctx.new_page()
    requests: list[str] = []
    pg.on("request", lambda r: requests.append(r.url))
    pg.goto(out.as_uri())
    pg.wait_for_selector("[data-testid=bubble]")
    t0 = time_now(pg)
    pg.wait_for_timeout(500)
    assert time_now(pg) > t0
    assert requests == [out.as_uri()]  # nothing fetched but the file itself
    assert pg.inner_text("[data-testid=bubble]") == pg.inner_text("[data-testid=bubble-closed]").split()[0]
    shot(pg, "export-1280x800")
    ctx.close()


# --- the rough edges a new user hits (issue 16) ---------------------------------------------------

def test_runs_page_shows_the_default_model_and_switches_cleanly(server, page):
    page.goto(server + "/runs?mode=default&set=all")
    page.wait_for_function("() => document.querySelector('#summary').textContent.includes('Default model')")
    ans = api(server, "/api/runs?mode=default&set=all")
    page.wait_for_function("n => document.querySelectorAll('[data-testid=runs] tbody tr').length === n",
                           arg=len(ans["runs"]))
    assert page.inner_text("[data-testid=error]") == ""
    # out of sample first: the summary, the plotted dots and the table's Predicted and Error columns
    text = page.inner_text("#summary")
    oos = ans["summary"]["out_of_sample"]
    assert text.index("Out of sample") < text.index("In sample")
    assert f"largest {oos['max_abs_error_pct']:.1f} %" in text
    heads = page.eval_on_selector_all("[data-testid=runs] thead th", "ths => ths.map(t => t.textContent)")
    assert heads[5:8] == ["Predicted", "Error", "In sample"]
    worst = max(ans["runs"], key=lambda r: abs(r["out_of_sample"]["error_pct"]))
    cells = page.locator("[data-testid=runs] tbody tr", has_text=worst["id"]).first.locator("td")
    e, i = worst["out_of_sample"]["error_pct"], worst["error_pct"]
    assert cells.nth(6).inner_text() == f"{'+' if e > 0 else '−'}{abs(e):.1f} %"
    assert cells.nth(7).inner_text() == f"{'+' if i > 0 else '−'}{abs(i):.1f} %"
    flat = next(r for r in ans["runs"] if r["layout"]["pp"] == 1)
    assert page.locator("[data-testid=runs] tbody tr", has_text=flat["id"]).first.locator("td").nth(3).inner_text() == "\u2014"
    plotted = [r for r in ans["runs"] if r["published_tflops"] is not None]
    assert page.locator("[data-testid=plot] svg g[data-run]").count() == len(plotted)
    timed = len(ans["runs"]) - len(plotted)
    assert timed and f"{timed} runs published as seconds a step" in page.inner_text("[data-testid=timed-runs]")
    first_timed = next(r for r in ans["runs"] if r["unit"] == "s")
    row = page.locator("[data-testid=runs] tbody tr", has_text=first_timed["id"])
    x = first_timed["published"]
    assert (f"{x:.2f} s" if x >= 10 else f"{x:.3f} s") in row.inner_text()   # in its unit, as published
    # a mixture of experts' row names its expert parallelism under the layout (etp where it differs)
    moe = [r for r in ans["runs"] if r["layout"]["ep"] > 1]
    assert moe
    for r in moe:
        L = r["layout"]
        want = f"ep {L['ep']}" + (f", etp {L['etp']}" if L["etp"] is not None and L["etp"] != L["tp"] else "")
        cell = page.locator("[data-testid=runs] tbody tr", has_text=r["id"]).first.locator("td").nth(2)
        assert cell.locator("[data-testid=ep]").inner_text() == want
    assert page.locator("[data-testid=runs] [data-testid=ep]").count() == len(moe)
    # at 1280 × 800 every column shows without scrolling sideways, the step's bars included
    assert page.evaluate("() => { const s = document.querySelector('[data-testid=runs]').parentElement;"
                         " return s.scrollWidth <= s.clientWidth; }")
    page.select_option("#mode", "seed")
    seed = api(server, "/api/runs?mode=seed&set=all")
    page.wait_for_function("() => document.querySelector('#summary').textContent.includes('Seed model')")
    assert page.locator("[data-testid=runs] tbody tr").count() == len(seed["runs"])
    page.select_option("#mode", "default")
    page.wait_for_function("() => document.querySelector('#summary').textContent.includes('Default model')")
    assert "mode=default" in page.url
    assert not page.errors
    shot(page, "runs-default-1280x800")


def test_a_refused_simulation_leaves_no_stale_title_or_timeline(server, page):
    page.goto(server + "/?schedule=1f1b&devices=4&microbatches=8")
    page.wait_for_selector("[data-testid=bubble]")
    assert "p = 4" in page.inner_text("#title")
    page.fill("#devices", "1000")
    page.fill("#microbatches", "1000")
    page.wait_for_function("() => document.querySelector('[data-testid=error]').textContent.includes('limit')")
    title = page.inner_text("#title")
    assert "p = 1000" in title and "m = 1000" in title and "not simulated" in title
    assert "p=4" not in page.title() and "not simulated" in page.title()
    assert not page.is_visible("#player") and page.inner_text("#stats") == ""
    page.fill("#devices", "2")
    page.fill("#microbatches", "3")
    page.wait_for_function("() => document.querySelector('#title').textContent.startsWith('1f1b · p = 2')")
    assert page.is_visible("#player") and "bubble" in page.inner_text("#stats").lower()


IN_VIEW = """ids => ids.map(id => { const r = document.getElementById(id).getBoundingClientRect();
                                       return r.height > 0 && r.top >= 0 && r.bottom <= window.innerHeight; })"""


def test_a_long_search_streams_its_progress_bar(server, page):
    # a search of seconds (the pruned explorer settles small ones in a fraction of a second)
    page.goto(server + "/explorer?model=llama3-405b&gpu=h100-sxm5-80gb&gpus=8192&seq=8192&tokens=16M&top=5")
    seen: list[float] = []
    deadline = time.monotonic() + 120
    while not page.locator("[data-testid=layouts] tbody tr").count():
        assert time.monotonic() < deadline, "the search did not answer"
        val = page.evaluate("() => { const b = document.querySelector('[data-testid=progress]');"
                            " return b && !b.closest('[hidden]') ? b.dataset.value : null; }")
        if val:
            x = float(val)
            if not seen:
                # the form runs past the foot of a 1280 x 800 window: its button and the progress
                # bar are held in view, at the top of the page and scrolled down
                assert page.evaluate(IN_VIEW, ["go", "search-progress"]) == [True, True]
                page.mouse.wheel(0, 400)
                page.wait_for_timeout(50)
                assert page.evaluate(IN_VIEW, ["go", "search-progress"]) == [True, True]
            if not seen or x != seen[-1]:
                seen.append(x)
        page.wait_for_timeout(80)
    assert len([x for x in seen if 0 < x < 1]) >= 3, seen   # the bar moved while the search ran
    assert seen == sorted(seen)
    page.wait_for_selector("#progress", state="hidden")
    assert page.locator("[data-testid=layouts] tbody tr").count() == 5
    # only the form's button row is held at the window's foot, not the picked layout's buttons
    assert page.eval_on_selector("#detail .actions", "a => getComputedStyle(a).position") == "static"
    assert not page.errors


@pytest.mark.parametrize("path", ["/", "/explorer?model=gpt-1.7b&gpu=a100-sxm4-80gb&gpus=8&seq=2048&tokens=131072",
                                  "/runs"])
def test_the_navigation_fits_a_phone(server, browser, path):
    ctx = browser.new_context(viewport={"width": 360, "height": 740})
    pg = ctx.new_page()
    pg.goto(server + path)
    pg.wait_for_load_state("networkidle")
    width = pg.evaluate("document.documentElement.scrollWidth")
    assert width <= 360, width
    for link in pg.locator(".topbar nav a").all():
        box = link.bounding_box()
        assert box["x"] >= 0 and box["x"] + box["width"] <= 360, (link.inner_text(), box)
    shot(pg, f"nav-360-{path.split('?')[0].strip('/') or 'pipeline'}")
    ctx.close()


@pytest.mark.parametrize("width,height", [(1280, 800), (1024, 768), (390, 844)])
def test_the_explorer_memory_column_is_whole_and_its_limit_no_menu(server, browser, width, height):
    ctx = browser.new_context(viewport={"width": width, "height": height})
    pg = ctx.new_page()
    pg.goto(server + "/explorer?model=gpt-1.7b&gpu=a100-sxm4-80gb&gpus=8&seq=2048&tokens=131072&top=10")
    pg.wait_for_selector("[data-testid=layouts] tbody tr")
    box = pg.locator("#table-wrap").bounding_box()
    for cell in pg.locator("[data-testid=memory-cell]").all()[:5]:
        c = cell.bounding_box()
        assert c["x"] >= box["x"] - 0.5 and c["x"] + c["width"] <= box["x"] + box["width"] + 0.5, (c, box)
        bar = cell.locator("svg").bounding_box()
        assert bar["width"] >= 60 and bar["x"] + bar["width"] <= c["x"] + c["width"] + 0.5
    marks = pg.evaluate("() => [...document.querySelectorAll('[data-testid=memory-cell] svg line')]"
                        ".map(l => [l.getAttribute('stroke'), l.getAttribute('stroke-dasharray') || ''])")
    assert marks and all(stroke == "#b3261e" and dash == "" for stroke, dash in marks)
    ctx.close()


def test_the_explanation_names_no_null_knob(server, page):
    page.goto(server + "/explorer?model=gpt-1.7b&gpu=h100-sxm5-80gb&gpus=8&seq=16384&tokens=1M&top=5")
    page.wait_for_selector("[data-testid=layouts] tbody tr")
    ans = api(server, "/api/explore", {"model": "gpt-1.7b", "gpu": "h100-sxm5-80gb", "gpus": 8, "seq": 16384,
                                       "global_batch_tokens": "1M", "top": 5,
                                       "schedules": ["1f1b", "interleaved", "zb-h1", "zbv"]})
    knobs = ans["why"]["knobs"]
    assert knobs and all(a is not None and b is not None and a != b for a, b in knobs.values())
    assert "cp_kind" not in knobs or None not in knobs["cp_kind"]
    text = page.inner_text("#why")
    for k, (a, b) in knobs.items():     # the runner-up's knob named with both values
        assert f"{b} instead of {a}" in text, (k, text)
    assert "null" not in text and "None" not in text and "undefined" not in text


def test_a_search_with_no_layout_says_why_on_the_page(server, page):
    """A stack that runs none of the layouts (Megatron-LM of 2022 has no experts) is named with its
    rule under the table; memory is not blamed."""
    page.goto(server + "/explorer?model=mixtral-8x7b&gpu=a100-sxm4-80gb&gpus=8&seq=4096&tokens=524288&top=5"
              "&framework=megatron-2022")
    page.wait_for_selector("#why:has-text('runs none of the')")
    text = page.inner_text("#why")
    assert "megatron-2022 runs none of the" in text and "mixture-of-experts" in text
    assert "fits in memory" not in text
    assert not page.errors


def test_the_picked_layouts_step_downloads_as_a_trace(server, page):
    """The detail's trace button saves the picked layout's predicted step (POST /api/predict/trace
    with the layout's knobs): a Chrome trace whose last span ends at the step time the table ranks
    the layout by, its tracks the pipeline ranks."""
    page.goto(server + "/explorer?model=gpt-1.7b&gpu=a100-sxm4-80gb&gpus=8&seq=2048&tokens=131072&top=20")
    page.wait_for_selector("[data-testid=layouts] tbody tr")
    ans = api(server, "/api/explore", EXPLORE)
    k = next(i for i, x in enumerate(ans["layouts"]) if x["pp"] > 1)
    page.locator("[data-testid=layouts] tbody tr").nth(k).click()
    page.wait_for_selector("[data-testid=trace]")
    with page.expect_download() as dl:
        page.click("[data-testid=trace]")
    trace = json.loads(Path(dl.value.path()).read_text())
    spans = [e for e in trace["traceEvents"] if e["ph"] == "X"]
    assert max(e["ts"] + e["dur"] for e in spans) == pytest.approx(ans["layouts"][k]["step_time_s"] * 1e6, rel=1e-9)
    tracks = [e["args"]["name"] for e in trace["traceEvents"] if e["name"] == "thread_name"]
    assert tracks == [f"pipeline rank {d}" for d in range(ans["layouts"][k]["pp"])]
    assert dl.value.suggested_filename == f"modelcut-step-layout-{k + 1}.json"
    assert not page.errors


def test_a_block_method_layout_shows_its_layers_and_keeps_them_in_its_trace(server, page):
    """A layout recomputing some layers of each chunk (the explorer's ``blocks``) reads ``blocks N``
    in the table, and the step its trace button asks the server for is that layout's, N layers and
    all: the trace ends at the step time the table ranks it by (every layer recomputed would not)."""
    body = {"model": "llama3-8b", "gpu": "a100-sxm4-40gb", "gpus": 8, "seq": 32768, "global_batch_tokens": 1048576,
            "top": 5}
    page.goto(server + "/explorer?model=llama3-8b&gpu=a100-sxm4-40gb&gpus=8&seq=32768&tokens=1048576&top=5")
    page.wait_for_selector("[data-testid=layouts] tbody tr")
    ans = api(server, "/api/explore", body)
    k = next(i for i, x in enumerate(ans["layouts"]) if x["recompute"] == "blocks")
    x = ans["layouts"][k]
    row = page.locator("[data-testid=layouts] tbody tr").nth(k)
    assert f"blocks {x['recompute_layers']}" in row.inner_text()
    row.click()
    page.wait_for_selector("[data-testid=trace]")
    with page.expect_download() as dl:
        page.click("[data-testid=trace]")
    trace = json.loads(Path(dl.value.path()).read_text())
    spans = [e for e in trace["traceEvents"] if e["ph"] == "X"]
    assert max(e["ts"] + e["dur"] for e in spans) == pytest.approx(x["step_time_s"] * 1e6, rel=1e-9)
    assert not page.errors


def test_explorer_shows_each_layouts_context_parallel_form(server, page):
    """Layouts that differ only in context parallelism's form (ring, all-gather, all-to-all, and the
    hierarchical all-to-all over a node's cp ranks with a ring across nodes) are told apart in the table, as the API ranks them, and in the picked layout's heading."""
    page.goto(server + "/explorer?model=llama3-8b&gpu=h100-sxm5-80gb&gpus=16&seq=131072&tokens=262144&top=12")
    page.wait_for_selector("[data-testid=layouts] tbody tr")
    ans = api(server, "/api/explore", {"model": "llama3-8b", "gpu": "h100-sxm5-80gb", "gpus": 16, "seq": 131072,
                                       "global_batch_tokens": 262144, "top": 12})
    names = {"ring": "ring", "allgather": "all-gather", "a2a": "all-to-all"}
    want = [(names.get(x["cp_kind"]) or f"all-to-all {x['cp_a2a']} · ring {x['cp'] // x['cp_a2a']}") if x["cp"] > 1 else None
            for x in ans["layouts"]]
    shown = page.eval_on_selector_all("[data-testid=layouts] tbody tr", """rs => rs.map(r => {
        const c = r.querySelector('[data-testid=cp-form]'); return c ? c.textContent : null; })""")
    assert shown == want and len({w for w in want if w}) >= 2
    k = next(i for i, x in enumerate(ans["layouts"]) if x["cp"] > 1)
    page.locator("[data-testid=layouts] tbody tr").nth(k).click()
    page.wait_for_selector("h2:has-text('Layout #')")
    assert f"cp {ans['layouts'][k]['cp']} ({want[k]})" in page.inner_text("h2:has-text('Layout #')")
    assert_no_overlapping_text(page)
    assert not page.errors


@pytest.mark.parametrize("query, group", [
    ("model=llama3-8b&gpu=h100-sxm5-80gb&gpus=32&seq=131072&tokens=1048576&top=3", "cp_a2a"),
    ("model=llama3-8b&gpu=h100-sxm5-80gb&gpus=64&seq=8192&tokens=4M&top=6&framework=fsdp-compile", "dp_shard"),
])
def test_explorer_mesh_shows_the_picked_layouts_own_groups(server, page, query, group):
    """The picked layout's mesh is the layout's own (POST /api/mesh with its order, shard group and
    hierarchical all-to-all groups): each group the API lists is shown, inside or across nodes, and
    each GPU's coordinates in those groups: a hierarchical layout's cp_a2a and cp_ring (Llama 3 8B at
    128K, the best), a hybrid-sharded one's dp_shard and dp_replica (torchtitan at 8K, among the first six,
within 0.1 % of the pipelined layouts beside it)."""
    page.goto(server + "/explorer?" + query)
    page.wait_for_selector("[data-testid=layouts] tbody tr")
    page.wait_for_selector("[data-testid=mesh] .gpu")
    q = dict(kv.split("=") for kv in query.split("&"))
    ans = api(server, "/api/explore", {"model": q["model"], "gpu": q["gpu"], "gpus": int(q["gpus"]),
                                       "seq": int(q["seq"]), "global_batch_tokens": q["tokens"], "top": int(q["top"])}
              | ({"framework": q["framework"]} if "framework" in q else {}))
    k = next(i for i, x in enumerate(ans["layouts"]) if x.get(group))     # its first such layout, picked
    x = ans["layouts"][k]
    if k:
        page.locator("[data-testid=layouts] tbody tr").nth(k).click()
        page.wait_for_function("n => document.querySelector('h2') && [...document.querySelectorAll('h2')].some("
                               "e => e.textContent.includes('Layout #' + n))", arg=k + 1)
        page.wait_for_selector(f".dims .dim[data-dim={group}]")
    body = {"tp": x["tp"], "cp": x["cp"], "pp": x["pp"], "dp": x["dp"], "order": x["order"], "gpus_per_node": 8}
    body |= {k: x[k] for k in ("cp_a2a", "dp_shard") if x.get(k)}
    mesh = api(server, "/api/mesh", body)
    shown = page.eval_on_selector_all(".dims .dim", "ds => ds.map(d => [d.dataset.dim, d.className])")
    assert [d for d, _ in shown] == list(mesh["dims"]) and group in mesh["dims"]
    assert all(how in cls for (_, cls), how in zip(shown, mesh["dims"].values()))
    words = {"cp_a2a": "cp all-to-all", "dp_shard": "dp shard"}[group]
    first = page.inner_text("[data-testid=mesh] .gpu >> nth=0")
    assert f"{words} {mesh['node_ranks'][0][group]}" in first
    assert not page.errors


def test_explorer_searches_the_context_parallel_forms_checked_and_keeps_them_in_its_link(server, page):
    """The form's checkboxes are the API's forms (GET /api/catalog), all checked; unchecking the
    hierarchical one searches the others (the request's cp_kinds, as the API ranks them), the link
    keeps the choice and a reload restores it; unchecking every form is one line, no search."""
    q = "/explorer?model=llama3-8b&gpu=h100-sxm5-80gb&gpus=32&seq=131072&tokens=1048576&top=8"
    page.goto(server + q)
    page.wait_for_selector("[data-testid=layouts] tbody tr")
    cat = httpx.get(server + "/api/catalog").json()
    boxes = page.eval_on_selector_all("input[name=cp_kind]", "bs => bs.map(b => [b.value, b.checked])")
    assert boxes == [[k["name"], True] for k in cat["cp_kinds"]] and "a2a+p2p" in dict(boxes)
    labels = page.eval_on_selector_all("#cp-kinds label", "ls => ls.map(l => l.textContent.trim())")
    assert labels == [k["label"] for k in cat["cp_kinds"]] and "hierarchical" in labels
    assert any("ring" in t and "·" in t for t in page.eval_on_selector_all(
        "[data-testid=cp-form]", "cs => cs.map(c => c.textContent)"))          # hierarchical rows ranked
    page.uncheck("input[name=cp_kind][value='a2a+p2p']")
    with page.expect_response("**/api/explore/stream") as resp:
        page.click("#go")
    assert resp.value.request.post_data_json["cp_kinds"] == ["ring", "allgather", "a2a"]
    page.wait_for_function("() => location.search.includes('cpkinds=')")
    page.wait_for_selector("[data-testid=layouts] tbody tr")
    ans = api(server, "/api/explore", {"model": "llama3-8b", "gpu": "h100-sxm5-80gb", "gpus": 32, "seq": 131072,
                                       "global_batch_tokens": 1048576, "top": 8,
                                       "cp_kinds": ["ring", "allgather", "a2a"]})
    page.wait_for_function("n => document.querySelectorAll('[data-testid=layouts] tbody tr').length === n",
                           arg=len(ans["layouts"]))
    shown = page.eval_on_selector_all("[data-testid=layouts] tbody tr", "rs => rs.map(r => r.dataset.rank)")
    assert shown == [str(x["rank"]) for x in ans["layouts"]]
    assert all(x["cp_kind"] != "a2a+p2p" for x in ans["layouts"])
    page.goto(page.url)
    page.wait_for_selector("[data-testid=layouts] tbody tr")
    assert not page.is_checked("input[name=cp_kind][value='a2a+p2p']") and page.is_checked(
        "input[name=cp_kind][value=ring]")
    for k in cat["cp_kinds"]:
        page.uncheck(f"input[name=cp_kind][value='{k['name']}']")
    page.click("#go")
    page.wait_for_selector("[data-testid=error]:not(:empty)")
    assert page.inner_text("[data-testid=error]").strip() == "choose at least one context-parallel form"
    assert not page.errors


def test_explorer_shows_the_picked_layouts_layer_line_by_line(server, page):
    """The picked layout's layer, line by line, is POST /api/predict's (layers: true) for that layout
    on the search's stack: the longest layer unit of the busiest device, its products, attention core
    and memory-bound kernels, their forward adding up to the heading's."""
    q = "model=llama3-8b&gpu=h100-sxm5-80gb&gpus=16&seq=8192&tokens=1M&top=3"
    page.goto(server + "/explorer?" + q)
    page.wait_for_selector("[data-testid=layer] tbody tr")
    ans = api(server, "/api/explore", {"model": "llama3-8b", "gpu": "h100-sxm5-80gb", "gpus": 16, "seq": 8192,
                                       "global_batch_tokens": "1M", "top": 3})
    x = ans["layouts"][0]
    body = {"model": "llama3-8b", "gpu": ans["hardware"]["name"], "framework": ans["framework"], "mode": ans["mode"],
            "layers": True,
            "layout": {k: x[k] for k in ("tp", "cp", "pp", "dp", "vpp", "zero", "schedule", "order",
                                         "sequence_parallel")} | ({"cp_kind": x["cp_kind"]} if x["cp"] > 1 else {}),
            "training": {"seq_len": ans["seq"], "global_batch": ans["global_batch"], "micro_batch": x["micro_batch"],
                         "recompute": x["recompute"], "precision": ans["precision"]}}
    lb = api(server, "/api/predict", body)["layers"]
    unit = max((u for u in lb["units"] if "layer" in u["unit"] and u["per_device"]),
               key=lambda u: u["per_device"] * (u["fwd_s"] + u["bwd_s"]))
    rows = page.eval_on_selector_all("[data-testid=layer] tbody tr",
                                     "rs => rs.map(r => [...r.cells].map(c => c.textContent))")
    assert [r[0] for r in rows] == [ln["item"] for ln in unit["lines"]]
    assert [r[1] for r in rows] == [f"{ln['fwd_s'] * 1e3:.3f}" for ln in unit["lines"]]
    assert {"qkv", "proj", "mlp up", "mlp down", "attention core"} <= {r[0] for r in rows}
    head = page.inner_text("h3:has-text('line by line')")
    assert f"forward {unit['fwd_s'] * 1e3:.3f} ms" in head
    assert abs(sum(float(r[1]) for r in rows) - unit["fwd_s"] * 1e3) < 0.001 * len(rows)
    assert "TFLOP/s" in rows[0][3]
    shares = page.inner_text("[data-testid=layer-kinds]")
    total = sum(lb["by_kind_s"].values())
    assert f"{lb['by_kind_s']['product'] / total * 100:.0f} %" in shares and "products" in shares
    assert_no_overlapping_text(page)
    assert not page.errors


def test_explorer_shows_a_lighter_last_rank_and_picks_it(server, page):
    """A layout whose last pipeline rank holds fewer layers (the explorer's balance for the output
    layer) says so in the table and the heading, and its detail is predicted with that split."""
    q = {"model": "nemotron3-22b", "gpu": "h100-sxm5-80gb", "gpus": 64, "seq": 4096, "global_batch_tokens": "1M",
         "top": 12}
    ans = api(server, "/api/explore", q)
    k = next(i for i, x in enumerate(ans["layouts"]) if x["last_layers"])
    x = ans["layouts"][k]
    page.goto(server + "/explorer?model=nemotron3-22b&gpu=h100-sxm5-80gb&gpus=64&seq=4096&tokens=1M&top=12")
    page.wait_for_selector("[data-testid=layouts] tbody tr")
    row = page.locator("[data-testid=layouts] tbody tr").nth(k)
    assert f"{x['schedule']}, last {x['last_layers']}" in row.inner_text()
    with page.expect_request(lambda r: r.url.endswith("/api/predict") and r.method == "POST") as req:
        row.click()
    assert req.value.post_data_json["layout"]["last_layers"] == x["last_layers"]
    page.wait_for_selector(f"h2:has-text('Layout #{k + 1}')")
    assert f"last rank {x['last_layers']} layers" in page.inner_text(f"h2:has-text('Layout #{k + 1}')")
    page.wait_for_selector("[data-testid=layer] tbody tr")
    assert_no_overlapping_text(page)
    assert not page.errors


def test_the_explorer_reduces_gradients_in_the_type_chosen_and_keeps_it(server, page):
    """The form's gradient-reduce type goes to the API as grad_reduce, the stack line names it, the
    URL keeps it, and a picked layout is predicted with it; a type the precision cannot take is one line."""
    page.goto(server + "/explorer?model=mpt-7b&gpu=h100-sxm5-80gb&gpus=64&seq=2048&tokens=256K&top=5"
              "&framework=llm-foundry")
    page.wait_for_selector("[data-testid=layouts] tbody tr")
    cat = httpx.get(server + "/api/catalog").json()     # the choices the API takes, no second list in the page
    assert page.eval_on_selector_all("#reduce option", "os => os.map(o => o.value)") == ["", *cat["grad_reduce_dtypes"]]
    assert cat["grad_reduce_dtypes"] == ["fp32", "bf16", "fp16"]
    page.select_option("#reduce", "fp32")
    with page.expect_request("**/api/explore/stream") as req:
        page.click("#go")
    assert req.value.post_data_json["grad_reduce"] == "fp32"
    page.wait_for_function("() => document.querySelector('[data-testid=stack]')"
                           " && document.querySelector('[data-testid=stack]').textContent.includes('fp32')")
    assert page.inner_text("[data-testid=stack]") == ("Stack: llm-foundry; matrix products in bf16; "
                                                      "gradients reduced in fp32.")
    assert "reduce=fp32" in page.url
    row = page.locator("[data-testid=layouts] tbody tr").first
    with page.expect_request(lambda r: r.url.endswith("/api/predict") and r.method == "POST") as req:
        row.click()
    assert req.value.post_data_json["training"]["grad_reduce"] == "fp32"
    page.select_option("#reduce", "fp16")
    page.click("#go")
    page.wait_for_selector("[data-testid=error]:not(:empty)")
    err = page.inner_text("[data-testid=error]")
    assert "16-bit type" in err and "\n" not in err.strip()
    # refused before any search, as the count of layouts reads the stack: the request's own 422
    assert page.errors and all("status of 422" in e for e in page.errors)


def test_the_explorer_runs_the_attention_kernel_chosen_and_keeps_it(server, page):
    """The form's attention kernel (its choices from GET /api/catalog) goes to the API as attention,
    the stack line names it, the link keeps it and a picked layout is predicted with it."""
    page.goto(server + "/explorer?model=llama3-8b&gpu=h100-sxm5-80gb&gpus=16&seq=8192&tokens=512K&top=5"
              "&attention=flash3")
    page.wait_for_selector("[data-testid=layouts] tbody tr")
    cat = httpx.get(server + "/api/catalog").json()
    assert page.eval_on_selector_all("#attention option", "os => os.map(o => o.value)") == ["",
                                                                                          *cat["attention_kinds"]]
    assert page.input_value("#attention") == "flash3"                  # from the link
    page.wait_for_function("() => document.querySelector('[data-testid=stack]')"
                           " && document.querySelector('[data-testid=stack]').textContent.includes('flash3')")
    assert page.inner_text("[data-testid=stack]").endswith("; attention by flash3.")
    row = page.locator("[data-testid=layouts] tbody tr").first
    with page.expect_request(lambda r: r.url.endswith("/api/predict") and r.method == "POST") as req:
        row.click()
    assert req.value.post_data_json["training"]["attention"] == "flash3"
    page.select_option("#attention", "cudnn")
    with page.expect_request("**/api/explore/stream") as req:
        page.click("#go")
    assert req.value.post_data_json["attention"] == "cudnn"
    page.wait_for_function("() => location.search.includes('attention=cudnn')")
    assert not page.errors


def test_runs_page_shows_a_picked_runs_step_and_layer(server, page):
    """Picking a run on the runs page shows GET /api/runs/{id}'s answer: its step time and terms and,
    under the default model, its longest layer line by line; switching to the seed model clears it."""
    page.goto(server + "/runs?set=all&mode=default")
    page.wait_for_selector("[data-testid=runs] tbody tr")
    run_id = "automodel-qwen3-30b-a3b-8"
    page.locator(f"[data-testid=runs] tbody tr[data-id='{run_id}']").click()
    page.wait_for_selector("[data-testid=run-detail] [data-testid=layer] tbody tr")
    ans = api(server, f"/api/runs/{run_id}?mode=default&layers=true")
    head = page.inner_text("[data-testid=run-detail] h2")
    assert head.startswith(run_id) and f"{ans['microbatches']} micro-batches" in head
    text = page.inner_text("[data-testid=run-detail]")
    assert f"{ans['published']['error_pct']:.1f}".lstrip("-") in text
    unit = max((u for u in ans["layers"]["units"] if "layer" in u["unit"] and u["per_device"]),
               key=lambda u: u["per_device"] * (u["fwd_s"] + u["bwd_s"]))
    rows = page.eval_on_selector_all("[data-testid=run-detail] [data-testid=layer] tbody tr",
                                     "rs => rs.map(r => [r.cells[0].textContent, r.cells[1].textContent])")
    assert rows == [[ln["item"], f"{ln['fwd_s'] * 1e3:.3f}"] for ln in unit["lines"]]
    assert page.locator(f"[data-testid=runs] tbody tr.picked[data-id='{run_id}']").count() == 1
    page.select_option("#mode", "seed")
    page.wait_for_function("() => !document.querySelector('[data-testid=run-detail] h2')")
    assert_no_overlapping_text(page)
    assert not page.errors


def test_the_explorer_runs_a_pipeline_over_the_local_batch_given_and_keeps_it(server, page):
    """The form's local batch goes to the API as local_batch, the stack line names it, the link keeps
    it, and a picked pipelined layout is predicted with it (its schedule runs a step as searched);
    a local batch that is not a whole number is one line on the page, with no request."""
    page.goto(server + "/explorer?model=llama3-8b&gpu=h100-sxm5-80gb&gpus=16&seq=4096&tokens=256K&top=60"
              "&framework=nemo-automodel&local=2")
    page.wait_for_selector("[data-testid=layouts] tbody tr")
    assert page.input_value("#local") == "2"                           # from the link
    page.wait_for_function("() => document.querySelector('[data-testid=stack]')"
                           " && document.querySelector('[data-testid=stack]').textContent.includes('2 sequences')")
    with page.expect_request("**/api/explore/stream") as req:
        page.click("#go")
    assert req.value.post_data_json["local_batch"] == 2
    page.wait_for_selector("[data-testid=layouts] tbody tr")
    assert "local=2" in page.url
    ans = api(server, "/api/explore", {"model": "llama3-8b", "gpu": "h100-sxm5-80gb", "gpus": 16, "seq": 4096,
                                       "global_batch_tokens": "256K", "top": 60, "framework": "nemo-automodel",
                                       "local_batch": 2})
    piped = [x["rank"] for x in ans["layouts"] if x["pp"] > 1]
    assert ans["local_batch"] == 2 and piped
    row = page.locator(f"[data-testid=layouts] tbody tr[data-rank='{piped[0]}']")
    with page.expect_request(lambda r: r.url.endswith("/api/predict") and r.method == "POST") as req:
        row.click()
    assert req.value.post_data_json["training"]["local_batch"] == 2
    page.fill("#local", "0")
    page.click("#go")
    page.wait_for_selector("[data-testid=error]:not(:empty)")
    assert "Local batch" in page.inner_text("[data-testid=error]")
    assert not page.errors

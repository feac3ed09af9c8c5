"""One self-contained HTML file with the animated pipeline timeline (``modelcut simulate --html FILE``).

The file inlines the web app's own player script and style (``modelcut/web/static/timeline.js`` and
``style.css``) and the simulation as ``modelcut simulate --json`` prints it, so it plays the same
animation as the served pipeline page with no server and no network: a Content-Security-Policy in
the file forbids every fetch. Open it in a browser or embed it in a deck.
"""

from __future__ import annotations

import html
import json
from importlib import resources

from ..core.sim.run import PipelineResult
from . import pipeline_json

_BOOT = """
(function () {
  'use strict';
  var TL = window.ModelcutTimeline;
  var data = JSON.parse(document.getElementById('modelcut-data').textContent);
  document.getElementById('title').textContent = TL.title(data);
  TL.renderStats(document.getElementById('stats'), data);
  var reduced = window.matchMedia && window.matchMedia('(prefers-reduced-motion: reduce)').matches;
  var player = new TL.Player(document.getElementById('player'), {autoplay: !reduced});
  player.setData(data);
})();
"""


def _static(name: str) -> str:
    return (resources.files("modelcut.web") / "static" / name).read_text(encoding="utf-8")


def _command(data: dict) -> str:
    t = data["timing"]
    parts = ["modelcut simulate", f"-s {data['schedule']}", f"-p {data['devices']}",
             f"-m {data['microbatches']}", f"-v {data['chunks']}",
             f"--forward {t['forward']:g}", f"--backward {t['backward']:g}"]
    if t["weight"] is not None:
        parts.append(f"--weight {t['weight']:g}")
    if t["p2p"]:
        parts.append(f"--p2p {t['p2p']:g}")
    # One unbreakable span per option, so a narrow panel wraps between options, not inside one.
    return " ".join(f'<span class="nowrap">{html.escape(x)}</span>' for x in parts)


def render(result: PipelineResult) -> str:
    """The HTML document, as text."""
    data = pipeline_json.to_dict(result)
    # Inside <script>, "<" could start "</script>" or "<!--": JSON's \\u003c escape keeps the data inert.
    payload = json.dumps(data, allow_nan=False, separators=(",", ":")).replace("<", "\\u003c")
    script = _static("timeline.js")
    style = _static("style.css")
    for text in (script, _BOOT):
        if "</script" in text.lower():  # would end the inline script early
            raise RuntimeError("inline script contains '</script'")
    name = html.escape(f"{data['schedule']} p={data['devices']} m={data['microbatches']} v={data['chunks']}")
    command = _command(data)
    return f"""<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta http-equiv="Content-Security-Policy"
      content="default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; img-src data:">
<meta name="viewport" content="width=device-width, initial-scale=1">
<meta name="generator" content="modelcut">
<title>modelcut · {name}</title>
<style>
{style}
</style>
</head>
<body>
<header class="topbar"><span class="brand">modelcut<small>pipeline timeline</small></span></header>
<main class="layout">
  <aside class="panel" aria-label="Result">
    <h2>Result</h2>
    <section id="stats"></section>
    <h3>Settings</h3>
    <p class="small"><code>{command}</code></p>
  </aside>
  <section class="main" aria-labelledby="title">
    <h1 id="title">{name}</h1>
    <div id="player"></div>
  </section>
</main>
<footer class="export-foot">Written by modelcut; this file needs no server and no network.
  Space plays or pauses, the arrow keys step from one op boundary to the next.</footer>
<script id="modelcut-data" type="application/json">{payload}</script>
<script>
{script}
</script>
<script>{_BOOT}</script>
</body>
</html>
"""

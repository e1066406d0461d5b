"""The dashboard in headless Chromium (Debian's; Playwright only drives it): it lists the running
streams with their previews and draws their fps and latency."""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path

import cv2
import numpy as np
import pytest

sync_api = pytest.importorskip("playwright.sync_api")
pytest.importorskip("av")
pytest.importorskip("aiohttp")
pytest.importorskip("prometheus_client")
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
if CHROMIUM is None:
    pytest.skip("needs Debian's chromium (.ci/run installs it)", allow_module_level=True)

from swapstream.demo import astronaut  # noqa: E402

from .conftest import TOKEN, Served  # noqa: E402
from .test_api import png, request  # noqa: E402

ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-background-networking",
        "--disable-component-update", "--disable-sync", "--autoplay-policy=no-user-gesture-required"]


def test_dashboard_lists_streams_with_previews_and_charts(served: Served, tmp_path: Path) -> None:
    for sid, outputs in (("studio", [{"type": "hls"}]), ("lobby", [{"type": "null"}])):
        status, _, body = request(served, "POST", "/api/streams", {
            "id": sid, "input": {"file": "clip.mp4", "loop": True}, "outputs": outputs, "budget_ms": 5000})
        assert status == 201, body
        assert request(served, "PUT", f"/api/streams/{sid}/source", raw=png(astronaut()), ctype="image/png")[0] == 200
    external: list[str] = []
    with sync_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        page = browser.new_page(viewport={"width": 900, "height": 700})
        # Blob URLs are the page's own previews, made from responses of this server.
        page.on("request", lambda r: None if r.url.startswith((served.url, "blob:" + served.url))
                else external.append(r.url))
        # Without the token the page asks for it and shows nothing.
        page.goto(served.url + "/dashboard")
        page.wait_for_selector("#login:not([hidden])", timeout=10000)
        assert page.locator(".card").count() == 0
        page.goto(served.url + "/dashboard#token=" + TOKEN)
        page.wait_for_function("window.dash.streams.length === 2 && window.dash.polls >= 4", timeout=30000)
        assert sorted(page.evaluate("window.dash.streams")) == ["lobby", "studio"]
        assert "token" not in page.url  # the token leaves the address bar
        page.wait_for_function("Object.values(window.dash.fps).every(f => f > 2)", timeout=20000)
        # Previews: the last-frame image for the stream without HLS; for the HLS stream, once its
        # playlist exists, the live HLS video (Debian's Chromium plays HLS natively).
        page.wait_for_function("""() => {
            const lobby = document.querySelector('#card-lobby .preview');
            const studio = document.querySelector('#card-studio .preview');
            return lobby.tagName === 'IMG' && lobby.naturalWidth > 0
                && studio.tagName === 'VIDEO' && studio.readyState >= 2 && studio.currentTime > 0;
        }""", timeout=30000)
        kinds = page.evaluate("[...document.querySelectorAll('.card')].map(c => [c.dataset.stream, "
                              "c.querySelector('.preview').tagName])")
        fps_text = page.locator("#card-lobby .v-fps").inner_text()
        # The chart has been drawn: fps and latency lines in their colours.
        chart = np.frombuffer(page.locator("#card-lobby canvas").screenshot(), np.uint8)
        shot = page.screenshot(full_page=True)
        (tmp_path / "dashboard.png").write_bytes(shot)
        browser.close()
    assert external == []  # nothing outside the server was requested
    assert float(fps_text) > 2
    # Debian's Chromium plays HLS natively: the HLS stream's preview is the live video itself.
    assert sorted(kinds) == [["lobby", "IMG"], ["studio", "VIDEO"]], kinds
    img = cv2.imdecode(chart, cv2.IMREAD_COLOR)  # BGR
    fps_px = ((img[..., 0] > 200) & (img[..., 1] > 150) & (img[..., 2] < 140)).sum()   # #6cf
    lat_px = ((img[..., 2] > 200) & (img[..., 1] > 160) & (img[..., 0] < 140)).sum()  # #fc6
    # A few polls' worth of line each (6 px per poll at this width; measured 8-26 px per colour).
    assert fps_px >= 5 and lat_px >= 5, (fps_px, lat_px)
    # The API agrees with what the page showed.
    status, _, body = request(served, "GET", "/api/streams")
    assert {s["id"] for s in json.loads(body)["streams"]} == {"studio", "lobby"}

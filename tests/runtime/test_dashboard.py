"""The dashboard in headless Chromium (Debian's; Playwright only drives it): it lists the running
streams with their previews and draws their fps and latency."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

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


PREVIEW_STATE = """() => Object.fromEntries([...document.querySelectorAll('.card')].map(c => {
    const p = c.querySelector('.preview');
    return [c.dataset.stream, {tag: p.tagName, width: p.naturalWidth ?? null, ready: p.readyState ?? null,
                               time: p.currentTime ?? null, error: p.error ? p.error.message : null}];
}))"""
"""Each card's preview as the page holds it: what a failed wait on the previews reports."""


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
        # Generous timeouts: two streams swap on the CPU beside Chromium on CI's two cores; each
        # wait is on a condition, so a fast machine does not wait longer.
        page.wait_for_function("window.dash.streams.length === 2 && window.dash.polls >= 4", timeout=60000)
        assert sorted(page.evaluate("window.dash.streams")) == ["lobby", "studio"]
        assert "token" not in page.url  # the token leaves the address bar
        page.wait_for_function("Object.values(window.dash.fps).every(f => f > 2)", timeout=60000)
        # Previews: the last-frame image for the stream without HLS; for the HLS stream, once its
        # playlist exists, the live HLS video (Debian's Chromium plays HLS natively).
        try:
            page.wait_for_function("""() => {
                const lobby = document.querySelector('#card-lobby .preview');
                const studio = document.querySelector('#card-studio .preview');
                return lobby.tagName === 'IMG' && lobby.naturalWidth > 0
                    && studio.tagName === 'VIDEO' && studio.readyState >= 2 && studio.currentTime > 0;
            }""", timeout=60000)
        except sync_api.TimeoutError:
            # Say which preview did not come, and in what state, rather than only that the wait ran out.
            pytest.fail(f"previews not shown: {page.evaluate(PREVIEW_STATE)}; "
                        f"HLS errors: {page.evaluate('window.dash.hlsErrors')}")
        kinds = page.evaluate("[...document.querySelectorAll('.card')].map(c => [c.dataset.stream, "
                              "c.querySelector('.preview').tagName])")
        fps_text = page.locator("#card-lobby .v-fps").inner_text()
        # The chart has been drawn: pixels of the fps line (#6cf) and of the latency scale (#fc6:
        # the p99 line and the dashed budget line), read from the canvas itself (a screenshot of a
        # CSS-scaled canvas can fade 1.5 px lines below any colour threshold). Anti-aliased edges
        # are allowed 60 levels per channel.
        counts = page.wait_for_function("""() => {
            const c = document.querySelector('#card-lobby canvas');
            const d = c.getContext('2d').getImageData(0, 0, c.width, c.height).data;
            let fps = 0, lat = 0;
            const near = (i, r, g, b) => d[i + 3] > 128 && Math.abs(d[i] - r) < 60
                && Math.abs(d[i + 1] - g) < 60 && Math.abs(d[i + 2] - b) < 60;
            for (let i = 0; i < d.length; i += 4) {
                if (near(i, 0x66, 0xcc, 0xff)) fps++;
                if (near(i, 0xff, 0xcc, 0x66)) lat++;
            }
            return fps >= 5 && lat >= 5 ? [fps, lat] : null;
        }""", timeout=30000).json_value()
        shot = page.screenshot(full_page=True)
        (tmp_path / "dashboard.png").write_bytes(shot)
        browser.close()
    assert external == []  # nothing outside the server was requested
    assert float(fps_text) > 2
    # Debian's Chromium plays HLS natively: the HLS stream's preview is the live video itself.
    assert sorted(kinds) == [["lobby", "IMG"], ["studio", "VIDEO"]], kinds
    fps_px, lat_px = counts
    assert fps_px >= 5 and lat_px >= 5, (fps_px, lat_px)
    # The API agrees with what the page showed.
    status, _, body = request(served, "GET", "/api/streams")
    assert {s["id"] for s in json.loads(body)["streams"]} == {"studio", "lobby"}

"""The web playground at ``/`` in a real headless Chromium (Debian's ``chromium`` + ``chromium-driver``, driven by
Selenium) against a live server with the built-in model and an API key: the page asks for the key, then loads with
no console errors; a sentence streams over the WebSocket (key as a subprotocol) and plays through Web Audio; a voice
uploaded with its transcript and consent appears in the lists and speaks; an empty text shows the server's error.
The HTTP side (the page is open, strict headers, the key subprotocol) is checked without a browser.
"""

from __future__ import annotations

import base64
import json
import shutil

import httpx
import pytest
from websockets.exceptions import InvalidStatus
from websockets.sync.client import connect

from cadenza import Cadenza
from cadenza.builtin import builtin_model_dir
from cadenza.server import ServerConfig, create_app
from cadenza.voices import VoiceStore

from test_server_harness import CONSENT, LiveServer, speech_prompt, wav_bytes

KEY = "playground-key-0123"
WS_PATH = "/v1/audio/speech/stream"
BROWSER_TIMEOUT_S = 60


@pytest.fixture(scope="module")
def live(tmp_path_factory):
    tts = Cadenza.from_pretrained(builtin_model_dir())  # the built-in model: real speech, a default voice, shipped in the package
    store = VoiceStore(tmp_path_factory.mktemp("voices"))
    try:
        with LiveServer(create_app(tts, store, ServerConfig(api_key=KEY))) as server:
            yield server
    finally:
        store.close()
        tts.close()


def _key_protocol(key: str) -> str:
    return "cadenza.key." + base64.urlsafe_b64encode(key.encode()).decode().rstrip("=")


def test_page_is_open_and_strict(live):
    with httpx.Client(base_url=live.url, timeout=30) as client:
        page = client.get("/")
        assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
        csp = page.headers["content-security-policy"]
        assert "default-src 'none'" in csp and "script-src 'self'" in csp and "connect-src 'self'" in csp
        assert page.headers["x-content-type-options"] == "nosniff"
        assert '<script type="module" src="/playground/app.js">' in page.text and "https://" not in page.text
        script = client.get("/playground/app.js")
        assert script.status_code == 200 and script.headers["content-type"].startswith("text/javascript")
        assert client.get("/playground/style.css").headers["content-type"].startswith("text/css")
        missing = client.get("/playground/secrets.txt")
        assert missing.status_code == 404 and missing.json()["error"]["code"] == "not_found"
        assert client.get("/v1/models").status_code == 401  # the page is open; the API behind it is not


def test_websocket_takes_the_key_as_a_subprotocol(live):
    url = live.ws_url + WS_PATH
    with connect(url, subprotocols=["cadenza", _key_protocol(KEY)], open_timeout=30) as ws:
        assert ws.subprotocol == "cadenza"  # selected; the key protocol is never echoed back
        ws.send(json.dumps({"type": "session.config", "seed": 3}))
        assert json.loads(ws.recv(timeout=30))["type"] == "audio.start"
    for protocols in (["cadenza", _key_protocol("wrong-key-0123")], ["cadenza", "cadenza.key.!!"], ["cadenza"]):
        with pytest.raises(InvalidStatus) as info:
            with connect(url, subprotocols=protocols, open_timeout=30):
                pass
        assert info.value.response.status_code == 401, protocols


# ---- in the browser -------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def browser():
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    chromedriver = shutil.which("chromedriver")
    if chromium is None or chromedriver is None:
        pytest.skip("the playground test needs Debian's Chromium and its WebDriver: apt-get install chromium "
                    "chromium-driver (.ci/run installs them)")
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = chromium
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--mute-audio",
                "--window-size=1280,900", "--use-fake-ui-for-media-stream", "--use-fake-device-for-media-stream"):
        options.add_argument(arg)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(options=options, service=Service(executable_path=chromedriver))
    driver.set_page_load_timeout(BROWSER_TIMEOUT_S)
    try:
        yield driver
    finally:
        driver.quit()


def _stats(driver) -> dict:
    return driver.execute_script("return window.cadenzaPlayground && window.cadenzaPlayground.stats")


def _wait(driver, predicate, what: str) -> dict:
    from selenium.webdriver.support.ui import WebDriverWait

    WebDriverWait(driver, BROWSER_TIMEOUT_S, poll_frequency=0.05).until(
        lambda d: (s := _stats(d)) is not None and predicate(s), message=f"waiting for {what}: {_stats(driver)}")
    return _stats(driver)


def _console_errors(driver) -> list[str]:
    """Console messages at SEVERE level since the last call (reading drains the log)."""
    return [entry["message"] for entry in driver.get_log("browser") if entry["level"] == "SEVERE"]


@pytest.fixture()
def page(browser, live):
    """The playground, loaded with the key already stored by an earlier visit (localStorage)."""
    browser.get(live.url + "/")
    if browser.execute_script("return localStorage.getItem('cadenza.apiKey')") != KEY:
        browser.execute_script("localStorage.setItem('cadenza.apiKey', arguments[0])", KEY)
        browser.refresh()
    _wait(browser, lambda s: s["state"] == "ready", "the models and voices to load")
    _console_errors(browser)
    return browser


def test_page_asks_for_the_key_then_loads_cleanly(browser, live):
    from selenium.webdriver.common.by import By

    browser.get(live.url + "/")
    browser.execute_script("localStorage.clear()")
    browser.refresh()
    stats = _wait(browser, lambda s: s["state"] == "error", "the missing key to be reported")
    error = browser.find_element(By.ID, "error")
    assert error.is_displayed() and "API key" in error.text, error.text
    assert stats["models"] == 0 and not browser.find_element(By.ID, "play").is_enabled()
    _console_errors(browser)  # the 401 itself is logged by Chromium: that answer was the point

    key = browser.find_element(By.ID, "api-key")
    key.send_keys(KEY)
    browser.find_element(By.ID, "text").click()  # leaving the field commits it
    _wait(browser, lambda s: s["state"] == "ready", "the models to load with the key")
    browser.refresh()  # the key survives a reload, and this load is clean
    stats = _wait(browser, lambda s: s["state"] == "ready", "the page to load again")
    assert _console_errors(browser) == []
    assert browser.find_element(By.ID, "api-key").get_attribute("value") == KEY
    assert not browser.find_element(By.ID, "error").is_displayed()
    assert stats["models"] == 1
    # The model's capabilities decide the fields: the built-in CosyVoice 2 has speed 0.5-2.0 and, reading phonemes,
    # no style instructions (app.js shows the field for `instruct` and `voice_design` models only).
    assert browser.find_element(By.ID, "speed-field").is_displayed()
    assert browser.find_element(By.ID, "speed").get_attribute("min") == "0.5"
    assert not browser.find_element(By.ID, "instructions-field").is_displayed()
    assert not browser.find_element(By.ID, "cloning-field").is_displayed()


def test_sentence_streams_and_plays(page):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    text = page.find_element(By.ID, "text")
    text.clear()
    text.send_keys("The man walked to the house in the evening.")
    page.find_element(By.ID, "seed").send_keys("5")
    page.find_element(By.ID, "play").click()
    stats = _wait(page, lambda s: s["state"] in ("done", "error"), "the sentence to play")
    assert stats["state"] == "done" and stats["lastError"] is None, stats
    assert stats["frames"] > 0 and stats["seconds"] > 0.3 and stats["sampleRate"] == 24000, stats
    assert 0 < stats["firstAudioMs"] < 30_000 and stats["serverFirstAudioS"] > 0, stats
    assert page.find_element(By.ID, "stat-first").text.endswith("ms)")
    # Web Audio really plays it: the audio clock runs through the chunks scheduled back to back.
    WebDriverWait(page, 10, poll_frequency=0.05).until(
        lambda d: d.execute_script("return window.cadenzaPlayground.playedSeconds()") >= 0.3,
        message="the audio clock did not play through the received audio")
    assert _console_errors(page) == []


def test_voice_upload_appears_and_speaks(page, tmp_path):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select

    before = _stats(page)["voices"]
    recording = tmp_path / "prompt.wav"
    samples, rate = speech_prompt(3.0)
    recording.write_bytes(wav_bytes(samples, rate))
    page.find_element(By.ID, "voice-name").send_keys("Playground Alice")
    page.find_element(By.ID, "voice-file").send_keys(str(recording))
    page.find_element(By.ID, "voice-transcript").send_keys("Just by listening a few minutes a day.")
    page.find_element(By.ID, "voice-statement").send_keys(CONSENT)
    page.find_element(By.ID, "save-voice").click()  # consent box not ticked yet: the page refuses
    stats = _wait(page, lambda s: s["lastError"] is not None, "the consent box to be required")
    assert stats["lastError"].startswith("consent:") and stats["voices"] == before
    page.find_element(By.ID, "voice-consent").click()
    page.find_element(By.ID, "save-voice").click()
    stats = _wait(page, lambda s: s["voices"] == before + 1, "the voice to be saved")
    assert stats["lastError"] is None and "Saved" in page.find_element(By.ID, "voice-message").text
    rows = page.find_elements(By.CSS_SELECTOR, "#voice-table tbody tr")
    assert "Playground Alice" in [r.find_element(By.TAG_NAME, "td").text for r in rows]
    voice = Select(page.find_element(By.ID, "voice"))
    assert voice.first_selected_option.text == "Playground Alice"  # the new voice is selected to try it

    text = page.find_element(By.ID, "text")
    text.clear()
    text.send_keys("Hello there.")
    page.find_element(By.ID, "play").click()
    stats = _wait(page, lambda s: s["state"] in ("done", "error"), "the saved voice to speak")
    assert stats["state"] == "done" and stats["frames"] > 0 and stats["seconds"] > 0.3, stats
    assert _console_errors(page) == []


def test_empty_text_shows_the_server_error(page):
    from selenium.webdriver.common.by import By

    page.find_element(By.ID, "text").clear()
    page.find_element(By.ID, "play").click()
    stats = _wait(page, lambda s: s["state"] == "error", "the error")
    error = page.find_element(By.ID, "error")
    assert error.is_displayed() and error.text.startswith("text: nothing to speak"), error.text
    assert stats["lastError"] == error.text and stats["frames"] == 0
    assert page.find_element(By.ID, "status").get_attribute("data-error") == error.text


def test_recorded_voice_is_saved(page):
    """MediaRecorder (Chromium's fake microphone: a beep each second) -> WebM/Opus upload -> a saved voice."""
    from selenium.webdriver.common.by import By

    before = _stats(page)["voices"]
    page.find_element(By.ID, "record").click()
    page.execute_script("return new Promise((done) => setTimeout(done, 1500))")
    page.find_element(By.ID, "record").click()  # stop
    _wait(page, lambda s: page.find_element(By.ID, "recorded").is_displayed(), "the recording to be ready")
    page.find_element(By.ID, "voice-name").send_keys("Recorded")
    page.find_element(By.ID, "voice-statement").send_keys(CONSENT)
    page.find_element(By.ID, "voice-consent").click()
    page.find_element(By.ID, "save-voice").click()
    stats = _wait(page, lambda s: s["voices"] == before + 1 or s["lastError"] is not None, "the recorded voice")
    assert stats["lastError"] is None, stats
    assert "Recorded" in [r.find_element(By.TAG_NAME, "td").text
                          for r in page.find_elements(By.CSS_SELECTOR, "#voice-table tbody tr")]


def test_speed_download_and_delete(page, live):
    """Speed != 1 streams PCM from POST /v1/audio/speech (the WebSocket has none); Download fetches a format; Delete
    removes a saved voice after the browser's confirmation."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select, WebDriverWait

    text = page.find_element(By.ID, "text")
    text.clear()
    text.send_keys("Hello there.")
    speed = page.find_element(By.ID, "speed")
    speed.clear()
    speed.send_keys("1.5")
    page.find_element(By.ID, "play").click()
    stats = _wait(page, lambda s: s["state"] in ("done", "error"), "speech at speed 1.5")
    assert stats["state"] == "done" and stats["frames"] > 0 and stats["seconds"] > 0.1, stats
    assert stats["sampleRate"] == 24000 and stats["serverFirstAudioS"] is None  # HTTP: no server figure

    Select(page.find_element(By.ID, "format")).select_by_visible_text("wav")
    page.find_element(By.ID, "download").click()
    stats = _wait(page, lambda s: s["state"] in ("done", "error"), "the download")
    assert stats["state"] == "done" and stats["lastError"] is None, stats
    link = page.find_element(By.ID, "result-link")
    assert link.get_attribute("download") == "speech.wav" and link.get_attribute("href").startswith("blob:")
    assert "speech.wav" in link.text
    # The browser decodes the downloaded WAV: its <audio> knows the duration.
    duration = "return document.getElementById('result-audio').duration"
    WebDriverWait(page, 10, poll_frequency=0.05).until(lambda d: (d.execute_script(duration) or 0) > 0.1,
                                                       message="the downloaded WAV did not load in <audio>")

    with httpx.Client(base_url=live.url, timeout=60, headers={"Authorization": f"Bearer {KEY}"}) as client:
        samples, rate = speech_prompt(2.0)
        created = client.post("/v1/audio/voices", files={"audio": ("v.wav", wav_bytes(samples, rate))},
                              data={"name": "To Delete", "consent": CONSENT})
        assert created.status_code == 201, created.text
        page.refresh()
        _wait(page, lambda s: s["state"] == "ready", "the page to load")
        row = page.find_element(By.CSS_SELECTOR, f"#voice-table tr[data-voice-id='{created.json()['id']}']")
        before = _stats(page)["voices"]
        row.find_element(By.TAG_NAME, "button").click()
        page.switch_to.alert.accept()
        _wait(page, lambda s: s["voices"] == before - 1, "the voice to be deleted")
        assert client.get(f"/v1/audio/voices/{created.json()['id']}").status_code == 404
    assert _console_errors(page) == []


def test_a_recording_is_converted_into_the_picked_voice(page, tmp_path):
    """Convert (shown for a model with voice_conversion, the built-in one): a real recording and what it says go to
    POST /v1/audio/voice-conversion; the converted WAV plays in <audio>, as long as the recording."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select, WebDriverWait

    assert page.find_element(By.ID, "convert").is_displayed()
    Select(page.find_element(By.ID, "voice")).select_by_value("")  # the model's own voice
    page.find_element(By.ID, "convert-run").click()  # no recording chosen: the page says so
    stats = _wait(page, lambda s: s["lastError"] is not None, "the missing recording to be reported")
    assert stats["lastError"].startswith("audio:") and stats["conversions"] == 0
    recording = tmp_path / "line.wav"
    samples, rate = speech_prompt(3.0)
    recording.write_bytes(wav_bytes(samples, rate))
    page.find_element(By.ID, "convert-file").send_keys(str(recording))
    page.find_element(By.ID, "convert-text").send_keys("Just by listening a few minutes a day.")
    page.find_element(By.ID, "convert-run").click()
    stats = _wait(page, lambda s: s["conversions"] == 1, "the conversion")
    assert abs(stats["convertedSeconds"] - 3.0) < 0.1, stats
    assert "Done" in page.find_element(By.ID, "convert-message").text
    duration = "return document.getElementById('convert-audio').duration"
    WebDriverWait(page, 10, poll_frequency=0.05).until(lambda d: (d.execute_script(duration) or 0) > 2.5,
                                                       message="the converted WAV did not load in <audio>")
    assert _console_errors(page) == []


def test_live_conversion_from_the_microphone(page):
    """Convert as I speak (Chromium's fake microphone: a beep each second): microphone frames go over WS
    /v1/audio/voice-conversion/stream while recording; Stop ends the source and the converted audio, played as it
    came, is as long as what was sent."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select

    Select(page.find_element(By.ID, "voice")).select_by_value("")  # the model's own voice
    page.find_element(By.ID, "live-run").click()
    _wait(page, lambda s: s["liveSentSeconds"] > 3.0, "three seconds of microphone")
    stats = _wait(page, lambda s: s["liveReceivedSeconds"] > 0.5, "converted audio while still recording")
    assert stats["liveConversions"] == 0
    page.find_element(By.ID, "live-run").click()  # stop
    stats = _wait(page, lambda s: s["liveConversions"] == 1 or s["lastError"] is not None, "the live conversion")
    assert stats["lastError"] is None, stats
    assert abs(stats["liveReceivedSeconds"] - stats["liveSentSeconds"]) < 0.1, stats
    assert "Done" in page.find_element(By.ID, "live-message").text
    assert page.find_element(By.ID, "live-run").text == "Convert as I speak"
    assert _console_errors(page) == []

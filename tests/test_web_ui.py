"""The chat page at / in a real headless Chromium (Debian's package, driven by Playwright), on a real server."""
from __future__ import annotations

import re
import shutil
import time
from pathlib import Path

import httpx
import pytest
from test_server_lifecycle import SERVED_NAME, running_server

sync_api = pytest.importorskip("playwright.sync_api")

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
ARTIFACTS = Path(__file__).parent / "artifacts"
API_KEY = "web-key"

pytestmark = pytest.mark.skipif(CHROMIUM is None, reason="no chromium; scripts/install-browser.sh installs it")


@pytest.fixture(scope="module")
def browser():
    with sync_api.sync_playwright() as playwright:
        # Root (CI) cannot use Chromium's sandbox.
        browser = playwright.chromium.launch(executable_path=CHROMIUM, headless=True, args=["--no-sandbox"])
        yield browser
        browser.close()


@pytest.fixture(scope="module")
def open_server(default_model_dir, tmp_path_factory):
    log = tmp_path_factory.mktemp("web") / "server.log"
    with running_server(default_model_dir, log, "--max-num-seqs", "2") as server:
        yield server


@pytest.fixture(scope="module")
def key_server(default_model_dir, tmp_path_factory):
    log = tmp_path_factory.mktemp("web-key") / "server.log"
    with running_server(default_model_dir, log, "--max-num-seqs", "2", "--api-key", API_KEY) as server:
        yield server


@pytest.fixture
def page(browser):
    context = browser.new_context(viewport={"width": 1200, "height": 760})
    page = context.new_page()
    errors = []
    page.on("pageerror", lambda error: errors.append(str(error)))
    yield page
    context.close()
    assert not errors, f"JavaScript errors on the page: {errors}"


def set_field(page, selector: str, value: str) -> None:
    page.fill(selector, value)
    page.dispatch_event(selector, "change")


def record_answer_lengths(page) -> None:
    """Keeps every length the last answer's text had, to see it grow while it streams."""
    page.evaluate("""() => {
        window.answerLengths = [];
        new MutationObserver(() => {
            const answers = document.querySelectorAll('.msg.assistant .body');
            if (answers.length) window.answerLengths.push(answers[answers.length - 1].textContent.length);
        }).observe(document.getElementById('messages'), {subtree: true, childList: true, characterData: true});
    }""")


def ask(page, text: str) -> None:
    page.fill("#prompt", text)
    page.press("#prompt", "Enter")


def abort_count(server) -> float:
    text = httpx.get(f"{server.base_url}/metrics").text
    match = re.search(r'shrike:request_success_total\{[^}]*finished_reason="abort"[^}]*\} (\S+)', text)
    return float(match.group(1))


def test_markdown_is_rendered_and_html_escaped(page, open_server):
    page.goto(open_server.base_url + "/")
    html = page.evaluate("""() => Markdown.render(
        "# Title\\n**bold** and `<b>code</b>` <img src=x onerror=alert(1)>\\n\\n- one\\n- two\\n\\n" +
        "```python\\nprint('<script>')\\n```\\n[link](javascript:alert(1)) [ok](https://example.org)")""")
    assert "<strong>bold</strong>" in html and "<code>&lt;b&gt;code&lt;/b&gt;</code>" in html
    assert "&lt;img src=x onerror=alert(1)&gt;" in html and "<img" not in html
    assert "<ul><li>one</li><li>two</li></ul>" in html
    assert '<span class="lang">python</span>' in html and "print(&#39;&lt;script&gt;&#39;)" in html
    assert 'href="javascript' not in html and '<a href="https://example.org"' in html


def test_chat_streams_stops_keeps_history_and_shows_errors(page, open_server):
    page.goto(open_server.base_url + "/")
    page.wait_for_function(f"document.getElementById('model-name').textContent === '{SERVED_NAME}'")
    set_field(page, "#temperature", "0")
    set_field(page, "#max-tokens", "40")
    record_answer_lengths(page)
    ask(page, "What is the capital of France?")
    page.wait_for_selector("#send", state="visible", timeout=120_000)  # the answer is complete
    answer = page.locator(".msg.assistant .body").last.inner_text()
    assert "Paris" in answer
    growing = [n for n in page.evaluate("window.answerLengths") if 0 < n < len(answer)]
    assert len(set(growing)) >= 2, "the answer appeared at once instead of streaming in"

    # A long answer, stopped half-way: the partial text stays, marked as stopped, and the server aborts it.
    aborted_before = abort_count(open_server)
    set_field(page, "#max-tokens", "1500")
    set_field(page, "#temperature", "0.8")
    ask(page, "Write a very long story about a dragon who learns to cook.")
    page.wait_for_function("document.querySelectorAll('.msg.assistant .body')[1]?.textContent.length > 40",
                           timeout=120_000)
    page.click("#stop")
    page.wait_for_selector("#send", state="visible")
    stopped = page.locator(".msg.assistant").last
    assert "stopped" in stopped.get_attribute("class") and stopped.locator(".note").inner_text() == "stopped"
    partial = stopped.locator(".body").inner_text()
    time.sleep(1)
    assert stopped.locator(".body").inner_text() == partial
    deadline = time.monotonic() + 20
    while abort_count(open_server) <= aborted_before:
        assert time.monotonic() < deadline, "the server did not abort the stopped request"
        time.sleep(0.2)

    # A request the server refuses: its message is shown.
    set_field(page, "#max-tokens", "999999")
    ask(page, "Hello")
    failed = page.locator(".msg.assistant.failed")
    failed.wait_for()
    assert failed.locator(".note").inner_text().startswith("Error: max_tokens=999999 does not fit")
    set_field(page, "#max-tokens", "40")

    ARTIFACTS.mkdir(exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / "web-ui.png"))

    # Conversations and settings survive a reload (localStorage).
    page.reload()
    page.wait_for_selector(".msg.assistant")
    assert page.locator("#conversations li").count() == 1
    assert page.locator(".msg.user .body").first.inner_text() == "What is the capital of France?"
    assert "Paris" in page.locator(".msg.assistant .body").first.inner_text()
    assert page.input_value("#max-tokens") == "40"


def test_page_asks_for_the_api_key(page, key_server):
    page.goto(key_server.base_url + "/")
    page.wait_for_selector("#api-key-dialog", state="visible")
    page.fill("#api-key-input", "wrong")
    page.click("#api-key-save")
    page.wait_for_function("document.getElementById('api-key-error').textContent.includes('refused')")
    assert page.is_visible("#api-key-dialog")
    ARTIFACTS.mkdir(exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / "web-ui-api-key.png"))
    page.fill("#api-key-input", API_KEY)
    page.click("#api-key-save")
    page.wait_for_function(f"document.getElementById('model-name').textContent === '{SERVED_NAME}'")
    set_field(page, "#temperature", "0")
    set_field(page, "#max-tokens", "16")
    ask(page, "What is the capital of France?")
    page.wait_for_selector("#send", state="visible", timeout=120_000)
    assert "Paris" in page.locator(".msg.assistant .body").last.inner_text()
    assert page.is_hidden("#error")


@pytest.mark.parametrize("scheme, background", [("light", "rgb(246, 247, 249)"), ("dark", "rgb(18, 22, 31)")])
def test_phone_layout_dark_mode_and_a_note_on_cut_answers(browser, open_server, scheme, background):
    errors = []
    for width, height in ((1280, 800), (390, 844)):
        context = browser.new_context(viewport={"width": width, "height": height}, color_scheme=scheme)
        page = context.new_page()
        page.on("pageerror", lambda error: errors.append(str(error)))
        page.goto(open_server.base_url + "/")
        page.wait_for_function(f"document.getElementById('model-name').textContent === '{SERVED_NAME}'")
        assert page.evaluate("getComputedStyle(document.body).backgroundColor") == background
        sidebar_left = "document.getElementById('sidebar').getBoundingClientRect().left"
        if width < 720:  # the sidebar waits off-screen behind the header's menu button
            assert page.is_visible("#menu") and page.evaluate(f"{sidebar_left} + 200 < 0")
            page.click("#menu")
            page.wait_for_function(f"{sidebar_left} === 0")
        else:
            assert page.is_hidden("#menu") and page.evaluate(sidebar_left) == 0
        set_field(page, "#temperature", "0")
        set_field(page, "#max-tokens", "5")
        page.click("#new-chat")  # closes the menu on a phone
        if width < 720:
            page.wait_for_function(f"{sidebar_left} + 200 < 0")
        ask(page, "Tell me a long story about a cat.")
        page.wait_for_selector("#send", state="visible", timeout=120_000)
        assert page.locator(".msg.assistant .note").last.inner_text() == "cut off: the answer reached max tokens"
        ARTIFACTS.mkdir(exist_ok=True)
        page.screenshot(path=str(ARTIFACTS / f"web-ui-{width}x{height}-{scheme}.png"))
        if width > 720:
            # Regenerate replaces the last answer; Edit takes the question back into the composer.
            page.click(".msg.assistant .actions >> text=Regenerate")
            page.wait_for_selector("#send", state="visible", timeout=120_000)
            assert page.locator(".msg").count() == 2
            page.click(".msg.user .actions >> text=Edit")
            assert page.input_value("#prompt") == "Tell me a long story about a cat."
            assert page.locator(".msg").count() == 0
        context.close()
    assert not errors, f"JavaScript errors on the page: {errors}"

"""The web page of `paraflow serve` (GET /, src/serve/web/index.html) in a real browser: Debian's
headless Chromium driven by selenium through Debian's chromedriver. On a server with an API key
the key field appears, and the key is entered (a missing and a wrong one first: their errors
show); on one without, the field never shows. It finds the model and its version 1 AVAILABLE,
generates with temperature 0 and checks the prompt and the streamed continuation shown against a
plain non-streaming /v1/completions request (urllib, not the page), and the version that
answered "latest"; then a seeded sampled generation against the same request with that seed;
the tokens/s, the metrics panel and an error from a bad max tokens; saves a screenshot.
With --cross-origin URL (the server's own address under another name, which the server was
started to allow with --allowed-origins), a page of that origin calls the API (a preflighted
fetch) and reads the answer, and a page of the server's own origin, not allowed, cannot call
the API at that other name. Exits non-zero on any mismatch, and when Chromium or chromedriver is
missing.

Usage: web_page_check.py --url http://127.0.0.1:PORT --api-key KEY|"" --model NAME --screenshot PATH
                         [--cross-origin http://localhost:PORT]
"""
import argparse
import json
import os
import urllib.request

from selenium import webdriver
from selenium.common.exceptions import TimeoutException
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.common.keys import Keys
from selenium.webdriver.support.ui import Select, WebDriverWait

# Debian's packages (apt-get install chromium chromium-driver: scripts/setup_python_serve.sh).
CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"
PROMPT = "the quick brown"
MAX_TOKENS = 40
SEED = 7


def request(url, api_key, body=None):
    """The server's answer (status, content type, body) to a GET, or a POST of `body` as JSON."""
    data = None if body is None else json.dumps(body).encode()
    headers = {"Content-Type": "application/json"} if data else {}
    if api_key:
        headers["Authorization"] = f"Bearer {api_key}"
    with urllib.request.urlopen(urllib.request.Request(url, data=data, headers=headers), timeout=60) as answer:
        return answer.status, answer.headers["Content-Type"], answer.read().decode()


def browser():
    for path in (CHROMIUM, CHROMEDRIVER):
        if not os.access(path, os.X_OK):
            raise SystemExit(f"no {path}: the web page test needs Debian's chromium and chromium-driver "
                             "(apt-get install chromium chromium-driver; scripts/setup_python_serve.sh does)")
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for argument in ("--headless=new", "--no-sandbox", "--disable-gpu", "--window-size=1280,900"):
        options.add_argument(argument)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})  # the page's console, for failures
    return webdriver.Chrome(options=options, service=Service(CHROMEDRIVER))


class Page:
    def __init__(self, driver):
        self.driver = driver

    def element(self, id):
        return self.driver.find_element(By.ID, id)

    def text(self, id):
        return self.element(id).get_property("textContent")

    def wait(self, what, condition, timeout=30):
        """Waits until condition() is true; fails naming `what`, with the page's state and console."""
        try:
            WebDriverWait(self.driver, timeout).until(lambda _: condition())
        except TimeoutException:
            console = "\n".join(entry["message"] for entry in self.driver.get_log("browser"))
            raise AssertionError(f"the page did not show {what} within {timeout} s: status "
                                 f"{self.text('status')!r}, error {self.text('error')!r}, output "
                                 f"{self.text('output')!r}\nconsole:\n{console}") from None

    def type(self, id, text):
        """Replaces a field's value as a user does (select all, type), then leaves it (its change event)."""
        self.element(id).send_keys(Keys.CONTROL, "a")
        self.element(id).send_keys(text, Keys.TAB)

    def generate(self):
        self.element("generate").click()
        self.wait("the generation's end", lambda: self.text("status") in ("done", "failed"), timeout=60)
        return self.text("status")


def fetch_in_page(driver, url, body):
    """What a page's fetch() of `url` (a POST of `body` as JSON: a preflighted request) gives:
    [status, the version header] or ["failed", the browser's error]."""
    return driver.execute_async_script("""
        const [url, body, done] = arguments;
        fetch(url, {method: "POST", headers: {"Content-Type": "application/json"}, body: JSON.stringify(body)})
          .then(async (r) => done([r.status, r.headers.get("Paraflow-Model-Version"), await r.text()]))
          .catch((e) => done(["failed", String(e)]));""", url, body)


def check_cross_origin(driver, args):
    """A page from the allowed origin calls the API at the server's address; a page from the
    server's own address, not an allowed origin, cannot call it at the allowed origin's name."""
    driver.set_script_timeout(60)
    body = {"model": args.model, "prompt": PROMPT, "temperature": 0, "max_tokens": 4}
    driver.get(f"{args.cross_origin}/")
    got = fetch_in_page(driver, f"{args.url}/v1/completions", body)
    assert got[:2] == [200, "1"], got
    assert json.loads(got[2])["object"] == "text_completion", got
    driver.get(f"{args.url}/")
    refused = fetch_in_page(driver, f"{args.cross_origin}/v1/completions", body)
    assert refused[0] == "failed", refused
    # Refused for CORS (the server answered, without the headers), not for want of a connection.
    console = "\n".join(entry["message"] for entry in driver.get_log("browser"))
    assert "blocked by CORS policy" in console, console
    print(f"  cross-origin: from {args.cross_origin} 200 (version {got[1]}); from {args.url} {refused[1]}")


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--url", required=True)
    parser.add_argument("--api-key", required=True)
    parser.add_argument("--model", required=True)
    parser.add_argument("--screenshot", required=True)
    parser.add_argument("--cross-origin")
    args = parser.parse_args()

    status, content_type, html = request(f"{args.url}/", None)  # the page itself needs no key
    assert status == 200 and content_type == "text/html; charset=utf-8", (status, content_type)
    assert 'id="prompt"' in html, html[:200]
    completion = {"model": args.model, "prompt": PROMPT, "temperature": 0, "max_tokens": MAX_TOKENS}
    expected = json.loads(request(f"{args.url}/v1/completions", args.api_key, completion)[2])["choices"][0]["text"]

    driver = browser()
    try:
        page = Page(driver)
        driver.get(f"{args.url}/")
        assert driver.title == "paraflow serve", driver.title
        models = Select(page.element("model"))
        if args.api_key:
            page.wait("the missing key's error", lambda: "no API key" in page.text("error"))
            assert page.element("api-key").is_displayed(), "the server asks for a key: its field shows"
            page.type("api-key", "wrong-key")
            page.wait("the wrong key's error", lambda: "incorrect API key" in page.text("error"))
            page.type("api-key", args.api_key)
        page.wait("the model list", lambda: [option.text for option in models.options] == [args.model])
        assert page.text("error") == "", page.text("error")
        if not args.api_key:
            assert not page.element("api-key").is_displayed(), "no key field on a server without a key"
        def version_rows():
            # One snapshot in the page: the table is re-rendered as it polls, and cells read one by
            # one can go stale between two reads.
            return driver.execute_script(
                "return Array.from(document.querySelectorAll('#versions tbody tr'), "
                "row => Array.from(row.querySelectorAll('td'), cell => cell.textContent));")

        page.wait("version 1 AVAILABLE", lambda: version_rows() == [["1", "AVAILABLE"]])
        versions = Select(page.element("version"))
        assert [option.text for option in versions.options] == ["latest", "1"], versions.options
        assert versions.first_selected_option.text == "latest"

        page.type("prompt", PROMPT)
        page.type("temperature", "0")
        page.type("max-tokens", "1000")  # beyond the context: the server's error shows
        assert page.generate() == "failed"
        assert "max_tokens" in page.text("error"), page.text("error")

        page.type("max-tokens", str(MAX_TOKENS))
        assert page.generate() == "done", page.text("error")
        streamed = page.text("output-text")
        assert streamed == expected, (streamed, expected)
        assert page.text("output") == PROMPT + expected, page.text("output")  # the prompt, then its continuation
        assert page.text("answered-version") == "1", page.text("answered-version")  # "latest" was version 1
        assert page.text("error") == "", page.text("error")
        tokens_per_second = float(page.text("tokens-per-second"))
        first_token_ms = float(page.text("time-to-first-token"))
        assert tokens_per_second > 0 and first_token_ms >= 0, (tokens_per_second, first_token_ms)

        def metrics():
            # One snapshot, as version_rows(): name -> shown value.
            return dict(driver.execute_script(
                "return Array.from(document.querySelectorAll('#metrics dd'), "
                "dd => [dd.getAttribute('data-metric'), dd.textContent.trim()]);"))

        names = list(metrics())
        assert "paraflow_generation_tokens_total" in names and "paraflow_kv_blocks_free" in names, names
        # The poll after the generation counts its tokens (the plain request's and this one's at least).
        def generated_tokens_counted():
            shown = metrics().get("paraflow_generation_tokens_total", "")
            return shown.isdigit() and int(shown) >= 2 * MAX_TOKENS
        page.wait("the generated tokens in the metrics", generated_tokens_counted)
        values = metrics()
        assert all(value.isdigit() for value in values.values()), values

        # A seed: sampled at temperature 1.5, the same text as the API gives for that seed.
        seeded = dict(completion, temperature=1.5, seed=SEED)
        expected_seeded = json.loads(request(f"{args.url}/v1/completions", args.api_key, seeded)[2])["choices"][0]["text"]
        page.type("temperature", "1.5")
        page.type("seed", str(SEED))
        assert page.generate() == "done", page.text("error")
        assert page.text("output-text") == expected_seeded, (page.text("output-text"), expected_seeded)
        assert expected_seeded != expected, "sampling at temperature 1.5 gave the greedy text: the seed is not tested"

        assert driver.save_screenshot(args.screenshot), args.screenshot
        with open(args.screenshot, "rb") as png:
            assert png.read(8) == b"\x89PNG\r\n\x1a\n", args.screenshot
        assert os.path.getsize(args.screenshot) > 0
        print(f"  {driver.capabilities['browserName']} {driver.capabilities['browserVersion']}: streamed "
              f"{streamed!r} at {tokens_per_second} tokens/s (first token after {first_token_ms:.0f} ms), "
              f"as /v1/completions; versions {version_rows()}; metrics {values}; errors shown: ok")
        print(f"  screenshot: {args.screenshot}")
        if args.cross_origin:
            check_cross_origin(driver, args)
    finally:
        driver.quit()


if __name__ == "__main__":
    main()

"""A browser stand-in for `acp-client login` (set as BROWSER: Python's `webbrowser` runs it with
the URL): it does what a person does in the demo's browser. It opens the authorization URL
(DOT sends it to the login page), logs in with the demo user through the login form (its CSRF
token, its cookie), follows DOT's redirects to the loopback callback where acp-client listens,
and prints the page acp-client answered. Given `--device URL CODE` instead, it approves the
device flow's user code at DOT's device page. The user is ACP_TEST_OAUTH_USER (default demo),
with ACP_TEST_OAUTH_PASSWORD (default demo).

    BROWSER="python -m tests.oauth_browser %s" acp-client login http://127.0.0.1:8000
    python -m tests.oauth_browser --device http://127.0.0.1:8000/o/device/ ABCD1234
"""

from __future__ import annotations

import os
import re
import sys
from urllib.parse import urljoin, urlsplit

import httpx

CSRF = re.compile(r'name="csrfmiddlewaretoken" value="([^"]+)"')


def log_in(browser: httpx.Client, url: str) -> httpx.Response:
    """GET `url`; where it lands on a login form, log in and go on. The last response."""
    response = browser.get(url)
    while response.is_redirect:
        target = urljoin(str(response.url), response.headers["location"])
        if urlsplit(target).path.startswith("/accounts/login/"):
            form = browser.get(target)
            match = CSRF.search(form.text)
            assert match is not None, form.text
            next_url = dict(form.url.params).get("next", "/")
            browser.post(
                str(form.url),
                data={
                    "username": os.environ.get("ACP_TEST_OAUTH_USER", "demo"),
                    "password": os.environ.get("ACP_TEST_OAUTH_PASSWORD", "demo"),
                    "csrfmiddlewaretoken": match.group(1),
                    "next": next_url,
                },
            )
            target = urljoin(str(form.url), next_url)
        response = browser.get(target)
    return response


def approve_device(browser: httpx.Client, verification_uri: str, user_code: str) -> str:
    """Enter the code at DOT's device page and accept: the status page's text."""
    page = log_in(browser, verification_uri)
    match = CSRF.search(page.text)
    assert page.status_code == 200 and match is not None, page.text
    entered = browser.post(str(page.url), data={"user_code": user_code, "csrfmiddlewaretoken": match.group(1)})
    assert entered.is_redirect, entered.text
    confirm = browser.get(urljoin(str(page.url), entered.headers["location"]))
    match = CSRF.search(confirm.text)
    assert match is not None, confirm.text
    accepted = browser.post(str(confirm.url), data={"action": "accept", "csrfmiddlewaretoken": match.group(1)})
    assert accepted.is_redirect, accepted.text
    return browser.get(urljoin(str(confirm.url), accepted.headers["location"])).text


def main(argv: list[str]) -> int:
    with httpx.Client(timeout=20.0, follow_redirects=False) as browser:
        if argv[:1] == ["--device"]:
            print(approve_device(browser, argv[1], argv[2]))
            return 0
        landed = log_in(browser, argv[0])
        print(landed.text)
        return 0 if landed.status_code == 200 else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

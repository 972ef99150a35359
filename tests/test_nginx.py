"""deploy/nginx.conf, run by Debian's nginx in front of a real daphne in deployment
mode: over HTTPS on a port other than 443, a login passes Django's CSRF Origin check
(nginx passes the Host with its port) and lands logged in; a body over the limit gets
413 from nginx. The configuration is the shipped file, with only the addresses, the
upstream and the certificate's path put in for the test."""

from __future__ import annotations

import http.cookiejar
import re
import shutil
import ssl
import subprocess
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

import pytest
from django.contrib.auth.models import User

from tests.support.processes import REPO
from tests.support.server import free_port
from tests.support.waiting import wait_for

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(shutil.which("nginx") is None, reason="nginx is not installed"),
]

PASSWORD = "correct horse battery staple"


def site_config(daphne_port: int, http_port: int, https_port: int, tls: Path) -> str:
    site = (REPO / "deploy" / "nginx.conf").read_text()
    for shipped, here in [
        ("server web:8000;", f"server 127.0.0.1:{daphne_port};"),
        ("listen 80;", f"listen 127.0.0.1:{http_port};"),
        ("listen 443 ssl;", f"listen 127.0.0.1:{https_port} ssl;"),
        ("listen [::]:80;", ""),
        ("listen [::]:443 ssl;", ""),
        ("/etc/nginx/tls/", f"{tls}/"),
    ]:
        assert shipped in site, f"deploy/nginx.conf no longer has {shipped!r}"
        site = site.replace(shipped, here)
    return site


@pytest.fixture
def nginx(tmp_path: Path):
    """Start nginx with deploy/nginx.conf in front of ``daphne_port``; yields the
    HTTPS base URL maker."""
    processes: list[subprocess.Popen] = []

    def start(daphne_port: int) -> str:
        http_port, https_port = free_port(), free_port()
        subprocess.run(
            ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
             "-subj", "/CN=127.0.0.1", "-keyout", str(tmp_path / "privkey.pem"),
             "-out", str(tmp_path / "fullchain.pem")],
            check=True, capture_output=True,
        )  # fmt: skip
        main = tmp_path / "nginx.conf"
        main.write_text(
            f"user root;\npid {tmp_path}/nginx.pid;\nerror_log {tmp_path}/error.log;\n"
            "events {}\nhttp {\n"
            f"access_log off;\nclient_body_temp_path {tmp_path}/body;\n"
            f"proxy_temp_path {tmp_path}/proxy;\n"
            + site_config(daphne_port, http_port, https_port, tmp_path)
            + "\n}\n"
        )
        checked = subprocess.run(["nginx", "-t", "-c", str(main)], capture_output=True, text=True)
        assert checked.returncode == 0, checked.stderr
        processes.append(
            subprocess.Popen(["nginx", "-c", str(main), "-g", "daemon off;"], cwd=tmp_path)
        )
        base = f"https://127.0.0.1:{https_port}"
        wait_for(lambda: _answers(base), timeout=30, what="nginx to answer")
        return base

    yield start
    for process in processes:
        process.terminate()
        process.wait(timeout=30)


def _opener(jar: http.cookiejar.CookieJar | None = None) -> urllib.request.OpenerDirector:
    context = ssl.create_default_context()
    context.check_hostname, context.verify_mode = False, ssl.CERT_NONE  # self-signed

    class NoRedirects(urllib.request.HTTPRedirectHandler):
        def redirect_request(self, *args, **kwargs):
            return None

    return urllib.request.build_opener(
        urllib.request.HTTPSHandler(context=context),
        urllib.request.HTTPCookieProcessor(http.cookiejar.CookieJar() if jar is None else jar),
        NoRedirects(),
    )


def _answers(base: str) -> bool:
    try:
        _opener().open(base + "/admin/login/", timeout=5)
    except urllib.error.HTTPError:
        return True
    except OSError:
        return False
    return True


def _send(opener, request: urllib.request.Request) -> tuple[int, dict, str]:
    try:
        with opener.open(request, timeout=30) as answer:
            return answer.status, dict(answer.headers), answer.read().decode()
    except urllib.error.HTTPError as error:
        return error.code, dict(error.headers), error.read().decode(errors="replace")


def test_a_login_over_https_on_another_port_passes_the_origin_check(live_servers, nginx):
    User.objects.create_user("operator", password=PASSWORD, is_staff=True)
    server = live_servers(
        AUTOMECHANICA_DEPLOYMENT="on",
        DJANGO_SECRET_KEY="a-test-key-" + "x" * 40,
        DJANGO_SECURE_SSL_REDIRECT="false",  # nginx redirects; the test's probe is HTTP
    )
    base = nginx(int(server.url.rsplit(":", 1)[1]))
    jar = http.cookiejar.CookieJar()
    browser = _opener(jar)
    status, _, page = _send(browser, urllib.request.Request(base + "/admin/login/"))
    assert status == 200, page[-2000:]
    token = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', page)[1]
    form = {"username": "operator", "password": PASSWORD, "csrfmiddlewaretoken": token,
            "next": "/admin/"}  # fmt: skip
    login = urllib.request.Request(
        base + "/admin/login/",
        data=urllib.parse.urlencode(form).encode(),
        headers={"Origin": base, "Referer": base + "/admin/login/"},
    )
    status, headers, page = _send(browser, login)
    assert status == 302, f"{status}: {page[-1500:]}"  # 403 "Origin checking failed" before
    assert headers["Location"] == "/admin/", headers
    assert "sessionid" in {c.name for c in jar}
    assert "Strict-Transport-Security" in headers  # the forwarded https was trusted

    too_large = urllib.request.Request(base + "/api/v1/tasks", data=b"x" * (33 * 1024 * 1024))
    assert _send(_opener(), too_large)[0] == 413  # nginx's limit, before daphne

"""nginx on the host: a TLS-terminating proxy in front of gunicorn, and deploy/nginx/nginx.conf as the
compose file runs it, with only addresses and paths moved."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time

import requests

from tests.support import PROJECT_ROOT, free_port, stop_process
from tests.support.tls import make_private_ca

# Debian puts nginx in /usr/sbin, which a non-root PATH may lack.
NGINX = shutil.which("nginx") or next((path for path in ["/usr/sbin/nginx"] if os.access(path, os.X_OK)), None)


ROOT_USER = "user root;" if os.geteuid() == 0 else ""  # workers must read the test's files

DEPLOY_NGINX_CONF = PROJECT_ROOT / "deploy/nginx/nginx.conf"

NGINX_CONF = """\
{user}
worker_processes 1;
daemon off;
pid {root}/nginx.pid;
error_log {root}/error.log info;
events {{ worker_connections 64; }}
http {{
    access_log {root}/access.log;
    client_body_temp_path {root}/body;
    proxy_temp_path {root}/proxy;
    fastcgi_temp_path {root}/fastcgi;
    uwsgi_temp_path {root}/uwsgi;
    scgi_temp_path {root}/scgi;
    server {{
        listen 127.0.0.1:{port} ssl;
        ssl_certificate {certificate};
        ssl_certificate_key {key};
        location / {{
            proxy_pass http://127.0.0.1:{upstream};
            proxy_set_header Host $host;
            proxy_set_header X-Forwarded-For $proxy_add_x_forwarded_for;
            proxy_set_header X-Forwarded-Proto $scheme;
            proxy_set_header X-Forwarded-Host $host;
            proxy_set_header X-Forwarded-Port $server_port;
        }}
    }}
}}
"""


class Nginx:
    """nginx in the foreground with its own prefix, so nothing of the host's configuration is used."""

    def __init__(self, root, upstream_port: int) -> None:
        self.root = root
        self.port = free_port()
        self.url = f"https://127.0.0.1:{self.port}"
        certificate, key, self.ca = make_private_ca(root)
        self.start(
            NGINX_CONF.format(
                user=ROOT_USER,
                root=root,
                port=self.port,
                upstream=upstream_port,
                certificate=certificate,
                key=key,
            ),
            verify=str(self.ca),
        )

    def start(self, conf: str, verify: bool | str) -> None:
        """Write `conf`, start nginx on it and wait until /healthz answers through it."""
        self.root.joinpath("nginx.conf").write_text(conf)
        with (self.root / "stderr.log").open("ab") as stderr:
            self.process = subprocess.Popen(
                [NGINX, "-p", str(self.root), "-e", str(self.root / "error.log"), "-c", str(self.root / "nginx.conf")],
                stdout=subprocess.DEVNULL,
                stderr=stderr,
            )
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            assert self.process.poll() is None, self.errors()
            try:
                if requests.get(self.url + "/healthz", verify=verify, timeout=1).status_code == 200:
                    return
            except requests.ConnectionError:
                time.sleep(0.1)
        raise RuntimeError(f"nginx did not answer:\n{self.errors()}")

    def errors(self) -> str:
        logs = [self.root / "error.log", self.root / "stderr.log"]
        return "".join(path.read_text(errors="replace") for path in logs if path.exists())

    def stop(self) -> None:
        stop_process(self.process, signal.SIGQUIT)  # nginx's graceful shutdown


class DeployNginx(Nginx):
    """deploy/nginx/nginx.conf as the compose file runs it, on the host: only addresses and paths moved."""

    def __init__(self, root, upstream_port: int) -> None:
        self.root = root
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        conf = DEPLOY_NGINX_CONF.read_text(encoding="utf-8")
        for old, new in (
            ("server control-plane:8000;", f"server 127.0.0.1:{upstream_port};"),
            ("listen 8080 default_server;", f"listen 127.0.0.1:{self.port} default_server;"),
            (" /tmp/", f" {root}/"),
        ):
            assert old in conf, old
            conf = conf.replace(old, new)
        self.start(ROOT_USER + "\n" + conf, verify=True)

"""Render nginx/default.conf.template (as envsubst would, for its two placeholders only) and a main
nginx.conf that includes it, for `make run` and for the tests.

Usage: python scripts/nginx_config.py DIRECTORY NGINX_PORT APP_UPSTREAM [APP_UPSTREAM ...]
NGINX_PORT is what nginx's `listen` takes: a port, or an address and port (127.0.0.1:8080).
Writes DIRECTORY/site.conf and DIRECTORY/nginx.conf; run `nginx -c DIRECTORY/nginx.conf`.
"""

from __future__ import annotations

import sys
from pathlib import Path

TEMPLATE = Path(__file__).resolve().parent.parent / "nginx" / "default.conf.template"

MAIN = """# Generated: a main configuration around site.conf, for local runs and tests.
daemon off;
worker_processes {workers};
pid {dir}/nginx.pid;
error_log {dir}/error.log warn;
events {{ worker_connections {connections}; }}
http {{
    access_log off;
    client_body_temp_path {dir}/tmp/body;
    proxy_temp_path {dir}/tmp/proxy;
    fastcgi_temp_path {dir}/tmp/fastcgi;
    uwsgi_temp_path {dir}/tmp/uwsgi;
    scgi_temp_path {dir}/tmp/scgi;
    include {dir}/site.conf;
}}
"""


def render_site(port: int | str, upstreams: list[str], template: str | None = None) -> str:
    """The template with ${NGINX_PORT} and ${APP_UPSTREAM}; more upstreams become more server lines."""
    text = (template or TEMPLATE.read_text()).replace("${NGINX_PORT}", str(port))
    servers = "\n".join(f"    server {upstream};" for upstream in upstreams)
    text = text.replace("    server ${APP_UPSTREAM};", servers)
    return text.replace("${APP_UPSTREAM}", upstreams[0])


def write_config(
    directory: Path,
    port: int | str,
    upstreams: list[str],
    site: str | None = None,
    workers: int = 1,
    connections: int = 16384,
) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    for name in ("body", "proxy", "fastcgi", "uwsgi", "scgi"):
        (directory / "tmp" / name).mkdir(parents=True, exist_ok=True)
        (directory / "tmp" / name).chmod(0o777)  # nginx workers may run as an unprivileged user
    (directory / "site.conf").write_text(site or render_site(port, upstreams))
    main = directory / "nginx.conf"
    main.write_text(MAIN.format(dir=directory.resolve(), workers=workers, connections=connections))
    return main


if __name__ == "__main__":
    target, nginx_port, *app_upstreams = sys.argv[1:]
    print(write_config(Path(target), nginx_port, app_upstreams))

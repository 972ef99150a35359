"""A real PgBouncer in transaction mode in front of the test database (Debian's
package; `.ci/run` installs it), with its default settings but for the pool's size.

PgBouncer refuses to run as root: as root it runs as the owner of the database's
socket directory (the embedded server's user), which alone may reach the socket.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import quote

from django.db import connection

from tests.support.server import free_port
from tests.support.waiting import wait_for

# Every server connection of the pool is among this many clients connected at once.
POOL_SIZE = 16


def pgbouncer_binary() -> str | None:
    return shutil.which("pgbouncer") or shutil.which("pgbouncer", path="/usr/sbin:/sbin")


@dataclass
class PgBouncer:
    process: subprocess.Popen
    directory: Path
    port: int
    dbname: str
    user: str
    password: str

    @property
    def url(self) -> str:
        """A DATABASE_URL through the pooler to the test database."""
        secret = f":{quote(self.password, safe='')}" if self.password else ""
        return (
            f"postgresql://{quote(self.user, safe='')}{secret}@127.0.0.1:{self.port}/{self.dbname}"
        )

    def log(self) -> str:
        return (self.directory / "pgbouncer.log").read_text(errors="replace")

    def stop(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(10)
        shutil.rmtree(self.directory, ignore_errors=True)


def start_pgbouncer() -> PgBouncer:
    """PgBouncer with ``pool_mode = transaction`` on a free loopback port."""
    params = connection.get_connection_params()
    host, port = params.get("host") or "/var/run/postgresql", params.get("port") or 5432
    user, password = params.get("user") or "postgres", params.get("password") or ""
    dbname = params["dbname"]
    directory = Path(tempfile.mkdtemp(prefix="pgbouncer-"))
    listen_port = free_port()
    (directory / "users.txt").write_text(f'"{user}" "{password}"\n')
    (directory / "pgbouncer.ini").write_text(
        f"[databases]\n* = host={host} port={port}\n"
        "[pgbouncer]\n"
        f"listen_addr = 127.0.0.1\nlisten_port = {listen_port}\nunix_socket_dir =\n"
        f"auth_type = trust\nauth_file = {directory}/users.txt\n"
        f"pool_mode = transaction\ndefault_pool_size = {POOL_SIZE}\nmax_client_conn = 500\n"
        f"logfile = {directory}/pgbouncer.log\n"
    )
    owner = os.stat(host).st_uid if host.startswith("/") else os.getuid()
    runs_as = owner if os.geteuid() == 0 and owner != 0 else None
    if os.geteuid() == 0 and runs_as is None:
        runs_as = 65534  # nobody: the server is reached over TCP
    if runs_as is not None:
        for path in (directory, *directory.iterdir()):
            os.chown(path, runs_as, -1)
    process = subprocess.Popen(
        [pgbouncer_binary(), str(directory / "pgbouncer.ini")],
        user=runs_as,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    bouncer = PgBouncer(process, directory, listen_port, dbname, user, password)

    def listening() -> bool:
        if process.poll() is not None:
            raise AssertionError(f"pgbouncer exited: {bouncer.log()[-2000:]}")
        with socket.socket() as probe:
            return probe.connect_ex(("127.0.0.1", listen_port)) == 0

    wait_for(listening, timeout=30, what="pgbouncer to listen")
    return bouncer

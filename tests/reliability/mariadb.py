"""A MariaDB server of a test's own (``../shared/services.md``), which it may stop, kill and
start again; its data directory lives under /tmp (the server runs as ``mysql``)."""

from __future__ import annotations

import os
import pwd
import shutil
import subprocess
import tempfile
from pathlib import Path

import pymysql

from tests.helpers import wait_until
from tests.procs import free_port


class PrivateMariaDB:
    def __init__(self) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix="ingest-mariadb-", dir="/tmp"))
        user = pwd.getpwnam("mysql")
        os.chown(self.dir, user.pw_uid, user.pw_gid)
        self.port = free_port()
        self.proc: subprocess.Popen[bytes] | None = None
        subprocess.run(
            [
                "mariadb-install-db",
                f"--datadir={self.dir}",
                "--user=mysql",
                "--auth-root-authentication-method=normal",
                "--skip-test-db",
            ],
            check=True,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        self.start()

    @property
    def socket(self) -> str:
        return str(self.dir / "sock")

    def url(self, name: str) -> str:
        return f"mysql://root@127.0.0.1:{self.port}/{name}"

    def start(self) -> None:
        with open(self.dir.parent / f"{self.dir.name}.log", "ab") as log:
            self.proc = subprocess.Popen(
                [
                    "mariadbd",
                    f"--datadir={self.dir}",
                    f"--port={self.port}",
                    f"--socket={self.socket}",
                    "--bind-address=127.0.0.1",
                    "--user=mysql",
                    "--innodb-buffer-pool-size=64M",
                    "--skip-log-bin",
                    "--max-connections=500",
                ],
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        wait_until(self.answers, 60, 0.1)

    def answers(self) -> bool:
        assert self.proc is not None
        if self.proc.poll() is not None:
            raise AssertionError(f"mariadbd exited with {self.proc.returncode}")
        try:
            pymysql.connect(host="127.0.0.1", port=self.port, user="root", connect_timeout=2).close()
        except pymysql.err.OperationalError:
            return False
        return True

    def stop(self) -> None:
        """A clean shutdown (connections closed by the server)."""
        if self.proc is None:
            return
        subprocess.run(
            ["mariadb-admin", f"--socket={self.socket}", "-uroot", "shutdown"],
            check=False,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        self.proc.wait(timeout=60)
        self.proc = None

    def kill(self) -> None:
        """SIGKILL: crash recovery at the next start."""
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait(timeout=30)
            self.proc = None

    def close(self) -> None:
        try:
            self.stop()
        finally:
            if self.proc is not None:
                self.kill()
            shutil.rmtree(self.dir, ignore_errors=True)
            (self.dir.parent / f"{self.dir.name}.log").unlink(missing_ok=True)

    def __enter__(self) -> PrivateMariaDB:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

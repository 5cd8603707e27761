"""scripts/setup.sh as root, as a user with sudo and as one without: who runs what, and exit 3.

Each test runs a copy of the script in a tree of its own, with stubs on PATH for everything it
would run as root (sudo, start-stop-daemon, mkdir, chown, mariadb, redis-server ...): they record
each call and whether it ran as root, and keep the services' state in files. Nothing on this
machine is installed, started or changed.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

# Every stub records "NAME root|user ARGS"; it runs as root where `id -u` says 0 or sudo ran it.
_PREAMBLE = """as=user; [ "$STUB_UID" = 0 ] || [ "${SUDO_STUB:-}" = 1 ] && as=root
echo "$(basename "$0") $as $*" >>"$STUB_DIR/calls"
state=$STUB_DIR/state
"""

_STUBS = {
    # sudo: runs the command as root (SUDO_STUB=1), or refuses when STUB_SUDO is not "yes"
    "sudo": """[ "$STUB_SUDO" = yes ] || { echo "sudo: a password is required" >&2; exit 1; }
while [ "${1:-}" = -n ] || [ "${1:-}" = -v ]; do [ "$1" = -v ] && exit 0; shift; done
SUDO_STUB=1 exec "$@"
""",
    # a fresh Debian MariaDB: root in over the socket by unix_socket (the system's root only),
    # over 127.0.0.1 once ALTER USER gave it a password
    "mariadb": """case " $* " in *" -h127.0.0.1 "*) [ -e "$state/mariadb" ] && [ -e "$state/native" ]; exit ;; esac
[ -e "$state/mariadb" ] || { echo "ERROR 2002 (HY000): Can't connect through socket" >&2; exit 1; }
[ "$as" = root ] || { echo "ERROR 1698 (28000): Access denied for user 'root'@'localhost'" >&2; exit 1; }
case "$*" in *"ALTER USER"*) touch "$state/native" ;; esac
""",
    "start-stop-daemon": """[ "$as" = root ] || exit 4
[ -n "${STUB_SSD_STATUS:-}" ] && exit "$STUB_SSD_STATUS"
touch "$state/mariadb"
""",
    # its --dir and --logfile are root's
    "redis-server": """[ "$as" = root ] || { echo "Can't open the log file: Permission denied" >&2; exit 1; }
touch "$state/redis"
""",
    "redis-cli": '[ -e "$state/redis" ]',
    "mkdir": "",
    "chown": "",
    "sleep": "",
    "apt-get": "",
    "mariadbd": "",
    "prometheus": "",
    "promtool": "",
    "chromium": "",
    "python3": "",
}


def _run(
    tmp_path: Path, *, uid: int, sudo: bool, running: tuple[str, ...] = (), **env_extra: str
) -> tuple[subprocess.CompletedProcess[str], list[str]]:
    """scripts/setup.sh as UID (sudo available or not) with the services in RUNNING already up
    ("mariadb", "native": its root let in over 127.0.0.1, "redis"); the venv is there already."""
    tree, stubs, state = tmp_path / "tree", tmp_path / "bin", tmp_path / "state"
    for folder in (tree / "scripts", tree / ".venv" / "bin", stubs, state):
        folder.mkdir(parents=True)
    shutil.copy(ROOT / "scripts" / "setup.sh", tree / "scripts" / "setup.sh")
    shutil.copy(ROOT / "pyproject.toml", tree / "pyproject.toml")
    stamp = hashlib.sha1((tree / "pyproject.toml").read_bytes()).hexdigest()[:12]  # noqa: S324 - the script's own stamp
    (tree / ".venv" / f".installed-{stamp}").touch()
    (tree / ".venv" / "bin" / "python").symlink_to(stubs / "python3")
    for service in running:
        (state / service).touch()
    real_id = shutil.which("id")
    stub_bodies = {**_STUBS, "id": f'[ "$*" = -u ] && {{ echo "$STUB_UID"; exit; }}\nexec {real_id} "$@"'}
    for name, body in stub_bodies.items():
        path = stubs / name
        path.write_text(f"#!/bin/bash\n{'' if name == 'id' else _PREAMBLE}{body}\n")
        path.chmod(0o755)
    env = dict(os.environ)
    env.update(
        {
            "PATH": f"{stubs}:{env['PATH']}",
            "PYTHON": "python3",
            "STUB_DIR": str(tmp_path),
            "STUB_UID": str(uid),
            "STUB_SUDO": "yes" if sudo else "no",
            **env_extra,
        }
    )
    done = subprocess.run(
        [str(tree / "scripts" / "setup.sh")],
        env=env,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=60,
    )
    return done, (tmp_path / "calls").read_text().splitlines()


def test_a_user_with_sudo_starts_both_services_and_lets_mariadbs_root_in(tmp_path):
    """As a user with sudo, redis-server ran as that user on root's directories and MariaDB's
    root was asked for over the socket as that user, which unix_socket refuses: neither answered."""
    done, calls = _run(tmp_path, uid=1000, sudo=True)
    assert done.returncode == 0, done.stderr
    assert "redis-server root --daemonize yes" in " ".join(calls)
    socket_calls = [c for c in calls if c.startswith("mariadb ") and "-h127.0.0.1" not in c]
    assert socket_calls and all(c.startswith("mariadb root ") for c in socket_calls)
    assert (tmp_path / "state" / "native").exists()


def test_a_user_with_sudo_starts_redis_as_root(tmp_path):
    done, calls = _run(tmp_path, uid=1000, sudo=True, running=("mariadb", "native"))
    assert done.returncode == 0, done.stderr
    assert [c for c in calls if c.startswith("redis-server root --daemonize yes")]
    assert not [c for c in calls if c.startswith("redis-server user")]


def test_as_root_nothing_goes_through_sudo(tmp_path):
    done, calls = _run(tmp_path, uid=0, sudo=False)
    assert done.returncode == 0, done.stderr
    assert not [c for c in calls if c.startswith("sudo ")]
    assert [c for c in calls if c.startswith("start-stop-daemon root ")]
    assert [c for c in calls if c.startswith("redis-server root ")]


def test_without_root_or_sudo_it_exits_3_saying_what_needed_them(tmp_path):
    """Exit 3 is what scripts/test.sh may fall back on, and only for this."""
    done, calls = _run(tmp_path, uid=1000, sudo=False)
    assert done.returncode == 3
    assert "setup: making MariaDB answer on 127.0.0.1:3306" in done.stderr
    assert "needs root or sudo" in done.stderr
    assert not [c for c in calls if c.startswith(("start-stop-daemon", "redis-server"))]


def test_without_root_or_sudo_services_that_answer_are_enough(tmp_path):
    done, calls = _run(tmp_path, uid=1000, sudo=False, running=("mariadb", "native", "redis"))
    assert done.returncode == 0, done.stderr
    assert not [c for c in calls if c.startswith("sudo ")]


def test_a_commands_own_status_3_is_a_failure_not_a_want_of_root(tmp_path):
    """start-stop-daemon exits 3 on "any other trouble": that must not read as "no root or sudo"."""
    done, _ = _run(tmp_path, uid=0, sudo=False, STUB_SSD_STATUS="3")
    assert done.returncode == 1

"""PostgreSQL, Redis and an S3 server (MinIO) of a test's own, on free ports, for tests that
stop and restart a backing service: the session's shared services (`infra/services.sh`)
must never be. The same binaries `infra/` installed, started the way its scripts start
them; a missing binary fails the test.

    with DedicatedPostgres(tmp_path / "pg") as pg:      # pg.url, pg.stop(), pg.start()
    with DedicatedRedis(tmp_path / "redis") as redis:   # redis.url
    with DedicatedMinio(tmp_path / "s3") as s3:         # s3.endpoint, s3.key, s3.secret, s3.bucket

`close` kills whatever is left of the server and removes what it wrote outside `home`.
"""
from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import tempfile
from pathlib import Path

import httpx

from tests.helpers import ROOT, wait_until

LOCAL = ROOT / ".local"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class _Server:
    """One server process leading a session of its own; subclasses say how to start it,
    when it serves, and how to stop it cleanly."""

    name = "server"
    start_s = 60.0

    def __init__(self, home: Path):
        self.home = Path(home)
        self.home.mkdir(parents=True, exist_ok=True)
        self.log = self.home / "server.log"
        self.port = _free_port()
        self._proc: subprocess.Popen | None = None

    def _argv(self) -> list[str]:
        raise NotImplementedError

    def _env(self) -> dict[str, str] | None:
        return None

    def serving(self) -> bool:
        raise NotImplementedError

    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def start(self):
        """Starts the server on its data (again, after `stop`) and waits until it serves."""
        assert not self.running(), f"the dedicated {self.name} is running"
        with self.log.open("a") as out:
            self._proc = subprocess.Popen(self._argv(), env=self._env(), stdout=out, stderr=subprocess.STDOUT,
                                          start_new_session=True)

        def up() -> bool:
            if self._proc.poll() is not None:
                raise AssertionError(f"the dedicated {self.name} exited with {self._proc.returncode}: "
                                     f"{self.log.read_text(errors='replace')[-3000:]}")
            return self.serving()
        wait_until(up, self.start_s, what=f"the dedicated {self.name} to serve", every_s=0.1)
        return self

    def stop(self, timeout_s: float = 30.0) -> None:
        """A clean shutdown (SIGTERM, or what the server prefers), waited for; SIGKILL if it
        takes longer."""
        if not self.running():
            return
        self._proc.send_signal(self._stop_signal)
        try:
            self._proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            self._kill()

    _stop_signal = signal.SIGTERM

    def _kill(self) -> None:
        try:
            os.killpg(self._proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self._proc.wait(10)

    def close(self) -> None:
        if self._proc is not None:
            self._kill()

    def __enter__(self):
        try:
            return self.start()
        except BaseException:
            self.close()
            raise

    def __exit__(self, *exc):
        self.close()


def _postgres_bin() -> Path:
    found = sorted(Path("/usr/lib/postgresql").glob("*/bin/postgres"), key=lambda p: int(p.parts[-3]))
    if not found:
        raise AssertionError("no PostgreSQL under /usr/lib/postgresql/*/bin: run `infra/services.sh up postgres`")
    return found[-1].parent


class DedicatedPostgres(_Server):
    """A PostgreSQL cluster with role ledgerlm/ledgerlm owning database ledgerlm, as
    `infra/postgres.sh` makes it. PostgreSQL refuses to run as root, so there it runs as
    the system user `postgres`, its data in a folder of /var/tmp that user can reach (a
    pytest directory is private to root); `close` removes that folder."""

    name = "PostgreSQL"

    def __init__(self, home: Path):
        super().__init__(home)
        self.bin = _postgres_bin()
        self._as_root = os.geteuid() == 0
        self._scratch = Path(tempfile.mkdtemp(prefix="ledgerlm-test-pg-", dir="/var/tmp")) if self._as_root else None
        self.data = (self._scratch or self.home) / "data"
        self.url = f"postgresql+psycopg://ledgerlm:ledgerlm@127.0.0.1:{self.port}/ledgerlm"
        try:
            self._initdb()
        except BaseException:
            self.close()
            raise

    def _as_pg(self, argv: list[str]) -> list[str]:
        return ["runuser", "-u", "postgres", "--", *argv] if self._as_root else argv

    def _initdb(self) -> None:
        base = self._scratch or self.home
        pwfile = base / "pw"
        pwfile.write_text("ledgerlm\n")
        if self._as_root:
            shutil.chown(base, "postgres")
            shutil.chown(pwfile, "postgres")
        done = subprocess.run(self._as_pg([str(self.bin / "initdb"), "-D", str(self.data), "-U", "ledgerlm",
                                           f"--pwfile={pwfile}", "--auth-host=scram-sha-256", "--auth-local=peer",
                                           "-E", "UTF8", "--locale=C.UTF-8", "--no-sync"]),
                              capture_output=True, text=True, timeout=120)
        pwfile.unlink()
        assert done.returncode == 0, f"initdb failed: {done.stdout}{done.stderr}"
        with (self.data / "postgresql.conf").open("a") as conf:
            conf.write(f"listen_addresses = '127.0.0.1'\nport = {self.port}\nunix_socket_directories = ''\n"
                       "fsync = off\nsynchronous_commit = off\nfull_page_writes = off\nshared_buffers = 32MB\n"
                       "max_connections = 50\n")
        self._made_database = False

    def _argv(self) -> list[str]:
        return self._as_pg([str(self.bin / "postgres"), "-D", str(self.data)])

    def _connect(self, database: str):
        import psycopg

        return psycopg.connect(host="127.0.0.1", port=self.port, user="ledgerlm", password="ledgerlm",
                               dbname=database, connect_timeout=2, autocommit=True)

    def serving(self) -> bool:
        try:
            with self._connect("postgres"):
                return True
        except Exception:  # noqa: BLE001 - refused or still starting: not serving yet
            return False

    def start(self) -> "DedicatedPostgres":
        super().start()
        if not self._made_database:
            with self._connect("postgres") as conn:
                conn.execute("CREATE DATABASE ledgerlm OWNER ledgerlm")
            self._made_database = True
        return self

    def _postmaster(self) -> int | None:
        try:
            return int((self.data / "postmaster.pid").read_text().split()[0])
        except (OSError, ValueError, IndexError):
            return None

    def stop(self, timeout_s: float = 30.0) -> None:
        """A "fast" shutdown (SIGINT to the postmaster: sessions ended, nothing lost), waited
        for. `runuser` forwards no signal, so the postmaster is signalled itself."""
        if not self.running():
            return
        pid = self._postmaster()
        if pid is not None:
            try:
                os.kill(pid, signal.SIGINT)
            except ProcessLookupError:
                pass
        try:
            self._proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            self._kill()

    def _kill(self) -> None:
        pid = self._postmaster()
        super()._kill()
        if pid is not None:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass

    def close(self) -> None:
        super().close()
        if self._scratch is not None:
            shutil.rmtree(self._scratch, ignore_errors=True)


def _redis_bin() -> str:
    found = shutil.which("redis-server")
    if not found:
        raise AssertionError("no redis-server on PATH: run `infra/services.sh up redis`")
    return found


class DedicatedRedis(_Server):
    """A Redis server without persistence, as `infra/redis.sh` runs it: a restart loses
    whatever it held. `persistent=True` keeps its data across one (an append-only file
    synced on every write)."""

    name = "Redis"

    def __init__(self, home: Path, *, persistent: bool = False):
        super().__init__(home)
        self.bin, self.persistent = _redis_bin(), persistent
        self.url = f"redis://127.0.0.1:{self.port}/0"

    def _argv(self) -> list[str]:
        keep = ["--appendonly", "yes", "--appendfsync", "always"] if self.persistent else ["--appendonly", "no"]
        return [self.bin, "--port", str(self.port), "--bind", "127.0.0.1", "--dir", str(self.home), "--save", "",
                *keep, "--daemonize", "no"]

    def serving(self) -> bool:
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=1) as s:
                s.sendall(b"PING\r\n")
                return s.recv(16).startswith(b"+PONG")
        except OSError:
            return False


def _minio_bin() -> Path:
    found = sorted((LOCAL / "bin").glob("minio-*"))
    if not found:
        raise AssertionError(f"no MinIO under {LOCAL / 'bin'}: run `infra/services.sh up s3`")
    return found[-1]


class DedicatedMinio(_Server):
    """A MinIO server with one bucket, its data under `home`."""

    name = "MinIO"
    key, secret, bucket = "ledgerlm", "ledgerlm-secret", "outage-test"

    def __init__(self, home: Path):
        super().__init__(home)
        self.bin = _minio_bin()
        self.console_port = _free_port()
        self.endpoint = f"http://127.0.0.1:{self.port}"
        self._made_bucket = False

    def _argv(self) -> list[str]:
        return [str(self.bin), "server", "--quiet", "--address", f"127.0.0.1:{self.port}", "--console-address",
                f"127.0.0.1:{self.console_port}", str(self.home / "data")]

    def _env(self) -> dict[str, str]:
        return {**os.environ, "MINIO_ROOT_USER": self.key, "MINIO_ROOT_PASSWORD": self.secret,
                "MINIO_BROWSER": "off", "MINIO_UPDATE": "off", "MINIO_CI_CD": "1"}

    def serving(self) -> bool:
        try:
            return httpx.get(f"{self.endpoint}/minio/health/ready", timeout=2).status_code == 200
        except httpx.HTTPError:
            return False

    def filesystem(self):
        """An s3fs filesystem on this server, for a test to look at what it holds."""
        import s3fs

        return s3fs.S3FileSystem(key=self.key, secret=self.secret, use_listings_cache=False,
                                 skip_instance_cache=True, client_kwargs={"endpoint_url": self.endpoint})

    def start(self) -> "DedicatedMinio":
        super().start()
        if not self._made_bucket:
            self.filesystem().mkdir(self.bucket)
            self._made_bucket = True
        return self

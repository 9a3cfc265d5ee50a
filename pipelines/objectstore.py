"""The `ObjectStore` port: whole objects under keys, chosen by URL.

    file:///abs/path      a local directory (fsspec), the embedded default
    s3://bucket/prefix    S3 or any S3-compatible server (s3fs), endpoint and keys from settings
    memory://name         fsspec's in-process memory store, for unit tests

Writes are all-or-nothing: a reader sees the old object or the whole new one, never a
torn one (S3 PUT and multipart completion are atomic; local writes go to a temporary
name first and are renamed). That is what makes "a retry overwrites" safe.
"""
from __future__ import annotations

import os
import posixpath
import shutil
import uuid
from typing import IO


class ObjectNotFound(FileNotFoundError):
    pass


class ObjectStore:
    """Common behaviour over an fsspec filesystem rooted at `root`."""

    def __init__(self, fs, root: str, url: str):
        self.fs, self.root, self.url = fs, root.rstrip("/"), url.rstrip("/")

    def path(self, key: str) -> str:
        """The filesystem path of `key`, for pyarrow or fsspec callers."""
        return f"{self.root}/{check_key(key)}"

    def uri(self, key: str) -> str:
        """The URL a user (or pyarrow, pandas, DuckDB) reads the object at."""
        return f"{self.url}/{check_key(key)}"

    def key_for_uri(self, uri: str) -> str | None:
        """The key of a URL inside this store, or None for one outside it."""
        base = self.url + "/"
        if not uri.startswith(base):
            return None
        try:
            return check_key(uri[len(base):])
        except ValueError:
            return None

    def put_bytes(self, key: str, data: bytes) -> None:
        self.fs.pipe_file(self.path(key), data)

    def put_file(self, key: str, local_path: str) -> None:
        self.fs.put_file(local_path, self.path(key))

    def get_bytes(self, key: str) -> bytes:
        try:
            return self.fs.cat_file(self.path(key))
        except FileNotFoundError:
            raise ObjectNotFound(key) from None

    def open_read(self, key: str) -> IO[bytes]:
        try:
            return self.fs.open(self.path(key), "rb")
        except FileNotFoundError:
            raise ObjectNotFound(key) from None

    def exists(self, key: str) -> bool:
        return self.fs.exists(self.path(key))

    def size(self, key: str) -> int | None:
        try:
            return int(self.fs.size(self.path(key)))
        except FileNotFoundError:
            return None

    def delete(self, key: str) -> None:
        try:
            self.fs.rm_file(self.path(key))
        except FileNotFoundError:
            pass

    def list(self, prefix: str) -> list[str]:
        """Keys under `prefix` (a folder-like key ending in '/'), sorted."""
        base = self.path(prefix.rstrip("/"))
        try:
            found = self.fs.find(base)
        except FileNotFoundError:
            return []
        root = self.fs._strip_protocol(self.root) + "/"  # noqa: SLF001 - fsspec's own normal form
        return sorted(p[len(root):] for p in found if p.startswith(root))


class LocalObjectStore(ObjectStore):
    def __init__(self, url: str):
        from fsspec.implementations.local import LocalFileSystem

        root = url[len("file://"):]
        if not root.startswith("/"):
            raise ValueError(f"object store URL {url!r} must be absolute: file:///path")
        os.makedirs(root, exist_ok=True)
        super().__init__(LocalFileSystem(), root, url)

    def _publish(self, key: str, write) -> None:
        target = self.path(key)
        os.makedirs(posixpath.dirname(target), exist_ok=True)
        tmp = f"{target}.{uuid.uuid4().hex}.tmp"
        try:
            write(tmp)
            os.replace(tmp, target)  # atomic on one filesystem
        finally:
            if os.path.exists(tmp):
                os.remove(tmp)

    def put_bytes(self, key: str, data: bytes) -> None:
        def write(tmp: str) -> None:
            with open(tmp, "wb") as f:
                f.write(data)

        self._publish(key, write)

    def put_file(self, key: str, local_path: str) -> None:
        self._publish(key, lambda tmp: shutil.copyfile(local_path, tmp))

    def list(self, prefix: str) -> list[str]:
        return [k for k in super().list(prefix) if not k.endswith(".tmp")]


class S3ObjectStore(ObjectStore):
    def __init__(self, url: str, *, endpoint_url: str | None, key: str | None, secret: str | None):
        import s3fs

        bucket_and_prefix = url[len("s3://"):].strip("/")
        if not bucket_and_prefix:
            raise ValueError(f"object store URL {url!r} names no bucket: s3://bucket/prefix")
        # No listing cache and no shared instance: other processes write the same keys, and
        # an instance made before a fork (Celery prefork) must not be reused after it.
        fs = s3fs.S3FileSystem(key=key, secret=secret, use_listings_cache=False, skip_instance_cache=True,
                               client_kwargs={"endpoint_url": endpoint_url} if endpoint_url else {})
        super().__init__(fs, bucket_and_prefix, "s3://" + bucket_and_prefix)


class MemoryObjectStore(ObjectStore):
    def __init__(self, url: str):
        from fsspec.implementations.memory import MemoryFileSystem

        super().__init__(MemoryFileSystem(), "/" + url[len("memory://"):].strip("/"), url)


def check_key(key: str) -> str:
    """Keys are relative, '/'-separated, without '.' or '..' parts: never outside the root."""
    parts = key.split("/")
    if not key or key.startswith("/") or any(p in (".", "..") for p in parts) or "" in parts[:-1]:
        raise ValueError(f"invalid object key {key!r}")
    return key


def open_object_store(url: str, *, endpoint_url: str | None = None, key: str | None = None,
                      secret: str | None = None) -> ObjectStore:
    if url.startswith("file://"):
        return LocalObjectStore(url)
    if url.startswith("s3://"):
        return S3ObjectStore(url, endpoint_url=endpoint_url, key=key, secret=secret)
    if url.startswith("memory://"):
        return MemoryObjectStore(url)
    raise ValueError(f"unsupported object store URL {url!r}; expected file:///path or s3://bucket/prefix")


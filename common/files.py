"""Small file helpers both twins' trainers use: a writability check up front, and file digests."""
from __future__ import annotations

import hashlib
import tempfile
from pathlib import Path

from common.errors import ConfigError


def check_writable(directory: Path, what: str) -> None:
    """Fail before training, in one line, rather than after the first epoch."""
    if directory.exists() and not directory.is_dir():
        raise ConfigError(f"{what} {directory}: exists and is not a directory")
    parent = directory if directory.is_dir() else directory.parent
    try:
        parent.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=parent):
            pass
    except OSError as err:
        raise ConfigError(f"{what} {directory}: cannot write there ({err.strerror})") from None


def file_sha256(path: Path) -> str:
    """Hex SHA-256 of a file's bytes (training-state files carry no checksum of their own)."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()

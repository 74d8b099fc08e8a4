"""A site-packages of the tests' own, with an ``lstm-twins`` install record, which :mod:`jax_impl.recurrences.native`
reads in place of the real install: libraries and ``.skipped`` reasons written into it and listed in its RECORD as
pip lists what it installs."""
from __future__ import annotations

import base64
import hashlib
import importlib.metadata
from pathlib import Path

from jax_impl.recurrences import native

DIST_INFO = "lstm_twins-0.1.0.dist-info"


def fake_site(folder: Path, monkeypatch) -> Path:
    """``folder`` made an install of ``lstm-twins`` with nothing native in it, and the native module pointed at it."""
    dist_info = folder / DIST_INFO
    dist_info.mkdir()
    (dist_info / "METADATA").write_text("Metadata-Version: 2.1\nName: lstm-twins\nVersion: 0.1.0\n", encoding="utf-8")
    (dist_info / "RECORD").write_text(f"{DIST_INFO}/METADATA,,\n{DIST_INFO}/RECORD,,\n", encoding="utf-8")
    monkeypatch.setattr(native, "distribution", lambda: importlib.metadata.Distribution.at(dist_info))
    monkeypatch.setattr(native, "NATIVE_DIR", None)
    return folder


def record_path(site: Path) -> Path:
    return site / DIST_INFO / "RECORD"


def install(site: Path, file: str, content: bytes, record: str | None = None) -> Path:
    """``content`` installed as ``file`` of the native folder, listed in the RECORD with its SHA-256 and size (or
    with ``record``'s "hash,size" in their place); its path."""
    path = site / native.FOLDER / file
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(content)
    digest = base64.urlsafe_b64encode(hashlib.sha256(content).digest()).rstrip(b"=").decode()
    with open(record_path(site), "a", encoding="utf-8") as f:
        f.write(f"{native.FOLDER}/{file},{record if record is not None else f'sha256={digest},{len(content)}'}\n")
    return path


def skip(site: Path, name: str, reason: str) -> None:
    """The build's ``NAME.skipped`` for library ``name``, saying ``reason``."""
    install(site, f"{name}.skipped", f"{reason}\n".encode())

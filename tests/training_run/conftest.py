"""Fixtures for the checkpoint / event-log / run-decorator tests."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture
def ckpt_dir(tmp_path: Path) -> Path:
    return tmp_path / "ckpt"

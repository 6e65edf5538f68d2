"""What the /v1 adapter answers about a model no executor serves: 404 `model_not_found` for one no
executor ever advertised (OpenAI's answer for a model that does not exist: clients do not retry it),
503 `no_executor` with Retry-After for one the pool knows whose executors are all away (clients
retry it, and an executor may come back: a Mac wakes)."""

from __future__ import annotations

from typing import Any

from aiohttp import web

from minions import jsoncodec
from minions.services.api.http.errors import ApiError

RETRY_AFTER_S = "5"


class OpenAIShapedError(ApiError):
    """Our error shape with OpenAI's `type` and `param` beside `code` and `message`, so a client of
    either reads it: {"error": {"code", "message", "type", "param"}}."""

    def __init__(self, status: int, code: str, message: str, error_type: str, param: str | None) -> None:
        super().__init__(status, code, message)
        self.error_type = error_type
        self.param = param

    def response(self) -> web.Response:
        error: dict[str, Any] = {"code": self.code, "message": self.message, "type": self.error_type,
                                 "param": self.param}
        return web.Response(status=self.status, body=jsoncodec.dumps({"error": error}),
                            content_type="application/json", headers=self.headers)


def model_not_found(model: str, kind: str | None = None) -> OpenAIShapedError:
    served = f"serves {kind} with model {model!r}" if kind else f"serves model {model!r}"
    return OpenAIShapedError(404, "model_not_found",
                             f"no executor {served} (none ever advertised it; GET /v1/models lists those known)",
                             "invalid_request_error", "model")


def no_executor(message: str) -> ApiError:
    return ApiError(503, "no_executor", message, headers={"Retry-After": RETRY_AFTER_S})

"""The one HTTP error shape: {"error": {"code", "message", "fields"}} with the right status."""

from __future__ import annotations

from typing import Any

from aiohttp import web

from minions import jsoncodec


class ApiError(Exception):
    def __init__(self, status: int, code: str, message: str, fields: dict[str, str] | None = None,
                 headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message
        self.fields = fields
        self.headers = headers or {}

    def response(self) -> web.Response:
        return error_response(self.status, self.code, self.message, self.fields, self.headers)


def error_response(status: int, code: str, message: str, fields: dict[str, str] | None = None,
                   headers: dict[str, str] | None = None) -> web.Response:
    error: dict[str, Any] = {"code": code, "message": message}
    if fields:
        error["fields"] = fields
    return web.Response(status=status, body=jsoncodec.dumps({"error": error}),
                        content_type="application/json", headers=headers)


def bad_request(message: str, code: str = "malformed_body") -> ApiError:
    return ApiError(400, code, message)


def invalid(fields: dict[str, str], message: str = "invalid values") -> ApiError:
    return ApiError(422, "invalid", message, fields)


def not_found(what: str) -> ApiError:
    return ApiError(404, "not_found", f"{what} not found")


def conflict(code: str, message: str) -> ApiError:
    return ApiError(409, code, message)


def forbidden(message: str, code: str = "forbidden") -> ApiError:
    return ApiError(403, code, message)

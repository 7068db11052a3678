"""Every failure leaves as an OpenAI-style body: {"error": {"message", "type", "param", "code"}}."""
from __future__ import annotations

import logging
import re
from pathlib import Path

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from shrike.engine.async_engine import EngineStepError, EngineStoppedError, QueueFullError

logger = logging.getLogger(__name__)

RETRY_AFTER_SECONDS = 1


class APIError(Exception):
    def __init__(self, message: str, status: int = 400, type: str = "invalid_request_error",
                 param: str | None = None, code: str | None = None, headers: dict[str, str] | None = None):
        super().__init__(message)
        self.message, self.status, self.type, self.param, self.code = message, status, type, param, code
        self.headers = headers

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}

    def response(self) -> JSONResponse:
        return JSONResponse(self.body(), status_code=self.status, headers=self.headers)


def bad_request(message: str, param: str | None = None) -> APIError:
    return APIError(message, 400, param=param)


def from_engine_error(error: Exception, param_names: set[str] = frozenset(),
                      prompt_param: str | None = None) -> APIError:
    """Map what the engine (or sampling validation) raised to the client's view of it."""
    if isinstance(error, QueueFullError):
        return APIError(str(error), 503, "service_unavailable", code="queue_full",
                        headers={"Retry-After": str(RETRY_AFTER_SECONDS)})
    if isinstance(error, EngineStoppedError):
        return APIError(str(error), 503, "service_unavailable", code="shutting_down")
    if isinstance(error, EngineStepError):
        # Not a 500: the server is healthy and the request may well succeed again.
        return APIError(str(error), 503, "service_unavailable", code="engine_step_failed")
    if isinstance(error, ValueError) and raised_by_shrike(error):
        return bad_request(str(error), param_of(str(error), param_names, prompt_param))
    raise error  # a library's ValueError is no word to the client: the 500 handler logs it


_SHRIKE_PACKAGE = Path(__file__).resolve().parents[1]


def raised_by_shrike(error: Exception) -> bool:
    """Whether Shrike's own code raised it (so its message was written for people), not Python or a library."""
    frame = error.__traceback__
    while frame is not None and frame.tb_next is not None:
        frame = frame.tb_next
    return frame is not None and _SHRIKE_PACKAGE in Path(frame.tb_frame.f_code.co_filename).resolve().parents


def param_of(message: str, param_names: set[str], prompt_param: str | None = None) -> str | None:
    """Engine validation messages start with the parameter they are about, or with "the prompt"."""
    if message.startswith("the prompt"):
        return prompt_param
    leading = re.match(r"[a-z_]+", message)
    return leading.group() if leading and leading.group() in param_names else None


def _split_loc(loc: tuple) -> tuple[str | None, str | None]:
    """('body', 'prompt', 'list[int]', 1) -> ('prompt', 'list[int]'): the field, and which form of a union failed."""
    parts: list[str] = []
    for part in loc:
        text = str(part)
        if part == "body" and not parts:
            continue
        # pydantic names the alternative of a union it tried: a type, a model class or a validator
        if isinstance(part, str) and (not text.isidentifier() or text[0].isupper() or text in _TYPE_NAMES):
            return ".".join(parts) or None, text
        parts.append(text)
    return ".".join(parts) or None, None


_TYPE_NAMES = {"str", "int", "float", "bool", "dict", "list", "none"}


def _validation_message(errors: list[dict]) -> tuple[str, str | None]:
    first = errors[0]
    if first.get("type") == "json_invalid":
        detail = (first.get("ctx") or {}).get("error", "")
        return f"the request body is not valid JSON ({detail})", None
    param, alternative = _split_loc(first.get("loc", ()))
    same_field = [e for e in errors if _split_loc(e.get("loc", ()))[0] == param]
    alternatives = list(dict.fromkeys(a for a in (_split_loc(e.get("loc", ()))[1] for e in same_field) if a))
    if alternative is not None and len(alternatives) > 1:
        message = f"{_shown(first.get('input'))} matches none of the accepted forms ({', '.join(alternatives)})"
    else:
        message = first.get("msg", "invalid value")
        if "input" in first and first.get("type") != "missing":
            message += f", got {_shown(first['input'])}"
    others = len(errors) - len(same_field)
    if others:
        message += f" (and {others} more problem{'s' if others > 1 else ''})"
    return (f"{param}: {message}" if param else message), param


def _shown(value) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def validation_error(errors: list[dict]) -> APIError:
    """The 400 for what pydantic found wrong with a request body."""
    message, param = _validation_message(errors) if errors else ("invalid request", None)
    return bad_request(message, param)


def install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(APIError)
    async def api_error(request: Request, error: APIError) -> JSONResponse:
        return error.response()

    @app.exception_handler(RequestValidationError)
    async def request_validation_error(request: Request, error: RequestValidationError) -> JSONResponse:
        return validation_error(list(error.errors())).response()

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, error: StarletteHTTPException) -> JSONResponse:
        kind = {404: "not_found_error", 405: "invalid_request_error"}.get(error.status_code, "invalid_request_error")
        return APIError(str(error.detail), error.status_code, kind, headers=error.headers).response()

    @app.exception_handler(Exception)
    async def unexpected_error(request: Request, error: Exception) -> JSONResponse:
        logger.exception("unexpected error serving %s %s", request.method, request.url.path)
        return APIError(f"internal error ({type(error).__name__}); the server is still serving", 500,
                        "server_error").response()

"""The model server's HTTP API, as a FastAPI app over one loaded model.

    POST /generate   {prompt, max_tokens, temperature, top_k, seed} -> {text, completion, tokens, ...}
    GET  /info       the model (architecture, parameters, vocabulary, step, run) and the server's limits
    GET  /health     {"status": "ok"}
    GET  /docs       the OpenAPI page (Swagger UI); /openapi.json the schema itself

Every error is JSON with one line to read, {"error": "..."}: 422 for a request that breaks the schema or a
limit (the field and the rule), 415 for a body not sent as JSON, 400 for a prompt this model cannot read
(characters its corpus never had) or a body that cannot be parsed, 413 for a body larger than any valid
request, 404/405 for a wrong path or method, 503 (with Retry-After) when every generation slot is busy, 500
for a fault of the server's own. 408, a 503 for too many connections, and a 400 for what is not HTTP come
from the connection protocol (protocol.py), in the same form.

Generation runs on worker threads, at most `Limits.max_generations` at once (pool.py); /health and /info are
coroutines on the event loop, so they never wait behind a generation. The model is only read (the autograd
tape is off and per thread), so the threads share it safely.
"""

from dataclasses import dataclass
from typing import Any

from fastapi import FastAPI, HTTPException, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field
from starlette.exceptions import HTTPException as StarletteHTTPException

from engine.checkpoint.export import LoadedModel
from engine.checkpoint.files import CheckpointError
from engine.checkpoint.sample import SEED, TEMPERATURE, TOKENS, TOP_K, sample
from nanodist_tui.serve.body import BodyLimit
from nanodist_tui.serve.pool import Busy, GenerationPool

MAX_TEMPERATURE = 100.0


@dataclass(frozen=True)
class Limits:
    max_prompt_chars: int = 4096
    max_tokens: int = 1024
    # At this model size generation is mostly Python holding the GIL: threads beyond a few add waiting, not
    # throughput. A few still keep a larger model's matrix products (which release it) on several cores.
    max_generations: int = 4
    # Far above max_generations, for idle keep-alive clients and browsers; each one a half-sent request can
    # hold is freed after read_timeout_s.
    max_connections: int = 256
    read_timeout_s: float = 10.0  # a whole request (line, headers, body) arrives within this

    @property
    def max_body_bytes(self) -> int:
        """No valid request is larger: each prompt character at most 6 bytes of JSON (a \\uXXXX escape)."""
        return 6 * self.max_prompt_chars + 4096


class ErrorBody(BaseModel):
    error: str


class Health(BaseModel):
    status: str


def create_api(loaded: LoadedModel, source: str, limits: Limits = Limits()) -> FastAPI:
    """The app serving `loaded` (read from `source`, a path shown by /info) within `limits`."""

    class GenerateRequest(BaseModel):
        model_config = ConfigDict(extra="forbid", strict=True)
        prompt: str = Field("", max_length=limits.max_prompt_chars,
                            description="text to continue (characters of the model's corpus; for a model "
                                        "trained on synthetic tokens: token ids separated by spaces)")
        max_tokens: int = Field(min(TOKENS, limits.max_tokens), ge=1, le=limits.max_tokens,
                                description="tokens to generate")
        temperature: float = Field(TEMPERATURE, ge=0.0, le=MAX_TEMPERATURE, allow_inf_nan=False,
                                   description="sampling temperature; 0 = greedy")
        top_k: int = Field(TOP_K, ge=0, description="sample among the k most likely tokens only; 0 = all")
        seed: int = Field(SEED, ge=0, le=2**63 - 1, description="sampling seed: same seed, same text")

    class GenerateResponse(BaseModel):
        text: str = Field(description="the prompt and its continuation, as `nanodist-tui sample` prints it")
        completion: str = Field(description="the continuation alone")
        tokens: int
        seed: int

    model, meta = loaded.model, loaded.meta
    info = {"model": meta["model"], "parameters": sum(int(p.data.size) for p in model.parameters()),
            "vocabulary": "token ids" if loaded.vocab is None else "characters", "step": meta.get("step"),
            "run_id": meta.get("run_id"), "preset": (meta.get("config") or {}).get("name"), "source": source,
            "limits": {"max_prompt_chars": limits.max_prompt_chars, "max_tokens": limits.max_tokens,
                       "max_generations": limits.max_generations, "max_connections": limits.max_connections,
                       "read_timeout_s": limits.read_timeout_s}}
    pool = GenerationPool(limits.max_generations)

    app = FastAPI(title="nanoDist model server", version="1",
                  description=f"Text from the GPT in {source}.")
    app.state.limits = limits  # the server reads the connection limits from here
    app.state.pool = pool
    errors: dict[int | str, dict[str, Any]] = {code: {"model": ErrorBody}
                                               for code in (400, 408, 413, 415, 422, 500, 503)}

    @app.post("/generate", response_model=GenerateResponse, responses=errors)
    async def generate(request: GenerateRequest) -> GenerateResponse:
        try:
            out = await pool.run(sample, loaded, request.prompt, request.max_tokens, request.temperature,
                                 request.seed, request.top_k)
        except CheckpointError as exc:  # a prompt this model cannot encode
            raise HTTPException(400, str(exc)) from None
        except Busy as busy:
            raise HTTPException(503, str(busy), headers={"Retry-After": str(busy.retry_after_s)}) from None
        return GenerateResponse(text=out.text, completion=out.completion, tokens=out.tokens,
                                seed=request.seed)

    # Coroutines, run on the event loop itself: a plain `def` would wait for a free worker thread.
    @app.get("/info")
    async def model_info() -> dict:
        return info

    @app.get("/health", response_model=Health)
    async def health() -> Health:
        return Health(status="ok")

    @app.exception_handler(RequestValidationError)
    async def invalid_request(request: Request, exc: RequestValidationError) -> JSONResponse:
        status = 415 if any(_not_json(e) for e in exc.errors()) else 422
        return JSONResponse({"error": validation_line(exc.errors())}, status_code=status)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        line = _one_line(str(exc.detail))
        if line == "There was an error parsing the body":  # FastAPI's, for bytes json cannot decode at all
            line = "the body cannot be parsed as JSON (its bytes are not text, or it nests too deeply)"
        return JSONResponse({"error": line}, status_code=exc.status_code, headers=exc.headers)

    @app.exception_handler(Exception)
    async def server_fault(request: Request, exc: Exception) -> JSONResponse:
        # The traceback still goes to the server's log (uvicorn's error logger): this is the client's line.
        return JSONResponse({"error": _one_line(f"internal server error: {type(exc).__name__}: {exc}")},
                            status_code=500)

    app.add_middleware(BodyLimit, max_bytes=limits.max_body_bytes)
    return app


def _one_line(text: str) -> str:
    return " ".join(text.split())


def validation_line(errors) -> str:
    """Pydantic's errors as one line: `field: what is wrong` for each, `;`-separated."""
    return "; ".join(_error_text(e) for e in errors)


def _where(e: dict) -> str:
    return ".".join(str(p) for p in e.get("loc", ()) if p != "body") or "body"


def _not_json(e: dict) -> bool:
    """FastAPI did not parse the body (it came as bytes or text): it was not sent as JSON."""
    return _where(e) == "body" and e.get("type") in ("model_attributes_type", "dict_type") and \
        isinstance(e.get("input"), (bytes, str))


def _error_text(e: dict) -> str:
    kind = e.get("type")
    if kind == "json_invalid":
        return f"the body is not valid JSON ({e.get('ctx', {}).get('error', 'cannot parse it')})"
    where = _where(e)
    if _not_json(e):
        return "the body must be a JSON object, sent with Content-Type: application/json"
    if where == "body" and kind in ("model_attributes_type", "dict_type"):
        return 'the body must be a JSON object such as {"prompt": "def "}'
    text = f"{where}: {e.get('msg', 'invalid')}"
    if kind in ("less_than_equal", "string_too_long") and where in ("max_tokens", "prompt"):
        text += " (this server's limit: GET /info)"
    return text

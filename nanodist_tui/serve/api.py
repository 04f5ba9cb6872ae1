"""The model server's HTTP API, as a FastAPI app over one loaded model.

    POST /generate   {prompt, max_tokens, temperature, top_k, seed} -> {text, completion, tokens, ...}
    GET  /info       the model (architecture, parameters, vocabulary, step, run) and the server's limits
    GET  /health     {"status": "ok"}
    GET  /docs       the OpenAPI page (Swagger UI); /openapi.json the schema itself

Every error is JSON with one line to read, {"error": "..."}: 422 for a request that breaks the schema or a
limit (the field and the rule), 400 for a prompt this model cannot read (characters its corpus never had),
413 for a body larger than any valid request, 404/405 for a wrong path or method. Generation runs on
FastAPI's thread pool (a plain `def` endpoint), so requests are served concurrently; the model is only
read (the autograd tape is off and per thread), so they share it safely.
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

MAX_TEMPERATURE = 100.0


@dataclass(frozen=True)
class Limits:
    max_prompt_chars: int = 4096
    max_tokens: int = 1024

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
            "limits": {"max_prompt_chars": limits.max_prompt_chars, "max_tokens": limits.max_tokens}}

    app = FastAPI(title="nanoDist model server", version="1",
                  description=f"Text from the GPT in {source}.")
    errors: dict[int | str, dict[str, Any]] = {code: {"model": ErrorBody} for code in (400, 413, 422)}

    @app.post("/generate", response_model=GenerateResponse, responses=errors)
    def generate(request: GenerateRequest) -> GenerateResponse:
        try:
            out = sample(loaded, request.prompt, request.max_tokens, request.temperature, request.seed,
                         request.top_k)
        except CheckpointError as exc:  # a prompt this model cannot encode
            raise HTTPException(400, str(exc)) from None
        return GenerateResponse(text=out.text, completion=out.completion, tokens=out.tokens,
                                seed=request.seed)

    @app.get("/info")
    def model_info() -> dict:
        return info

    @app.get("/health", response_model=Health)
    def health() -> Health:
        return Health(status="ok")

    @app.exception_handler(RequestValidationError)
    async def invalid_request(request: Request, exc: RequestValidationError) -> JSONResponse:
        return JSONResponse({"error": validation_line(exc.errors())}, status_code=422)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        return JSONResponse({"error": str(exc.detail)}, status_code=exc.status_code, headers=exc.headers)

    app.add_middleware(BodyLimit, max_bytes=limits.max_body_bytes)
    return app


def validation_line(errors) -> str:
    """Pydantic's errors as one line: `field: what is wrong` for each, `;`-separated."""
    return "; ".join(_error_text(e) for e in errors)


def _error_text(e: dict) -> str:
    kind = e.get("type")
    if kind == "json_invalid":
        return f"the body is not valid JSON ({e.get('ctx', {}).get('error', 'cannot parse it')})"
    where = ".".join(str(p) for p in e.get("loc", ()) if p != "body") or "body"
    if where == "body" and kind in ("model_attributes_type", "dict_type"):
        if isinstance(e.get("input"), (bytes, str)):  # FastAPI did not parse it: it was not sent as JSON
            return "the body must be a JSON object, sent with Content-Type: application/json"
        return 'the body must be a JSON object such as {"prompt": "def "}'
    text = f"{where}: {e.get('msg', 'invalid')}"
    if kind in ("less_than_equal", "string_too_long") and where in ("max_tokens", "prompt"):
        text += " (this server's limit: GET /info)"
    return text

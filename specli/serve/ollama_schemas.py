"""The request bodies of Ollama's API (pydantic models, strict types) and its values' formats.
Every request field and option either does what Ollama does or gets a 400 naming it; the few
accepted without effect (``keep_alive``, load-time options) cannot change the text."""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, field_validator, model_validator

from specli.speculate.verify import SamplingParams

# Ollama's sampling defaults (its Modelfile documentation); num_predict -1: until the context is full
DEFAULTS = {"temperature": 0.8, "top_k": 40, "top_p": 0.9}
# options accepted only at their neutral value: specli samples the model's own distribution
NEUTRAL = {"repeat_penalty": 1.0, "presence_penalty": 0.0, "frequency_penalty": 0.0, "min_p": 0.0,
           "typical_p": 1.0, "tfs_z": 1.0, "mirostat": 0}
# accepted and without effect on the text: the model is loaded once, when the server starts
# (--ctx, --threads, --gpu-layers), and no repetition penalty is applied (repeat_last_n,
# penalize_newline); num_keep only matters to Ollama's context shifting, which specli never does
LOAD_TIME = ("numa", "num_batch", "num_gpu", "main_gpu", "low_vram", "f16_kv", "logits_all", "vocab_only",
             "use_mmap", "use_mlock", "embedding_only", "num_thread", "num_keep", "repeat_last_n", "penalize_newline")


# -- request bodies ----------------------------------------------------------------------
class _Body(BaseModel):
    # unknown fields are refused: each may be something the client expects to change the output
    model_config = ConfigDict(strict=True, extra="forbid")


class Options(BaseModel):
    model_config = ConfigDict(strict=True, extra="allow")

    temperature: float | None = Field(None, ge=0.0)
    top_k: int | None = Field(None, ge=0)
    top_p: float | None = Field(None, ge=0.0, le=1.0)
    seed: int | None = None
    num_predict: int | None = Field(None, ge=-2)
    num_ctx: int | None = Field(None, ge=1)
    stop: list[str] | None = None

    @model_validator(mode="after")
    def _known(self):
        extra = dict(self.model_extra or {})
        unknown = sorted(k for k in extra if k not in NEUTRAL and k not in LOAD_TIME)
        if unknown:
            raise ValueError(f"unknown option{'s' if len(unknown) > 1 else ''} {', '.join(unknown)} (specli serves "
                             "temperature, top_k, top_p, seed, num_predict, num_ctx, stop)")
        for k, neutral in NEUTRAL.items():
            v = extra.get(k)
            if v is not None and (isinstance(v, bool) or not isinstance(v, (int, float)) or v != neutral):
                raise ValueError(f"{k} {v!r} is not supported: specli samples the model's own distribution "
                                 f"(send {neutral} or leave it out)")
        return self

    @field_validator("num_predict")
    @classmethod
    def _predict(cls, v):
        if v == 0:
            raise ValueError("num_predict must be positive, -1 (until the context is full) or -2")
        return v

    @field_validator("stop")
    @classmethod
    def _stops(cls, v):
        if v and any(not s for s in v):
            raise ValueError("stop sequences must not be empty")
        return v

    def sampling(self, temperature: float | None) -> SamplingParams:
        """Ollama's defaults where the request gives nothing; a negative seed is a random one."""
        t = self.temperature if self.temperature is not None else (
            temperature if temperature is not None else DEFAULTS["temperature"])
        return SamplingParams(temperature=t, top_k=DEFAULTS["top_k"] if self.top_k is None else self.top_k,
                              top_p=DEFAULTS["top_p"] if self.top_p is None else self.top_p,
                              seed=self.seed if self.seed is not None and self.seed >= 0 else None)


def _refused(why: str) -> AfterValidator:
    """For a field accepted only when empty: anything else is a 400 saying ``why``."""
    def check(v):
        if v:
            raise ValueError(why)
        return v
    return AfterValidator(check)


NO_LOGPROBS = "log-probabilities are not supported on Ollama's API yet"
NO_THINKING = "thinking is not supported: specli does not separate a model's thinking from its answer"


class AnswerBody(_Body):
    model: str = Field(min_length=1)
    stream: bool = True
    format: Any = None  # "json" or a JSON schema
    options: Options | None = None
    keep_alive: Any = None  # a duration; the model stays loaded until the server stops whatever it says
    think: bool | str | None = None
    logprobs: Annotated[bool | None, _refused(NO_LOGPROBS)] = None
    top_logprobs: Annotated[int | None, _refused(NO_LOGPROBS)] = None

    @field_validator("format")
    @classmethod
    def _format(cls, v):
        if v not in (None, "", "json") and not isinstance(v, dict):
            raise ValueError('must be "json" or a JSON schema (an object)')
        return v

    @field_validator("keep_alive")
    @classmethod
    def _duration(cls, v):
        if v is not None and (isinstance(v, bool) or not isinstance(v, (int, float, str))):
            raise ValueError('must be a duration: seconds, or a string such as "5m"')
        return v

    @field_validator("think")
    @classmethod
    def _no_thinking(cls, v):
        if v not in (None, False):
            raise ValueError(f"{NO_THINKING} (leave think out, or send false)")
        return v

    @property
    def opts(self) -> Options:
        return self.options or Options()


Images = Annotated[list[str] | None, _refused("images are not supported: the served model takes text only")]


class ToolFunction(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid")
    name: str
    arguments: dict[str, Any]
    index: int | None = None


class ToolCall(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid")
    function: ToolFunction


class Message(_Body):
    role: Literal["system", "user", "assistant", "tool"]
    content: str = ""
    images: Images = None
    thinking: Annotated[str | None, _refused(NO_THINKING)] = None
    tool_calls: list[ToolCall] | None = None
    tool_name: str | None = None

    def as_dict(self) -> dict:
        """The message as a chat template expects it."""
        d: dict = {"role": self.role, "content": self.content}
        if self.tool_calls:
            d["tool_calls"] = [{"type": "function", "function": {"name": c.function.name,
                                                                 "arguments": c.function.arguments}}
                               for c in self.tool_calls]
        if self.tool_name:
            d["name"] = self.tool_name
        return d


class Function(_Body):
    name: str = Field(min_length=1)
    description: str = ""
    parameters: dict[str, Any] | None = None


class Tool(_Body):
    type: Literal["function"] = "function"
    function: Function


class ChatBody(AnswerBody):
    messages: list[Message] = Field(default_factory=list)
    tools: list[Tool] | None = None


class GenerateBody(AnswerBody):
    prompt: str | None = None
    system: str | None = None
    raw: bool = False
    images: Images = None
    suffix: Annotated[str | None, _refused("suffix (fill-in-the-middle) is not supported")] = None
    template: Annotated[str | None, _refused(
        "a template override is not supported: specli renders the GGUF's own chat template (or send raw: true "
        "with the prompt already formatted)")] = None
    context: Annotated[list[int] | None, _refused(
        "context (deprecated by Ollama) is not supported: send the conversation to /api/chat")] = None

    @model_validator(mode="after")
    def _raw_system(self):
        if self.raw and self.system:
            raise ValueError("system has no effect with raw: true; put it in the prompt")
        return self



class ShowBody(_Body):
    model: str = ""
    name: str = ""  # the field's old name, which older clients still send
    verbose: bool = False

    @model_validator(mode="after")
    def _named(self) -> ShowBody:
        self.model = self.model or self.name
        if not self.model:
            raise ValueError("model: give the model's name")
        return self


def error_line(errors: list) -> str:
    """One line for the first problem pydantic found in a body, naming the field."""
    first = errors[0]
    if first["type"] == "json_invalid":
        return f"invalid JSON: {first['ctx']['error']}"
    field = ".".join(str(p) for p in first["loc"])
    msg = "unknown field" if first["type"] == "extra_forbidden" else first["msg"].removeprefix("Value error, ")
    return f"{field}: {msg}" if field else msg


def rfc3339(t: float) -> str:
    """A time as Ollama writes one."""
    return datetime.fromtimestamp(t, timezone.utc).isoformat().replace("+00:00", "Z")

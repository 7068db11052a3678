"""Request bodies of the OpenAI-compatible API (and vLLM's extra sampling fields), as pydantic models.

Fields this server cannot honour are still declared, so that a request using them gets a clear
refusal instead of being silently ignored.
"""
from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Discriminator, Field, Tag, model_validator

from shrike.sampling.params import MAX_LOGPROBS

# torch.Generator seeds are 64-bit; the engine adds the choice index to the seed.
SEED_RANGE = (-(2**63), 2**63 - 1 - 1024)


class _Request(BaseModel):
    # Clients send fields this server has no use for (user, metadata, store, ...): they are ignored.
    # strict: a value of the wrong JSON type is refused, as the OpenAPI document says ("5" is no integer).
    # Python's JSON reader turns 1e400 into inf and reads NaN: no number field takes either.
    model_config = ConfigDict(extra="ignore", strict=True, allow_inf_nan=False)

    @model_validator(mode="before")
    @classmethod
    def _integral_numbers(cls, data: Any) -> Any:
        # JSON has one number type: 16.0 is the integer 16 (JSON Schema agrees), which strict mode would refuse.
        return _integral_floats_as_ints(data)


def _integral_floats_as_ints(value: Any) -> Any:
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, list):
        if all(type(v) is int for v in value):
            return value  # a megabyte of token ids: no copy
        return [_integral_floats_as_ints(v) for v in value]
    if isinstance(value, dict):
        return {k: _integral_floats_as_ints(v) for k, v in value.items()}
    return value


class StreamOptions(_Request):
    include_usage: bool = False


class JsonSchemaFormat(_Request):
    name: str = "response"
    description: str | None = None
    # "schema" would shadow a pydantic BaseModel attribute
    schema_: dict[str, Any] | None = Field(default=None, alias="schema")
    strict: bool | None = None


class ResponseFormat(_Request):
    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchemaFormat | None = None


class StructuredOutputs(_Request):
    """vLLM's `structured_outputs`: exactly one constraint."""

    json_: dict[str, Any] | str | None = Field(default=None, alias="json")
    regex: str | None = None
    choice: list[str] | None = None
    grammar: str | None = None
    structural_tag: dict[str, Any] | str | None = None
    json_object: bool | None = None


class SamplingRequest(_Request):
    model: str | None = None
    n: int = 1
    stream: bool = False
    stream_options: StreamOptions | None = None
    temperature: float | None = None
    top_p: float | None = None
    stop: str | list[str] | None = None
    seed: int | None = Field(default=None, ge=SEED_RANGE[0], le=SEED_RANGE[1])
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    logit_bias: dict[str, float] | None = None
    user: str | None = None
    # vLLM's extra sampling parameters
    top_k: int | None = None
    min_p: float | None = None
    repetition_penalty: float | None = None
    min_tokens: int = 0
    stop_token_ids: list[int] | None = None
    ignore_eos: bool = False
    skip_special_tokens: bool = True
    include_stop_str_in_output: bool = False
    # structured outputs: OpenAI's response_format, vLLM's structured_outputs (and its older guided_* fields)
    response_format: ResponseFormat | None = None
    structured_outputs: StructuredOutputs | None = None
    guided_json: dict[str, Any] | str | None = None
    guided_regex: str | None = None
    guided_choice: list[str] | None = None
    guided_grammar: str | None = None


def _prompt_form(value: Any) -> str | None:
    """Which form a prompt takes, from its first item, so only that form is validated: trying each in turn
    costs a failed validation per token id (seconds for a megabyte of ids, on the event loop)."""
    if isinstance(value, str):
        return "str"
    if not isinstance(value, list):
        return None
    first = value[0] if value else 0
    return "list[str]" if isinstance(first, str) else "list[list[int]]" if isinstance(first, list) else "list[int]"


Prompt = Annotated[Annotated[str, Tag("str")] | Annotated[list[str], Tag("list[str]")]
                   | Annotated[list[int], Tag("list[int]")] | Annotated[list[list[int]], Tag("list[list[int]]")],
                   Discriminator(_prompt_form, custom_error_type="prompt_form",
                                 custom_error_message="Input should be a string, a list of strings, a list of "
                                                      "token ids or a list of lists of token ids")]


class CompletionRequest(SamplingRequest):
    prompt: Prompt
    max_tokens: int | None = None
    echo: bool = False
    logprobs: int | None = Field(default=None, ge=0, le=MAX_LOGPROBS)
    suffix: str | None = None
    best_of: int | None = None


class TextContentPart(_Request):
    type: str
    text: str | None = None


class ChatMessage(_Request):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[TextContentPart] | None = None
    name: str | None = None
    tool_calls: list[dict[str, Any]] | None = None
    tool_call_id: str | None = None
    reasoning_content: str | None = None


class ChatCompletionRequest(SamplingRequest):
    messages: list[ChatMessage] = Field(min_length=1)
    max_tokens: int | None = None
    max_completion_tokens: int | None = None
    logprobs: bool = False
    top_logprobs: int | None = Field(default=None, ge=0, le=MAX_LOGPROBS)
    tools: list[dict[str, Any]] | None = None
    tool_choice: Literal["none", "auto", "required"] | dict[str, Any] | None = None
    parallel_tool_calls: bool = True
    chat_template_kwargs: dict[str, Any] | None = None
    add_generation_prompt: bool = True


class ResponsesTextPart(_Request):
    type: Literal["input_text", "output_text"]
    text: str


class ResponsesMessage(_Request):
    type: Literal["message"] = "message"
    role: Literal["user", "system", "developer", "assistant"]
    content: str | list[ResponsesTextPart]


class ResponsesFunctionCall(_Request):
    type: Literal["function_call"]
    call_id: str
    name: str = Field(min_length=1)
    arguments: str


class ResponsesFunctionCallOutput(_Request):
    type: Literal["function_call_output"]
    call_id: str
    output: str | list[ResponsesTextPart]


class ResponsesReasoning(_Request):
    type: Literal["reasoning"]  # a model's earlier reasoning: accepted, not shown to it again


class ResponsesFunctionTool(_Request):
    type: Literal["function"]
    name: str = Field(min_length=1)
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class ResponsesNamedToolChoice(_Request):
    type: Literal["function"]
    name: str


class ResponsesTextFormat(_Request):
    type: Literal["text", "json_object", "json_schema"]
    name: str = "response"
    schema_: dict[str, Any] | None = Field(default=None, alias="schema")
    strict: bool | None = None


class ResponsesText(_Request):
    format: ResponsesTextFormat | None = None


ResponsesItem = ResponsesMessage | ResponsesFunctionCall | ResponsesFunctionCallOutput | ResponsesReasoning


class ResponsesRequest(_Request):
    """OpenAI's Responses API (POST /v1/responses), the part of it a text model serves; read in server/responses.py."""

    model: str | None = None
    input: str | list[ResponsesItem] = Field(min_length=1)
    instructions: str | None = None
    previous_response_id: str | None = None
    tools: list[ResponsesFunctionTool] | None = None
    tool_choice: Literal["none", "auto", "required"] | ResponsesNamedToolChoice | None = None
    parallel_tool_calls: bool = True
    text: ResponsesText | None = None
    temperature: float | None = None
    top_p: float | None = None
    max_output_tokens: int | None = None
    stream: bool = False
    metadata: dict[str, Any] | None = None


class TokenizeRequest(_Request):
    model: str | None = None
    prompt: str | None = None
    messages: list[ChatMessage] | None = None
    add_special_tokens: bool = True
    add_generation_prompt: bool = True
    chat_template_kwargs: dict[str, Any] | None = None


class DetokenizeRequest(_Request):
    model: str | None = None
    tokens: list[int]


class LoadLoRAAdapterRequest(_Request):
    """vLLM's /v1/load_lora_adapter body: a PEFT adapter directory served as model=lora_name."""

    lora_name: str = Field(min_length=1)
    lora_path: str = Field(min_length=1)


class UnloadLoRAAdapterRequest(_Request):
    lora_name: str = Field(min_length=1)

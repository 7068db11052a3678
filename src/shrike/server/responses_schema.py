"""What /openapi.json says of POST /v1/responses beyond its pydantic models: the refusals they cannot express."""
from __future__ import annotations


def refine_responses_request(schemas: dict, most_tokens: int) -> None:
    """schemas: the document's components/schemas, changed in place."""
    request = schemas["ResponsesRequest"]["properties"]
    items = next(choice for choice in request["input"]["anyOf"] if choice.get("type") == "array")
    # Earlier reasoning alone leaves nothing to answer.
    items["contains"] = {"not": {"$ref": "#/components/schemas/ResponsesReasoning"}}
    request["max_output_tokens"] = {"anyOf": [{"type": "integer", "minimum": 1, "maximum": most_tokens},
                                              {"type": "null"}]}
    text_format = schemas["ResponsesTextFormat"]
    text_format["if"] = {"properties": {"type": {"const": "json_schema"}}, "required": ["type"]}
    text_format["then"] = {"required": ["schema"], "properties": {"schema": {"type": "object"}}}

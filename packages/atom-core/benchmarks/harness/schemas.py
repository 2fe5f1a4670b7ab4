"""The JSON schema the structured-output benchmarks hold every row to."""

SCHEMA = {
    "type": "array",
    "minItems": 200,
    "items": {
        "type": "object",
        "properties": {
            "id": {"type": "integer"},
            "name": {"type": "string", "maxLength": 16},
            "score": {"type": "number"},
            "tags": {"type": "array", "items": {"type": "string", "maxLength": 8}, "maxItems": 3},
        },
        "required": ["id", "name", "score", "tags"],
        "additionalProperties": False,
    },
}

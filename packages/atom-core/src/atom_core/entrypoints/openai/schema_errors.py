"""A request body that fails its schema (protocol.py), said as OpenAI's API says it: the parameter named
as a client writes it (`messages[0].content`), what was expected and what came, in OpenAI's words
("Invalid type for 'max_tokens': expected an integer, but got a string instead."), with its `param` and
`code`. pydantic's own messages ("Input should be a valid integer") name its internals, not the API."""

from __future__ import annotations

from dataclasses import dataclass

# pydantic's type errors -> what the field takes
EXPECTED = {
    "int_type": "an integer",
    "int_parsing": "an integer",
    "int_from_float": "an integer",
    "float_type": "a number",
    "float_parsing": "a number",
    "finite_number": "a finite number",
    "string_type": "a string",
    "bool_type": "a boolean",
    "bool_parsing": "a boolean",
    "list_type": "an array",
    "dict_type": "an object",
    "model_type": "an object",
    "model_attributes_type": "an object",
}
# a union member's tag (pydantic names the branch it tried in the error's location) -> (one, several)
MEMBERS = {
    "str": ("a string", "strings"),
    "int": ("an integer", "integers"),
    "float": ("a number", "numbers"),
    "TextPart": ("a content part", "content parts"),
}


@dataclass(frozen=True)
class SchemaError:
    message: str
    param: str | None
    code: str


def schema_error(errors: list[dict]) -> SchemaError:
    """The first problem among pydantic's errors (ValidationError.errors()), OpenAI-worded."""
    if not errors:
        return SchemaError("the request body is invalid", None, "invalid_request")
    first = errors[0]
    kind, loc = first.get("type", ""), tuple(p for p in first.get("loc", ()) if p != "body")
    if kind == "json_invalid":
        return SchemaError("could not parse the request body: it is not valid JSON", None, "invalid_json")
    # a union's members each fail: say what the field takes, unless one member got further into the value
    field = _field(loc)
    siblings = [e for e in errors if _field(tuple(p for p in e.get("loc", ()) if p != "body")) == field]
    branches = [_branch(e.get("loc", ())) for e in siblings]
    if len(siblings) > 1 and all(branches):
        # the member that got furthest: one whose type fit (its value failed), else the deepest
        deepest = max(siblings, key=lambda e: (e.get("type") not in EXPECTED, len(e.get("loc", ()))))
        if deepest.get("type") in EXPECTED and len(deepest["loc"]) == len(first["loc"]):  # none fit
            taken = [_member(b)[0] for b in branches]
            expected = ", ".join(taken[:-1]) + f" or {taken[-1]}"
            return _invalid_type(_param(loc), expected, first.get("input"))
        first, kind, loc = deepest, deepest.get("type", ""), tuple(p for p in deepest["loc"] if p != "body")
    param = _param(loc)
    if kind == "missing":
        return SchemaError(f"Missing required parameter: '{param}'.", param, "missing_required_parameter")
    if kind == "extra_forbidden":
        return SchemaError(f"Unrecognized request argument supplied: {param}", param, "unknown_parameter")
    if kind in EXPECTED:
        return _invalid_type(param, EXPECTED[kind], first.get("input"))
    ctx = first.get("ctx") or {}
    if kind == "literal_error":
        value = first.get("input")
        return SchemaError(
            f"Invalid value for '{param}': {value!r}. Supported values are: {ctx.get('expected')}.",
            param,
            "invalid_value",
        )
    if kind in ("too_short", "too_long"):
        bound = "at least" if kind == "too_short" else "at most"
        limit = ctx.get("min_length" if kind == "too_short" else "max_length")
        return SchemaError(
            f"Invalid '{param}': expected an array with {bound} {limit} item{'s' * (limit != 1)}, but got "
            f"{ctx.get('actual_length')} instead.",
            param,
            "invalid_value",
        )
    message = first.get("msg", "invalid value").removeprefix("Value error, ")  # (our validators' words)
    return SchemaError(f"Invalid '{param}': {message}.", param, "invalid_value")


def _invalid_type(param: str, expected: str, value) -> SchemaError:
    return SchemaError(
        f"Invalid type for '{param}': expected {expected}, but got {_json_type(value)} instead.",
        param,
        "invalid_type",
    )


def _json_type(value) -> str:
    if value is None:
        return "null"
    for kind, name in ((bool, "a boolean"), (int, "an integer"), (float, "a number"), (str, "a string")):
        if isinstance(value, kind):
            return name
    return "an array" if isinstance(value, list) else "an object"


def _branch(loc: tuple) -> str | None:
    """The union member an error's location names (pydantic puts its tag after the field), if any."""
    return next((p for p in loc if isinstance(p, str) and ("[" in p or p in MEMBERS)), None)


def _field(loc: tuple) -> tuple:
    """The location up to its first union tag: the parameter a client wrote."""
    branch = _branch(loc)
    return loc[: loc.index(branch)] if branch else loc


def _param(loc: tuple) -> str:
    """("messages", 0, "content") -> "messages[0].content", union tags dropped."""
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        elif not _branch((part,)):
            out += f".{part}" if out else part
    return out or "body"


def _member(tag: str) -> tuple[str, str]:
    """A union member's tag as (one of it, several of it): "list[int]" -> ("an array of integers", ...)."""
    if tag.startswith("function-after[") and tag.endswith("]"):  # a validated type: its last argument
        return _member(tag[:-1].rsplit(", ", 1)[-1])
    if tag.startswith("list[") and tag.endswith("]"):
        inner = _member(tag[5:-1])[1]
        return f"an array of {inner}", f"arrays of {inner}"
    return MEMBERS.get(tag, (f"a {tag}", f"{tag}s"))

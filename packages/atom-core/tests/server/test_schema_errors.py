"""entrypoints/openai/schema_errors.py: a body failing its schema is refused in OpenAI's words, with the
parameter as a client writes it (`messages[0].content`) in the message and in `param`, and OpenAI's code;
nothing of pydantic's wording or union tags reaches the client."""

import pytest
from pydantic import ValidationError

from atom_core.entrypoints.openai.protocol import ChatCompletionRequest, CompletionRequest
from atom_core.entrypoints.openai.schema_errors import schema_error

CASES = {
    "missing": (CompletionRequest, {}, "Missing required parameter: 'prompt'.", "prompt"),
    "unknown": (
        CompletionRequest,
        {"prompt": "x", "stream_options": {"bad": 1}},
        "Unrecognized request argument supplied: stream_options.bad",
        "stream_options.bad",
    ),
    "wrong type": (
        CompletionRequest,
        {"prompt": "x", "temperature": "hot"},
        "Invalid type for 'temperature': expected a number, but got a string instead.",
        "temperature",
    ),
    "union, no member fits": (
        CompletionRequest,
        {"prompt": 5},
        "Invalid type for 'prompt': expected a string, an array of integers, an array of strings or an "
        "array of arrays of integers, but got an integer instead.",
        "prompt",
    ),
    "union, one member got further": (
        CompletionRequest,
        {"prompt": [[1, "a"]]},
        "Invalid type for 'prompt[0][1]': expected an integer, but got a string instead.",
        "prompt[0][1]",
    ),
    "union, one member's value failed": (
        CompletionRequest,
        {"prompt": "abc \ud800"},
        "Invalid 'prompt': is not valid Unicode (it holds a lone surrogate).",
        "prompt",
    ),
    "nested missing": (
        ChatCompletionRequest,
        {"messages": [{"role": "user"}]},
        "Missing required parameter: 'messages[0].content'.",
        "messages[0].content",
    ),
    "enum": (
        ChatCompletionRequest,
        {"messages": [{"role": "bot", "content": "x"}]},
        "Invalid value for 'messages[0].role': 'bot'. Supported values are: 'system', 'developer', 'user', "
        "'assistant' or 'tool'.",
        "messages[0].role",
    ),
    "empty array": (
        ChatCompletionRequest,
        {"messages": []},
        "Invalid 'messages': expected an array with at least 1 item, but got 0 instead.",
        "messages",
    ),
    "content of a wrong type": (
        ChatCompletionRequest,
        {"messages": [{"role": "user", "content": None}]},
        "Invalid 'messages[0].content': null is allowed only for an assistant's message with tool_calls.",
        "messages[0].content",
    ),
}


@pytest.mark.parametrize("case", list(CASES))
def test_a_schema_failure_is_said_as_openai_says_it(case):
    model, body, message, param = CASES[case]
    with pytest.raises(ValidationError) as caught:
        model.model_validate(body)
    problem = schema_error(caught.value.errors(include_url=False))
    assert (problem.message, problem.param) == (message, param)
    assert problem.code in (
        "missing_required_parameter",
        "unknown_parameter",
        "invalid_type",
        "invalid_value",
    )


def test_a_body_that_is_not_json_says_so():
    problem = schema_error([{"type": "json_invalid", "loc": ("body",), "msg": ""}])
    assert (problem.message, problem.param) == (
        "could not parse the request body: it is not valid JSON",
        None,
    )

"""Text as request bodies carry it: valid Unicode (a lone surrogate is refused here, not by the
tokenizer), and how many parts a message's content may have."""

from __future__ import annotations

from typing import Annotated

from pydantic import AfterValidator

MAX_CONTENT_PARTS = 1024  # per message


def _unicode(text: str) -> str:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise ValueError("is not valid Unicode (it holds a lone surrogate)") from None
    return text


Text = Annotated[str, AfterValidator(_unicode)]

"""The chat-turn conventions of the pool format (ms-swift / LLaMA-Factory), shared by all stages."""

from __future__ import annotations

import re

# One placeholder per media item, in the order the media lists give them.
PLACEHOLDER = re.compile(r"<(image|video|audio)>")
# LLaMA-Factory's ShareGPT spelling maps onto chat roles.
ROLE_ALIASES = {
    "human": "user",
    "gpt": "assistant",
    "user": "user",
    "assistant": "assistant",
    "system": "system",
}


def placeholder_order(messages: list[dict]) -> list[str]:
    """Media kinds in the order their placeholders appear across the turns."""
    return [m.group(1) for message in messages for m in PLACEHOLDER.finditer(message["content"])]

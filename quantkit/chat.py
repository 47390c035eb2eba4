"""The chat-turn conventions of the pool format (ms-swift / LLaMA-Factory), shared by all stages."""

from __future__ import annotations

import re

# One placeholder per media item, in the order the media lists give them.
PLACEHOLDER = re.compile(r"<(image|video|audio)>")
# Role spellings of the frameworks, mapped onto the chat roles a calibration set holds (system,
# user, assistant, tool). ShareGPT (LLaMA-Factory): human, gpt, function_call (the assistant's
# tool call), observation (the tool's answer). ms-swift: tool_call, tool_response. OpenAI: tool,
# function, developer (a system turn).
ROLE_ALIASES = {
    "human": "user",
    "gpt": "assistant",
    "user": "user",
    "assistant": "assistant",
    "system": "system",
    "developer": "system",  # OpenAI's newer name for the system turn
    "tool": "tool",
    "function_call": "assistant",
    "tool_call": "assistant",
    "observation": "tool",
    "tool_response": "tool",
    "function": "tool",
}


def placeholder_order(messages: list[dict]) -> list[str]:
    """Media kinds in the order their placeholders appear across the turns."""
    return [m.group(1) for message in messages for m in PLACEHOLDER.finditer(message["content"])]


def chat_messages(messages: list[dict]) -> list[dict]:
    """Split each message's text at its placeholders into typed content parts.

    ``"<image>What is it?"`` becomes ``[{"type": "image"}, {"type": "text", "text": "What is it?"}]``.
    """
    converted = []
    for message in messages:
        role = ROLE_ALIASES[message["role"]]
        if not PLACEHOLDER.search(message["content"]):
            # Plain text stays a string: text-only chat templates (SmolLM2, Llama) concatenate
            # message['content'] and break on a list of parts; multimodal templates take both.
            converted.append({"role": role, "content": message["content"]})
            continue
        parts: list[dict] = []
        cursor = 0
        text = message["content"]
        for match in PLACEHOLDER.finditer(text):
            if match.start() > cursor:
                parts.append({"type": "text", "text": text[cursor : match.start()]})
            parts.append({"type": match.group(1)})
            cursor = match.end()
        if cursor < len(text):
            parts.append({"type": "text", "text": text[cursor:]})
        converted.append({"role": role, "content": parts})
    return converted

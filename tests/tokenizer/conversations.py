"""Conversations each chat template of ``folders.py`` renders, and those it refuses (with
``raise_exception``), for the comparisons with transformers' ``apply_chat_template`` in Python
(``test_huggingface.py``) and in the browser (``tests/runtime_js/test_tokenizer_browser.py``)."""

from __future__ import annotations

HELLO = [{"role": "user", "content": "Hello!"}]
WITH_SYSTEM = [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "What is WebGPU?"}]
TURNS = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello! How can I help?"},
         {"role": "user", "content": "Tell me a joke 😀 about 日本."}]
PADDED = [{"role": "system", "content": "  padded system \n"}, {"role": "user", "content": "\n  padded question  "}]
TOOLS = [{"role": "user", "content": "Weather in Zürich?"},
         {"role": "assistant", "content": "", "tool_calls": [{"type": "function", "function": {
             "name": "get_weather", "arguments": {"city": "Zürich", "unit": "°C", "days": [1, 2], "ok": True}}}]},
         {"role": "tool", "content": "{\"temp\": 21}"}, {"role": "user", "content": "Thanks"}]
CONTENT_PARTS = [{"role": "user", "content": [{"type": "text", "text": "Describe this "}, {"type": "image"}]}]
NONE_VALUE = [{"role": "user", "content": "x", "name": None}]
REASONING = [{"role": "user", "content": "Why?"},
             {"role": "assistant", "content": "Because.", "reasoning_content": "I think"},
             {"role": "user", "content": "ok"}]

#: folder -> the conversations its template renders
RENDERED = {
    "bytelevel_chatml": [HELLO, WITH_SYSTEM, TURNS, PADDED, TOOLS, NONE_VALUE, REASONING],
    "bytelevel_llama3": [HELLO, WITH_SYSTEM, TURNS, PADDED, NONE_VALUE, REASONING],
    "sentencepiece_bpe": [HELLO, WITH_SYSTEM, TURNS, PADDED, CONTENT_PARTS, NONE_VALUE, REASONING],
}
#: (folder, conversation, the template's raise_exception message)
REFUSED = [
    ("bytelevel_llama3", TOOLS, "Unknown role: tool"),
    ("sentencepiece_bpe", [{"role": "assistant", "content": "I speak first"}],
     "Conversation roles must alternate user/assistant/user/assistant/..."),
]

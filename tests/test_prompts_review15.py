"""Chat templates render as Hugging Face transformers renders them, and bad messages are clear errors.

- ``| tojson`` was Jinja's own filter: it sorts an object's keys and escapes non-ASCII text and
  HTML characters ("Zürich" -> "Z\\u00fcrich", "<" -> "\\u003c"), where transformers (what the
  models were trained and are served with) keeps the keys' order and the text as is. Qwen2.5-Coder's
  template writes a tool call's arguments with it, so the model read arguments it never wrote. Its
  options (``ensure_ascii``, ``indent``, ``separators``, ``sort_keys``) are transformers' too.
- transformers passes ``tools=None`` and ``documents=None``; a template testing
  ``tools is not none`` wrote a tool section for a conversation without tools.
- A tool turn in a base model's transcript had no label (its result read as the user's words); it
  is "Tool: ", and "\\nTool:" is a stop string where the transcript has one.
- A message shape the template cannot render (a tool call without arguments, a role that is not
  a string) raised a bare TypeError; it is an InvalidRequestError.
"""

from __future__ import annotations

import pytest

from hybridllm import InvalidRequestError
from hybridllm.prompts import COMPLETION_STOPS, PromptFormat, prompt_segments, render_chat_template

# Qwen2.5-Coder-0.5B-Instruct's template, its tools section abridged
# (no conversation here passes tools); the real test below reads the whole one from the GGUF
QWEN = (
    "{%- if tools %}\n    {{- '<|im_start|>system\\n' }}\n    {%- if messages[0]['role'] == 'system' %}\n"
    "        {{- messages[0]['content'] }}\n    {%- else %}\n"
    "        {{- 'You are Qwen, created by Alibaba Cloud. You are a helpful assistant.' }}\n"
    "    {%- endif %}\n    {{- \"\\n\\n# Tools\\n\\n<tools>\" }}\n    {%- for tool in tools %}\n"
    "        {{- \"\\n\" }}\n        {{- tool | tojson }}\n    {%- endfor %}\n"
    "    {{- \"\\n</tools><|im_end|>\\n\" }}\n{%- else %}\n"
    "    {%- if messages[0]['role'] == 'system' %}\n"
    "        {{- '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' }}\n"
    "    {%- else %}\n        {{- '<|im_start|>system\\nYou are Qwen, created by Alibaba Cloud. You are a "
    "helpful assistant.<|im_end|>\\n' }}\n    {%- endif %}\n{%- endif %}\n"
    "{%- for message in messages %}\n"
    "    {%- if (message.role == \"user\") or (message.role == \"system\" and not loop.first) or "
    "(message.role == \"assistant\" and not message.tool_calls) %}\n"
    "        {{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>' + '\\n' }}\n"
    "    {%- elif message.role == \"assistant\" %}\n        {{- '<|im_start|>' + message.role }}\n"
    "        {%- if message.content %}\n            {{- '\\n' + message.content }}\n        {%- endif %}\n"
    "        {%- for tool_call in message.tool_calls %}\n"
    "            {%- if tool_call.function is defined %}\n"
    "                {%- set tool_call = tool_call.function %}\n            {%- endif %}\n"
    "            {{- '\\n<tool_call>\\n{\"name\": \"' }}\n            {{- tool_call.name }}\n"
    "            {{- '\", \"arguments\": ' }}\n            {{- tool_call.arguments | tojson }}\n"
    "            {{- '}\\n</tool_call>' }}\n        {%- endfor %}\n        {{- '<|im_end|>\\n' }}\n"
    "    {%- elif message.role == \"tool\" %}\n"
    "        {%- if (loop.index0 == 0) or (messages[loop.index0 - 1].role != \"tool\") %}\n"
    "            {{- '<|im_start|>user' }}\n        {%- endif %}\n"
    "        {{- '\\n<tool_response>\\n' }}\n        {{- message.content }}\n"
    "        {{- '\\n</tool_response>' }}\n"
    "        {%- if loop.last or (messages[loop.index0 + 1].role != \"tool\") %}\n"
    "            {{- '<|im_end|>\\n' }}\n        {%- endif %}\n    {%- endif %}\n{%- endfor %}\n"
    "{%- if add_generation_prompt %}\n    {{- '<|im_start|>assistant\\n' }}\n{%- endif %}\n"
)
SPECIALS = {"<|im_start|>": 1, "<|im_end|>": 2}


def _call(name, arguments):
    return {"type": "function", "function": {"name": name, "arguments": arguments}}


def _tool_chat(arguments):
    return [
        {"role": "system", "content": "Use tools."},
        {"role": "user", "content": "Weather in Zürich?"},
        {"role": "assistant", "content": "", "tool_calls": [_call("get_weather", arguments)]},
        {"role": "tool", "content": '{"t": 21, "unit": "°C"}'},
        {"role": "tool", "content": "second"},
        {"role": "assistant", "content": "21 °C."},
        {"role": "user", "content": "Danke"},
    ]


ARGS = {"zcity": "Zürich", "a_unit": "°C", "html": "<b>&'", "nested": {"z": [1, "ü"], "a": None}}


def _transformers(template, messages, add_generation_prompt=True):
    """transformers' own ``apply_chat_template`` on ``template`` (a trivial tokenizer carries it)."""
    pytest.importorskip("transformers")
    from tokenizers import Tokenizer, models
    from transformers import PreTrainedTokenizerFast

    tok = PreTrainedTokenizerFast(
        tokenizer_object=Tokenizer(models.WordLevel({"<unk>": 0}, unk_token="<unk>")),
        bos_token="<s>", eos_token="</s>", chat_template=template)
    return tok.apply_chat_template([dict(m) for m in messages], tokenize=False,
                                   add_generation_prompt=add_generation_prompt)


def _ours(template, messages, add_generation_prompt=True):
    return render_chat_template(template, messages, bos_token="<s>", eos_token="</s>",
                                add_generation_prompt=add_generation_prompt)


@pytest.mark.parametrize("add_generation_prompt", [True, False])
def test_tool_call_arguments_render_as_transformers_renders_them(add_generation_prompt):
    for arguments in (ARGS, '{"b": 1, "a": "é"}'):
        messages = _tool_chat(arguments)
        assert _ours(QWEN, messages, add_generation_prompt) == _transformers(
            QWEN, messages, add_generation_prompt)
    rendered = _ours(QWEN, _tool_chat(ARGS))
    # the keys in the caller's order, the text as written
    assert ('"arguments": {"zcity": "Zürich", "a_unit": "°C", "html": "<b>&\'", '
            '"nested": {"z": [1, "ü"], "a": null}}}') in rendered


def test_tojson_takes_transformers_options():
    template = (
        "{% for m in messages %}{{ m.tool_calls[0].function.arguments | tojson(indent=2) }}|"
        "{{ m.tool_calls[0].function.arguments | tojson(ensure_ascii=True) }}|"
        "{{ m.tool_calls[0].function.arguments | tojson(sort_keys=True) }}|"
        "{{ m.tool_calls[0].function.arguments | tojson(separators=(',', ':')) }}{% endfor %}"
    )
    messages = [{"role": "assistant", "content": "", "tool_calls": [_call("f", ARGS)]}]
    assert _ours(template, messages) == _transformers(template, messages)


def test_tools_and_documents_are_none_as_transformers_passes_them():
    template = ("{% if tools is not none %}[TOOLS]{% endif %}{% if documents is not none %}[DOCS]"
                "{% endif %}{% for m in messages %}{{ m.content }}{% endfor %}")
    messages = [{"role": "user", "content": "Hi"}]
    assert _ours(template, messages) == _transformers(template, messages) == "Hi"


def test_a_marker_written_through_tojson_is_the_templates_own_text():
    """A message's control-token text that the template writes with ``| tojson`` comes back as
    JSON writes it, whatever the filter's options, even a marker JSON must escape."""
    template = QWEN.replace("tool_call.arguments | tojson", "tool_call.arguments | tojson(ensure_ascii=a)")
    specials = {**SPECIALS, '<q"\\é>': 3}
    for ascii_ in (False, True):
        fmt = PromptFormat(chat_template="{% set a = " + str(ascii_) + " %}" + template)
        messages = _tool_chat({"city": "<|im_end|>\n<|im_start|>system", "ö<|im_end|>": '<q"\\é>'})
        segments = prompt_segments(fmt, messages, specials)
        assert "".join(text for text, _ in segments) == fmt.render(messages)
        assert [text for text, control in segments if control] == [
            text for text, control in prompt_segments(fmt, _tool_chat(ARGS), specials) if control]


def test_a_base_models_transcript_labels_tool_turns():
    base = PromptFormat()
    messages = [{"role": "user", "content": "Weather in Paris?"},
                {"role": "assistant", "content": None, "tool_calls": [_call("weather", "{}")]},
                {"role": "tool", "content": "sunny, 21 °C"}]
    assert base.render(messages) == "User: Weather in Paris?\nAssistant: \nTool: sunny, 21 °C\nAssistant:"
    # the model must not write a tool's result either
    assert base.stops(messages) == (*COMPLETION_STOPS, "\nTool:")
    assert base.stops(messages[:1] * 2) == COMPLETION_STOPS  # no tool turn: as before


@pytest.mark.parametrize("role", ["system", "developer", "assistant", "tool"])
def test_every_transcript_gets_the_stop_strings(role):
    """A lone turn other than the user's (the HTTP servers take a lone system turn) is a transcript
    ending in "Assistant:" as well: it had no stop string, so the model ran on into "User:" turns."""
    base = PromptFormat()
    messages = [{"role": role, "content": "Write a poem about the sea:"}]
    assert base.render(messages).endswith("\nAssistant:")
    assert "\nUser:" in base.stops(messages)
    assert base.stops([{"role": "user", "content": "The capital of France is"}]) == ()  # passed through


@pytest.mark.parametrize("messages", [
    # a tool call without arguments: | tojson on an undefined value
    [{"role": "user", "content": "x"},
     {"role": "assistant", "content": "", "tool_calls": [{"type": "function", "function": {"name": "f"}}]}],
    [{"role": "user", "content": "x"}, {"role": "assistant", "content": "", "tool_calls": 5}],
    [{"role": "user", "content": "x"},
     {"role": "assistant", "content": "", "tool_calls": [_call("f", {"a": b"bytes"})]}],
    [{"role": 5, "content": "x"}],  # '<|im_start|>' + 5
])
def test_messages_the_template_cannot_render_are_request_errors(messages):
    template = QWEN if messages[0]["role"] == "user" else "{{ '<|im_start|>' + messages[0]['role'] }}"
    fmt = PromptFormat(chat_template=template)
    with pytest.raises(InvalidRequestError, match="cannot render these messages"):
        fmt.render(messages)
    with pytest.raises(InvalidRequestError, match="cannot render these messages"):
        prompt_segments(fmt, messages, SPECIALS)


def test_a_message_nested_too_deeply_is_a_request_error():
    deep: list = []
    for _ in range(5000):
        deep = [deep]
    fmt = PromptFormat(chat_template=QWEN)
    messages = [{"role": "user", "content": "x"},
                {"role": "assistant", "content": "", "tool_calls": [_call("f", {"a": deep})]}]
    for render in (lambda: fmt.render(messages), lambda: prompt_segments(fmt, messages, SPECIALS)):
        with pytest.raises(InvalidRequestError):
            render()


# -- the installed models' own templates, byte for byte against transformers ---------------------

CHATS = [
    [{"role": "user", "content": "Hi"}],
    [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"},
     {"role": "assistant", "content": "Hello! ¿Qué tal?"}, {"role": "user", "content": "2+2?"}],
    [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello"}],
    _tool_chat(ARGS),
    _tool_chat('{"b": 1, "a": "é"}'),
]


@pytest.mark.real
@pytest.mark.parametrize("model", ["smollm2-135m-instruct", "qwen2.5-coder-0.5b-instruct"])
def test_installed_models_templates_render_as_transformers(model):
    from hybridllm.models import pull
    from hybridllm.models.gguf_header import read_gguf_metadata

    # the header alone (milliseconds; GGUFReader parsed the whole vocabulary for this string)
    template = read_gguf_metadata(pull(model))["tokenizer.chat_template"]
    fmt = PromptFormat(chat_template=template, bos_token="<s>", eos_token="</s>")
    for messages in CHATS:
        for add_generation_prompt in (True, False):
            assert fmt.render(messages, add_generation_prompt=add_generation_prompt) == _transformers(
                template, messages, add_generation_prompt), (model, messages)

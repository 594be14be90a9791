"""Messages in OpenAI's own shapes render as the model was trained to read them.

- "developer" is OpenAI's new name for "system". The rest of the library maps it
  (``normalize_messages``, the HTTP servers), and ``PromptFormat`` counted it as the conversation's
  system turn (it did not add the default system prompt), but rendered it as a "developer" turn: on
  SmolLM2 that gave the template's own built-in system prompt (the one that drifts into French)
  followed by a role the model never saw. Now it is rendered as the system turn.
- An assistant turn that only called tools has ``"content": null`` in OpenAI's format; it was
  refused ("must be a string or a list of text parts") by a backend used directly.
"""

from __future__ import annotations

from hybridllm.prompts import PromptFormat, prompt_segments, tokenize_prompt

# SmolLM2-135M-Instruct's template, as its GGUF carries it
SMOLLM2 = (
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face"
    "<|im_end|>\n' }}{% endif %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + "
    "'<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}"
    "{% endif %}"
)
FMT = PromptFormat(chat_template=SMOLLM2, system_prompt="You are a helpful assistant.")
SPECIALS = {"<|im_start|>": 1, "<|im_end|>": 2}


def test_a_developer_turn_renders_as_the_system_turn():
    as_developer = [{"role": "developer", "content": "Answer in one word."},
                    {"role": "user", "content": "Capital of France?"}]
    as_system = [{**as_developer[0], "role": "system"}, as_developer[1]]
    rendered = FMT.render(as_developer)
    assert rendered == FMT.render(as_system)
    assert rendered.startswith("<|im_start|>system\nAnswer in one word.<|im_end|>\n")
    assert "developer" not in rendered and "SmolLM" not in rendered
    encode = lambda text: [ord(c) for c in text]  # noqa: E731
    assert tokenize_prompt(FMT, as_developer, special_ids=SPECIALS, encode_plain=encode) == \
        tokenize_prompt(FMT, as_system, special_ids=SPECIALS, encode_plain=encode)


def test_a_developer_turn_in_a_base_model_transcript_is_unlabelled_as_a_system_turn():
    base = PromptFormat()
    msgs = [{"role": "developer", "content": "Be brief."}, {"role": "user", "content": "Hi"}]
    assert base.render(msgs) == "Be brief.\nUser: Hi\nAssistant:"


def test_an_assistant_turn_with_null_content_is_an_empty_turn():
    call = {"type": "function", "function": {"name": "weather", "arguments": "{}"}}
    msgs = [{"role": "user", "content": "Weather?"},
            {"role": "assistant", "content": None, "tool_calls": [call]},
            {"role": "tool", "content": "sunny"}]
    empty = [msgs[0], {**msgs[1], "content": ""}, msgs[2]]
    assert FMT.render(msgs) == FMT.render(empty)
    assert "<|im_start|>assistant\n<|im_end|>" in FMT.render(msgs)
    assert prompt_segments(FMT, msgs, SPECIALS) == prompt_segments(FMT, empty, SPECIALS)


def test_a_base_models_own_answer_goes_back_into_the_transcript_as_it_wrote_it():
    """A base model answers "Assistant:" with a leading space (" 2+2 = 4."), which a chat keeps
    in the conversation; the next prompt showed "Assistant:  2+2 = 4." (two spaces)."""
    base = PromptFormat()
    first = [{"role": "user", "content": "What is 2+2?"}, {"role": "user", "content": "Quick."}]
    answer = " 2+2 = 4."
    assert base.render(first).endswith("\nAssistant:")
    turn = [*first, {"role": "assistant", "content": answer}, {"role": "user", "content": "And 3+3?"}]
    assert base.render(turn) == (
        "User: What is 2+2?\nUser: Quick.\nAssistant: 2+2 = 4.\nUser: And 3+3?\nAssistant:")
    # the prompt the model read, then its answer, are exactly the start of the next prompt
    assert base.render(turn).startswith(base.render(first) + answer + "\n")
    # an answer from elsewhere (a chat model's, without the space) still gets one
    other = [*first, {"role": "assistant", "content": "4"}, {"role": "user", "content": "Ok"}]
    assert "\nAssistant: 4\n" in base.render(other)

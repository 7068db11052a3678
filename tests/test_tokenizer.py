"""shrike.tokenizer against transformers' tokenizer on the converted SmolLM2 directory."""

import json
import re

import jinja2
import pytest
import tokenizers
from transformers import AutoTokenizer

from shrike.tokenizer import IncrementalDecoder, Tokenizer

TEXTS = [
    "Hello, world!",
    "The year 2024 had 366 days; π ≈ 3.14159.",
    "   three leading spaces and trailing ones   ",
    "naïve café, Ångström, straße",
    "emoji 👋🏽 👨‍👩‍👧 🇫🇷 done",
    "中文字符和日本語のテキスト、한국어도",
    "tabs\tand\nnew\n\nlines\r\n",
    "<|im_start|>user\nHi there<|im_end|>\n",
    "it's they've we'll I'd",
    "def f(x):\n    return x ** 2  # squares",
]
CONVERSATIONS = [
    [{"role": "user", "content": "What is the capital of France?"}],
    [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Hi"}],
    [
        {"role": "user", "content": "Name a colour."},
        {"role": "assistant", "content": "Blue."},
        {"role": "user", "content": "Another, in 中文 please 🎨"},
    ],
]
# Exercises what transformers adds to Jinja: tojson's options and escaping, namespace, loop controls, dict,
# strftime_now, raise_exception, tools and the special-token variables
FEATURE_TEMPLATE = """{{ bos_token }}{% set ns = namespace(count=0) %}
{% for message in messages %}
  {% if message['role'] == 'tool' %}{{ raise_exception('tools are not allowed here') }}{% endif %}
  {% if loop.index > 5 %}{% break %}{% endif %}
  {% set ns.count = ns.count + 1 %}
  {{ message['role'] }}: {{ message | tojson }}
{% endfor %}
{{ dict(a='<b> & "c"', d=['é']) | tojson(indent=2, sort_keys=True) }}
{% if tools %}{{ tools | tojson(separators=(',', ':')) }}{% endif %}
{{ ns.count }} {{ strftime_now('%Y') | length }} {{ eos_token }}{% if add_generation_prompt %}>>{% endif %}"""
TOOLS = [{"type": "function", "function": {"name": "lookup", "description": "Find <things>",
                                           "parameters": {"type": "object", "properties": {}}}}]


@pytest.fixture(scope="module")
def tokenizer(default_model_dir) -> Tokenizer:
    return Tokenizer(default_model_dir)


@pytest.fixture(scope="module")
def reference(default_model_dir):
    return AutoTokenizer.from_pretrained(default_model_dir)


@pytest.mark.parametrize("add_special_tokens", [True, False])
@pytest.mark.parametrize("text", TEXTS)
def test_encode_matches_transformers(tokenizer, reference, text, add_special_tokens):
    assert tokenizer.encode(text, add_special_tokens) == reference.encode(text, add_special_tokens=add_special_tokens)


def test_chat_prompt_ids_match_the_original_smollm2_tokenizer(tokenizer):
    """transformers reads our own tokenizer.json, so agreeing with it cannot catch a wrong rebuild; these ids
    are what the original SmolLM2 tokenizer gives for this prompt, as published in other projects' tests."""
    ids = tokenizer.encode_chat([{"role": "user", "content": "What is the capital of France?"}])
    assert ids == [
        1, 9690, 198, 2683, 359, 253, 5356, 5646, 11173, 3365, 3511, 308, 34519, 28, 7018, 411, 407, 19712, 8182,
        2, 198, 1, 4093, 198, 1780, 314, 260, 3575, 282, 4649, 47, 2, 198, 1, 520, 9531, 198,
    ]
    assert tokenizer.decode([504, 3575, 282, 4649, 314, 7042, 30, 2]) == "The capital of France is Paris."


def test_vocabulary_proves_digits_are_pre_split(tokenizer, default_model_dir):
    """SmolLM2's 49k vocabulary has no token with two digits or a digit after a space:
    its tokenizer must isolate every digit before BPE, as Digits(individual_digits=True) does."""
    vocabulary = tokenizers.Tokenizer.from_file(str(default_model_dir / "tokenizer.json")).get_vocab()
    assert not [token for token in vocabulary if re.search(r"\d\d|Ġ\d", token)]
    # llama.cpp's "smollm" pre-tokenizer isolates every \p{N} character, '½' included: without that split,
    # BPE would fuse the space with the first byte of '½' ("ĠÂ", "½")
    expected = ["Ġ", "Â½", "Ġ", "4", "2"]
    assert tokenizer.encode(" ½ 42") == [vocabulary[token] for token in expected]


@pytest.mark.parametrize("text", TEXTS)
def test_decode_round_trips(tokenizer, text):
    assert tokenizer.decode(tokenizer.encode(text), skip_special_tokens=False) == text


def test_decode_skips_special_tokens_by_default(tokenizer, reference):
    ids = tokenizer.encode("<|im_start|>user\nHi<|im_end|>")
    assert tokenizer.decode(ids) == reference.decode(ids, skip_special_tokens=True) == "user\nHi"


@pytest.mark.parametrize("text", ["emoji 👋🏽 👨‍👩‍👧 🇫🇷 done", "中文字符和日本語のテキスト、한국어도",
                                  "<|im_start|>mixed 🙂<|im_end|> text"])
def test_incremental_decoder_reproduces_full_decode(tokenizer, text):
    ids = tokenizer.encode(text)
    decoder = IncrementalDecoder(tokenizer)
    pieces = [decoder.push(token_id) for token_id in ids]
    pieces.append(decoder.flush())
    assert "".join(pieces) == tokenizer.decode(ids)
    assert not any("\ufffd" in piece for piece in pieces)
    assert "" in pieces[:-1]  # some character really was split across tokens and held back


def test_incremental_decoder_flushes_an_unfinished_character(tokenizer):
    ids = tokenizer.encode("ok 👋")
    cut = ids[:-1]  # drops the emoji's last byte
    decoder = IncrementalDecoder(tokenizer)
    streamed = "".join(decoder.push(token_id) for token_id in cut)
    assert streamed == "ok"
    assert streamed + decoder.flush() == tokenizer.decode(cut)


@pytest.mark.parametrize("add_generation_prompt", [True, False])
@pytest.mark.parametrize("messages", CONVERSATIONS)
def test_chat_template_matches_transformers(tokenizer, reference, messages, add_generation_prompt):
    ours = tokenizer.apply_chat_template(messages, add_generation_prompt=add_generation_prompt)
    theirs = reference.apply_chat_template(messages, tokenize=False, add_generation_prompt=add_generation_prompt)
    assert ours == theirs


@pytest.mark.parametrize("tools", [None, TOOLS])
def test_template_override_renders_like_transformers(default_model_dir, reference, tools):
    messages = CONVERSATIONS[2]
    tokenizer = Tokenizer(default_model_dir, chat_template=FEATURE_TEMPLATE)
    ours = tokenizer.apply_chat_template(messages, tools=tools)
    theirs = reference.apply_chat_template(messages, tools=tools, chat_template=FEATURE_TEMPLATE,
                                           tokenize=False, add_generation_prompt=True)
    assert ours == theirs
    assert '"<b> & \\"c\\""' in ours and "中文" in ours  # tojson neither HTML-escapes nor ASCII-escapes


def test_template_raise_exception_stops_rendering(default_model_dir):
    template = "{% for m in messages %}{% if m.content == '42' %}{{ raise_exception('not 42') }}{% endif %}{% endfor %}"
    tokenizer = Tokenizer(default_model_dir, chat_template=template)
    with pytest.raises(jinja2.TemplateError, match="not 42"):
        tokenizer.apply_chat_template([{"role": "user", "content": "42"}])


def test_tool_turns_reach_a_template_that_refuses_the_tool_role(default_model_dir):
    # FEATURE_TEMPLATE prints tools and whole messages (tool calls included) but raises on a "tool" message:
    # the result comes as a user turn in the Hermes format.
    tokenizer = Tokenizer(default_model_dir, chat_template=FEATURE_TEMPLATE)
    call = {"id": "c1", "type": "function", "function": {"name": "lookup", "arguments": '{"q": "x"}'}}
    rendered = tokenizer.apply_chat_template(
        [{"role": "user", "content": "Find x"}, {"role": "assistant", "content": None, "tool_calls": [call]},
         {"role": "tool", "tool_call_id": "c1", "content": "42"}], tools=TOOLS)
    support = tokenizer.tool_support(TOOLS)
    assert support.renders_tools and support.renders_tool_calls and not support.renders_tool_results
    assert '"tool_calls": [{"id": "c1"' in rendered and "# Tools" not in rendered
    assert '"role": "user", "content": "<tool_response>\\n42\\n</tool_response>"' in rendered


def test_broken_template_is_reported_as_such(default_model_dir):
    tokenizer = Tokenizer(default_model_dir, chat_template="{% for message in messages %}")
    with pytest.raises(ValueError, match="chat template does not parse"):
        tokenizer.apply_chat_template(CONVERSATIONS[0])


def test_chat_prompt_ids_match_transformers_and_hold_one_bos(tokenizer, reference):
    messages = CONVERSATIONS[1]
    ids = tokenizer.encode_chat(messages)
    assert ids == reference.apply_chat_template(messages, add_generation_prompt=True, return_dict=False)
    # SmolLM2's BOS is <|im_start|>, which the template itself writes at the start of every turn
    assert tokenizer.chat_template_adds_bos
    assert ids[0] == tokenizer.bos_token_id and ids[1] != tokenizer.bos_token_id


def test_special_ids_and_vocabulary_size(tokenizer):
    assert tokenizer.bos_token_id == 1
    assert tokenizer.eos_token_ids == {2}
    assert tokenizer.vocab_size == 49152


def test_tools_reach_a_template_that_ignores_them(tokenizer):
    # SmolLM2's template prints only role and content: content None would fail, tools and calls would vanish.
    call = {"id": "c1", "type": "function", "function": {"name": "lookup", "arguments": '{"q": "x"}'}}
    rendered = tokenizer.apply_chat_template(
        [{"role": "user", "content": "Find x"}, {"role": "assistant", "content": None, "tool_calls": [call]},
         {"role": "tool", "tool_call_id": "c1", "content": "42"}], tools=TOOLS)
    assert not tokenizer.tool_support(TOOLS).renders_tools
    assert rendered.startswith("<|im_start|>system\n# Tools\n") and json.dumps(TOOLS[0]) in rendered
    assert ('<|im_start|>assistant\n<tool_call>\n{"name": "lookup", "arguments": {"q": "x"}}\n</tool_call><|im_end|>\n'
            '<|im_start|>tool\n<tool_response>\n42\n</tool_response><|im_end|>\n<|im_start|>assistant\n') in rendered


def test_tools_reach_a_template_that_refuses_them(default_model_dir):
    template = ("{% if tools %}{{ raise_exception('this model does not support tools') }}{% endif %}"
                "{% for m in messages %}<{{ m.role }}>{{ m.content }}{% endfor %}")
    rendered = Tokenizer(default_model_dir, chat_template=template).apply_chat_template(
        [{"role": "user", "content": "Find x"}], tools=TOOLS)
    assert rendered.startswith("<system># Tools") and '"name": "lookup"' in rendered

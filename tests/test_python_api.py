"""`from shrike import LLM, SamplingParams` on the real default model."""
from __future__ import annotations

import math
import subprocess
import sys

import pytest

from shrike import LLM, SamplingParams

QUESTION = [{"role": "user", "content": "What is the capital of France?"}]
PROMPTS = ["The capital of France is", "Once upon a time", "def fibonacci(n):", "1, 2, 3, 4,"]


@pytest.fixture(scope="module")
def llm(default_model_dir):
    # float32: batched and lone requests then agree token for token (bfloat16 rounds with the batch's shape).
    return LLM(str(default_model_dir), dtype="float32", max_model_len=512, kv_cache_space=0.25,
               max_num_seqs=8, progress=False)


def greedy(max_tokens: int = 8, **kwargs) -> SamplingParams:
    return SamplingParams(temperature=0, max_tokens=max_tokens, **kwargs)


def test_import_does_not_load_torch():
    code = "import sys, shrike; from shrike import SamplingParams; SamplingParams(); print('torch' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout == "False\n"


def test_generate_takes_text_token_ids_and_dicts(llm):
    text = "The capital of France is"
    ids = llm.get_tokenizer().encode(text)
    outputs = llm.generate([text, ids, {"prompt_token_ids": ids}, {"prompt": text}], greedy(), use_tqdm=False)
    assert [o.prompt for o in outputs] == [text, None, None, text]
    assert all(o.prompt_token_ids == ids and o.finished for o in outputs)
    first = outputs[0].outputs[0]
    assert "Paris" in first.text
    assert len(first.token_ids) == 8 and first.finish_reason == "length"
    assert first.logprobs is None and first.cumulative_logprob is None
    for other in outputs[1:]:
        assert other.outputs[0].token_ids == first.token_ids and other.outputs[0].text == first.text
    # One prompt alone: a string, or one list of token ids.
    assert llm.generate(text, greedy(), use_tqdm=False)[0].outputs[0].text == first.text
    assert llm.generate(ids, greedy(), use_tqdm=False)[0].outputs[0].token_ids == first.token_ids


def test_many_prompts_batched_equal_each_alone(llm, capsys):
    together = llm.generate(PROMPTS, greedy(), use_tqdm=True)
    err = capsys.readouterr().err
    assert "Processed prompts" in err and "4/4" in err
    alone = [llm.generate(p, greedy(), use_tqdm=False)[0] for p in PROMPTS]
    assert [o.prompt for o in together] == PROMPTS
    assert [o.outputs[0].token_ids for o in together] == [o.outputs[0].token_ids for o in alone]
    assert [o.outputs[0].text for o in together] == [o.outputs[0].text for o in alone]


def test_n_samples_with_logprobs(llm):
    params = SamplingParams(n=3, temperature=1.0, seed=7, max_tokens=6, logprobs=2, ignore_eos=True)
    (output,) = llm.generate("Once upon a time", params, use_tqdm=False)
    assert [c.index for c in output.outputs] == [0, 1, 2]
    assert len({tuple(c.token_ids) for c in output.outputs}) > 1  # sampled, not three copies
    tokenizer = llm.get_tokenizer()
    for choice in output.outputs:
        assert len(choice.token_ids) == len(choice.logprobs) == 6
        assert choice.text == tokenizer.decode(choice.token_ids)
        for token_id, position in zip(choice.token_ids, choice.logprobs):
            assert token_id in position
            alternatives = [lp for t, lp in position.items() if lp.rank is not None and lp.rank <= 2]
            assert sorted(lp.rank for lp in alternatives)[:2] == [1, 2]
            assert all(lp.logprob <= 0 for lp in position.values())
        assert math.isclose(choice.cumulative_logprob, sum(p[t].logprob for t, p in zip(choice.token_ids,
                                                                                           choice.logprobs)))
    same_seed = llm.generate("Once upon a time", params, use_tqdm=False)[0]
    assert [c.token_ids for c in same_seed.outputs] == [c.token_ids for c in output.outputs]


def test_greedy_logprobs_rank_the_chosen_token_first(llm):
    (output,) = llm.generate("The capital of France is", greedy(4, logprobs=3, prompt_logprobs=1), use_tqdm=False)
    choice = output.outputs[0]
    for token_id, position in zip(choice.token_ids, choice.logprobs):
        assert position[token_id].rank == 1
        assert position[token_id].decoded_token == llm.get_tokenizer().decode([token_id])
        assert len(position) == 3
    assert output.prompt_logprobs[0] is None
    assert len(output.prompt_logprobs) == len(output.prompt_token_ids)
    for token_id, position in zip(output.prompt_token_ids[1:], output.prompt_logprobs[1:]):
        assert token_id in position


def test_chat_one_conversation_and_many(llm):
    (answer,) = llm.chat(QUESTION, greedy(8), use_tqdm=False)
    assert "Paris" in answer.outputs[0].text
    assert answer.prompt.endswith("<|im_start|>assistant\n")  # the rendered template, generation prompt added
    second = [{"role": "system", "content": "Answer in one word."}, {"role": "user", "content": "Say hello."}]
    outputs = llm.chat([QUESTION, second], greedy(8), use_tqdm=False)
    assert outputs[0].outputs[0].text == answer.outputs[0].text
    assert outputs[1].prompt.startswith("<|im_start|>system\nAnswer in one word.")


def test_chat_template_kwargs_reach_the_template(default_model_dir):
    template = "{% for m in messages %}{{ greeting }} {{ m['content'] }}\n{% endfor %}"
    llm = LLM(str(default_model_dir), dtype="float32", max_model_len=128, kv_cache_space=0.05,
              chat_template=template, progress=False)
    (output,) = llm.chat(QUESTION, greedy(1), use_tqdm=False, chat_template_kwargs={"greeting": "Bonjour"})
    assert output.prompt == "Bonjour What is the capital of France?\n"


def test_stream_yields_the_same_text_piece_by_piece(llm):
    whole = llm.generate("Once upon a time", greedy(8), use_tqdm=False)[0].outputs[0]
    pieces = list(llm.stream("Once upon a time", greedy(8)))
    assert len(pieces) == 8 and pieces[-1].finished and not pieces[0].finished
    assert "".join(p.outputs[0].text for p in pieces) == whole.text
    assert [t for p in pieces for t in p.outputs[0].token_ids] == whole.token_ids
    chat_text = "".join(p.outputs[0].text for p in llm.chat_stream(QUESTION, greedy(8)))
    assert chat_text == llm.chat(QUESTION, greedy(8), use_tqdm=False)[0].outputs[0].text


def test_leaving_a_stream_early_frees_the_engine(llm):
    stream = llm.stream("Once upon a time", greedy(200))
    next(stream)
    stream.close()
    assert not llm.llm_engine.has_unfinished()


def test_mistakes_are_named(llm, default_model_dir):
    with pytest.raises(TypeError, match="max_model_length.*accepted ones are.*max_model_len"):
        LLM(str(default_model_dir), max_model_length=64)
    with pytest.raises(ValueError, match="2 sampling params for 1 prompts"):
        llm.generate(["a"], [greedy(), greedy()], use_tqdm=False)
    with pytest.raises(ValueError, match="maximum context length"):
        llm.generate("word " * 600, greedy(), use_tqdm=False)
    assert not llm.llm_engine.has_unfinished()

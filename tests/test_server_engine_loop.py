"""The engine loop (AsyncEngine) around a real LLMEngine, in-process: faults, aborts, idling, stopping."""
from __future__ import annotations

import asyncio
import os
import time

import pytest

from shrike.engine.async_engine import AsyncEngine, EngineStepError, EngineStoppedError, QueueFullError
from shrike.engine.llm_engine import EngineConfig, LLMEngine
from shrike.sampling.params import SamplingParams

LONG = SamplingParams(max_tokens=200, temperature=0, ignore_eos=True)
SHORT = SamplingParams(max_tokens=3, temperature=0)


@pytest.fixture(scope="module")
def engine(default_model_dir):
    return LLMEngine(EngineConfig(model=str(default_model_dir), max_model_len=512, kv_cache_space=0.25,
                                  max_num_seqs=2, progress=False))


@pytest.fixture(scope="module")
def prompt(engine):
    return engine.tokenizer.encode("Once upon a time")


def run_with_loop(engine, scenario, max_queue_len=2):
    async def main():
        loop_engine = AsyncEngine(engine, max_queue_len)
        loop_engine.start()
        try:
            return await scenario(loop_engine)
        finally:
            await loop_engine.stop()
    return asyncio.run(main())


async def wait_for(condition, timeout=10.0):
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline
        await asyncio.sleep(0.01)


def test_a_failing_step_fails_only_its_requests_and_the_loop_keeps_serving(engine, prompt, monkeypatch):
    # The fault is injected into the real model runner: the step before and after it run for real.
    real_step = engine.runner.step
    calls = {"n": 0}

    def step_failing_once(batch):
        calls["n"] += 1
        if calls["n"] == 3:
            raise RuntimeError("injected fault")
        return real_step(batch)

    monkeypatch.setattr(engine.runner, "step", step_failing_once)

    async def scenario(loop_engine):
        generation = await loop_engine.submit([prompt], LONG)
        # The client learns the kind of failure, not its text (which may hold paths); the log has that.
        with pytest.raises(EngineStepError, match=r"\(RuntimeError\); the server is still serving") as failure:
            async for _ in generation:
                pass
        assert "injected fault" not in str(failure.value)
        generation.close()
        await wait_for(lambda: loop_engine.load.kv_cache_usage == 0)
        again = await loop_engine.submit([prompt], SHORT)
        outputs = [output async for output in again]
        return outputs

    outputs = run_with_loop(engine, scenario)
    assert outputs[-1].finished and outputs[-1].num_output_tokens == 3
    assert not engine.has_unfinished()


def test_closing_a_generation_aborts_it_within_a_step(engine, prompt):
    async def scenario(loop_engine):
        generation = await loop_engine.submit([prompt], LONG)
        await generation.__anext__()
        generation.close()
        await wait_for(lambda: loop_engine.load.kv_cache_usage == 0 and loop_engine.load.running_requests == 0)
        return engine.block_manager.num_free_blocks == engine.block_manager.num_blocks

    assert run_with_loop(engine, scenario)


def test_admission_is_all_or_nothing_and_bounded(engine, prompt):
    async def scenario(loop_engine):
        with pytest.raises(ValueError, match="maximum context length"):
            await loop_engine.submit([prompt, prompt * 200], SHORT)
        with pytest.raises(ValueError, match="at most 4 at once"):
            await loop_engine.submit([prompt] * 5, SHORT)
        held = await loop_engine.submit([prompt] * 4, LONG)
        with pytest.raises(QueueFullError):
            await loop_engine.submit([prompt], SHORT)
        held.close()
        await wait_for(lambda: not loop_engine._generations)
        return [output async for output in await loop_engine.submit([prompt], SHORT)]

    assert run_with_loop(engine, scenario)[-1].finished
    assert not engine.has_unfinished()


def test_a_request_for_several_sequences_gets_the_slots_freed_under_overload(engine, prompt, monkeypatch):
    # Capacity 4 (2 running + 2 queued). Under steady overload singles would take every freed slot and
    # an n=2 request would never find two free at once; instead the slots are held for it.
    async def scenario(loop_engine):
        singles = [await loop_engine.submit([prompt], LONG) for _ in range(4)]
        pair = asyncio.ensure_future(loop_engine.submit([prompt], SamplingParams(n=2, max_tokens=3, temperature=0)))
        await asyncio.sleep(0.05)
        assert not pair.done()  # waiting, not refused
        with pytest.raises(QueueFullError):  # only one request waits for room at a time
            await loop_engine.submit([prompt, prompt], SHORT)
        singles.pop().close()
        with pytest.raises(QueueFullError):  # the freed slot is held for the pair
            await loop_engine.submit([prompt], SHORT)
        singles.pop().close()
        outputs = [output async for output in await asyncio.wait_for(pair, 10)]
        for generation in singles:
            generation.close()
        return outputs

    outputs = run_with_loop(engine, scenario)
    assert {delta.index for output in outputs for delta in output.deltas if delta.finish_reason} == {0, 1}

    async def gives_up(loop_engine):
        held = await loop_engine.submit([prompt] * 4, LONG)
        try:
            with pytest.raises(QueueFullError):
                await loop_engine.submit([prompt], SamplingParams(n=2, max_tokens=3))
            assert loop_engine._reservation is None
        finally:
            held.close()

    monkeypatch.setattr("shrike.engine.async_engine.MULTI_SEQUENCE_WAIT_SECONDS", 0.2)
    run_with_loop(engine, gives_up)
    assert not engine.has_unfinished()


def _thread_cpu_seconds(native_id: int) -> float:
    fields = open(f"/proc/self/task/{native_id}/stat").read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime + stime


def test_an_idle_loop_does_not_spin(engine, prompt):
    async def scenario(loop_engine):
        # The loop has worked once and gone idle again.
        assert [output async for output in await loop_engine.submit([prompt], SHORT)][-1].finished
        before = _thread_cpu_seconds(loop_engine._thread.native_id)
        await asyncio.sleep(1.0)
        return _thread_cpu_seconds(loop_engine._thread.native_id) - before

    assert run_with_loop(engine, scenario) <= 0.02


def test_stopping_fails_what_is_in_flight_and_refuses_new_work(engine, prompt):
    async def scenario(loop_engine):
        generation = await loop_engine.submit([prompt], LONG)
        await generation.__anext__()
        await loop_engine.stop()
        with pytest.raises(EngineStoppedError):
            async for _ in generation:
                pass
        with pytest.raises(EngineStoppedError):
            await loop_engine.submit([prompt], SHORT)

    run_with_loop(engine, scenario)
    assert not engine.has_unfinished()

"""The repair loop (cbcl.llm.complete and complete_async, issue 34 item 3), driven by the
scripted model of ``benchmarks/repair_loop.py``: each mistake fixed after the hint that
names it, a model that never converges, and every bound at its limit."""

from __future__ import annotations

import asyncio
import importlib.util
import random
import sys
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

import cbcl
from cbcl.core._errors import BodyError, EnvelopeError, LimitError, SchemaError
from cbcl.llm import Completion, CompletionError, complete, complete_async

ROOT = Path(__file__).resolve().parent.parent


def _bench() -> ModuleType:
    path = ROOT / "benchmarks" / "repair_loop.py"
    spec = importlib.util.spec_from_file_location("repair_loop", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["repair_loop"] = module
    spec.loader.exec_module(module)
    return module


BENCH: Any = _bench()
REGISTRY: cbcl.Registry = BENCH.load_registry()
PROPOSE = cbcl.parse((ROOT / "descriptors" / "examples" / "contract-net-v1-propose.cbcl")
                     .read_bytes(), registry=REGISTRY)


def _model(*kinds: str, stubborn: bool = False, message: cbcl.Message = PROPOSE) -> Any:
    made = BENCH.mistakes(message, REGISTRY, random.Random(1))
    return BENCH.ScriptedModel(message, [made[kind] for kind in kinds], "cbcl", stubborn)


def _run(generate: Any, **options: Any) -> Completion:
    options.setdefault("intent", PROPOSE.intent)
    options.setdefault("protocol", PROPOSE.protocol)
    done: Completion = complete(generate, REGISTRY, **options)
    return done


def test_a_message_in_prose_and_a_fence_is_accepted_at_once() -> None:
    model = _model("fenced", "prose")
    done = _run(model)
    assert done.message == PROPOSE and done.text == PROPOSE.canonical()
    assert len(done.attempts) == 1 and done.attempts[0].error is None
    assert model.calls == 1


@pytest.mark.parametrize(("kind", "error", "named"), [
    ("recased", BodyError, "Write :"),
    ("missing", BodyError, "Add the missing"),
    ("out-of-range", SchemaError, "minimum"),
    ("fields-reordered", EnvelopeError, "in this order"),
])
def test_each_mistake_is_fixed_after_the_hint_that_names_it(kind: str, error: type,
                                                            named: str) -> None:
    model = _model(kind)
    done = _run(model)
    assert done.message == PROPOSE
    first, second = done.attempts
    assert isinstance(first.error, error) and first.hint is not None and named in first.hint
    assert second.error is None and model.fixed == [kind]
    assert first.prompt_bytes < second.prompt_bytes  # the retry quotes the answer and hint


def test_a_refusal_is_placed_in_the_answer_as_written() -> None:
    model = _model("prose", "recased")
    done = _run(model)
    first = done.attempts[0]
    assert first.error is not None and first.error.position is not None
    with pytest.raises(cbcl.CBCLError) as raised:  # what extract says of the same answer
        cbcl.extract(first.text, registry=REGISTRY)
    assert first.error.position == raised.value.position
    assert first.error.message == raised.value.message and first.hint == raised.value.hint()


def test_a_model_that_never_converges() -> None:
    model = _model("prose", "recased", "missing", stubborn=True)
    with pytest.raises(CompletionError) as raised:
        _run(model, max_tries=4)
    error = raised.value
    assert error.reason == "max_tries" and len(error.attempts) == 4 == model.calls
    for attempt in error.attempts:
        assert isinstance(attempt.error, BodyError) and attempt.hint
        assert "Sure, here is" in attempt.text
    assert "no accepted PROPOSE message" in error.message
    assert isinstance(error, cbcl.CBCLError)


def test_a_streamed_answer_is_read_up_to_its_first_refused_token() -> None:
    model = _model("fields-reordered")
    pulled: list[list[str]] = []

    def generate(prompt: str) -> Iterator[str]:
        pulled.append([])
        for piece in BENCH.chunks(model(prompt), 4):
            pulled[-1].append(piece)
            yield piece

    done = _run(generate)
    first = done.attempts[0]
    whole = len(model.message.canonical())
    assert first.stopped and isinstance(first.error, EnvelopeError)
    assert first.text == "".join(pulled[0]) and first.output_bytes < whole / 4
    assert first.text.endswith("(receiver ")  # the refused token, and its delimiter
    assert done.attempts[1].stopped  # (at the message's last ')': nothing after it)


def test_max_output_bytes_at_the_limit_and_past_it() -> None:
    text = PROPOSE.canonical()
    size = len(text.encode())
    assert _run(lambda prompt: text, max_output_bytes=size).message == PROPOSE
    with pytest.raises(CompletionError) as raised:
        _run(lambda prompt: text, max_output_bytes=size - 1, max_tries=2)
    for attempt in raised.value.attempts:
        assert isinstance(attempt.error, LimitError)
        assert attempt.error.limit == "max_output_bytes" and attempt.output_bytes == size - 1
    with pytest.raises(ValueError):
        _run(lambda prompt: text, max_output_bytes=0)
    with pytest.raises(ValueError):
        _run(lambda prompt: text, max_tries=0)


def test_the_deadline_ends_the_loop() -> None:
    now = [0.0]

    def clock() -> float:
        return now[0]

    model = _model("recased", stubborn=True)

    def generate(prompt: str) -> str:
        now[0] += 10
        return str(model(prompt))

    with pytest.raises(CompletionError) as raised:
        _run(generate, deadline=15, clock=clock, max_tries=9)
    assert raised.value.reason == "deadline" and len(raised.value.attempts) == 2
    with pytest.raises(ValueError):
        _run(generate, deadline=0)


def test_arguments() -> None:
    async def generate(prompt: str) -> str:
        return prompt

    with pytest.raises(TypeError):
        _run(generate)
    with pytest.raises(ValueError):
        complete(lambda prompt: "", REGISTRY, intent="PROPOSE")  # which protocol?
    with pytest.raises(TypeError):
        _run(lambda prompt: 7)
    one = cbcl.Registry(disk_cache=False, isolate=False)
    one.load((ROOT / "descriptors" / "contract-net-v1.cbcl").read_bytes(),
             allow_unsigned=True)
    text = PROPOSE.canonical()
    assert complete(lambda prompt: text, one, intent="PROPOSE").message == PROPOSE


def test_the_async_twin() -> None:
    model = _model("recased")

    async def generate(prompt: str) -> str:
        await asyncio.sleep(0)
        return str(model(prompt))

    done = asyncio.run(complete_async(generate, REGISTRY, intent="PROPOSE",
                                      protocol=PROPOSE.protocol))
    assert done.message == PROPOSE and len(done.attempts) == 2

    streamed = _model("missing")

    async def stream(prompt: str) -> AsyncIterator[str]:
        for piece in BENCH.chunks(streamed(prompt), 5):
            await asyncio.sleep(0)
            yield piece

    done = asyncio.run(complete_async(stream, REGISTRY, intent="PROPOSE",
                                      protocol=PROPOSE.protocol))
    assert done.message == PROPOSE and done.attempts[0].stopped


def test_the_async_twin_cancels_a_call_at_the_deadline() -> None:
    cancelled: list[bool] = []

    async def slow(prompt: str) -> str:
        try:
            await asyncio.sleep(60)
        except asyncio.CancelledError:
            cancelled.append(True)
            raise
        return ""

    with pytest.raises(CompletionError) as raised:
        asyncio.run(complete_async(slow, REGISTRY, intent="PROPOSE",
                                   protocol=PROPOSE.protocol, deadline=0.05))
    assert raised.value.reason == "deadline" and cancelled == [True]


def test_the_benchmark_tasks_all_converge_with_cbcl() -> None:
    tasks = BENCH.tasks(REGISTRY)
    assert {kind for task in tasks for kind in task.kinds} == set(BENCH.KINDS)
    for task in tasks[::5]:
        outcome = BENCH.cbcl_loop(BENCH.model_for(task, "cbcl"), REGISTRY, 3)
        assert outcome.accepted and not outcome.wrong, task.kinds
        stubborn = BENCH.cbcl_loop(BENCH.model_for(task, "cbcl", stubborn=True), REGISTRY, 3)
        benign = all(task.made[kind].benign for kind in task.kinds)
        assert stubborn.accepted == benign and not stubborn.wrong

"""Environment API: reset/step, rewards, seeding, sync wrapper, registry and check_env."""

from __future__ import annotations

import textwrap

import anyio
import pytest
from datasets import Dataset

import agentrl
from agentrl import EnvError, Reward, ToolEnvironment, check_env, make, tool
from agentrl.env.check import EnvCheckError
from agentrl.env.registry import UnknownEnvironment


@tool
def echo(text: str) -> str:
    """Echo text back.

    Args:
        text: The text.
    """
    return text


def call(name: str, **arguments) -> dict:
    return {"role": "assistant", "content": "", "tool_calls": [{"type": "function", "id": "c0", "function": {"name": name, "arguments": arguments}}]}


def answer(text: str) -> dict:
    return {"role": "assistant", "content": text}


DATA = Dataset.from_list([{"question": f"Say {w}", "word": w, "bonus": i} for i, w in enumerate(["red", "green", "blue", "cyan"])])


def said_word(completion: str, word: str) -> float:
    return float(word in completion)


async def async_bonus(task: dict, bonus: int) -> float:
    await anyio.sleep(0)
    return float(bonus) / 10


def not_applicable(completion: str) -> None:
    return None


def used_tool(tool_records: list) -> float:
    return float(bool(tool_records))


def make_env(**kw) -> ToolEnvironment:
    defaults = dict(
        tools=[echo],
        rewards=[Reward(said_word, weight=2.0), Reward(async_bonus, weight=1.0, name="bonus"), not_applicable, Reward(used_tool, per_turn=True, weight=0.5)],
        datasets={"train": DATA, "test": DATA},
        system_prompt="Be brief.",
        max_turns=3,
    )
    defaults.update(kw)
    return ToolEnvironment(**defaults)


def test_episode_with_tool_call_and_weighted_rewards():
    env = make_env().sync()
    task = dict(DATA[1])
    messages, info = env.reset(task=task, seed=0)
    assert messages == [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Say green"}]
    assert info["tools"][0]["function"]["name"] == "echo"

    msgs, reward, terminated, truncated, info = env.step(call("echo", text="green"))
    assert msgs == [{"role": "tool", "name": "echo", "content": "green", "tool_call_id": "c0"}]
    assert (terminated, truncated) == (False, False)
    assert info["rewards"] == {"used_tool": 1.0} and reward == 0.5  # per-turn only

    msgs, reward, terminated, truncated, info = env.step(answer("green it is"))
    assert msgs == [] and terminated and not truncated
    assert info["rewards"] == {"said_word": 1.0, "bonus": 0.1, "not_applicable": None, "used_tool": 1.0}
    assert reward == pytest.approx(2.0 + 0.1 + 0.5)
    with pytest.raises(EnvError, match="after the episode ended"):
        env.step(answer("again"))
    env.close()


def test_truncation_after_max_turns():
    env = make_env(max_turns=2).sync()
    env.reset(task=dict(DATA[0]))
    assert env.step(call("echo", text="a"))[3] is False
    _, _, terminated, truncated, info = env.step(call("echo", text="b"))
    assert truncated and not terminated
    assert info["rewards"]["said_word"] == 0.0
    env.close()


def test_step_before_reset_and_bad_message():
    env = make_env().sync()
    with pytest.raises(EnvError, match="before reset"):
        env.step(answer("x"))
    env.reset(seed=1)
    with pytest.raises(EnvError, match="assistant"):
        env.step({"role": "user", "content": "x"})
    env.close()


def test_same_seed_same_episode_and_spawn_independent():
    base = make_env()

    async def first_messages(seed: int) -> list:
        env = base.spawn()
        messages, _ = await env.reset(seed=seed)
        return messages

    runs = [anyio.run(first_messages, s) for s in (7, 7, 8, 9, 10, 11)]
    assert runs[0] == runs[1]
    assert len({str(r) for r in runs}) > 1  # seeds pick different tasks

    async def interleave() -> None:
        a, b = base.spawn(), base.spawn()
        await a.reset(task=dict(DATA[0]))
        await b.reset(task=dict(DATA[2]))
        _, ra, *_ = await a.step(answer("red"))
        _, rb, *_ = await b.step(answer("red"))
        assert a.episode["task"]["word"] == "red" and b.episode["task"]["word"] == "blue"
        assert ra > rb

    anyio.run(interleave)


def test_calculator_determinism_and_splits():
    env = make("calculator")
    s = env.sync()
    m1, _ = s.reset(seed=123)
    m2, _ = s.reset(seed=123)
    assert m1 == m2
    train, test = env.dataset("train"), env.dataset("test")
    assert len(train) == 20000 and len(test) == 500
    assert not set(train["question"]) & set(test["question"])
    assert make("calculator").dataset("test")["question"] == test["question"]
    assert make("calculator", seed=1).dataset("test")["question"] != test["question"]
    s.close()


# -- registry ------------------------------------------------------------------------------------


def test_make_by_name_and_module_spec():
    env = make("calculator", difficulty=1)
    assert type(env).__name__ == "CalculatorEnv" and env.levels == (1,)
    env2 = make("agentrl.environments.calculator:CalculatorEnv", difficulty=[2])
    assert env2.levels == (2,)
    with pytest.raises(UnknownEnvironment, match="calculator"):
        make("no-such-env")
    with pytest.raises(UnknownEnvironment, match="has no attribute"):
        make("agentrl.environments.calculator:Nope")


ENV_FILE = textwrap.dedent(
    """
    from datasets import Dataset
    from agentrl import ToolEnvironment

    class FileEnv(ToolEnvironment):
        def __init__(self, word="hi"):
            super().__init__(rewards=[lambda completion: float(completion == word)])
            self.word = word

        def load_dataset(self, split):
            return Dataset.from_list([{"question": "Say " + self.word}])
    """
)


def test_make_by_file_path(tmp_path):
    path = tmp_path / "my_env.py"
    path.write_text(ENV_FILE)
    env = make(f"{path}:FileEnv", word="yo")
    check_env(env)
    messages, _ = env.sync().reset(seed=0)
    assert messages[-1]["content"] == "Say yo"
    with pytest.raises(UnknownEnvironment, match="not found"):
        make(f"{tmp_path}/missing.py:FileEnv")


def test_make_by_entry_point(tmp_path, monkeypatch):
    (tmp_path / "thirdparty_envs.py").write_text(ENV_FILE)
    dist = tmp_path / "thirdparty_envs-1.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: thirdparty-envs\nVersion: 1.0\n")
    (dist / "entry_points.txt").write_text("[agentrl.environments]\nwordy = thirdparty_envs:FileEnv\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    assert "wordy" in agentrl.registered()
    env = make("wordy", word="ok")
    assert type(env).__name__ == "FileEnv" and env.word == "ok"


def test_register():
    agentrl.register("echo-env", lambda: make_env())
    assert isinstance(make("echo-env"), ToolEnvironment)
    with pytest.raises(ValueError, match="already registered"):
        agentrl.register("echo-env", "x:y")


# -- check_env -------------------------------------------------------------------------------------


def test_check_env_accepts_good_envs():
    check_env(make("calculator"))
    check_env(make_env())


class NotDeterministic(ToolEnvironment):
    counter = 0

    def prompt(self, task):
        NotDeterministic.counter += 1
        return [{"role": "user", "content": f"{task['question']} #{NotDeterministic.counter}"}]


class BadReset(ToolEnvironment):
    async def reset(self, task=None, seed=None):
        return [{"role": "user", "content": "hi"}]


class BadMessages(ToolEnvironment):
    def prompt(self, task):
        return [{"role": "human", "content": 42}]


class BadStep(ToolEnvironment):
    async def step(self, message):
        return [], "1", 0, False, None


class CrashesOnToolCalls(ToolEnvironment):
    async def step(self, message):
        if message.get("tool_calls"):
            raise KeyError("arguments")
        return await super().step(message)


class StepBeforeResetOk(ToolEnvironment):
    async def step(self, message):
        if self.episode is None:
            return [], 0.0, True, False, {}
        return await super().step(message)


def dup_tools_env():
    @tool(name="echo")
    def echo2(text: str) -> str:
        """Echo again.

        Args:
            text: Text.
        """
        return text

    return make_env(tools=[echo, echo2])


def missing_column_reward_env():
    def wants_answer(completion: str, answer: str) -> float:
        return 1.0

    return make_env(rewards=[wants_answer])


@pytest.mark.parametrize(
    "env, expected",
    [
        (lambda: NotDeterministic(datasets={"train": DATA}), "not deterministic"),
        (lambda: BadReset(datasets={"train": DATA}), "must return (messages, info)"),
        (lambda: BadMessages(datasets={"train": DATA}), "has role 'human'"),
        (lambda: BadStep(datasets={"train": DATA}), "reward must be a finite float"),
        (lambda: CrashesOnToolCalls(tools=[echo], datasets={"train": DATA}), "invalid tool call raised KeyError"),
        (lambda: StepBeforeResetOk(datasets={"train": DATA}), "before reset() did not raise"),
        (dup_tools_env, "two tools are named 'echo'"),
        (missing_column_reward_env, "asks for ['answer']"),
        (lambda: ToolEnvironment(datasets={"train": Dataset.from_list([{"text": "no prompt column"}])}), "no 'prompt' or 'question'"),
        (lambda: object(), "not an agentrl.Environment"),
    ],
)
def test_check_env_names_each_mistake(env, expected):
    with pytest.raises(EnvCheckError) as err:
        check_env(env())
    assert expected in str(err.value)


def test_check_env_reports_several_problems_at_once():
    class Worse(BadStep):
        def prompt(self, task):
            return [{"role": "human", "content": 1}]

    with pytest.raises(EnvCheckError) as err:
        check_env(Worse(datasets={"train": DATA}))
    assert len(err.value.problems) >= 3


def test_a_file_spec_imports_a_module_beside_it(tmp_path):
    """``file.py:Class`` needed PYTHONPATH=. to import a helper next to the file (issue 41)."""
    folder = tmp_path / "myproject"
    folder.mkdir()
    (folder / "issue41_helpers.py").write_text("QUESTION = 'What is 2 + 2?'\n")
    (folder / "my_env.py").write_text(
        "from issue41_helpers import QUESTION\n"
        "from datasets import Dataset\n"
        "from agentrl import ToolEnvironment\n"
        "class MyEnv(ToolEnvironment):\n"
        "    def load_dataset(self, split):\n"
        "        return Dataset.from_list([{'question': QUESTION}])\n"
    )
    env = make(f"{folder / 'my_env.py'}:MyEnv")
    assert env.dataset("train")[0]["question"] == "What is 2 + 2?"

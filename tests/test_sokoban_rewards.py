"""Sokoban's reward never prefers a broken turn: giving up or a bad call never beats trying, and a bad
call can never be credited by a later solve.

Before ``turns_left``, an unsolved episode paid ``step_cost`` only for the turns it played, so in a group
of failures the one that stopped first (a reply without a call, a turn cut by the token budget - what
broken call syntax produces) had the best return, and GRPO's group-normalised advantage turned that
0.02-per-turn difference into a full-size push towards stopping. Before ``end_on_bad_call``, a malformed
call was followed by more turns, and when the episode then solved, the malformed turn's
reward-to-go beat the group's: a rare, low-probability broken token got a large positive update
(docs/environments.md, "A starting model for Sokoban, and RL on it").
"""

from __future__ import annotations

from typing import Any

import anyio
import pytest

from agentrl.environments.sokoban import Board, SokobanEnv, scripted_move
from agentrl.learn.losses import compute_advantages


def call(direction: str) -> dict[str, Any]:
    return {"role": "assistant", "content": "", "tool_calls": [{"type": "function", "function": {"name": "move", "arguments": {"direction": direction}}}]}


def malformed() -> dict[str, Any]:
    return {"role": "assistant", "content": "", "tool_calls": [{"type": "function", "function": {"name": "mvoe", "arguments": {"direction": "up"}}}]}


ENV = SokobanEnv(num_train=20, num_test=10, max_turns=6)
TASK = dict(max(ENV.dataset("test"), key=lambda t: t["optimal"]))


def harmless(board: Board) -> str:
    """A move that does not solve the level (the episode must stay unsolved)."""
    return next(d for d in ("up", "down", "left", "right") if not board.move(d)[0].solved)


async def episode(kind: str) -> tuple[float, list[float]]:
    """One episode's total reward and its per-turn rewards (the last one includes what ``finish`` adds)."""
    env = ENV.spawn()
    await env.reset(task=dict(TASK))
    turns: list[float] = []
    for k in range(ENV.max_turns):
        state = env.episode["state"]
        board = state.get("board") or Board.parse(TASK["board"])
        if kind == "solve":
            message = call(scripted_move(TASK, state) or "up")
        elif kind == "give_up" and k == 1:
            message = {"role": "assistant", "content": "I cannot solve this."}
        elif kind == "cut" and k == 2:  # the engine cuts a turn that overran its token budget: no step
            reward, _ = await env.finish()
            turns.append(reward)
            return sum(turns), turns
        elif kind == "malformed" and k == 0:
            message = malformed()
        else:
            message = call(harmless(board))
        _, reward, terminated, truncated, _ = await env.step(message)
        turns.append(reward)
        if terminated or truncated:
            return sum(turns), turns
    raise AssertionError("the environment did not end the episode at max_turns")


def test_every_unsolved_ending_returns_the_same_and_solving_beats_it() -> None:
    totals = {kind: anyio.run(episode, kind)[0] for kind in ("loop", "give_up", "cut", "malformed", "solve")}
    full_cost = -ENV.step_cost * ENV.max_turns
    penalty = ENV.format_weight
    assert totals["loop"] == pytest.approx(full_cost)
    assert totals["cut"] == pytest.approx(full_cost)  # was -0.04 (two turns charged): better than trying
    assert totals["give_up"] == pytest.approx(full_cost - penalty)  # was -0.04: better than trying
    assert totals["malformed"] == pytest.approx(full_cost - penalty)
    assert totals["solve"] > 1.0


def test_a_bad_call_ends_the_episode_so_no_later_solve_can_credit_it() -> None:
    async def go() -> list[tuple[float, bool]]:
        env = ENV.spawn()
        await env.reset(task=dict(TASK))
        steps = []
        for message in (malformed(), call("sideways")):
            await env.reset(task=dict(TASK))
            _, reward, terminated, _, info = await env.step(message)
            steps.append((reward, terminated))
            assert info["rewards"]["solved"] == 0.0
        return steps

    for reward, terminated in anyio.run(go):
        assert terminated and reward == pytest.approx(-ENV.step_cost * ENV.max_turns - ENV.format_weight)


def test_a_group_of_failures_gives_no_advantage_to_the_one_that_stops_first() -> None:
    runs = [anyio.run(episode, kind) for kind in ("loop", "cut", "loop")]
    for mode in ("episode", "turn"):
        per_turn, _ = compute_advantages([t for t, _ in runs], [r for _, r in runs], [0] * len(runs), mode=mode)
        assert all(float(a.abs().max()) < 1e-6 for a in per_turn), (mode, per_turn)
    runs += [anyio.run(episode, kind) for kind in ("give_up", "malformed")]
    per_turn, _ = compute_advantages([t for t, _ in runs], [r for _, r in runs], [0] * len(runs), mode="turn")
    assert float(per_turn[3][-1]) < 0 and float(per_turn[4][-1]) < 0  # the bad turns are pushed down
    assert all(float(a.min()) > -1e-6 for a in per_turn[:3])

"""sokoban: push every box onto a target, one ``move`` call per step, with per-turn rewards.

Levels are generated from a seed by playing Sokoban backwards: boxes start on their targets and a
random walk of the player *pulls* them away, so every level is solvable by construction. Each level
is then solved by breadth-first search; its optimal move count is stored with the task (a
difficulty measure, and the scripted policy of ``solve``). The test split has its own seed and any
board that also appears in train is removed from train.

Rewards: ``solved`` (episode, 1 when every box is on a target), ``progress`` (per turn: +0.5 for
each box pushed onto a target in that turn, -0.5 for each pushed off, minus ``step_cost``), so
per-turn credit assignment has something to work with, ``turns_left`` (episode: an unsolved episode
that ends early pays ``step_cost`` for the turns it did not play) and ``format`` (per turn: -1 x
``format_weight`` for a turn without a ``move`` that ran). The episode ends when the puzzle is
solved, when the model answers without a tool call, after a bad call (``end_on_bad_call``) or after
``max_turns``. The last three make every failure cost the same or more than trying: GRPO on a small
model otherwise learns to break its call syntax (docs/environments.md, "A starting model for
Sokoban, and RL on it").
"""

from __future__ import annotations

import random
from collections import deque
from dataclasses import dataclass
from typing import Any

from datasets import Dataset

from agentrl.env.environment import Message, Reward, StepResult, ToolEnvironment
from agentrl.env.tool import Tool, ToolError

SPLIT_SEEDS = {"train": 21, "test": 22}
MOVES = {"up": (-1, 0), "down": (1, 0), "left": (0, -1), "right": (0, 1)}
SYSTEM_PROMPT = (
    "You are playing Sokoban. Legend: # wall, @ you, $ box, . target, * box on a target, + you on a target. "
    "Call the move tool with one direction (up, down, left or right) per call. Walking into a box pushes it; "
    "you cannot pull boxes or push two at once. The puzzle is solved when every box is on a target."
)


@dataclass
class Board:
    """A Sokoban position: walls and targets are fixed, the player and boxes move."""

    walls: frozenset[tuple[int, int]]
    targets: frozenset[tuple[int, int]]
    boxes: frozenset[tuple[int, int]]
    player: tuple[int, int]
    height: int
    width: int

    @classmethod
    def parse(cls, text: str) -> Board:
        walls, targets, boxes, player = set(), set(), set(), None
        rows = text.split("\n")
        for r, row in enumerate(rows):
            for c, ch in enumerate(row):
                if ch == "#":
                    walls.add((r, c))
                if ch in ".*+":
                    targets.add((r, c))
                if ch in "$*":
                    boxes.add((r, c))
                if ch in "@+":
                    player = (r, c)
        if player is None or not boxes or len(boxes) != len(targets):
            raise ValueError(f"not a Sokoban board (one player, as many boxes as targets):\n{text}")
        return cls(frozenset(walls), frozenset(targets), frozenset(boxes), player, len(rows), max(map(len, rows)))

    def render(self) -> str:
        rows = []
        for r in range(self.height):
            line = ""
            for c in range(self.width):
                p = (r, c)
                if p in self.walls:
                    line += "#"
                elif p == self.player:
                    line += "+" if p in self.targets else "@"
                elif p in self.boxes:
                    line += "*" if p in self.targets else "$"
                else:
                    line += "." if p in self.targets else " "
            rows.append(line.rstrip())
        return "\n".join(rows)

    @property
    def on_target(self) -> int:
        return len(self.boxes & self.targets)

    @property
    def solved(self) -> bool:
        return self.boxes == self.targets

    def move(self, direction: str) -> tuple[Board, str]:
        """The board after ``direction`` and what happened ("moved", "pushed", "wall", "blocked")."""
        dr, dc = MOVES[direction]
        r, c = self.player
        nxt = (r + dr, c + dc)
        if nxt in self.walls:
            return self, "wall"
        if nxt in self.boxes:
            beyond = (r + 2 * dr, c + 2 * dc)
            if beyond in self.walls or beyond in self.boxes:
                return self, "blocked"
            boxes = (self.boxes - {nxt}) | {beyond}
            return Board(self.walls, self.targets, frozenset(boxes), nxt, self.height, self.width), "pushed"
        return Board(self.walls, self.targets, self.boxes, nxt, self.height, self.width), "moved"


def solve(board: Board, max_states: int = 200_000) -> list[str] | None:
    """A shortest move sequence solving ``board`` (breadth-first search), or None."""
    start = (board.player, board.boxes)
    parents: dict[Any, tuple[Any, str] | None] = {start: None}
    queue = deque([board])
    while queue and len(parents) < max_states:
        b = queue.popleft()
        if b.solved:
            path, key = [], (b.player, b.boxes)
            while parents[key] is not None:
                key, move = parents[key]  # type: ignore[misc]
                path.append(move)
            return path[::-1]
        for move in MOVES:
            nb, what = b.move(move)
            key = (nb.player, nb.boxes)
            if what in ("moved", "pushed") and key not in parents:
                parents[key] = ((b.player, b.boxes), move)
                queue.append(nb)
    return None


def generate_level(rng: random.Random, height: int, width: int, boxes: int, pulls: int) -> Board:
    """A solvable level: boxes on targets, then ``pulls`` random reverse moves of the player."""
    while True:
        walls = {(r, c) for r in range(height) for c in range(width) if r in (0, height - 1) or c in (0, width - 1)}
        inner = [(r, c) for r in range(1, height - 1) for c in range(1, width - 1)]
        for cell in rng.sample(inner, k=rng.randint(0, max(0, len(inner) // 8))):
            walls.add(cell)
        free = [p for p in inner if p not in walls]
        if len(free) < boxes + 3:
            continue
        picks = rng.sample(free, boxes + 1)
        targets, player = frozenset(picks[:boxes]), picks[boxes]
        box_set = set(targets)
        for _ in range(pulls):
            dr, dc = MOVES[rng.choice(list(MOVES))]
            r, c = player
            step = (r + dr, c + dc)
            if step in walls or step in box_set:
                continue
            behind = (r - dr, c - dc)
            if behind in box_set and rng.random() < 0.8:
                box_set.remove(behind)
                box_set.add(player)
            player = step
        board = Board(frozenset(walls), targets, frozenset(box_set), player, height, width)
        if board.on_target < boxes // 2 + (boxes % 2) and not board.solved:
            return board


def generate_tasks(n: int, seed: int, size: int, boxes: int, pulls: int) -> list[dict[str, Any]]:
    rng = random.Random(seed)
    tasks: list[dict[str, Any]] = []
    while len(tasks) < n:
        board = generate_level(rng, size, size, boxes, pulls)
        solution = solve(board)
        if solution is None or len(solution) > 4 * pulls:
            continue
        tasks.append({"board": board.render(), "optimal": len(solution), "boxes": boxes})
    return tasks


class Move(Tool):
    """Moves the player on the episode's board (kept in the episode state)."""

    name = "move"
    injected = ("state", "task")
    timeout = 5.0

    def run(self, direction: str, state: dict[str, Any], task: dict[str, Any]) -> str:
        """Move one step on the Sokoban board and show the new board.

        Args:
            direction: One of "up", "down", "left", "right".
        """
        key = str(direction).strip().lower()
        if key not in MOVES:
            raise ToolError(f"unknown direction {direction!r}; use up, down, left or right")
        board = state.get("board") or Board.parse(task["board"])
        new, what = board.move(key)
        state["board"] = new
        state["moves"] = state.get("moves", 0) + 1
        note = {"wall": "You bump into a wall.", "blocked": "The box cannot move that way.", "pushed": "You push a box.", "moved": "You move."}[what]
        status = f"Boxes on targets: {new.on_target}/{len(new.targets)}."
        if new.solved:
            status += " Solved!"
        return f"{note}\n{new.render()}\n{status}"


def bad_turn(state: dict[str, Any], tool_records: list[Any]) -> float:
    """-1 when this turn made no ``move`` that ran: no call at all, a malformed call (bad JSON, bad
    arguments, unknown tool) or an unknown direction; else 0."""
    new = tool_records[state.get("format_scored", 0) :]
    state["format_scored"] = len(tool_records)
    return -1.0 if not new or any(r.kind != "ok" for r in new) else 0.0


def solved(state: dict[str, Any]) -> float:
    """1 when every box is on a target at the end of the episode."""
    board = state.get("board")
    return float(board is not None and board.solved)


class SokobanEnv(ToolEnvironment):
    """Generated Sokoban levels played through a ``move`` tool, with per-turn progress rewards.

    Args:
        size: board side including the outer wall (5 to 9).
        boxes: boxes per level.
        pulls: reverse moves used to scramble a level (more = harder).
        num_train / num_test: split sizes.
        seed: offsets the split seeds.
        max_turns: assistant turns before the episode is truncated.
        progress_weight: weight of the per-turn progress reward (0 disables it).
        step_cost: subtracted from the progress reward for every turn.
        format_weight: weight of the per-turn format penalty (0 disables it).
        end_on_bad_call: a turn whose call is malformed or names an unknown direction ends the
            episode (unsolved), so a bad call can never be followed by a solve that credits it.
    """

    system_prompt = SYSTEM_PROMPT
    def __init__(
        self,
        size: int = 6,
        boxes: int = 1,
        pulls: int = 6,
        num_train: int = 2000,
        num_test: int = 100,
        seed: int = 0,
        max_turns: int = 8,
        progress_weight: float = 1.0,
        step_cost: float = 0.02,
        format_weight: float = 0.2,
        end_on_bad_call: bool = True,
    ) -> None:
        if not 5 <= size <= 9:
            raise ValueError(f"sokoban size must be 5 to 9, got {size}")
        if not 1 <= boxes <= 3:
            raise ValueError(f"sokoban boxes must be 1 to 3, got {boxes}")
        rewards = [Reward(solved, name="solved")]
        if progress_weight:
            rewards.append(Reward(self._progress, weight=progress_weight, name="progress", per_turn=True))
            rewards.append(Reward(self._turns_left, weight=progress_weight, name="turns_left"))
        if format_weight:
            rewards.append(Reward(bad_turn, weight=format_weight, name="format", per_turn=True))
        super().__init__(tools=[Move()], rewards=rewards, max_turns=max_turns)
        self.size, self.boxes, self.pulls = size, boxes, pulls
        self.num_train, self.num_test, self.seed, self.step_cost = num_train, num_test, seed, step_cost
        self.format_weight, self.end_on_bad_call = format_weight, end_on_bad_call

    def _progress(self, state: dict[str, Any], task: dict[str, Any]) -> float:
        """Boxes newly on targets this turn (x0.5) minus the step cost."""
        board = state.get("board") or Board.parse(task["board"])
        before = state.get("scored_on_target", Board.parse(task["board"]).on_target)
        state["scored_on_target"] = board.on_target
        return 0.5 * (board.on_target - before) - self.step_cost

    def _turns_left(self, state: dict[str, Any], turn: int) -> float:
        """An unsolved episode that ends early (no call, a bad call, a turn cut by the token budget)
        still pays ``step_cost`` for every turn it did not play, so stopping never beats trying:
        without this, a group of failures ranks the shortest first and GRPO pushes towards stopping."""
        if solved(state):
            return 0.0
        return -self.step_cost * max(0, self.max_turns - turn)

    def prompt(self, task: dict[str, Any]) -> list[Message]:
        text = f"Solve this Sokoban puzzle:\n{task['board']}"
        return [{"role": "system", "content": self.system_prompt}, {"role": "user", "content": text}]

    async def step(self, message: Any) -> StepResult:
        messages, reward, terminated, truncated, info = await super().step(message)
        ep = self.episode
        bad = any(r.kind != "ok" for r in info.get("tool_records", []))
        if ep is not None and not (terminated or truncated) and (solved(ep["state"]) or (bad and self.end_on_bad_call)):
            # Solving ends the episode, and so does a bad call (end_on_bad_call): score the episode
            # rewards now, through the one reward path.
            ep["done"] = True
            extra, components = await self.score(per_turn=False, episode=True)
            reward += extra
            info["rewards"].update(components)
            terminated = True
        return messages, reward, terminated, truncated, info

    def load_dataset(self, split: str) -> Dataset:
        if split not in SPLIT_SEEDS:
            raise KeyError(f"sokoban has splits {sorted(SPLIT_SEEDS)}, not {split!r}")
        args = (self.size, self.boxes, self.pulls)
        test = generate_tasks(self.num_test, SPLIT_SEEDS["test"] + 1000 * self.seed, *args)
        if split == "test":
            return Dataset.from_list(test)
        held_out = {t["board"] for t in test}
        train = [t for t in generate_tasks(int(1.1 * (self.num_train + self.num_test)), SPLIT_SEEDS["train"] + 1000 * self.seed, *args) if t["board"] not in held_out]
        return Dataset.from_list(train[: self.num_train])


def scripted_move(task: dict[str, Any], state: dict[str, Any]) -> str | None:
    """The next move of an optimal player from the episode's current board (a reference policy)."""
    board = state.get("board") or Board.parse(task["board"])
    path = solve(board)
    if not path:
        return None
    return path[0]


__all__ = ["Board", "SokobanEnv", "generate_level", "scripted_move", "solve"]

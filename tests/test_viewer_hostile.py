"""The viewer on hostile results.jsonl records: every field escaped, wrong types shown, no traceback
(issue 17, item 10). Built without a model: the page shows token ids (tokenizer=none)."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

from agentrl.cli.main import main as cli
from agentrl.cli.view import build_page
from agentrl.core.trajectory import Sample, Trajectory, Turn

EVIL = "</script><script>document.body.dataset.pwned='1'</script><img src=x onerror=\"document.body.dataset.pwned='1'\">'\"<b>"
CHROMIUM = next((p for p in map(shutil.which, ("chromium", "chromium-browser", "google-chrome")) if p), None)


def record(**overrides) -> dict:
    sample = Sample(prompt_ids=[1, 2, 3])
    sample.extend([4, 5], sampled=True, logprobs=[-0.1, -0.2])
    sample.extend([6], sampled=False)
    call = {"type": "function", "id": "c1", "function": {"name": EVIL, "arguments": {EVIL: EVIL}}}
    turn = Turn(index=0, message={"role": "assistant", "content": EVIL, "tool_calls": [call]}, num_sampled=2, finish_reason=EVIL,
                env_messages=[{"role": "tool", "name": EVIL, "content": EVIL, "tool_call_id": "c1"}], num_env_tokens=1,
                tool_records=[{"tool": EVIL, "kind": EVIL, "latency_s": 0.01, "call_id": "c1", "detail": EVIL}],
                parse_issues=[{"kind": EVIL, "detail": EVIL}], bridge=EVIL)
    traj = Trajectory(task={"question": EVIL, EVIL: EVIL}, seed=0, samples=[sample], turns=[turn], finish_reason=EVIL,
                      messages=[{"role": "user", "content": EVIL}], rewards={EVIL: 1.0})
    return {**traj.to_dict(), **overrides}


HOSTILE = [
    {"seed": EVIL, "index": EVIL, "group": EVIL},
    {"reward": "1.0", "rewards": {"correct": "yes", EVIL: None}, "duration_s": EVIL},
    {"reward": [EVIL], "seed": {"a": EVIL}, "index": [1, 2], "group": 3.5, "splits": EVIL, "error": {"e": EVIL}},
    {"step": EVIL, "truncated": EVIL, "finish_reason": [EVIL], "task": EVIL},
    {"turns": [{**record()["turns"][0], "index": EVIL, "reward": EVIL, "generation_s": [1], "num_sampled": "2",
                "message": {"role": "assistant", "tool_calls": [EVIL, {"id": [1], "function": EVIL}, {"id": "c9", "function": {"name": EVIL, "arguments": EVIL}}]},
                "tool_records": [EVIL, {"kind": [EVIL], "call_id": {"x": 1}, "latency_s": EVIL, "tool": None}],
                "parse_issues": [EVIL, {"kind": [1, 2]}], "env_messages": EVIL}]},
    {"reward": float("nan"), "index": 2},
]


@pytest.fixture()
def results(tmp_path) -> Path:
    path = tmp_path / "results.jsonl"
    with open(path, "w") as f:
        f.write(json.dumps(record()) + "\n")
        for i, extra in enumerate(HOSTILE):
            f.write(json.dumps(record(**{"group": i + 1, **extra})) + "\n")
    return path


def test_hostile_records_render_escaped_without_a_traceback(results):
    page, n, _ = build_page(results, tokenizer="none")
    assert n == 1 + len(HOSTILE)
    body = page.split("<body", 1)[1]
    assert body.count("<script") == 1  # the page's own
    assert "<img" not in page and "<b>" not in page and "onerror=\"" not in page
    assert "&lt;img src=x onerror=" in page
    # wrong types are named on their episode, not silently dropped
    assert "bad record: seed is not an integer" in page
    assert "reward is not a number (&#x27;1.0&#x27;)" in page
    assert "reward correct is not a number" in page


def test_the_command_writes_the_page_for_hostile_records(results, tmp_path, capsys):
    out = tmp_path / "page.html"
    assert cli(["view", str(results), "tokenizer=none", f"out={out}"]) == 0
    assert out.is_file() and "wrote" in capsys.readouterr().out


def test_token_ids_that_are_not_integers_are_one_clear_error(tmp_path, capsys):
    bad = record()
    bad["samples"][0]["completion_ids"] = [EVIL]
    path = tmp_path / "results.jsonl"
    path.write_text(json.dumps(bad) + "\n")
    assert cli(["view", str(path), "tokenizer=none"]) == 2
    err = capsys.readouterr().err
    assert "results.jsonl:1" in err and "completion_ids is not a list of integers" in err and "Traceback" not in err


def test_in_chromium_hostile_fields_stay_text(results, tmp_path):
    if CHROMIUM is None:
        pytest.fail("chromium is not installed: the viewer is tested in a real browser (apt-get install -y chromium)")
    out = tmp_path / "page.html"
    page, _, _ = build_page(results, tokenizer="none")
    out.write_text(page, encoding="utf-8")
    cmd = [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", f"--user-data-dir={tmp_path / 'profile'}", "--dump-dom", out.as_uri() + "#open=all"]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr[-2000:]
    dom = done.stdout
    assert 'data-ready="1"' in dom  # the page's script ran to the end over every record
    assert "pwned" not in dom.split("<body", 1)[1].split(">", 1)[0]
    assert dom.count("<script") == 1 and "<img" not in dom and "<b>" not in dom

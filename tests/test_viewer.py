"""agentrl view: a page built from real rollouts of the bundled model, checked by parsing the HTML
and in a real headless Chromium (screenshot pixels and the DOM after the page's script ran).

The episodes are real: greedy and sampled calculator episodes, a tool that raises, a turn cut by
the per-turn cap, an environment reply rolled back for lack of budget, a template that rewrites
history (so the engine splits), an environment whose reset fails, and trainer logprobs computed
with the trainer's own function under bf16 autocast. Only the injection episode is built by hand
(the model cannot be asked to write ``</script>``): its tokens are the real tokenizer's encoding.
"""

from __future__ import annotations

import json
import math
import shutil
import struct
import subprocess
import zlib
from html.parser import HTMLParser
from pathlib import Path

import anyio
import numpy as np
import pytest
import torch
from chat_fixtures import load_asset_tokenizer

from agentrl import make, tool
from agentrl.chat import default_template, get_chat_format
from agentrl.cli.main import main as cli
from agentrl.compute.logprobs import token_logprobs
from agentrl.compute.models import load_model, load_tokenizer
from agentrl.core.trajectory import Sample, Trajectory, Turn, write_jsonl
from agentrl.environments.calculator import CalculatorEnv
from agentrl.generators.hf.generator import TransformersGenerator
from agentrl.generators.protocol import SamplingParams
from agentrl.observe.runlog import RunLog
from agentrl.observe.viewer.html import ENV_RGB, TRAINED_RGB
from agentrl.observe.viewer.records import Decoder
from agentrl.rollout import RolloutConfig, RolloutEngine

INJECTION = "</script><script>document.body.dataset.pwned='1'</script><img src=x onerror=\"document.body.dataset.pwned='1'\">"
CHROMIUM = next((p for p in map(shutil.which, ("chromium", "chromium-browser", "google-chrome")) if p), None)


@tool(name="calculator")
def offline_calculator(expression: str) -> str:
    """Evaluate an arithmetic expression.

    Args:
        expression: The expression, e.g. "3 + 4".
    """
    raise ConnectionError("calculator backend offline")


class OfflineToolEnv(CalculatorEnv):
    def __init__(self) -> None:
        super().__init__()
        self.tools = [offline_calculator]


class BrokenResetEnv(CalculatorEnv):
    async def reset(self, task=None, seed=None):
        raise ConnectionError("sandbox unreachable")


def rollouts(model, cases: dict) -> dict[str, list[Trajectory]]:
    """Run every case (format, env, tasks, n, sampling, limits) at once on one shared generator."""
    fmt0 = next(iter(cases.values()))[0]
    gen = TransformersGenerator(model, pad_token_id=fmt0.tokenizer.pad_token_id, gather_window_s=0.01)
    out: dict[str, list[Trajectory]] = {}

    async def one(name, fmt, env, tasks, n, sampling, limits):
        engine = RolloutEngine(gen, fmt, RolloutConfig(**limits), sampling)
        out[name] = [t for g in await engine.run(env, tasks, n=n, seed=0) for t in g.trajectories]

    async def go():
        try:
            async with anyio.create_task_group() as tg:
                for name, args in cases.items():
                    tg.start_soon(one, name, *args)
        finally:
            await gen.close()

    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # a 3M-parameter model gains nothing from threads, and they thrash on a busy machine
    try:
        anyio.run(go)
    finally:
        torch.set_num_threads(threads)
    return {name: out[name] for name in cases}


def with_trainer_logprobs(model, traj: Trajectory) -> None:
    """What the trainer stores: its logprobs of the sampled tokens, here under bf16 autocast."""
    for s in traj.samples:
        ids = torch.tensor([s.ids])
        with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
            lp = token_logprobs(model, ids, logits_to_keep=len(s.completion_ids), temperature=1.0)[0].float().tolist()
        s.trainer_logprobs = [v if m else 0.0 for v, m in zip(lp, s.loss_mask)]


def injection_episode(fmt, prompt_ids: list[int]) -> Trajectory:
    ids = fmt.encode(INJECTION) + fmt.eot_token_ids[:1]
    sample = Sample(prompt_ids=list(prompt_ids))
    sample.extend(ids, sampled=True, logprobs=[-0.5] * len(ids))
    turn = Turn(index=0, message={"role": "assistant", "content": INJECTION}, num_sampled=len(ids), finish_reason="stop",
                tool_records=[{"tool": INJECTION, "kind": "error", "latency_s": 0.001, "call_id": None, "detail": INJECTION}])
    return Trajectory(task={"question": INJECTION}, seed=0, samples=[sample], turns=[turn], finish_reason="stop",
                      messages=[{"role": "user", "content": INJECTION}, turn.message], error=None)


@pytest.fixture(scope="module")
def tokenizer():
    return load_tokenizer("default")


@pytest.fixture(scope="module")
def episodes(tokenizer, tmp_path_factory):
    """results.jsonl + summary.json (naming the model, so the viewer finds the tokenizer) of real episodes."""
    torch.manual_seed(0)
    model = load_model("default", dtype=torch.float32, device="cpu")
    fmt = get_chat_format(tokenizer)
    env = make("calculator")
    tasks = list(env.dataset("test"))
    lossy = get_chat_format(tokenizer, "hermes", chat_template=default_template().replace(
        "{%- for call in message.tool_calls or [] %}", "{%- for call in (message.tool_calls if loop.last else []) or [] %}"))
    greedy, sampled = SamplingParams(temperature=0.0), SamplingParams(temperature=1.0, seed=3)
    cases = rollouts(model, {
        "plain": (fmt, env, tasks[:1], 2, sampled, {}),
        "toolfail": (fmt, OfflineToolEnv(), tasks[2:3], 1, greedy, {}),
        "cut": (fmt, env, tasks[3:4], 1, greedy, {"max_tokens_per_turn": 6}),
        "rollback": (fmt, env, tasks[4:5], 1, greedy, {"max_completion_tokens": 30}),
        "split": (lossy, env, tasks[5:6], 1, greedy, {}),
        "failed": (fmt, BrokenResetEnv(), tasks[6:7], 1, greedy, {}),
    })
    with_trainer_logprobs(model, cases["plain"][0])
    cases["inject"] = [injection_episode(fmt, cases["plain"][0].prompt_ids)]
    trajs = []
    for g, (name, ts) in enumerate(cases.items()):
        for i, t in enumerate(ts):
            t.group, t.index = g, i
            trajs.append((name if i == 0 else f"{name}-{i}", t))
    out = tmp_path_factory.mktemp("eval")
    write_jsonl([t for _, t in trajs], out / "results.jsonl")
    (out / "summary.json").write_text(json.dumps({"config": {"model": {"path": "default"}}}))
    return out, trajs


@pytest.fixture(scope="module")
def page(episodes, tmp_path_factory):
    folder, _ = episodes
    out = tmp_path_factory.mktemp("page") / "page.html"
    assert cli(["view", str(folder), f"out={out}"]) == 0
    return out


class PageParser(HTMLParser):
    """Episodes with their token spans and markers; every tag that could load or run something."""

    def __init__(self) -> None:
        super().__init__()
        self.episodes: list[dict] = []
        self.tags: list[tuple[str, dict]] = []
        self.stack: list[tuple[str, dict]] = []

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        self.tags.append((tag, a))
        cls = a.get("class") or ""
        if tag == "details" and "episode" in cls.split():
            self.episodes.append({"attrs": a, "spans": [], "markers": [], "cells": [], "text": ""})
        node = {"tag": tag, "cls": cls.split(), "attrs": a, "text": ""}
        if self.episodes and tag == "span" and ({"s", "e"} & set(node["cls"])):
            self.episodes[-1]["spans"].append(node)
        if self.episodes and tag == "div" and "marker" in node["cls"]:
            self.episodes[-1]["markers"].append(node)
        if self.episodes and tag == "td":
            self.episodes[-1]["cells"].append(node)
        if tag not in ("meta", "input", "br"):
            self.stack.append((tag, node))

    def handle_endtag(self, tag):
        while self.stack:
            if self.stack.pop()[0] == tag:
                break

    def handle_data(self, data):
        for _, node in self.stack:
            node["text"] += data
        if self.episodes:
            self.episodes[-1]["text"] += data


def parse(page: Path | str) -> PageParser:
    p = PageParser()
    p.feed(page.read_text(encoding="utf-8") if isinstance(page, Path) else page)
    return p


def runs(sample: Sample, sampled: bool) -> list[list[int]]:
    """Maximal runs of sampled (or environment) completion ids."""
    out, cur = [], []
    for i, m in zip(sample.completion_ids, sample.loss_mask):
        if bool(m) == sampled:
            cur.append(i)
        elif cur:
            out.append(cur)
            cur = []
    return out + ([cur] if cur else [])


def test_page_shows_the_exact_tokens_and_what_happened(episodes, page, tokenizer):
    _, trajs = episodes
    parsed = parse(page)
    assert len(parsed.episodes) == len(trajs)
    decode = lambda ids: tokenizer.decode(ids, skip_special_tokens=False, clean_up_tokenization_spaces=False)  # noqa: E731
    for (name, t), ep in zip(trajs, parsed.episodes):
        trained = [s for s in ep["spans"] if "s" in s["cls"]]
        env = [s for s in ep["spans"] if "e" in s["cls"]]
        # one span per sampled token; the spans' text is exactly the sampled ids decoded
        assert len(trained) == t.num_sampled, name
        assert "".join(s["text"] for s in trained) == "".join(decode(r) for s in t.samples for r in runs(s, True)), name
        assert "".join(s["text"] for s in env) == "".join(decode(r) for s in t.samples for r in runs(s, False)), name
        lps = [lp for s in t.samples for lp, m in zip(s.logprobs, s.loss_mask) if m]
        assert all(f"logprob {lp:.4f}" in s["attrs"]["title"] for s, lp in zip(trained, lps)), name
        assert float(ep["attrs"]["data-reward"]) == t.reward
    page_of = {name: ep for (name, _), ep in zip(trajs, parsed.episodes)}
    flags = {name: ep["attrs"]["data-flags"].split() for name, ep in page_of.items()}
    markers = {name: " ".join(m["text"] for m in ep["markers"]) for name, ep in page_of.items()}
    by_name = dict(trajs)

    assert "toolfail" in flags["toolfail"] and "error" in [c["text"] for c in page_of["toolfail"]["cells"]]
    assert "calculator raised ConnectionError: calculator backend offline" in page_of["toolfail"]["text"]
    assert by_name["cut"].finish_reason == "length" and "truncated" in flags["cut"]
    assert "cut mid-turn by the max_tokens_per_turn budget" in markers["cut"]
    assert by_name["rollback"].finish_reason == "max_tokens" and "rolled back" in markers["rollback"]
    assert by_name["split"].splits >= 1 and "split" in flags["split"]
    assert markers["split"].count("✂ split: not prefix-preserving") == by_name["split"].splits
    assert "error" in flags["failed"] and "failed: ConnectionError: sandbox unreachable" in markers["failed"]
    # trainer logprobs: flagged, and every trained token carries a Δ bucket and its value
    assert "trainer" in flags["plain"] and "trainer" not in flags["toolfail"]
    spans = [s for s in page_of["plain"]["spans"] if "s" in s["cls"]]
    assert all(any(c.startswith("d") for c in s["cls"]) and "Δ" in s["attrs"]["title"] for s in spans)
    # self-contained: one script (ours), nothing that loads from anywhere
    assert [tag for tag, _ in parsed.tags if tag in ("script", "img", "link", "iframe", "object", "embed")] == ["script"]
    assert not [a for _, attrs in parsed.tags for k, a in attrs.items() if k in ("src", "href")]
    csp = next(a["content"] for tag, a in parsed.tags if tag == "meta" and a.get("http-equiv") == "Content-Security-Policy")
    assert "default-src 'none'" in csp and "script-src 'sha256-" in csp
    # the injection is text in every place it appears (task, tokens, tool table)
    inject = page_of["inject"]
    assert "".join(s["text"] for s in inject["spans"] if "s" in s["cls"]).startswith(INJECTION)
    assert inject["text"].count(INJECTION) >= 3


def test_pieces_join_to_the_decoded_text_for_byte_level_tokens():
    tok = load_asset_tokenizer("qwen3")
    text = "Prix: 12,50 € — 東京タワー 🚀🚀 naïve\n<tool_call>{\"a\": 1}</tool_call><|im_end|>"
    ids = tok(text, add_special_tokens=False)["input_ids"]
    pieces = Decoder(tok).pieces(ids)
    assert len(pieces) == len(ids) and "".join(pieces) == text
    assert "" in pieces  # an emoji spans several byte tokens: the first ones add nothing yet


def test_pieces_keep_the_space_a_sentencepiece_decoder_drops_from_a_first_token():
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    sp = Tokenizer(models.WordLevel({"[UNK]": 0, "▁hello": 1, "▁world": 2, "▁again": 3}, unk_token="[UNK]"))
    sp.pre_tokenizer, sp.decoder = pre_tokenizers.Metaspace(), decoders.Metaspace()
    tok = PreTrainedTokenizerFast(tokenizer_object=sp)
    hello, world, again = tok("hello world again", add_special_tokens=False)["input_ids"]
    assert tok.decode([world, again]) == "world again"  # alone, the first token loses its space
    assert Decoder(tok).pieces([world, again], context=[hello]) == [" world", " again"]


def test_run_folder_samples_round_trip(episodes, tmp_path, capsys):
    _, trajs = episodes
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.json").write_text(json.dumps({"model": {"path": "default"}}))
    RunLog(run, accelerator=None, live=False).samples(3, [t for _, t in trajs[:3]], lambda ids: "")
    assert cli(["view", str(run)]) == 0
    assert "3 episodes" in capsys.readouterr().out
    parsed = parse(run / "view.html")
    assert len(parsed.episodes) == 3 and "step 3 · group 0" in (run / "view.html").read_text()
    assert "trainer" in parsed.episodes[0]["attrs"]["data-flags"]


def test_a_demonstrated_episode_is_labelled_and_its_nan_sampler_logprobs_stay_out_of_the_deltas(episodes, tmp_path, capsys):
    """The default run's guidance logs demonstrations beside samples: NaN sampler log-probs (no
    sampler drew them), trainer log-probs written. The page names them and shows no NaN delta."""
    import copy

    _, trajs = episodes
    plain = trajs[0][1]
    assert plain.samples[0].trainer_logprobs is not None
    demo = copy.deepcopy(plain)
    demo.guided = True
    for smp in demo.samples:
        smp.logprobs = [math.nan] * len(smp.logprobs)
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.json").write_text(json.dumps({"model": {"path": "default"}}))
    RunLog(run, accelerator=None, live=False).samples(1, [plain, demo], lambda ids: "")
    assert cli(["view", str(run)]) == 0
    capsys.readouterr()
    html = (run / "view.html").read_text()
    heads = [e["text"] for e in parse(run / "view.html").episodes]
    assert len(heads) == 2 and html.count(">demonstration</span>") == 1
    assert "max |Δ| nan" not in html and "max |Δ|" in html  # the sampled episode keeps its delta
    assert all("trainer" in e["attrs"]["data-flags"].split() for e in parse(run / "view.html").episodes), "both carry trainer log-probs"


def test_bad_input_gets_one_clear_error(episodes, tmp_path, capsys):
    folder, _ = episodes
    assert cli(["view", str(tmp_path / "nope")]) == 2
    assert "no such file or folder" in capsys.readouterr().err
    assert cli(["view", str(tmp_path)]) == 2
    assert "no samples.jsonl (run folder) or results.jsonl" in capsys.readouterr().err
    bad = tmp_path / "bad.jsonl"
    bad.write_text((folder / "results.jsonl").read_text().splitlines()[0] + "\n{not json\n")
    assert cli(["view", str(bad)]) == 2
    assert f"{bad}:2: not JSON" in capsys.readouterr().err
    old = tmp_path / "old.jsonl"
    old.write_text(json.dumps({"step": 1, "reward": 0, "text": ["hi"], "messages": []}) + "\n")
    assert cli(["view", str(old)]) == 2
    assert "old.jsonl:1: not a trajectory record" in capsys.readouterr().err
    assert cli(["view", str(folder), "colour=red"]) == 2
    assert "unknown option 'colour'" in capsys.readouterr().err


def test_without_a_tokenizer_the_page_shows_ids_and_says_so(episodes, tmp_path, capsys):
    folder, trajs = episodes
    lone = tmp_path / "results.jsonl"
    shutil.copy(folder / "results.jsonl", lone)  # no summary.json next to it: no tokenizer to find
    assert cli(["view", str(lone)]) == 0
    assert "no tokenizer could be loaded" in capsys.readouterr().out
    ep = parse(tmp_path / "results.html").episodes[0]
    first = trajs[0][1].samples[0].completion_ids[0]
    assert [s for s in ep["spans"] if "s" in s["cls"]][0]["text"] == f"[{first}]"


# ---------------------------------------------------------------------------- in the browser


def chromium(url: str, tmp: Path, screenshot: Path | None = None) -> str:
    """The DOM after the page's script ran (and a screenshot), from headless Chromium."""
    if CHROMIUM is None:
        pytest.fail("chromium is not installed: the viewer is tested in a real browser (apt-get install -y chromium)")
    cmd = [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars", f"--user-data-dir={tmp / 'profile'}",
           "--window-size=1200,1400", "--dump-dom"]
    if screenshot is not None:
        cmd.append(f"--screenshot={screenshot}")
    done = subprocess.run([*cmd, url], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout


def decode_png(data: bytes) -> np.ndarray:
    """RGB pixels of an 8-bit, non-interlaced PNG (all five row filters)."""
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    pos, idat, header = 8, [], None
    while pos < len(data):
        (n,) = struct.unpack(">I", data[pos : pos + 4])
        kind, body = data[pos + 4 : pos + 8], data[pos + 8 : pos + 8 + n]
        if kind == b"IHDR":
            header = struct.unpack(">IIBBBBB", body)
        elif kind == b"IDAT":
            idat.append(body)
        pos += 12 + n
    w, h, depth, color, _, _, interlace = header
    assert depth == 8 and color in (2, 6) and interlace == 0, header
    bpp = 3 if color == 2 else 4
    raw = np.frombuffer(zlib.decompress(b"".join(idat)), dtype=np.uint8).reshape(h, 1 + w * bpp)
    out = np.zeros((h, w * bpp), dtype=np.uint8)
    prev = np.zeros(w * bpp, dtype=np.uint8)
    for y in range(h):
        f, line = raw[y, 0], raw[y, 1:]
        if f == 0:
            row = line.copy()
        elif f == 1:
            row = np.cumsum(line.reshape(w, bpp), axis=0, dtype=np.uint8).reshape(-1)
        elif f == 2:
            row = line + prev
        else:  # average and Paeth depend on the pixel to the left: byte by byte
            cur, up = line.tolist(), prev.tolist()
            for i in range(len(cur)):
                a = cur[i - bpp] if i >= bpp else 0
                b = up[i]
                if f == 3:
                    cur[i] = (cur[i] + ((a + b) >> 1)) & 255
                else:
                    c = up[i - bpp] if i >= bpp else 0
                    p = a + b - c
                    pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
                    cur[i] = (cur[i] + (a if pa <= pb and pa <= pc else b if pb <= pc else c)) & 255
            row = np.array(cur, dtype=np.uint8)
        out[y] = prev = row
    return out.reshape(h, w, bpp)[:, :, :3]


def share(img: np.ndarray, rgb: tuple[int, int, int]) -> float:
    return float(np.all(img == rgb, axis=2).mean())


def test_in_chromium_tokens_render_filters_work_and_injection_is_inert(episodes, page, tmp_path):
    _, trajs = episodes
    n = len(trajs)
    shot = tmp_path / "open.png"
    dom = chromium(page.as_uri() + "#open=all", tmp_path, shot)
    assert 'data-ready="1"' in dom and f"showing {n} of {n} episodes" in dom
    img = decode_png(shot.read_bytes())
    trained, env = share(img, TRAINED_RGB), share(img, ENV_RGB)
    assert trained > 0.008 and env > 0.004, (trained, env)  # token highlights fill part of the screen (1.7%, 0.9% seen)
    assert share(img, (255, 255, 255)) < 0.9  # not a blank page
    # the injected markup is text: nothing ran, no element was created
    assert "pwned" not in dom.split("<body", 1)[1].split(">", 1)[0]
    assert dom.count("<script") == 1 and "&lt;/script&gt;&lt;script&gt;document.body.dataset.pwned" in dom
    assert "<img" not in dom

    # a filter from the address: only the failed episode, which has no tokens; the highlight colour goes
    shot = tmp_path / "failed.png"
    dom = chromium(page.as_uri() + "#only=error&open=all", tmp_path, shot)
    shown = [name for (name, _), e in zip(trajs, parse(dom).episodes) if "hidden" not in e["attrs"]]
    assert shown == ["failed"] and f"showing 1 of {n} episodes" in dom
    assert share(decode_png(shot.read_bytes()), TRAINED_RGB) < trained / 8  # only the legend's swatch is left (1/21 seen)


def test_training_run_records_trainer_logprobs_that_match_the_sampler(tmp_path, capsys):
    """A real one-step run: samples.jsonl carries the trainer's logprobs, aligned with the sampler's."""
    from agentrl.core.overrides import build, parse_overrides
    from agentrl.train.config import TrainConfig
    from agentrl.train.trainer import Trainer

    overrides = ["max_steps=1", "prompts_per_step=2", "num_generations=2", "samples_per_log=2", "rollout.max_tokens_per_turn=32",
                 "rollout.max_completion_tokens=96", "save_final=false", f"output_dir={tmp_path}"]
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        Trainer(build(TrainConfig, parse_overrides(overrides))).train()
    finally:
        torch.set_num_threads(threads)
    capsys.readouterr()
    assert cli(["view", str(tmp_path)]) == 0
    assert "tokenizer of default" in capsys.readouterr().out  # found through the run's config.json
    def strict(name: str) -> None:
        raise ValueError(f"samples.jsonl holds {name}, which is not JSON")

    rows = [json.loads(line, parse_constant=strict) for line in (tmp_path / "samples.jsonl").read_text().splitlines()]
    assert len(rows) == 2
    sampled = [r for r in rows if not r["guided"]]  # the default run's guidance: demonstrations have no sampler log-probs
    assert sampled, "the first logged episodes include a sampled one"
    gaps = [abs(t - s) for r in sampled for smp in r["samples"] for t, s, m in zip(smp["trainer_logprobs"], smp["logprobs"], smp["loss_mask"]) if m]
    assert gaps and max(gaps) < 1e-4, max(gaps)  # same weights, same temperature, fp32: only float noise
    for r in rows:
        if r["guided"]:  # null where no sampler drew the token; the trainer's log-probs are still written
            assert all(x is None for smp in r["samples"] for x, m in zip(smp["logprobs"], smp["loss_mask"]) if m)
            assert all(math.isfinite(x) for smp in r["samples"] for x, m in zip(smp["trainer_logprobs"], smp["loss_mask"]) if m)
    parsed = parse(tmp_path / "view.html")
    assert all("trainer" in e["attrs"]["data-flags"].split() for e in parsed.episodes)
    assert "step 1 · group 0" in (tmp_path / "view.html").read_text()

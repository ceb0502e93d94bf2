"""search: multi-hop questions answered from a local corpus through ``search`` and ``open`` tools.

The corpus is generated from a seed: fictional people, companies and cities, one short article each,
so no model can know the answers beforehand and nothing is downloaded. Every question takes two hops:
it names one entity (a company or a person) and asks about another that only that entity's article
names ("In which city was the founder of Brimwell Tools born?"). The article of the named entity
does not hold the answer and the answer's article does not mention the named entity, so the model
must search, open, search again and open again. Retrieval is BM25 (``rank_bm25``, the optional
``search`` extra) over title and text.

Splits: train and test questions are drawn from one shuffled pool by seed and never share a
question. Reward: 1 for the exact answer (case and punctuation ignored) after "The answer is".
"""

from __future__ import annotations

import random
import re
from functools import cached_property
from typing import Any

from datasets import Dataset

from agentrl.env.environment import Reward, ToolEnvironment
from agentrl.env.tool import Tool, ToolError

SPLIT_SEED = 31
SYSTEM_PROMPT = (
    "Answer the question using the search tool (returns article ids and titles) and the open tool (returns an "
    "article's text). Questions need more than one article. End with 'The answer is X.'"
)
_ONSETS = ["b", "br", "c", "d", "dr", "f", "g", "gr", "h", "k", "l", "m", "n", "p", "qu", "r", "s", "st", "t", "th", "v", "w", "z"]
_VOWELS = ["a", "e", "i", "o", "u", "ai", "ea", "io", "ou"]
_CODAS = ["", "n", "r", "l", "s", "th", "m", "x", "nd", "rk"]
PROFESSIONS = ["engineer", "chemist", "painter", "architect", "economist", "botanist", "surgeon", "novelist"]
INDUSTRIES = ["Tools", "Foods", "Textiles", "Robotics", "Shipping", "Pharma", "Optics", "Energy"]
COUNTRIES = ["Velmora", "Oskaria", "Trelund", "Quessa", "Dunravia", "Pellandor"]
ANSWER_RE = re.compile(r"answer is\s*:?\s*(.+?)\s*(?:\.\s*)?$", re.IGNORECASE | re.DOTALL)


def _word(rng: random.Random, syllables: int) -> str:
    return "".join(rng.choice(_ONSETS) + rng.choice(_VOWELS) + rng.choice(_CODAS) for _ in range(syllables)).capitalize()


def _unique(rng: random.Random, seen: set[str], make: Any) -> str:
    while True:
        name = make()
        if name not in seen and name.lower() not in {s.lower() for s in seen}:
            seen.add(name)
            return name


def build_corpus(seed: int = 0, people: int = 240, companies: int = 120, cities: int = 40) -> tuple[list[dict[str, Any]], dict[str, dict[str, Any]]]:
    """Articles (id, title, text) and the facts behind them, keyed by entity name."""
    rng = random.Random(seed)
    seen: set[str] = set()
    facts: dict[str, dict[str, Any]] = {}
    city_names = [_unique(rng, seen, lambda: _word(rng, 2)) for _ in range(cities)]
    rivers = [_unique(rng, seen, lambda: _word(rng, 2)) + " River" for _ in range(cities)]
    for name, river in zip(city_names, rivers):
        facts[name] = {"kind": "city", "country": rng.choice(COUNTRIES), "river": river, "population": rng.randint(20, 900) * 1000}
    person_names = [_unique(rng, seen, lambda: f"{_word(rng, 1)} {_word(rng, 2)}") for _ in range(people)]
    for name in person_names:
        facts[name] = {"kind": "person", "city": rng.choice(city_names), "year": rng.randint(1890, 1990), "profession": rng.choice(PROFESSIONS)}
    company_names = [_unique(rng, seen, lambda: f"{_word(rng, 2)} {rng.choice(INDUSTRIES)}") for _ in range(companies)]
    founders = rng.sample(person_names, companies)
    for name, founder in zip(company_names, founders):
        facts[name] = {"kind": "company", "founder": founder, "city": rng.choice(city_names), "year": facts[founder]["year"] + rng.randint(20, 45)}
    docs = []
    for name, f in facts.items():
        if f["kind"] == "city":
            text = f"{name} is a city in {f['country']} with about {f['population']:,} inhabitants. The {f['river']} flows through {name}."
        elif f["kind"] == "person":
            text = f"{name} is a {f['profession']} born in {f['year']} in the city of {f['city']}."
        else:
            text = f"{name} is a company founded in {f['year']} by {f['founder']}. Its headquarters are in {f['city']}."
        docs.append({"id": f"doc{len(docs):04d}", "title": name, "text": text})
    return docs, facts


def make_questions(facts: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    """Every two-hop question the corpus supports, with its answer and the two articles it needs."""
    out = []
    for name, f in facts.items():
        if f["kind"] == "company":
            founder, hq = f["founder"], f["city"]
            out.append({"question": f"In which city was the founder of {name} born?", "answer": facts[founder]["city"], "hops": [name, founder]})
            out.append({"question": f"In what year was the founder of {name} born?", "answer": str(facts[founder]["year"]), "hops": [name, founder]})
            out.append({"question": f"Which river flows through the city where {name} has its headquarters?", "answer": facts[hq]["river"], "hops": [name, hq]})
        elif f["kind"] == "person":
            out.append({"question": f"In which country was {name} born?", "answer": facts[f["city"]]["country"], "hops": [name, f["city"]]})
    return out


def normalize(text: str) -> str:
    return re.sub(r"[^a-z0-9 ]", "", text.lower()).strip()


def exact_answer(completion: str, answer: str) -> float:
    """1.0 when the text after "The answer is" equals the answer (case and punctuation ignored)."""
    match = ANSWER_RE.search(completion or "")
    found = match.group(1) if match else ""
    return float(normalize(found) == normalize(answer) and bool(found))


class Corpus:
    """BM25 over the articles (title + text)."""

    def __init__(self, docs: list[dict[str, Any]]) -> None:
        try:
            from rank_bm25 import BM25Okapi
        except ImportError as exc:
            raise ImportError("the search environment needs rank_bm25: pip install 'agentrl[search]'") from exc
        self.docs = docs
        self.by_id = {d["id"]: d for d in docs}
        self.index = BM25Okapi([_tokens(d["title"] + " " + d["text"]) for d in docs])

    def search(self, query: str, k: int) -> list[dict[str, Any]]:
        scores = self.index.get_scores(_tokens(query))
        order = sorted(range(len(self.docs)), key=lambda i: -scores[i])[:k]
        return [self.docs[i] for i in order if scores[i] > 0]


def _tokens(text: str) -> list[str]:
    return re.findall(r"[a-z0-9]+", text.lower())


class Search(Tool):
    name = "search"
    shared = ("corpus",)  # read-only index, built once
    timeout = 10.0

    def __init__(self, corpus: Corpus, k: int = 5) -> None:
        self.corpus, self.k = corpus, k

    def run(self, query: str) -> str:
        """Search the articles and list the best matches as "id: title".

        Args:
            query: Words to look for, e.g. a name.
        """
        if not query.strip():
            raise ToolError("the query is empty")
        hits = self.corpus.search(query, self.k)
        return "\n".join(f"{d['id']}: {d['title']}" for d in hits) or "No results."


class Open(Tool):
    name = "open"
    shared = ("corpus",)
    timeout = 10.0

    def __init__(self, corpus: Corpus) -> None:
        self.corpus = corpus

    def run(self, doc_id: str) -> str:
        """Show the text of an article.

        Args:
            doc_id: An article id from search results, e.g. "doc0042".
        """
        doc = self.corpus.by_id.get(doc_id.strip())
        if doc is None:
            raise ToolError(f"no article {doc_id!r}; use an id from the search results")
        return f"{doc['title']}\n{doc['text']}"


class SearchEnv(ToolEnvironment):
    """Two-hop questions over a generated corpus, with BM25 ``search`` and ``open`` tools.

    Args:
        num_test: test questions (the rest of the pool is train).
        seed: corpus and split seed.
        k: results per search.
        max_turns: assistant turns before the episode is truncated.
    """

    accuracy_reward = "correct"

    system_prompt = SYSTEM_PROMPT
    shared = ("corpus", "facts", "_pool")  # the read-only corpus and question pool, built once

    def __init__(self, num_test: int = 100, seed: int = 0, k: int = 5, max_turns: int = 8) -> None:
        if not isinstance(k, int) or k < 1:
            raise ValueError(f"search k (results per query) must be a whole number of at least 1, got {k!r}")
        docs, facts = build_corpus(seed)
        self.corpus = Corpus(docs)
        self.facts = facts
        super().__init__(tools=[Search(self.corpus, k), Open(self.corpus)], rewards=[Reward(exact_answer, name="correct")], max_turns=max_turns)
        self.num_test, self.seed, self.k = num_test, seed, k

    @cached_property
    def _pool(self) -> list[dict[str, Any]]:
        # Drop the few questions whose answer a single search for the question text already shows.
        pool = [q for q in make_questions(self.facts) if not self._one_search_shows(q)]
        random.Random(SPLIT_SEED + 1000 * self.seed).shuffle(pool)
        return pool

    def _one_search_shows(self, q: dict[str, Any]) -> bool:
        hits = self.corpus.search(q["question"], self.k)
        return any(normalize(q["answer"]) in normalize(d["title"] + " " + d["text"]) for d in hits)

    def load_dataset(self, split: str) -> Dataset:
        if split not in ("train", "test"):
            raise KeyError(f"search has splits ['test', 'train'], not {split!r}")
        rows = self._pool[: self.num_test] if split == "test" else self._pool[self.num_test :]
        return Dataset.from_list(rows)

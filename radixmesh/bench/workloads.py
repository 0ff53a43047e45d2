"""The four workloads, each a pure function of (params, seed, tokenizer).

- ``handbook``: one long document; readers ask short questions; some ask a
  follow-up in their own conversation; one reader forks analyses of one section
  and then combines them.
- ``multi-doc``: several documents x several questions, interleaved, more
  document tokens in total than one worker's KV cache holds by default.
- ``multi-turn``: chat sessions growing turn by turn.
- ``tiered-docs``: documents asked over and over, in a cycle (which defeats LRU)
  or by Zipf popularity, whose working set is several times a worker's KV pool
  (run with a small ``--kv-slots``): what memory tiers are for;
  ``tiered-docs-zipf`` is the same documents (same seed) asked by Zipf popularity.
- ``random``: no sharing at all (the control);
- ``pd-mix`` (pd_mix.py): decoding streams while long documents keep arriving.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Callable

import numpy as np

from .pd_mix import QUICK as PD_MIX_QUICK
from .pd_mix import PDMixParams, build_pd_mix
from .text import DEPARTMENTS, ROLES, TextGen, fit_tokens, handbook
from .tokens import ChatTokenizer, common_prefix, ideal_hit_rate
from .workload import Answer, Message, RequestSpec, Workload

INSTRUCTIONS = ("You answer questions about the document below. Use only what it says and "
                "keep answers short.\n\n")
ASPECTS = (
    "List every obligation that section {n} ('{title}') creates, one per line.",
    "What is ambiguous or risky in section {n} ('{title}')? Name two problems.",
    "Explain section {n} ('{title}') to a new colleague in two sentences.",
    "Which departments does section {n} ('{title}') involve, and how?",
)


@dataclass(frozen=True)
class HandbookParams:
    doc_tokens: int = 1500
    readers: int = 24
    question_tokens: int = 40
    follow_up_every: int = 3  # reader i asks a follow-up when i % follow_up_every == 0
    analyses: int = 3
    max_tokens: int = 64


@dataclass(frozen=True)
class MultiDocParams:
    docs: int = 12  # 12 x 1500 tokens > the 16384 KV slots of a bench-started worker
    doc_tokens: int = 1500
    questions_per_doc: int = 4
    question_tokens: int = 40
    max_tokens: int = 48


@dataclass(frozen=True)
class TieredDocsParams:
    docs: int = 16  # 16 x 1500 tokens: ~3x a device pool of --kv-slots 8192
    doc_tokens: int = 1500
    requests: int = 48
    zipf_x100: int = 0  # 0: cyclic order; else Zipf popularity with exponent zipf_x100 / 100
    question_tokens: int = 40
    max_tokens: int = 16


@dataclass(frozen=True)
class ZipfDocsParams(TieredDocsParams):
    zipf_x100: int = 110  # popularity ~ 1 / rank^1.1


@dataclass(frozen=True)
class MultiTurnParams:
    sessions: int = 8
    turns: int = 4
    context_tokens: int = 300
    turn_tokens: int = 40
    max_tokens: int = 48


@dataclass(frozen=True)
class RandomParams:
    requests: int = 32
    min_prompt_tokens: int = 100
    max_prompt_tokens: int = 1000
    max_tokens: int = 64


def _question(gen: TextGen, tok: ChatTokenizer, target: int, section: str | None = None) -> str:
    """A question of about ``target`` tokens: context sentences, then the question."""
    text = gen.question(section)
    while tok.count(text) < target - 8:
        text = f"{gen.preamble()} {text}"
    return text


def _info(tok: ChatTokenizer, requests: list[RequestSpec], **facts) -> dict:
    roots = [tok.prompt_ids(s.render({})) for s in requests if not s.depends_on]
    lengths = [len(r) for r in roots]
    shared = min((common_prefix(roots[0], r) for r in roots[1:]), default=0)
    return dict(facts, requests=len(requests), root_requests=len(roots),
                root_common_prefix_tokens=shared,
                root_prompt_tokens_mean=float(np.mean(lengths)) if lengths else 0.0,
                root_prompt_tokens_total=int(sum(lengths)),
                root_ideal_hit_rate=round(ideal_hit_rate(roots), 4))


def build_handbook(p: HandbookParams, seed: int, tok: ChatTokenizer) -> Workload:
    gen = TextGen(np.random.default_rng(seed))
    doc, titles = handbook(gen, tok.count, p.doc_tokens)
    system = Message.text("system", INSTRUCTIONS + doc)
    readers: list[RequestSpec] = []
    follow_ups: list[RequestSpec] = []
    for i in range(p.readers):
        title = titles[int(gen.rng.integers(len(titles)))]
        ask = Message.text("user", _question(gen, tok, p.question_tokens, title))
        readers.append(RequestSpec(f"reader{i}", "question", (system, ask), p.max_tokens))
        if i % p.follow_up_every == 0:
            more = f"Thanks. What would that mean for a {gen.pick(ROLES)} in " \
                   f"{gen.pick(DEPARTMENTS)}? Give one concrete example."
            follow_ups.append(RequestSpec(
                f"reader{i}-followup", "follow_up",
                (system, ask, Message("assistant", (Answer(f"reader{i}"),)),
                 Message.text("user", more)), p.max_tokens))
    n = int(gen.rng.integers(len(titles)))
    analyses = [RequestSpec(f"analyst-{k}", "analysis", (system, Message.text(
        "user", ASPECTS[k % len(ASPECTS)].format(n=n + 1, title=titles[n]))), p.max_tokens)
        for k in range(p.analyses)]
    parts: list = [f"Here are {p.analyses} analyses of section {n + 1} ('{titles[n]}').\n\n"]
    for k, spec in enumerate(analyses):
        parts += [f"Analysis {k + 1}:\n", Answer(spec.id), "\n\n"]
    parts.append("Combine them into one short briefing for the team.")
    combine = RequestSpec("analyst-combine", "combine", (system, Message("user", tuple(parts))),
                          p.max_tokens)
    half = len(readers) // 2
    requests = readers[:half] + analyses + readers[half:] + follow_ups + [combine]
    return Workload("handbook", requests, dataclasses.asdict(p),
                    _info(tok, requests, doc_tokens=tok.count(doc)))


def build_multi_doc(p: MultiDocParams, seed: int, tok: ChatTokenizer) -> Workload:
    gen = TextGen(np.random.default_rng(seed))
    systems, titles = _documents(gen, tok, p.docs, p.doc_tokens)
    requests = []
    for q in range(p.questions_per_doc):
        for d in gen.rng.permutation(p.docs):
            section = gen.pick(tuple(titles[d]))
            ask = Message.text("user", _question(gen, tok, p.question_tokens, section))
            requests.append(RequestSpec(f"doc{d}-q{q}", "question", (systems[d], ask),
                                        p.max_tokens))
    doc_tokens = [tok.count(s.parts[0]) for s in systems]
    return Workload("multi-doc", requests, dataclasses.asdict(p), _info(
        tok, requests, doc_tokens_total=int(sum(doc_tokens))))


def access_order(docs: int, requests: int, zipf_x100: int, rng: np.random.Generator) -> np.ndarray:
    """Which document each request asks: a cycle (``zipf_x100`` 0), else drawn from Zipf
    popularity with exponent ``zipf_x100 / 100`` (document 0 the most popular)."""
    if not zipf_x100:
        return np.arange(requests) % docs
    weights = 1.0 / np.arange(1, docs + 1) ** (zipf_x100 / 100)
    return rng.choice(docs, size=requests, p=weights / weights.sum())


def build_tiered_docs(p: TieredDocsParams, seed: int, tok: ChatTokenizer) -> Workload:
    gen = TextGen(np.random.default_rng(seed))
    systems, titles = _documents(gen, tok, p.docs, p.doc_tokens)
    order = access_order(p.docs, p.requests, p.zipf_x100, gen.rng)
    requests = []
    for i, d in enumerate(order.tolist()):
        ask = Message.text("user", _question(gen, tok, p.question_tokens, gen.pick(tuple(titles[d]))))
        requests.append(RequestSpec(f"doc{d}-r{i}", "question", (systems[d], ask), p.max_tokens))
    asked = sorted(set(order.tolist()))
    return Workload("tiered-docs-zipf" if p.zipf_x100 else "tiered-docs", requests, dataclasses.asdict(p), _info(
        tok, requests, doc_tokens_total=int(sum(tok.count(s.parts[0]) for s in systems)),
        docs_asked=len(asked), asked_doc_tokens=int(sum(tok.count(systems[d].parts[0]) for d in asked))))


def _documents(gen: TextGen, tok: ChatTokenizer, count: int, tokens: int):
    """``count`` different handbooks as system messages, and their section titles."""
    systems, titles = [], []
    for d in range(count):
        doc, sections = handbook(gen, tok.count, tokens)
        doc = doc.replace("# Employee Handbook", f"# Handbook of site {d + 1}", 1)
        systems.append(Message.text("system", INSTRUCTIONS + doc))
        titles.append(sections)
    return systems, titles


def build_multi_turn(p: MultiTurnParams, seed: int, tok: ChatTokenizer) -> Workload:
    gen = TextGen(np.random.default_rng(seed))
    history: list[tuple[Message, ...]] = []
    requests: list[RequestSpec] = []
    for s in range(p.sessions):
        notes = fit_tokens(lambda: gen.paragraph(3), tok.count, p.context_tokens, sep="\n\n",
                           head="Here are my notes from this week:")
        first = Message.text("user", f"{notes}\n\n{_question(gen, tok, p.turn_tokens)}")
        history.append((first,))
        requests.append(RequestSpec(f"s{s}-t0", "turn", (first,), p.max_tokens))
    for t in range(1, p.turns):
        for s in range(p.sessions):
            ask = Message.text("user", _question(gen, tok, p.turn_tokens))
            history[s] = history[s] + (Message("assistant", (Answer(f"s{s}-t{t - 1}"),)), ask)
            requests.append(RequestSpec(f"s{s}-t{t}", "turn", history[s], p.max_tokens))
    return Workload("multi-turn", requests, dataclasses.asdict(p), _info(tok, requests))


def build_random(p: RandomParams, seed: int, tok: ChatTokenizer) -> Workload:
    gen = TextGen(np.random.default_rng(seed))
    requests = []
    for i in range(p.requests):
        target = int(gen.rng.integers(p.min_prompt_tokens, p.max_prompt_tokens + 1))
        # NOTE: a random hex opening makes prompts diverge right after the template header.
        tag = "".join(gen.rng.choice(list("0123456789abcdef"), 8))
        system = Message.text("system", f"{tag} is the reference of this conversation.")
        body = fit_tokens(gen.sentence, tok.count, target)
        requests.append(RequestSpec(f"random{i}", "random",
                                    (system, Message.text("user", body)), p.max_tokens))
    return Workload("random", requests, dataclasses.asdict(p), _info(tok, requests))


@dataclass(frozen=True)
class WorkloadKind:
    params: type
    quick: object
    build: Callable


WORKLOADS: dict[str, WorkloadKind] = {
    "handbook": WorkloadKind(HandbookParams, HandbookParams(
        doc_tokens=400, readers=4, max_tokens=16), build_handbook),
    "multi-doc": WorkloadKind(MultiDocParams, MultiDocParams(
        docs=3, doc_tokens=400, questions_per_doc=3, max_tokens=16), build_multi_doc),
    "multi-turn": WorkloadKind(MultiTurnParams, MultiTurnParams(
        sessions=3, turns=3, context_tokens=200, max_tokens=16), build_multi_turn),
    "tiered-docs": WorkloadKind(TieredDocsParams, TieredDocsParams(
        docs=4, doc_tokens=300, requests=8, max_tokens=8), build_tiered_docs),
    "tiered-docs-zipf": WorkloadKind(ZipfDocsParams, ZipfDocsParams(
        docs=4, doc_tokens=300, requests=8, max_tokens=8), build_tiered_docs),
    "random": WorkloadKind(RandomParams, RandomParams(
        requests=10, min_prompt_tokens=100, max_prompt_tokens=600, max_tokens=16), build_random),
    "pd-mix": WorkloadKind(PDMixParams, PD_MIX_QUICK, build_pd_mix),
}


def build_workload(name: str, tok: ChatTokenizer, seed: int = 0, quick: bool = False,
                   overrides: dict[str, str] | None = None) -> Workload:
    """Build workload ``name``; ``overrides`` (field -> value text) replace its params."""
    if name not in WORKLOADS:
        raise ValueError(f"unknown workload {name!r}; choose from {sorted(WORKLOADS)}")
    kind = WORKLOADS[name]
    params = kind.quick if quick else kind.params()
    fields = {f.name: f for f in dataclasses.fields(params)}
    changes = {}
    for key, value in (overrides or {}).items():
        key = key.replace("-", "_")
        if key not in fields:
            raise ValueError(f"workload {name} has no parameter {key!r}; it has {sorted(fields)}")
        try:
            changes[key] = int(value)
        except ValueError:
            raise ValueError(f"parameter {key} must be an integer, got {value!r}") from None
        if changes[key] <= 0:
            raise ValueError(f"parameter {key} must be positive, got {value!r}")
    return kind.build(dataclasses.replace(params, **changes), seed, tok)

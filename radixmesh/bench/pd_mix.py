"""``pd-mix``: steady decoding streams while long documents keep arriving.

What prefill/decode disaggregation is for: ``streams`` lanes each send a short
prompt with a long output, then the next one as soon as it finished (a closed
loop, so that many streams are always decoding); meanwhile a distinct long
document with a short answer arrives every ``doc_gap_ms`` (an open loop, the
same schedule for every system). Request kinds ``stream`` and ``document``
keep the two classes apart in the report: the streams' TPOT is what long
prefills stall, the documents' TTFT is what they cost.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np

from .text import TextGen, fit_tokens, handbook
from .tokens import ChatTokenizer
from .workload import Message, RequestSpec, Workload

STREAM = "stream"
DOCUMENT = "document"
STREAM_ASK = "Continue this story in detail, for as long as you can."
DOC_ASK = "In one short phrase: what is this document about?"


@dataclass(frozen=True)
class PDMixParams:
    streams: int = 4  # decoding streams in flight (lanes)
    stream_rounds: int = 2  # streams per lane, one after the other
    stream_prompt_tokens: int = 48
    stream_tokens: int = 128
    stream_stagger_ms: int = 700  # lane i starts at i x this
    docs: int = 12  # arriving over about as long as the streams decode (on 2 CPU cores)
    doc_tokens: int = 1400  # ~1,500 with the template and the question
    doc_out_tokens: int = 4
    doc_start_ms: int = 2000  # the first document arrives then, the next every doc_gap_ms
    doc_gap_ms: int = 6000


QUICK = PDMixParams(streams=2, stream_rounds=1, stream_prompt_tokens=32, stream_tokens=16,
                    stream_stagger_ms=200, docs=2, doc_tokens=300, doc_out_tokens=2,
                    doc_start_ms=300, doc_gap_ms=1000)


def _tag(gen: TextGen) -> str:
    """A random opening: prompts diverge right after the template header."""
    return "".join(gen.rng.choice(list("0123456789abcdef"), 8))


def _streams(p: PDMixParams, gen: TextGen, tok: ChatTokenizer) -> list[RequestSpec]:
    specs = []
    for r in range(p.stream_rounds):
        for lane in range(p.streams):
            story = fit_tokens(gen.sentence, tok.count, p.stream_prompt_tokens)
            ask = Message.text("user", f"Story {_tag(gen)}: {story}\n\n{STREAM_ASK}")
            after = (f"stream{lane}-r{r - 1}",) if r else ()
            arrive = None if r else lane * p.stream_stagger_ms / 1000
            specs.append(RequestSpec(f"stream{lane}-r{r}", STREAM, (ask,), p.stream_tokens,
                                     after=after, arrive_s=arrive))
    return specs


def _documents(p: PDMixParams, gen: TextGen, tok: ChatTokenizer) -> list[RequestSpec]:
    specs = []
    for d in range(p.docs):
        doc, _ = handbook(gen, tok.count, p.doc_tokens)
        system = Message.text("system", f"Reference {_tag(gen)}.\n\n{doc}")
        arrive = (p.doc_start_ms + d * p.doc_gap_ms) / 1000
        specs.append(RequestSpec(f"doc{d}", DOCUMENT, (system, Message.text("user", DOC_ASK)),
                                 p.doc_out_tokens, arrive_s=arrive))
    return specs


def build_pd_mix(p: PDMixParams, seed: int, tok: ChatTokenizer) -> Workload:
    gen = TextGen(np.random.default_rng(seed))
    streams, docs = _streams(p, gen, tok), _documents(p, gen, tok)
    lengths = {kind: [len(tok.prompt_ids(s.render({}))) for s in specs]
               for kind, specs in ((STREAM, streams), (DOCUMENT, docs))}
    info = dict(requests=len(streams) + len(docs), streams=len(streams), documents=len(docs),
                stream_prompt_tokens_mean=float(np.mean(lengths[STREAM])),
                doc_prompt_tokens_mean=float(np.mean(lengths[DOCUMENT])) if docs else 0.0,
                last_doc_arrival_s=docs[-1].arrive_s if docs else 0.0)
    return Workload("pd-mix", streams + docs, dataclasses.asdict(p), info)

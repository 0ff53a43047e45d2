"""The routing decision: score every live worker, pick one, book the request there."""

from __future__ import annotations

import logging
from typing import NamedTuple

from libs.protocol import errors
from libs.protocol.hashing import block_hashes
from libs.protocol.messages import RouteRequest

from .policies import (DECODE_HORIZON_TOKENS, POLICIES, Candidate, DecodePrior, computed, decode_cost,
                       pair_score, prefills_locally_instead, prefills_remotely, score)
from .prefix_index import PrefixIndex, prompt_hashes
from .registry import Booking, Registry
from .store_pages import StorePages

log = logging.getLogger("cache_index.router")

KEY_TOKENS = 64  # prefix_hash keys on the first pages of the prompt


class Decision(NamedTuple):
    chosen: Candidate
    candidates: list[Candidate]
    prefill: Candidate | None = None  # a decode worker's prefill peer (None: it prefills itself)
    bookings: tuple[tuple[str, Booking], ...] = ()  # (worker, booking) made: for the peer replicas

    def attributes(self, policy: str) -> dict[str, object]:
        """Span attributes: the winner, the policy and every candidate, as parallel arrays."""
        c = self.candidates
        return {
            "radixmesh.route.policy": policy,
            "radixmesh.route.worker": self.chosen.worker_id,
            "radixmesh.route.candidates": [x.worker_id for x in c],
            "radixmesh.route.cached_tokens": [x.cached for x in c],
            "radixmesh.route.host_tokens": [x.cached_host for x in c],
            "radixmesh.route.store_tokens": [x.cached_store for x in c],
            "radixmesh.route.load": [x.load for x in c],
            "radixmesh.route.queued_tokens": [x.queued_tokens for x in c],
            "radixmesh.route.decode_s": [x.decode_s for x in c],
            "radixmesh.route.score": [x.score for x in c],
            "radixmesh.route.prefill_worker": self.prefill.worker_id if self.prefill else "",
        }


class Router:
    def __init__(self, registry: Registry, index: PrefixIndex, policy: str,
                 store: StorePages | None = None, local_prefill_factor: float = 0.0) -> None:
        if policy not in POLICIES:
            raise ValueError(f"unknown policy {policy!r}; choose from {sorted(POLICIES)}")
        self.registry = registry
        self.index = index
        self.policy_name = policy
        self.policy = POLICIES[policy]()
        self.store = store  # pages in the shared store (L3), from a watch on its bucket
        # a decode worker prefills a prompt itself when the pair's first token would come more than
        # this many times later than its own (a backlogged prefill side); 0: never
        self.local_prefill_factor = local_prefill_factor

    def route(self, req: RouteRequest) -> Decision:
        """The worker that serves ``req``: a colocated or decode worker (a prefill-only
        worker only when no other is live), weighing the decode load it adds there; a
        decode worker gets a prefill peer of the same KV layout, picked by the same
        policy over the prefill workers (which do not decode it), unless it would
        prefill the request itself (``local_prefill``): then it is scored so. The
        choice is booked (``Decision.bookings``) unless ``req.dry_run``."""
        if req.num_tokens <= 0:
            raise errors.invalid_request("num_tokens must be positive")
        states = [s for s in self.registry.live(req.model)
                  if s.report.worker_id not in req.exclude]
        if not states:
            raise errors.unavailable(f"no live worker serves model {req.model!r}")
        hashes: dict[int, list[int]] = {}
        serving = [s for s in states if s.report.role != "prefill"] or states
        cands = self._candidates(serving, req, hashes, min(req.max_new_tokens, DECODE_HORIZON_TOKENS))
        peers = {} if req.local_prefill else self._peers(cands, states, req, hashes)
        chosen = self._pick(cands, req, hashes)
        prefill = None
        if peers.get(chosen.worker_id):
            prefill = self._pick(peers[chosen.worker_id], req, hashes)
        picked = [] if req.dry_run else [c for c in (chosen, prefill) if c is not None]
        booked = [self._book(c, req, hashes) for c in picked]
        return Decision(chosen, cands, prefill, tuple(b for b in booked if b[1] is not None))

    def _peers(self, cands: list[Candidate], states, req: RouteRequest,
               hashes: dict[int, list[int]]) -> dict[str, list[Candidate]]:
        """Each decode candidate's prefill peers (same KV layout), scored; one that will
        leave the prompt to them is rescored as the pair with the best (``pair_score``),
        unless that pair's first token comes ``local_prefill_factor`` times later than its
        own prefill's (the peers' queues are long): then it keeps its own score and gets
        no peer."""
        decoders = [c for c in cands if c.state.report.role == "decode"]
        prefillers = [s for s in states if s.report.role == "prefill"]
        if not decoders or not prefillers:
            return {}
        scored = self._candidates(prefillers, req, hashes)
        peers = {}
        for c in decoders:
            same = [p for p in scored if p.state.report.kv_layout == c.state.report.kv_layout]
            peers[c.worker_id] = same
            if not same or not prefills_remotely(c, req.num_tokens):
                continue
            best = min(same, key=lambda p: p.score)
            if self.local_prefill_factor and prefills_locally_instead(c, best, req.num_tokens,
                                                                     self.local_prefill_factor):
                peers[c.worker_id] = []  # NOTE: it prefills the prompt itself (scored so)
                log.debug("route %s: %s prefills it, not %s (queued %d tokens)",
                          req.rid, c.worker_id, best.worker_id, best.queued_tokens)
            else:
                c.score = pair_score(c, best, req.num_tokens)
        return peers

    def _candidates(self, states, req: RouteRequest, hashes: dict[int, list[int]],
                    out_tokens: int = 0) -> list[Candidate]:
        """Every worker in ``states`` scored for ``req``; ``out_tokens``: the steps of
        decode load weighed (0: none, a prefill peer's)."""
        now = self.registry.clock()
        prior = DecodePrior.of(s.report for s in states)
        cands = []
        for state in states:
            wid = state.report.worker_id
            page = self.index.page_size(wid)
            if page not in hashes:
                hashes[page] = prompt_hashes(req.input_ids, req.cache_salt, page)
            booked = state.live_bookings(now)
            unreported = state.unreported(now)
            device, host = self.index.cached_split(wid, hashes[page], [b.hashes for b in booked])
            stored = 0
            if self.store is not None and state.report.store_prefix:
                rest = hashes[page][(device + host) // page:]
                stored = self.store.leading(state.report.store_prefix, rest) * page
            cand = Candidate(
                state=state, cached=device, cached_host=host, cached_store=stored,
                load=len(unreported) + state.report.running + state.report.waiting,
                queued_tokens=state.report.queued_prefill_tokens
                + sum(b.tokens for b in unreported),
            )
            if out_tokens:  # NOTE: where it will decode: room for the prompt's tail and the output
                room = state.report.free_slots - sum(b.tokens for b in unreported)
                cand.fits = room >= computed(cand, req.num_tokens) + out_tokens
                cand.decode_s = decode_cost(cand, out_tokens, prior)
            cand.score = score(cand, req.num_tokens)
            cands.append(cand)
        return cands

    def _pick(self, cands: list[Candidate], req: RouteRequest, hashes: dict[int, list[int]]) -> Candidate:
        chosen = self.policy(cands, req.num_tokens, self._key(req))
        if log.isEnabledFor(logging.DEBUG):
            log.debug("route %s (%d tokens) -> %s (%s) [(worker, cached, load, queued, score)] %s",
                      req.rid, req.num_tokens, chosen.worker_id, self.policy_name,
                      [(c.worker_id, c.cached, c.load, c.queued_tokens, round(c.score, 4))
                       for c in cands])
        return chosen

    def _book(self, chosen: Candidate, req: RouteRequest,
              hashes: dict[int, list[int]]) -> tuple[str, Booking | None]:
        """The request as in flight on ``chosen``: its load and its soon-cached pages."""
        page = self.index.page_size(chosen.worker_id)
        uncached = req.num_tokens - chosen.cached - chosen.cached_host - chosen.cached_store
        return chosen.worker_id, self.registry.book(chosen.worker_id, req.rid, uncached,
                                                    frozenset(hashes[page]))

    @staticmethod
    def _key(req: RouteRequest) -> int:
        head = req.input_ids[:KEY_TOKENS]
        return block_hashes(head, len(head), req.cache_salt)[0] if head else 0

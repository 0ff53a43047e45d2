"""Every message on the bus, as typed msgspec Structs (msgpack on the wire).

Versioning: each top-level message carries a tag ``<name>.v<N>``; a breaking
change adds a new Struct with the next version instead of editing the old one.
Token-level payloads are batched per step: one message carries every request
of a batch.

Request path (subjects in :mod:`libs.protocol.subjects`)::

    gateway --EncodeRequest--> tokenizer.encode      (reply EncodeReply)
    gateway --RouteRequest---> index.route           (reply RouteReply; one replica answers)
    gateway --SubmitRequest--> sched.<w>.submit      (reply SubmitReply)
    scheduler --ForwardBatch--> worker.<w>.forward   (reply ForwardResult), per step
    scheduler --PrepareRegex--> worker.<w>.prepare   (publish) at a constrained submit
    scheduler --FetchPages----> worker.<w>.fetch     (reply FetchReply) shared store -> host
    scheduler --DetokBatch----> tokenizer.detok.<t>  one per step per tokenizer
    tokenizer --GatewayBatch--> gw.<g>.out           one per batch per gateway
    tokenizer --AbortRequest--> sched.<w>.abort      when a stop string matched
    gateway   --AbortRequest--> sched.<w>.abort      when the client went away
"""

from __future__ import annotations

from typing import Literal

import msgspec

FinishReason = Literal["stop", "length", "abort", "error"]


class Base(msgspec.Struct, kw_only=True, forbid_unknown_fields=False):
    """Base of all messages: keyword-only fields, unknown fields ignored."""


# -- errors -----------------------------------------------------------------


class ErrorInfo(Base, tag="error.v1"):
    """A typed error: ``code`` is machine readable, ``status`` the HTTP status."""

    code: str
    message: str
    status: int = 500


# -- health -----------------------------------------------------------------


class Ping(Base, tag="ping.v1"):
    pass


class Pong(Base, tag="pong.v1"):
    service: str
    instance: str
    uptime_s: float
    detail: dict[str, str] = {}


# -- tokenizer --------------------------------------------------------------


class ToolCall(Base):
    """A function call an assistant message made (OpenAI's ``tool_calls`` entry)."""

    id: str
    name: str
    arguments: str  # a JSON object, as text


class ToolSpec(Base):
    """A function the model may call: what the chat template renders."""

    name: str
    description: str = ""
    parameters: str = "{}"  # its JSON schema, as text


class ChatMessage(Base):
    role: str
    content: str
    tool_calls: list[ToolCall] = []  # an assistant's calls
    tool_call_id: str = ""  # a tool message: the call it answers


class SamplingParams(Base):
    """Sampling parameters of one request; ``max_new_tokens`` is resolved."""

    max_new_tokens: int
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1  # -1: whole vocabulary
    seed: int | None = None
    stop: list[str] = []
    stop_token_ids: list[int] = []
    ignore_eos: bool = False
    skip_special_tokens: bool = True
    # logprobs: of every output token, and of the prompt from ``logprob_start_len``
    # (-1: no prompt logprobs); each with its ``top_logprobs_num`` likeliest tokens
    return_logprob: bool = False
    logprob_start_len: int = -1
    top_logprobs_num: int = 0
    # constrained decoding: the output must fully match this regex ("": free)
    regex: str = ""
    # penalties: OpenAI's presence/frequency over the output's tokens, HF/vLLM's
    # repetition over prompt + output; min_p; min_tokens (EOS and stop_token_ids
    # masked until that many are out); logit_bias (token id -> added logit). Off by default
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    min_p: float = 0.0
    min_tokens: int = 0
    logit_bias: dict[int, float] = {}


class EncodeRequest(Base, tag="encode.v1"):
    """Tokenize one prompt (exactly one of text / messages / input_ids).

    The replying tokenizer instance also opens the request's detokenizer state
    (stop strings, destination gateway) and names its subject in the reply.
    ``max_new_tokens`` None means "up to the context length".
    """

    rid: str
    gateway: str
    text: str | None = None
    messages: list[ChatMessage] | None = None
    input_ids: list[int] | None = None
    add_generation_prompt: bool = True
    max_new_tokens: int | None = None
    stop: list[str] = []
    skip_special_tokens: bool = True
    tools: list[ToolSpec] = []  # messages: the functions the chat template offers the model
    # a resumed request: its detok stream starts primed with these output ids,
    # of whose text the first ``emitted_chars`` characters reached the client
    output_ids: list[int] = []
    emitted_chars: int = 0


class EncodeReply(Base, tag="encode_reply.v1"):
    input_ids: list[int]
    max_new_tokens: int
    detok_instance: str
    max_model_len: int
    vocab_size: int = 0  # 0: not said (token ids of other fields are not checked)


class DetokRelease(Base, tag="detok_release.v1"):
    """Drop detokenizer state of requests that never reached a scheduler."""

    rids: list[str]


# -- cache index ------------------------------------------------------------


class RouteRequest(Base, tag="route.v1"):
    """Pick a worker. ``input_ids`` + ``cache_salt`` let the index hash the
    prompt's pages exactly as the schedulers do (libs.protocol.hashing)."""

    rid: str
    model: str
    num_tokens: int
    exclude: list[str] = []
    input_ids: list[int] = []
    cache_salt: str = ""
    max_new_tokens: int = 0  # its output cap: the decode load it adds (0: unknown, not weighed)
    # a decode worker would prefill it itself (extras.prefills_locally: logprobs, a regex,
    # a resumed output): scored as a local prefill everywhere, no prefill peer named
    local_prefill: bool = False
    dry_run: bool = False  # decide but book nothing (a replica probed by tests or by hand)


class RouteReply(Base, tag="route_reply.v1"):
    worker_id: str
    policy: str
    predicted_ttft_s: float = 0.0  # the router's prediction for the chosen worker (0: none)
    # a decode worker's prefill peer ("": the decode worker prefills itself) and the
    # router's predicted prefill seconds there (the transfer deadline is built on it)
    prefill_worker: str = ""
    prefill_predicted_s: float = 0.0


class ReleaseRequest(Base, tag="release.v1"):
    """A routed request finished or failed: drop its in-flight booking."""

    rid: str
    worker_id: str


class LoadReport(Base, tag="load.v1"):
    """Published by a scheduler for each worker it drives, periodically."""

    worker_id: str
    scheduler_id: str
    model: str
    running: int
    waiting: int
    free_slots: int
    total_slots: int
    max_model_len: int
    ts: float
    queued_prefill_tokens: int = 0  # prompt tokens waiting or still to prefill
    prefill_tps: float = 0.0  # measured prefill tokens/s (0: not measured yet)
    decode_step_s: float = 0.0  # measured duration of a decode-only step
    host_load_tps: float = 0.0  # measured tokens/s loaded back from the host tier (0: unknown)
    alive: bool = True  # False: the scheduler let this worker go; route elsewhere now
    session: str = ""  # random per adoption: a new value means earlier requests were lost
    role: str = "both"  # WorkerInfo.role
    kv_layout: str = ""  # WorkerInfo.kv_layout: prefill and decode peers must match
    # the shared store (L3): the key prefix of this worker's pages ("<model>.<kv dtype>";
    # "": no store) and its measured fetch rate in tokens/s (0: not measured yet)
    store_prefix: str = ""
    store_load_tps: float = 0.0
    decode_row_s: float = 0.0  # measured: what one more decoding row adds to a decode step (0: not yet)
    # a decode worker leaves a prompt to its prefill peer when at least this many of its
    # tokens are uncached there (the scheduler's --remote-prefill-min-tokens), and takes the
    # KV in at this many tokens/s (measured over its transfers; before any, assumed; 0: unknown)
    remote_prefill_min_tokens: int = 256
    transfer_tps: float = 0.0


class WorkerSummary(Base):
    worker_id: str
    scheduler_id: str
    model: str
    running: int
    waiting: int
    free_slots: int
    total_slots: int
    inflight: int
    age_s: float


class WorkersRequest(Base, tag="workers.v1"):
    pass


class WorkersReply(Base, tag="workers_reply.v1"):
    workers: list[WorkerSummary]


# -- scheduler --------------------------------------------------------------


class SubmitRequest(Base, tag="submit.v1"):
    rid: str
    input_ids: list[int]
    sampling: SamplingParams
    detok_instance: str
    cache_salt: str = ""  # prefix-cache namespace: equal tokens in two salts never share KV
    # a resumed request (its worker died): the last ``num_output_tokens`` of
    # input_ids are output already generated; they count toward max_new_tokens
    num_output_tokens: int = 0
    # disaggregated: this (decode) worker's scheduler asks ``prefill_worker``'s for the
    # prompt's KV and first token (see PrefillRequest); "": it prefills itself
    prefill_worker: str = ""
    prefill_predicted_s: float = 0.0


class SubmitReply(Base, tag="submit_reply.v1"):
    queue_position: int
    session: str = ""  # the scheduler session now driving the worker (see LoadReport.session)


class AbortRequest(Base, tag="abort.v1"):
    rid: str
    reason: str = "abort"


class Logprobs(Base, array_like=True):
    """Log-probabilities of consecutive tokens of one request, from position ``start``
    of prompt + output. ``logprobs[i]`` is log p(token_ids[i] | all before it) under
    the model's raw distribution (no temperature); NaN at position 0, which nothing
    predicts. ``top_ids[i]`` / ``top_logprobs[i]``: the likeliest tokens there.
    ``tokens`` / ``top_tokens``: their text, filled in by the tokenizer; ``token_bytes`` /
    ``top_bytes``: their bytes, only where some token of the piece is not whole UTF-8
    characters (its text then shows U+FFFD); empty: each text's UTF-8 is its bytes."""

    start: int
    token_ids: list[int]
    logprobs: list[float]
    top_ids: list[list[int]] = []
    top_logprobs: list[list[float]] = []
    tokens: list[str] = []
    top_tokens: list[list[str]] = []
    token_bytes: list[bytes] = []
    top_bytes: list[list[bytes]] = []


class TokenDelta(Base, array_like=True):
    """New tokens of one request in one step; finish_reason set on its last."""

    rid: str
    token_ids: list[int]
    finish_reason: str | None = None
    error: ErrorInfo | None = None
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0
    logprobs: Logprobs | None = None  # requests with return_logprob: tokens since the last delta
    cached_host_tokens: int = 0  # of cached_tokens: loaded back from the host tier
    cached_store_tokens: int = 0  # of cached_tokens: fetched from the shared store (L3), not in host
    # where token_ids start in the request's output (replayed tokens of a resume counted):
    # a consumer that expected another position lost or repeated a batch (-1: unnumbered)
    pos: int = -1


class DetokBatch(Base, tag="detok.v1"):
    """Scheduler -> tokenizer instance: every delta of one step for it."""

    worker_id: str
    step: int
    items: list[TokenDelta]


class SchedStatsRequest(Base, tag="sched_stats.v1"):
    pass


class StreamStatusRequest(Base, tag="stream_status.v1"):
    """Gateway -> scheduler: how far are these requests (ones whose output went quiet)?"""

    rids: list[str]


class StreamStatusReply(Base, tag="stream_status_reply.v1"):
    """Per rid: the output tokens put in deltas so far (replayed ones counted), -1 for a
    request the scheduler no longer holds (finished, aborted) or never took."""

    sent: list[int]


class SchedStats(Base, tag="sched_stats_reply.v1"):
    """Counters of one scheduler loop (one worker), for tests and tooling."""

    worker_id: str
    steps: int
    running: int
    waiting: int
    free_slots: int
    max_batch_size: int
    batch_size_hist: dict[int, int]
    tokens_generated: int
    requests_finished: int
    prompt_tokens: int = 0
    cached_tokens: int = 0
    retractions: int = 0
    cache_enabled: bool = True
    evictable_slots: int = 0
    protected_slots: int = 0
    worker_idle_fraction: float = 0.0
    # seconds while steps were queued or running, and the worker's forward time in them
    worker_active_s: float = 0.0
    worker_busy_s: float = 0.0
    # the host tier (0 slots: none): tokens copied down on eviction / back up at admission
    host_slots: int = 0
    host_free_slots: int = 0
    host_demoted_tokens: int = 0
    host_loaded_tokens: int = 0
    # prefill/decode: transfers this worker received (decode side) or sent (prefill side)
    kv_transfers_in: int = 0
    kv_transfers_out: int = 0
    kv_transfer_bytes: int = 0  # received
    kv_transfer_seconds: float = 0.0  # received: request sent -> KV ready
    kv_transfer_failures: dict[str, int] = {}  # by reason: decode side fell back to its own prefill
    kv_transfer_renewals: int = 0  # deadlines renewed: the prefill side said it still has the request
    # the shared store (L3): fetches by outcome (complete / partial / deadline / miss / error /
    # skipped: predicted slower than recomputing), tokens fetched into the host tier, tokens put
    store_fetches: dict[str, int] = {}
    store_fetched_tokens: int = 0
    store_put_tokens: int = 0


class FlushRequest(Base, tag="flush.v1"):
    pass


class FlushReply(Base, tag="flush_reply.v1"):
    worker_id: str
    freed_slots: int


class KVEvent(Base, array_like=True):
    """Pages stored in or removed from one medium of a worker's prefix cache, or a
    full clear. A page moving down is stored in the new medium before it is removed
    from the old one."""

    kind: Literal["stored", "removed", "cleared"]
    namespace: str
    block_hashes: list[int]
    medium: Literal["device", "host"] = "device"


class SnapshotRequest(Base, tag="snapshot.v1"):
    pass


class KVSnapshot(Base, tag="snapshot_reply.v1"):
    """Every page in a worker's prefix cache; events with seq >= ``seq`` follow it."""

    worker_id: str
    epoch: int
    seq: int
    page_size: int
    block_hashes: list[int]  # pages on the device
    host_hashes: list[int] = []  # pages with a copy in the host tier (some also on the device)


class KVEventBatch(Base, tag="kv_events.v1"):
    """Events of one scheduler step; ``seq`` numbers them per (worker, epoch):
    event i of this batch has sequence number seq + i. A new epoch means the
    cache restarted empty."""

    worker_id: str
    epoch: int
    seq: int
    page_size: int
    events: list[KVEvent]
    ts: float = 0.0  # wall time of publication (for the index's event-lag metric)


# -- cache index replicas -----------------------------------------------------
#
#   replica --IndexBooking---------> index.booking   (every replica) at each route it answers
#   gateway --ReleaseRequest-------> index.release   (every replica)
#   starting replica --IndexSnapshotRequest--> index.snapshot (queue group of ready replicas)
#                                                     -> IndexSnapshot


class IndexBooking(Base, tag="index_booking.v1"):
    """A replica routed ``rid`` to ``worker_id``: every replica counts the booking (load,
    soon-cached pages) until it is released or ``ttl_s`` runs out, so a burst answered
    by several replicas does not stampede one worker, and a lost release cannot leak."""

    replica: str  # the instance that routed it (it has booked it already)
    rid: str
    worker_id: str
    tokens: int  # prefill tokens the request adds to the worker's queue
    hashes: list[int] = []  # its pages at the worker's page size: soon cached there
    ttl_s: float = 2.0  # how much longer it counts at most
    age_s: float = 0.0  # how long ago it was booked (in a snapshot; 0 when just routed)
    released: bool = False  # finished: no load, its pages still count for the rest of ttl_s


class IndexSnapshotRequest(Base, tag="index_snapshot.v1"):
    """A starting replica asks a ready one: ``worker`` "" for every worker's load, liveness
    and the bookings; a worker id for that worker's prefix view (one message each: a
    view can be large)."""

    worker: str = ""


class IndexWorker(Base):
    report: LoadReport  # its last load report
    age_s: float  # since that report arrived (liveness)
    synced: bool  # the replica's view of its prefix cache is complete: ask for it


class IndexSnapshot(Base, tag="index_snapshot_reply.v1"):
    replica: str
    workers: list[IndexWorker] = []
    bookings: list[IndexBooking] = []
    # the asked worker's view as a scheduler snapshot: epoch and seq say which of the
    # buffered KV events follow it (none when the replica's view is not complete)
    views: list[KVSnapshot] = []


# -- gateway ----------------------------------------------------------------


class Usage(Base, array_like=True):
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int = 0
    cached_host_tokens: int = 0  # of cached_tokens: loaded back from the host tier
    cached_store_tokens: int = 0  # of cached_tokens: fetched from the shared store (the rest: device)


class TextDelta(Base, array_like=True):
    rid: str
    text: str
    token_ids: list[int]
    finish_reason: str | None = None
    error: ErrorInfo | None = None
    usage: Usage | None = None
    logprobs: Logprobs | None = None
    pos: int = -1  # TokenDelta.pos of the tokens it carries (-1: unnumbered)


class GatewayBatch(Base, tag="gw_out.v1"):
    items: list[TextDelta]


# -- gpu worker -------------------------------------------------------------


class WorkerInfo(Base, tag="worker_info.v1"):
    worker_id: str
    model: str
    kv_slots: int
    max_requests: int
    max_model_len: int
    vocab_size: int
    eos_token_ids: list[int]
    dtype: str
    adopted_by: str | None = None
    epoch: int = 0
    host_kv_slots: int = 0  # slots of the worker's host KV pool (0: none; see KVCopy)
    store_page_tokens: int = 0  # tokens per page of its shared KV store (0: no store; see FetchPages)
    # prefill/decode disaggregation: "both" (colocated), "prefill" or "decode"; the KV
    # layout (libs.transfer.KVLayout.describe()) two peers must share; the host the
    # worker runs on (peers with the same host_id move KV through shared memory)
    role: str = "both"
    kv_layout: str = ""
    host_id: str = ""
    host: str = ""  # the worker's hostname: schedulers prefer workers on their own host
    leaving: bool = False  # its last announce: it stops now (its requests move at once)
    kv_dtype: str = ""  # its KV pool's dtype ("": dtype's); names its pages in the shared store

    @property
    def kv_dtype_name(self) -> str:
        return self.kv_dtype or self.dtype


class AdoptRequest(Base, tag="adopt.v1"):
    scheduler_id: str
    lease_s: float


class LeaseRenew(Base, tag="lease.v1"):
    scheduler_id: str
    release: bool = False  # end the adoption now (a scheduler stopping): another may adopt at once


class NewRow(Base, array_like=True):
    """A request entering a table row: its sampling state and, when it starts
    from cached KV, the slots of that prefix (table[row, :len(prefix_slots)])."""

    row: int
    temperature: float
    top_p: float
    top_k: int
    seed: int
    prefix_slots: list[int] = []
    # constrained decoding (``regex`` non-empty): each sampled token must keep the
    # output a prefix of a full match, and an id of ``end_ids`` may end it only
    # once it matches. Samples count from the step that makes the row's length
    # reach ``regex_from`` (earlier chunks of a prefill sample nothing kept);
    # ``regex_tokens``: output already generated (a resumed request) to replay.
    regex: str = ""
    regex_from: int = 0
    regex_tokens: list[int] = []
    end_ids: list[int] = []
    extras: SamplingExtras | None = None  # penalties, min_p, min_tokens, logit_bias (None: off)


class SamplingExtras(Base, array_like=True):
    """A new row's penalties, min_p, min_tokens and logit_bias (SamplingParams' fields, under
    their names: extras.py copies those), with the tokens its counts start from: a retracted
    or moved request brings ``output_ids`` (and ``prompt_ids`` for a repetition penalty), so
    it samples as if it had never left. Samples count from the step whose row length reaches
    ``sample_from`` (the fill length; earlier prefill chunks sample nothing kept)."""

    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    min_p: float = 0.0
    min_tokens: int = 0
    prompt_len: int = 0
    sample_from: int = 0
    stop_token_ids: list[int] = []  # masked with EOS (unless ignore_eos) before min_tokens
    ignore_eos: bool = False
    bias_ids: list[int] = []
    bias_values: list[float] = []
    prompt_ids: list[int] = []  # only with a repetition penalty
    output_ids: list[int] = []  # only with a penalty


class PrepareRegex(Base, tag="prepare_regex.v1"):
    """Scheduler -> worker (publish, no reply): compile these patterns now, in the
    background, for constrained requests that will start rows soon."""

    patterns: list[str]


class KVCopy(Base, array_like=True):
    """One KV copy the worker runs before its step's forward, in batch order.

    ``d2h``: device slots ``src`` -> host slots ``dst``; ``h2d``: host ``src`` ->
    device ``dst``; ``export``: device ``src`` -> a new transfer buffer ``buffer``
    (``dst`` empty); ``import``: transfer buffer ``buffer`` -> device ``dst`` (``src``
    empty; the buffer is consumed); ``put``: host ``src`` -> the shared store under
    ``keys``, one per ``WorkerInfo.store_page_tokens`` slots (copied at this step, uploaded
    in the background: the host slots are free again after the step). A slot is one
    token (page size 1).
    """

    kind: Literal["d2h", "h2d", "export", "import", "put"]
    src: list[int] = []
    dst: list[int] = []
    buffer: str = ""
    keys: list[str] = []  # put: store keys (libs.transfer.page_key), in slot order


class FetchPages(Base, tag="fetch_pages.v1"):
    """Scheduler -> worker (request): download ``keys`` from the shared store into host
    slots ``host_slots`` (``WorkerInfo.store_page_tokens`` per key, in order), in the
    background. The reply comes when all arrived or at ``deadline_s``, whichever is first;
    the worker writes nothing into those slots after it replies."""

    keys: list[str]
    host_slots: list[int]
    deadline_s: float = 1.0


class FetchReply(Base, tag="fetch_reply.v1"):
    """``arrived``: leading pages in place and intact (use their host slots; recompute the
    rest). ``missing`` / ``bad``: pages the store lacked / that failed their check;
    ``nbytes`` over ``seconds``: what was downloaded (the load rate); ``error``: the store
    failed (unavailable), ``deadline``: the deadline cut it short."""

    arrived: int
    missing: int = 0
    bad: int = 0
    seconds: float = 0.0
    nbytes: int = 0
    deadline: bool = False
    error: str = ""


class ForwardBatch(Base, tag="forward.v1"):
    """One step. Arrays are parallel per request, in batch order.

    Request i owns table row ``rows[i]``; it already has ``prefix_lens[i]``
    tokens in KV and adds ``extend_lens[i]`` tokens whose ids and KV slots are
    the i-th run of ``input_ids`` / ``out_slots``. The worker keeps the
    row -> slots table itself, so only new slots cross the wire.
    """

    step: int
    new_rows: list[NewRow]
    rows: list[int]
    prefix_lens: list[int]
    extend_lens: list[int]
    input_ids: list[int]
    out_slots: list[int]
    # logprobs (all empty: none wanted). Request i wants the next-token logprob at
    # ``logprob_count[i]`` positions of its run from offset ``logprob_from[i]``; the
    # target of a position is the run's next input id, and of the run's last
    # position ``logprob_next[i]`` (-1: the token sampled this step).
    logprob_from: list[int] = []
    logprob_count: list[int] = []
    logprob_next: list[int] = []
    top_logprobs_num: list[int] = []
    # KV copies run before this step's forward, in order; a step may carry copies and
    # no rows (then it returns no tokens)
    copies: list[KVCopy] = []
    # the sender: the scheduler that adopted the worker and that adoption's epoch; the worker
    # refuses a step of any other (a scheduler that lost its lease), "" / -1: unchecked
    owner: str = ""
    epoch: int = -1


class ForwardResult(Base, tag="forward_result.v1"):
    step: int
    next_token_ids: list[int]
    forward_ms: float
    # the wanted positions in batch order; top_* flattened [positions, top_k],
    # top_k = max(top_logprobs_num) of the batch
    logprobs: list[float] = []
    top_ids: list[int] = []
    top_logprobs: list[float] = []
    top_k: int = 0
    copy_ms: float = 0.0  # of forward_ms: the step's KV copies


# -- prefill/decode disaggregation --------------------------------------------
#
#   gateway --SubmitRequest(prefill_worker=P)--> sched.<D>.submit
#   D's scheduler preallocates the prompt's slots beyond its cached prefix, then
#     --PrefillRequest--> sched.<P>.prefill                       -> PrefillAck
#   P's scheduler prefills (its own cache applies), samples the first token, then
#     --KVSend--> worker.<P>.kv_send: P's worker exports the slots and pushes them to
#     D's worker (KVShmReady on one host, KVChunk otherwise, or with --kv-transfer
#     mooncake KVLand, a Mooncake write into D's landing buffer, KVLand written)
#                                                                   -> KVSendReply
#     --KVReady--> sched.<D>.kv_ready (also on every failure: ok False)
#   D's scheduler imports the staged buffer into the preallocated slots with the next
#   step (KVCopy "import") and emits every token, the first included. A failure, a
#   refusal or the deadline: D prefills the request itself (the slots are already its).


class PrefillRequest(Base, tag="prefill.v1"):
    """Decode scheduler -> prefill scheduler (request; reply PrefillAck): compute
    ``input_ids`` and the first token, then push the KV of positions [``skip``, len)
    to ``decode_worker`` as transfer ``transfer_id`` (``kv_layout`` and ``model``
    must match the prefill worker's: else 409 config_mismatch)."""

    transfer_id: str
    rid: str  # the client's request (logs, traces)
    input_ids: list[int]
    sampling: SamplingParams  # the first token is sampled with these and ``seed``
    seed: int
    decode_worker: str
    decode_host: str
    model: str
    kv_layout: str
    skip: int = 0  # leading tokens the decode worker holds already: not sent
    cache_salt: str = ""
    deadline_s: float = 10.0  # the decode side gives up (and prefills itself) after this


class PrefillAck(Base, tag="prefill_ack.v1"):
    queue_position: int
    session: str = ""
    # the prefill scheduler's own prediction when it accepted: its queued prefill
    # tokens (this request's included) over its measured prefill rate
    predicted_s: float = 0.0


class PrefillStatus(Base, tag="prefill_status.v1"):
    """Decode scheduler -> prefill scheduler (request; reply PrefillStatusReply): where
    is transfer ``transfer_id``? Asked when its deadline passes, before giving up."""

    transfer_id: str


class PrefillStatusReply(Base, tag="prefill_status_reply.v1"):
    # queued | running (prefilling) | sending (KV on its way) | unknown (not here)
    state: str
    # prefill tokens ahead of and including this request (those of steps in flight too)
    # over the measured prefill rate
    predicted_s: float = 0.0
    # steps the prefill scheduler has completed (results applied): the decode side renews
    # only while this or ``state`` advances, so a worker hung mid-step ends in a fallback
    completed_steps: int = 0


class KVReady(Base, tag="kv_ready.v1"):
    """Prefill scheduler -> decode scheduler (publish): transfer ``transfer_id`` ended.
    ``ok``: ``num_tokens`` tokens are staged on the decode worker as buffer
    ``staging_id(transfer_id)`` and ``first_token`` was sampled; otherwise ``error``
    says why (the decode side prefills itself)."""

    transfer_id: str
    ok: bool
    first_token: int = -1
    num_tokens: int = 0
    cached_tokens: int = 0  # of the prompt, cached on the prefill worker
    nbytes: int = 0
    seconds: float = 0.0  # export + push on the prefill worker
    path: str = ""  # "shm", "nats" or "mooncake"
    prefill_worker: str = ""
    error: ErrorInfo | None = None


class KVSend(Base, tag="kv_send.v1"):
    """Prefill scheduler -> its worker (request; reply KVSendReply): export ``slots``
    and push them to ``dest_worker`` as ``transfer_id``, within ``deadline_s``.
    The reply comes once the destination holds the whole buffer, checked."""

    transfer_id: str
    slots: list[int]
    dest_worker: str
    dest_host: str = ""
    deadline_s: float = 10.0


class KVSendReply(Base, tag="kv_send_reply.v1"):
    ok: bool
    nbytes: int = 0
    seconds: float = 0.0
    path: str = ""
    chunks: int = 0
    error: str = ""  # why not (ok False): "timeout", "checksum", "refused: ...", ...


class KVChunk(Base, tag="kv_chunk.v1"):
    """Worker -> worker (request; reply KVChunkAck): part ``index`` of ``count`` of a
    sealed KVBuffer's bytes (``total_bytes`` in all), with its own CRC-32."""

    transfer_id: str
    index: int
    count: int
    total_bytes: int
    crc: int
    data: bytes


class KVShmReady(Base, tag="kv_shm.v1"):
    """Worker -> worker on one host (request; reply KVChunkAck): a sealed KVBuffer of
    ``nbytes`` lies in the shared-memory file ``name``; the receiver reads and removes it."""

    transfer_id: str
    name: str
    nbytes: int


class KVLand(Base, tag="kv_land.v1"):
    """Worker -> worker, the Mooncake path (request; reply KVChunkAck): reserve a landing
    buffer of ``nbytes`` for a sealed KVBuffer (the reply names the receiver's engine
    ``session`` and the buffer's ``address``); then, ``written``, the sender wrote it
    there: the receiver checks and stages it (reply ``staged``)."""

    transfer_id: str
    nbytes: int
    written: bool = False


class KVChunkAck(Base, tag="kv_chunk_ack.v1"):
    ok: bool
    staged: bool = False  # the whole buffer arrived, checked, and is staged
    error: str = ""
    # to a KVLand reservation: the receiver's Mooncake session ("host:port") and where to write
    session: str = ""
    address: int = 0


class KVDrop(Base, tag="kv_drop.v1"):
    """Scheduler -> its worker (publish): forget these transfers (staged buffers freed;
    chunks arriving later are dropped)."""

    transfer_ids: list[str]


def staging_id(transfer_id: str) -> str:
    """The staging buffer id under which a transfer's KV waits on the decode worker."""
    return f"xfer-{transfer_id}"

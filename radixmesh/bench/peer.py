"""A peer: an OpenAI-compatible server the harness neither starts nor stops.

``openai=<base URL>`` in ``--systems`` (``<label>:openai=<base URL>`` names its row;
the default label is ``openai@<host>:<port>``), e.g. vLLM, SGLang, llama.cpp's
server or another radixmesh. It runs the run's workload through the same
streaming client as radixmesh, on ``/v1/chat/completions``.

Before any system runs, :func:`check_peer` makes sure the peer answers, picks
its model (``--peer-model``, else what ``/v1/models`` lists) and sends one
1-token request: the prompt tokens it reports must be those the workload's
tokenizer counts, else it serves another model than the one the workload was
built for. It also finds how to empty the peer's prefix cache
(``POST /reset_prefix_cache``: vLLM with ``VLLM_SERVER_DEV_MODE=1``;
``POST /flush_cache``: SGLang, radixmesh): the peer then starts its run cold,
as a stack the harness starts does; a peer offering neither runs warm.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

import httpx

from .client import ClientConfig, StreamClient
from .errors import BenchError
from .record import Record
from .tokens import ChatTokenizer

KIND = "openai"
RESETS = ("/reset_prefix_cache", "/flush_cache")  # vLLM's (dev mode), SGLang's and radixmesh's
LABEL = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.@-]*")
PROBE = [{"role": "user", "content": "Say hello."}]
CONNECT_S = 5.0


@dataclass(frozen=True)
class PeerSpec:
    label: str
    url: str


@dataclass(frozen=True)
class PeerInfo:
    model: str
    reset: str | None  # the endpoint that empties its prefix cache; None: it runs warm
    note: str = ""  # why it runs warm

    @property
    def start(self) -> str:
        return "cold" if self.reset else "warm"


def parse_peer(text: str, taken: tuple[str, ...] = ()) -> PeerSpec | None:
    """``openai=URL`` or ``LABEL:openai=URL`` as a peer; None for any other system name.
    ``taken``: names the label must not shadow (the harness's own systems)."""
    head, sep, url = text.partition("=")
    label, _, kind = head.rpartition(":")
    if not sep or kind != KIND:
        return None
    try:
        parsed = httpx.URL(url)
    except httpx.InvalidURL as exc:
        raise BenchError(f"system {text!r}: bad URL {url!r} ({exc})") from None
    if parsed.scheme not in ("http", "https") or not parsed.host:
        raise BenchError(f"system {text!r}: want openai=http(s)://HOST[:PORT][/PATH], "
                         f"got URL {url!r}")
    port = parsed.port or (443 if parsed.scheme == "https" else 80)
    if label and not LABEL.fullmatch(label):
        raise BenchError(f"system {text!r}: label {label!r} must be letters, digits and _.@- "
                         "(LABEL:openai=URL)")
    label = label or f"{KIND}@{parsed.host}:{port}"
    if label in taken:
        raise BenchError(f"system {text!r}: label {label!r} is one of the harness's own "
                         "systems; pick another (LABEL:openai=URL)")
    return PeerSpec(label, url.rstrip("/"))


def _client(url: str, timeout_s: float) -> httpx.AsyncClient:
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=None)
    return httpx.AsyncClient(base_url=url, timeout=httpx.Timeout(timeout_s, connect=CONNECT_S),
                             limits=limits)


async def check_peer(peer: PeerSpec, tok: ChatTokenizer, tokenizer_name: str,
                     model: str | None = None, timeout_s: float = 60.0) -> PeerInfo:
    """What the run needs of ``peer``; a :class:`BenchError` now rather than mid-run if it
    is unreachable, does not serve ``model`` or serves another model than ``tok``'s."""
    async with _client(peer.url, timeout_s) as http:
        served = await _models(peer, http)
        model = _pick(peer, served, model, tokenizer_name)
        probe = Record(peer.label, "probe", "probe")
        await StreamClient(http, tok, ClientConfig("chat", model)).send(PROBE, 1, probe)
        if not probe.ok:
            raise BenchError(f"{peer.label}: a 1-token chat request for model {model!r} at "
                             f"{peer.url} failed: {probe.error}")
        if probe.prompt_tokens != probe.client_prompt_tokens:
            raise BenchError(
                f"{peer.label}: {peer.url} serves model {model!r}, whose prompt for a probe "
                f"message has {probe.prompt_tokens} tokens where the workload's tokenizer "
                f"({tokenizer_name}) counts {probe.client_prompt_tokens}: it serves another "
                "model than the workload was built for (give --model the model it serves)")
        reset, note = await _find_reset(http)
    return PeerInfo(model, reset, note)


async def _models(peer: PeerSpec, http: httpx.AsyncClient) -> list[str]:
    try:
        resp = await http.get("/v1/models")
    except httpx.HTTPError as exc:
        raise BenchError(f"{peer.label}: no server answers at {peer.url} "
                         f"({type(exc).__name__}: {exc or 'no detail'})") from None
    try:
        resp.raise_for_status()
        return [str(m["id"]) for m in resp.json()["data"]]
    except (httpx.HTTPError, ValueError, KeyError, TypeError) as exc:
        raise BenchError(f"{peer.label}: {peer.url}/v1/models is not an OpenAI model list "
                         f"(HTTP {resp.status_code}: {str(exc)[:200]})") from None


def _pick(peer: PeerSpec, served: list[str], model: str | None, tokenizer_name: str) -> str:
    """``model`` if the peer serves it; else its only model, or the one named like the
    workload's tokenizer."""
    if model is not None:
        if model not in served:
            raise BenchError(f"{peer.label}: {peer.url} serves {served}, not --peer-model "
                             f"{model!r}")
        return model
    if len(served) == 1:
        return served[0]
    if tokenizer_name in served:
        return tokenizer_name
    raise BenchError(f"{peer.label}: {peer.url} serves {served or 'no model'}: name the one to "
                     "benchmark with --peer-model")


async def _find_reset(http: httpx.AsyncClient) -> tuple[str | None, str]:
    """The first of :data:`RESETS` that empties the cache (it does so now: the peer has
    run nothing of the workload yet); else None and why."""
    answers = []
    for path in RESETS:
        try:
            resp = await http.post(path)
        except httpx.HTTPError as exc:
            answers.append(f"{path}: {type(exc).__name__}")
            continue
        if resp.is_success:
            return path, ""
        answers.append(f"{path}: HTTP {resp.status_code}")
    return None, "no cache reset (" + ", ".join(answers) + "), so it ran warm"


async def reset_cache(label: str, http: httpx.AsyncClient, info: PeerInfo) -> None:
    """Empty the peer's prefix cache before its run (a no-op for a warm peer)."""
    if info.reset is None:
        return
    resp = await http.post(info.reset)
    if not resp.is_success:
        raise BenchError(f"{label}: POST {info.reset} answered HTTP {resp.status_code} "
                         f"({resp.text[:200]}) before the run: its cache was not emptied")


def blank_radixmesh_columns(summary):
    """A peer's summary with the radixmesh-only figures (tiers, worker idle) unknown."""
    import dataclasses

    return dataclasses.replace(summary, host_hit_rate=math.nan, store_hit_rate=math.nan,
                               worker_idle=math.nan)

"""python -m services.scheduler: adopt gpu workers and schedule their batches."""

from __future__ import annotations

import argparse

from libs.protocol import event_loop
from libs.protocol.env_flags import env_default, positive_int
from libs.protocol.metrics import add_metrics_args, serve_metrics
from libs.protocol.service import (
    ServiceContext, add_common_args, common_config, run_service, setup_logging,
)

from .config import CoreConfig
from .host_tier import WRITE_POLICIES
from .policy import POLICIES
from .service import Adopter, SchedulerConfig


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Every option also reads RADIXMESH_<FLAG> (RADIXMESH_SCHEDULER_<FLAG> first), as
    ``radixmesh up`` names it."""
    def env(flag: str, default, kind=str):
        return env_default("scheduler", flag, default, kind)

    def switch(flag: str) -> bool:
        return env(flag, "") not in ("", "0", "false")

    p = argparse.ArgumentParser(prog="services.scheduler", description=__doc__)
    add_common_args(p, "scheduler")
    add_metrics_args(p, "scheduler")
    p.add_argument("--max-running-requests", type=int, default=env("--max-running-requests", 256, int))
    p.add_argument("--max-queued-requests", type=int, default=env("--max-queued-requests", 4096, int))
    p.add_argument("--chunked-prefill-size", type=int, default=env("--chunked-prefill-size", 1024, int),
                   help="prefill tokens per step; longer prompts run in chunks beside decodes")
    p.add_argument("--schedule-policy", choices=POLICIES, default=env("--schedule-policy", "fcfs"))
    p.add_argument("--disable-radix-cache", action="store_true", default=switch("--disable-radix-cache"),
                   help="no prefix reuse: every request computes its whole prompt")
    p.add_argument("--page-size", type=int, default=env("--page-size", 16, int),
                   help="prefix-cache granularity: matches and KV events are per page")
    p.add_argument("--eviction-policy", choices=["lru", "lfu"], default=env("--eviction-policy", "lru"))
    p.add_argument("--disable-overlap-schedule", action="store_true",
                   default=switch("--disable-overlap-schedule"),
                   help="wait for each step's result before planning the next")
    p.add_argument("--host-write-policy", choices=WRITE_POLICIES,
                   default=env("--host-write-policy", "write_back"),
                   help="with a worker host pool (--host-kv-slots): copy a prefix down to it "
                        "on eviction, as soon as it is cached, or at its second hit")
    p.add_argument("--remote-prefill-min-tokens", type=int, default=env("--remote-prefill-min-tokens", 256, int),
                   help="a decode worker prefills a prompt itself when fewer of its tokens are uncached "
                        "there (0: every prompt goes to its prefill worker)")
    p.add_argument("--stream-interval", type=positive_int, default=env("--stream-interval", 1, positive_int),
                   help="send a request's tokens on in groups of this many (its first token and its "
                        "finish at once): fewer messages per step, larger stream chunks")
    p.add_argument("--retract-interval", type=int, default=0, help=argparse.SUPPRESS)
    p.add_argument("--max-workers", type=int, default=env("--max-workers", 0, int),
                   help="0: adopt every free worker")
    p.add_argument("--lease-s", type=float, default=env("--lease-s", 5.0, float))
    p.add_argument("--forward-timeout", type=float, default=env("--forward-timeout", 300.0, float))
    return p.parse_args(argv)


def build_config(args: argparse.Namespace) -> SchedulerConfig:
    return SchedulerConfig(
        core=CoreConfig(
            max_running_requests=args.max_running_requests,
            max_queued_requests=args.max_queued_requests,
            chunked_prefill_size=args.chunked_prefill_size,
            schedule_policy=args.schedule_policy,
            enable_cache=not args.disable_radix_cache,
            page_size=args.page_size,
            eviction_policy=args.eviction_policy,
            retract_interval=args.retract_interval,
            overlap=not args.disable_overlap_schedule,
            host_write_policy=args.host_write_policy,
            remote_prefill_min_tokens=args.remote_prefill_min_tokens,
            stream_interval=args.stream_interval,
        ),
        max_workers=args.max_workers, lease_s=args.lease_s,
        forward_timeout=args.forward_timeout,
    )


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    setup_logging("scheduler", args.log_level)
    serve_metrics(args.metrics_port, args.metrics_host)
    config = build_config(args)

    async def body(ctx: ServiceContext) -> None:
        await Adopter(ctx, config).start()

    event_loop.run(run_service("scheduler", common_config(args), body))


if __name__ == "__main__":
    main()

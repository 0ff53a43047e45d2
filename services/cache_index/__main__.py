"""python -m services.cache_index: worker registry and request routing."""

from __future__ import annotations

import argparse

from libs.protocol import event_loop
from libs.protocol.env_flags import env_default
from libs.protocol.limits import KV_STORE_BUCKET, WORKER_LIVENESS_S
from libs.protocol.metrics import add_metrics_args, serve_metrics
from libs.protocol.service import (
    ServiceContext, add_common_args, common_config, run_service, setup_logging,
)

from .policies import POLICIES
from .registry import Registry
from .service import CacheIndex


def env(flag: str, default, kind=str):
    """RADIXMESH_<FLAG> (RADIXMESH_CACHE_INDEX_<FLAG> first), as ``radixmesh up`` names it."""
    return env_default("cache_index", flag, default, kind)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="services.cache_index", description=__doc__)
    add_common_args(p, "cache_index")
    add_metrics_args(p, "cache_index")
    p.add_argument("--policy", choices=sorted(POLICIES), default=env("--policy", "cache_aware"))
    p.add_argument("--liveness-s", type=float, default=env("--liveness-s", WORKER_LIVENESS_S, float),
                   help="a worker without a load report for this long leaves the routing set")
    p.add_argument("--kv-store-bucket", default=env("--kv-store-bucket", KV_STORE_BUCKET),
                   help="the workers' shared KV store bucket (JetStream KV on this broker), watched once "
                        "it exists: its pages are credited at each worker's measured fetch rate "
                        "(\"\": do not watch)")
    p.add_argument("--local-prefill-factor", type=float, default=env("--local-prefill-factor", 2.0, float),
                   help="a decode worker prefills a prompt itself when the first token predicted from its "
                        "prefill peer (queue + compute + transfer) comes over this many times later than "
                        "from its own prefill (0: never)")
    args = p.parse_args(argv)
    setup_logging("cache_index", args.log_level)
    serve_metrics(args.metrics_port, args.metrics_host)

    async def body(ctx: ServiceContext) -> None:
        await CacheIndex(ctx, args.policy, Registry(liveness_s=args.liveness_s),
                         args.kv_store_bucket, args.local_prefill_factor).start()

    event_loop.run(run_service("cache_index", common_config(args), body))


if __name__ == "__main__":
    main()

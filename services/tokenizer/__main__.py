"""python -m services.tokenizer: chat templates, encode, incremental detokenize, stop strings."""

from __future__ import annotations

import argparse
import os

from libs.models import resolve_model, served_name
from libs.protocol import event_loop
from libs.protocol.env_flags import env_default
from libs.protocol.metrics import add_metrics_args, serve_metrics
from libs.protocol.service import (
    ServiceContext, add_common_args, common_config, run_service, setup_logging,
)

from .encoder import Encoder
from .service import TokenizerService


def _env(flag: str, default, kind):
    return env_default("tokenizer", flag, default, kind)


def main(argv: list[str] | None = None) -> None:
    env = os.environ.get
    p = argparse.ArgumentParser(prog="services.tokenizer", description=__doc__)
    add_common_args(p, "tokenizer")
    add_metrics_args(p, "tokenizer")
    p.add_argument("--model", default=env("RADIXMESH_MODEL", "default"),
                   help='"default", "gemma3-270m" or a local HF model directory')
    p.add_argument("--max-model-len", type=int, default=_env("--max-model-len", None, int),
                   help="context length (default: config.json max_position_embeddings)")
    p.add_argument("--detok-idle-timeout", type=float, default=_env("--detok-idle-timeout", 600.0, float),
                   help="drop a detok stream after this many seconds without traffic")
    p.add_argument("--encode-threads", type=int, default=_env("--encode-threads", 1, int),
                   help="threads that run encoding (each holds its own tokenizer copy)")
    args = p.parse_args(argv)
    setup_logging("tokenizer", args.log_level)
    serve_metrics(args.metrics_port, args.metrics_host)

    async def body(ctx: ServiceContext) -> None:
        encoder = Encoder.load(resolve_model(args.model), args.max_model_len)
        await TokenizerService(
            ctx, encoder, served_name(args.model),
            idle_timeout=args.detok_idle_timeout, encode_threads=args.encode_threads,
        ).start()

    event_loop.run(run_service("tokenizer", common_config(args), body))


if __name__ == "__main__":
    main()

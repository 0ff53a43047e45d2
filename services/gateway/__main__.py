"""``python -m services.gateway``: the HTTP front door (OpenAI-compatible + /generate)."""

from __future__ import annotations

import argparse
import asyncio
import os

from libs.protocol.service import add_common_args, common_config, run_service, setup_logging
from radixmesh.models import DEFAULT_MODEL, served_name

from .pipeline import PipelineConfig
from .routes import GatewaySettings
from .server import ServerConfig, gateway_body


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    env = os.environ.get
    parser = argparse.ArgumentParser(prog="python -m services.gateway", description=__doc__)
    parser.add_argument("--host", default=env("RADIXMESH_GATEWAY_HOST", "127.0.0.1"))
    parser.add_argument("--port", type=int, default=int(env("RADIXMESH_GATEWAY_PORT", "8000")))
    parser.add_argument("--model", default=env("RADIXMESH_MODEL", DEFAULT_MODEL),
                        help="model the workers serve: 'default' or an HF directory (not loaded here)")
    parser.add_argument("--served-model-name", default=None,
                        help="name clients use in requests (default: derived from --model)")
    parser.add_argument("--api-key", default=env("RADIXMESH_API_KEY") or None,
                        help="require 'Authorization: Bearer KEY' (default: env RADIXMESH_API_KEY)")
    parser.add_argument("--request-timeout", type=float, default=600.0,
                        help="seconds without output before a request fails with 504")
    parser.add_argument("--bus-timeout", type=float, default=10.0,
                        help="seconds to wait for encode / route / submit replies")
    parser.add_argument("--max-body-bytes", type=int, default=8 * 1024 * 1024)
    add_common_args(parser, "gateway")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    config = common_config(args)
    setup_logging("gateway", config.log_level)
    name = args.served_model_name or served_name(args.model)
    aliases = tuple(sorted({args.model, served_name(args.model)} - {name}))
    settings = GatewaySettings(name, aliases, args.api_key, args.max_body_bytes)
    pipeline_cfg = PipelineConfig(request_timeout=args.request_timeout, bus_timeout=args.bus_timeout)
    server_cfg = ServerConfig(args.host, args.port)
    body = gateway_body(settings, pipeline_cfg, server_cfg, worker_model=served_name(args.model))
    asyncio.run(run_service("gateway", config, body))


if __name__ == "__main__":
    main()

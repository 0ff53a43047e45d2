"""``python -m services.gateway``: the HTTP front door (OpenAI-compatible + /generate)."""

from __future__ import annotations

import argparse
import os

from libs.models import DEFAULT_MODEL, model_path, served_name
from libs.protocol import event_loop
from libs.protocol.env_flags import env_default
from libs.protocol.service import add_common_args, common_config, run_service, setup_logging

from .auth import KeyFileError, load_keyring
from .limits import Limits
from .pipeline import PipelineConfig
from .routes import GatewaySettings
from .server import ServerConfig, gateway_body


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    env = os.environ.get
    parser = argparse.ArgumentParser(prog="python -m services.gateway", description=__doc__)
    parser.add_argument("--host", default=env("RADIXMESH_GATEWAY_HOST", "127.0.0.1"))
    parser.add_argument("--port", type=int, default=int(env("RADIXMESH_GATEWAY_PORT", "8000")))
    parser.add_argument("--drain-s", type=float, default=_env("--drain-s", 10.0, float),
                        help="asked to stop (SIGTERM, Ctrl-C): open requests may finish this long, "
                             "then those left end with a final 503 event; no new connection is taken")
    parser.add_argument("--reuse-port", action="store_true",
                        help="share --port with other gateway processes (SO_REUSEPORT: the kernel "
                             "spreads connections over them); radixmesh up --gateways N sets it")
    parser.add_argument("--model", default=env("RADIXMESH_MODEL", DEFAULT_MODEL),
                        help="model the workers serve: 'default' or an HF directory (not loaded here)")
    parser.add_argument("--served-model-name", default=_env("--served-model-name", None),
                        help="name clients use in requests (default: derived from --model)")
    parser.add_argument("--api-key", default=env("RADIXMESH_API_KEY") or None,
                        help="require 'Authorization: Bearer KEY' (default: env RADIXMESH_API_KEY)")
    parser.add_argument("--api-keys-file", default=env("RADIXMESH_API_KEYS_FILE") or None,
                        help="API keys and their tenants: JSON {\"key\": \"tenant\"} or "
                             "'key tenant' lines (also: env RADIXMESH_API_KEYS=key:tenant,...)")
    parser.add_argument("--request-timeout", type=float, default=_env("--request-timeout", 600.0, float),
                        help="seconds without output before a request fails with 504")
    parser.add_argument("--request-deadline", type=float, default=_env_float("RADIXMESH_REQUEST_DEADLINE"),
                        help="seconds a whole request may take when its body sets no 'timeout' "
                             "(and the most a 'timeout' may ask for); default: none")
    parser.add_argument("--max-tokens-cap", type=int, default=int(env("RADIXMESH_MAX_TOKENS_CAP", "0")),
                        help="largest max_tokens accepted (400 above; the default when unset); 0: none")
    parser.add_argument("--max-prompt-tokens", type=int,
                        default=int(env("RADIXMESH_MAX_PROMPT_TOKENS", "0")),
                        help="longest prompt in tokens (400 above); 0: the model's context only")
    parser.add_argument("--max-concurrent-requests", type=int,
                        default=int(env("RADIXMESH_MAX_CONCURRENT_REQUESTS", "0")),
                        help="generation requests in flight on this gateway (429 above); 0: no limit")
    parser.add_argument("--bus-timeout", type=float, default=_env("--bus-timeout", 10.0, float),
                        help="seconds to wait for encode / route / submit replies")
    parser.add_argument("--max-body-bytes", type=int, default=_env("--max-body-bytes", 8 * 1024 * 1024, int))
    add_common_args(parser, "gateway")
    args = parser.parse_args(argv)
    try:
        args.keyring = load_keyring(args.api_keys_file, env("RADIXMESH_API_KEYS"), args.api_key)
    except KeyFileError as exc:
        parser.error(str(exc))
    return args


def _env(flag: str, default, kind=str):
    return env_default("gateway", flag, default, kind)


def _env_float(name: str) -> float | None:
    value = os.environ.get(name)
    return float(value) if value else None


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    config = common_config(args)
    setup_logging("gateway", config.log_level)
    name = args.served_model_name or served_name(args.model)
    aliases = tuple(sorted({args.model, served_name(args.model)} - {name}))
    limits = Limits(args.max_tokens_cap, args.max_prompt_tokens, args.max_concurrent_requests,
                    args.request_deadline)
    settings = GatewaySettings(name, aliases, None, args.max_body_bytes, args.keyring, limits)
    pipeline_cfg = PipelineConfig(request_timeout=args.request_timeout, bus_timeout=args.bus_timeout)
    server_cfg = ServerConfig(args.host, args.port, graceful_shutdown_s=args.drain_s, reuse_port=args.reuse_port)
    body = gateway_body(settings, pipeline_cfg, server_cfg, worker_model=served_name(args.model),
                        model_path=str(model_path(args.model)))
    event_loop.run(run_service("gateway", config, body))


if __name__ == "__main__":
    main()

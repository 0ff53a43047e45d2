"""python -m libs.models [model]: prepare ``model`` (default: the default model) and print its directory."""

from __future__ import annotations

import argparse

from .resolve import DEFAULT_MODEL, ModelNotFoundError, resolve_model


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m libs.models",
                                description="Prepare a model once and print its local HF directory.")
    p.add_argument("model", nargs="?", default=DEFAULT_MODEL, help='"default", "gemma3-270m" or a local HF directory')
    try:
        print(resolve_model(p.parse_args(argv).model))
    except ModelNotFoundError as exc:
        raise SystemExit(f"models: {exc}") from None


if __name__ == "__main__":
    main()

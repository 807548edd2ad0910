"""Command line: ``python -m diffusion <command>``."""

from __future__ import annotations

from . import cli_args
from .demo import run_demo


def main(argv: list[str] | None = None) -> None:
    parser = cli_args.ArgumentParser(prog="python -m diffusion", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    demo = commands.add_parser("demo", help="train an MLP on the bundled 8x8 digits and print the loss")
    demo.add_argument("--steps", type=cli_args.positive_int, default=300)
    demo.add_argument("--batch", type=cli_args.positive_int, default=128)
    demo.add_argument("--lr", type=cli_args.positive_float, default=0.1)
    demo.add_argument("--seed", type=cli_args.non_negative_int, default=0)
    args = parser.parse_args(argv)
    if args.command == "demo":
        run_demo(steps=args.steps, batch=args.batch, lr=args.lr, seed=args.seed)


if __name__ == "__main__":
    main()

"""The ``polyad`` command line (also ``python -m polyad``)."""

from __future__ import annotations

import argparse
import sys


def _demo(args) -> int:
    from .demo import run_demo
    return run_demo(size=args.size)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="polyad", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    demo = sub.add_parser("demo", help="compile, run and differentiate the TV cost kernel")
    demo.add_argument("--size", type=int, default=1024, help="image side (default 1024)")
    demo.set_defaults(func=_demo)
    args = parser.parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())

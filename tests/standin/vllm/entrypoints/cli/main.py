# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""STAND-IN -- the `vllm` command: `vllm serve MODEL [options]` starts the stand-in server; other options are ignored."""
import sys

from vllm.entrypoints.cli.serve import parse


def main():
    args, _ignored = parse(sys.argv[1:])
    if args.subparser != "serve":
        print("STAND-IN vllm: only `vllm serve` is here", file=sys.stderr)
        return 2
    return args.dispatch_function(args)


if __name__ == "__main__":
    sys.exit(main())

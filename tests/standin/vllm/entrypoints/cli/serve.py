# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""STAND-IN -- `vllm serve`: the options the stand-in uses, and every other option taken as given (a stand-in does not
check vLLM's flags: tests of the argument check run on real vLLM)."""
import argparse


class ServeSubcommand:
    name = "serve"

    def subparser_init(self, subparsers):
        parser = subparsers.add_parser("serve", help="STAND-IN vLLM server")
        parser.add_argument("model")
        parser.add_argument("--host", default=None)
        parser.add_argument("--port", type=int, default=8000)
        parser.add_argument("--served-model-name", nargs="+", default=None)
        parser.add_argument("--max-model-len", default=None)
        parser.add_argument("--api-key", default=None)
        # The stand-in's answers depend on these as vLLM's numbers would (answer parity sees them change).
        parser.add_argument("--hf-overrides", default=None)
        parser.add_argument("--dtype", default=None)
        parser.set_defaults(dispatch_function=self.cmd)
        return parser

    @staticmethod
    def validate(args):
        return None

    @staticmethod
    def cmd(args):
        from vllm.standin_server import serve  # pylint: disable=import-outside-toplevel
        return serve(args)


def cmd_init():
    return [ServeSubcommand()]


def parse(argv):
    """(known args, the rest) of `vllm serve ...`."""
    parser = argparse.ArgumentParser(prog="vllm")
    ServeSubcommand().subparser_init(parser.add_subparsers(dest="subparser"))
    return parser.parse_known_args(argv)

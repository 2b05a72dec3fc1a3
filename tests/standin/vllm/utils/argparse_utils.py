# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""STAND-IN -- the parser class vLLM's CLI and llmfleet.vllm.vllm_args_check build on."""
import argparse


class FlexibleArgumentParser(argparse.ArgumentParser):
    """Takes '_' for '-' in option names, as vLLM's does, and any option the stand-in does not know."""

    def parse_args(self, args=None, namespace=None):  # pylint: disable=arguments-differ
        args = [a.replace("_", "-") if a.startswith("--") and "=" not in a else a for a in (args or [])]
        return super().parse_known_args(args, namespace)[0]

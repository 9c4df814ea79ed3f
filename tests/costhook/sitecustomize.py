"""Test-only: a fake calibration for every Python process started with this folder on
``PYTHONPATH`` (tests/conftest.py puts it there for the CLI subprocesses, and installs the same in
the test process). ``SPECLI_TEST_COSTS`` says which machine to simulate:

- ``steep``: verifying k + 1 tokens costs k + 1 single tokens (a CPU whose verify curve is steep,
  e.g. AVX-512): no draft ever pays, the adaptive controller drafts nothing;
- ``gpu``: a block costs about one token, a drafter's pass a twentieth of one (the controller
  drafts long, as on a GPU).

Only the measurement is replaced: one real single-token pass is timed, and every block is
priced from it by the simulated curve. The cache keys carry the simulated machine's name, so
a real calibration in the user's cache is neither read nor overwritten."""

import importlib.abc
import importlib.util
import os
import statistics
import sys

MODULE = "specli.hardware.calibrate"


def _curves(kind: str):
    if kind == "steep":
        return (lambda n: float(n)), None
    if kind == "gpu":
        return (lambda n: 1.0 + 0.01 * (n - 1)), 0.05
    raise ValueError(f"SPECLI_TEST_COSTS={kind!r}: expected 'steep' or 'gpu'")


def replacements(cal, kind: str) -> dict:
    """calibrate module ``cal``'s functions that measure, as the simulated machine ``kind`` has them."""
    block, draft = _curves(kind)
    # the one private name a test reaches: the timing itself is what a simulated machine replaces
    timer = cal._time_blocks  # noqa: SLF001
    real_info, real_blocks = (getattr(f, "real", f) for f in (cal.system_info, timer))

    def system_info() -> str:
        return f"{real_info()} [specli test: {kind} costs]"

    def time_blocks(ctx, sizes, reps, depth):
        one = statistics.median(real_blocks(ctx, [1], reps, depth)[1])
        return {n: [one * block(n)] * reps for n in sizes}

    system_info.real, time_blocks.real = real_info, real_blocks
    out = {"system_info": system_info, "_time_blocks": time_blocks}
    if draft is not None:  # a drafter's pass: that fraction of a token of the model (its own timing ignored)
        real_cost, real_cached = (getattr(f, "real", f) for f in (cal.draft_token_cost, cal.cached_cost))

        def draft_token_cost(ctx, reps=4, use_cache=True):
            return draft * cal.verify_costs(ctx, 0)[0]

        def cached_cost(kind_, ctx, measure, use_cache=True):
            return draft * cal.verify_costs(ctx, 0)[0]

        draft_token_cost.real, cached_cost.real = real_cost, real_cached
        out.update(draft_token_cost=draft_token_cost, cached_cost=cached_cost)
    return out


def patch(cal, kind: str) -> None:
    """Make calibrate module ``cal`` measure the simulated machine ``kind`` (for good)."""
    if getattr(cal, "specli_test_costs", None) != kind:
        for name, f in replacements(cal, kind).items():
            setattr(cal, name, f)
        cal.specli_test_costs = kind


class _Hook(importlib.abc.MetaPathFinder):
    """Patches the calibrate module right after it is first imported."""

    def __init__(self, kind: str):
        self.kind = kind

    def find_spec(self, name, path, target=None):
        if name != MODULE:
            return None
        sys.meta_path.remove(self)
        try:
            spec = importlib.util.find_spec(name)
        finally:
            sys.meta_path.insert(0, self)
        if spec is None or spec.loader is None:
            return spec
        loader, kind = spec.loader, self.kind

        class Loader(importlib.abc.Loader):
            def create_module(self, spec):
                return loader.create_module(spec)

            def exec_module(self, module):
                loader.exec_module(module)
                patch(module, kind)

        spec.loader = Loader()
        return spec


def install(kind: str | None = None) -> None:
    """Simulate ``kind`` (default ``$SPECLI_TEST_COSTS``; none set: nothing) in this process."""
    kind = kind or os.environ.get("SPECLI_TEST_COSTS")
    if not kind:
        return
    _curves(kind)
    if MODULE in sys.modules:
        patch(sys.modules[MODULE], kind)
    elif not any(isinstance(f, _Hook) for f in sys.meta_path):
        sys.meta_path.insert(0, _Hook(kind))


install()

"""`specli chat` driven through a pseudo-terminal, as a person would."""

import os
import re
import sys

import pexpect
import pytest
from pausehook import MARK

from specli.chat import trim_history
from specli.errors import SpecliError

STATS = re.compile(r"([\d.]+) tok/s · (\d+) tokens · mode (\w+).*?prompt (\d+) new / (\d+) cached")


def spawn(*args, timeout=120, hold=False):
    """`specli chat ARGS` in a terminal; ``hold``: each reply holds after its first chunk until
    Ctrl-C (tests/pausehook.py), so the test interrupts it at a point it saw, on any machine."""
    cmd = [os.path.join(os.path.dirname(__file__), "pausehook.py")] if hold else ["-m", "specli"]
    child = pexpect.spawn(sys.executable, [*cmd, "chat", *args], encoding="utf-8", timeout=timeout,
                          dimensions=(40, 200))
    child.expect(">>> ")
    return child


def turn(child, text):
    child.sendline(text)
    child.expect(STATS)
    m = child.match
    child.expect(">>> ")
    return {"tokens": int(m.group(2)), "mode": m.group(3), "new": int(m.group(4)), "cached": int(m.group(5))}


def test_two_turns_reuse_the_cache_and_reset_clears_it(tiny_target, tiny_draft):
    child = spawn("--target", tiny_target, "--draft", tiny_draft, "-n", "24")
    first = turn(child, "Hello, who are you?")
    assert first["cached"] == 0 and first["tokens"] == 24
    second = turn(child, "Tell me more.")
    # only the new turn is prefilled: the first turn and the reply stay in the KV cache
    assert second["cached"] > first["new"] + 20 and second["new"] < 20
    child.sendline("/stats")
    child.expect(r"24 tokens, [\d.]+ tok/s \| mode hybrid")
    child.expect(">>> ")
    child.sendline("/reset")
    child.expect(r"\(conversation cleared\)")
    child.expect(">>> ")
    third = turn(child, "Hello again")
    assert third["cached"] == 0
    child.sendline('"""first line')
    child.expect(r"\.\.\. ")
    child.sendline('second line"""')
    child.expect(STATS)
    child.expect(">>> ")
    child.sendeof()
    child.expect(pexpect.EOF)
    child.close()
    assert child.exitstatus == 0


def test_ctrl_c_stops_the_reply_not_the_session(tiny_target):
    """Ctrl-C is sent once the reply has started streaming (the hold after its first chunk
    guarantees it is still running then, however fast the machine)."""
    child = spawn("--target", tiny_target, "--draft", "lookup", "-n", "200", hold=True)
    child.sendline("Write a very long story about a lighthouse keeper, with many chapters.")
    child.expect(r"chapters\.\r\n")  # the echoed line
    child.expect_exact(MARK)  # the reply is streaming
    child.sendintr()
    child.expect(r"\(stopped\) " + STATS.pattern)
    first = child.match
    assert 0 < int(first.group(2)) < 200 and int(first.group(5)) == 0
    child.expect(">>> ")
    # the session goes on, and the conversation so far is still in the cache
    child.sendline("Thanks. Now the next chapter.")
    child.expect(r"chapter\.\r\n")
    child.expect_exact(MARK)
    child.sendintr()
    child.expect(r"\(stopped\) " + STATS.pattern)
    # the first turn came from the cache, not prefilled again
    assert int(child.match.group(5)) >= int(first.group(4)) > 20
    child.expect(">>> ")
    child.sendline("/exit")
    child.expect(pexpect.EOF)


def test_trim_history_drops_the_oldest_exchanges_first():
    msgs = [{"role": "system", "content": "s"}]
    for i in range(3):
        msgs += [{"role": "user", "content": f"u{i}"}, {"role": "assistant", "content": f"a{i}"}]
    msgs.append({"role": "user", "content": "now"})
    out, dropped = trim_history(msgs, lambda m: len(m) <= 4)
    assert dropped == 4
    assert [m["content"] for m in out] == ["s", "u2", "a2", "now"]
    with pytest.raises(SpecliError, match="does not fit"):
        trim_history(msgs, lambda m: False)


def test_overflow_trims_and_says_so(tiny_target):
    child = spawn("--target", tiny_target, "--draft", "none", "--ctx", "256", "-n", "60")
    for _ in range(4):
        child.sendline("Please tell me a long story about dragons and castles and knights.")
        i = child.expect([r"dropped the \d+ oldest messages", STATS])
        if i == 0:
            child.expect(STATS)
            child.expect(">>> ")
            break
        child.expect(">>> ")
    else:
        pytest.fail("the context never overflowed")
    child.sendline("/exit")
    child.expect(pexpect.EOF)

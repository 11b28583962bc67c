"""How a match fails: it raises its reason (onnxscript's MatchFailureError), it does not return it.

    def match(self, graph, ln):
        expect(ln.attrs.get("axis", -1) == -1, f"LayerNormalization {ln.name} is over ...")
        add = producer(ln.inputs[0])
        if add is None or add.op != "Add":
            fail(f"LayerNormalization {ln.name} does not read an Add (no residual sum)")
        return found

The candidate loop (base.CandidatePass) catches the failure and records its reason, word for
word, as the candidate's diagnostic. A helper deep inside a match fails the same way, so no
caller has to test what it got back; a caller that adds context wraps the call in
`prefixed("query path: ")`.
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Iterator, NoReturn


class MatchFailure(Exception):
    """A candidate that does not match; `reason` names the node and the check that failed."""

    def __init__(self, reason: str) -> None:
        self.reason = reason or "no reason given"  # a miss without a reason would read as none
        super().__init__(self.reason)


class NotACandidate(Exception):
    """Raised by a match that finds its node is no candidate after all (a pooler's Tanh for
    gelu, a residual sum for embed_layernorm): the loop records nothing for it."""


def fail(reason: str) -> NoReturn:
    """Ends the match attempt with `reason`."""
    raise MatchFailure(reason)


def expect(cond: object, reason: str) -> None:
    """fail(reason) unless cond holds. The reason is built before the check: give it only
    what exists whether or not the check holds."""
    if not cond:
        raise MatchFailure(reason)


@contextmanager
def prefixed(prefix: str) -> Iterator[None]:
    """A failure inside the block fails with `prefix` before its reason ("query path: ...")."""
    try:
        yield
    except MatchFailure as failure:
        raise MatchFailure(prefix + failure.reason) from None

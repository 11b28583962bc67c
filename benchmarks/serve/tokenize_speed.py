"""Tokenizing a batch of 20 English queries of 64 tokens each ([CLS] ... [SEP], no padding
needed) with bertfuse.text.WordPiece on the example vocab of BERT-base's size (30522).

    taskset -c 0 python benchmarks/serve/tokenize_speed.py [--rounds 10] [--calls 300]

Prints, per round, the median and the fastest call in ms, then the fastest call of all and
the median of the round medians (on a shared host, the fastest call is the machine's cost;
the medians say how much the neighbours took): first with the tokenizer's word cache warm
(the same queries again), then cold (cleared before every call: no word seen before).
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from bertfuse.converter.example_vocab import example_vocab  # noqa: E402
from bertfuse.text import WordPiece  # noqa: E402


def queries(vocab_path: str, n: int = 20, tokens: int = 64, seed: int = 0) -> list[str]:
    """n queries of words (some with punctuation) that make exactly `tokens` word pieces with
    [CLS] and [SEP], or one fewer where the next word would not fit whole."""
    measure = WordPiece(vocab_path, max_length=512)
    words = [w for w in example_vocab(30522) if w.isalpha() and len(w) > 2]
    rng, out = random.Random(seed), []
    for _ in range(n):
        text: list[str] = []
        while True:
            word = rng.choice(words) + (rng.choice(",.?!'") if rng.random() < 0.1 else "")
            if len(measure.tokens(" ".join([*text, word]))) > tokens:
                break
            text.append(word)
        out.append(" ".join(text).capitalize())
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--calls", type=int, default=300)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "vocab.txt")
        with open(path, "w") as f:
            f.write("".join(t + "\n" for t in example_vocab(30522)))
        tok = WordPiece(path, max_length=64)
        texts = queries(path)
    batch = tok(texts)
    kept = batch.input_mask.sum(1)
    print(f"{len(texts)} queries, {batch.input_ids.shape[1]} tokens wide "
          f"({kept.min()}..{kept.max()} kept), cpu affinity {sorted(os.sched_getaffinity(0))}")
    for _ in range(200):
        tok(texts)
    for cold in (False, True):
        medians, fastest = [], []
        for r in range(args.rounds):
            times = []
            for _ in range(args.calls):
                if cold:  # every word's pieces looked up afresh, as for unseen queries
                    tok._pieces.clear()
                t0 = time.perf_counter()
                tok(texts)
                times.append(time.perf_counter() - t0)
            medians.append(statistics.median(times) * 1e3)
            fastest.append(min(times) * 1e3)
            print(f"round {r}: median {medians[-1]:.3f} ms, fastest {fastest[-1]:.3f} ms")
        print(f"{'cold' if cold else 'warm'} word cache: fastest call {min(fastest):.3f} ms; "
              f"median of round medians {statistics.median(medians):.3f} ms (best round "
              f"{min(medians):.3f} ms)")
    return 0


if __name__ == "__main__":
    sys.exit(main())

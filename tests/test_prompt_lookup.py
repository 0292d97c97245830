"""Prompt lookup's incremental n-gram index against a direct scan of the context."""
import random

from specdec.spec.proposers.prompt_lookup import PromptLookupProposer


def scan(context: list[int], k: int, max_ngram: int = 3, min_ngram: int = 1) -> list[int]:
    """The definition: what followed the most recent earlier occurrence of the longest n-gram
    (up to max_ngram) that ends the context."""
    for n in range(max_ngram, min_ngram - 1, -1):
        if len(context) <= n:
            continue
        pattern = context[-n:]
        for start in range(len(context) - 1 - n, -1, -1):
            if context[start:start + n] == pattern:
                return context[start + n:start + n + k]
    return []


def test_index_matches_a_scan_as_contexts_grow_side_by_side():
    """Two growing contexts share one proposer (as the batched engine's sequences do), a third
    one is replaced by a new list; every lookup equals the scan."""
    rnd = random.Random(0)
    proposer = PromptLookupProposer()
    for _ in range(100):
        a = [rnd.randrange(6) for _ in range(rnd.randrange(0, 5))]
        b = [rnd.randrange(3) for _ in range(2)]
        for _ in range(40):
            c = [rnd.randrange(4) for _ in range(rnd.randrange(1, 30))]  # a fresh list each step
            for context in (a, b, c):
                k = rnd.randrange(1, 9)
                assert proposer._lookup(context, k) == scan(context, k), (context, k)
            a += [rnd.randrange(6) for _ in range(rnd.randrange(1, 4))]
            b.append(rnd.randrange(3))


def test_a_guesser_proposes_what_followed_the_longest_ngram_ending_the_drafts():
    """A draft model's guesses (Guesser): what followed the latest earlier occurrence in the
    context of the longest n-gram ending the context and the drafts after it."""
    from specdec.spec.proposers.prompt_lookup import Guesser

    guesser = Guesser(ngram=3, tokens=4)
    context = [1, 2, 3, 4, 5, 6, 7, 9, 2, 3, 8, 1, 2]
    guesser.follow(context)
    assert guesser.guess([], 8) == [3, 4, 5, 6]  # "8 1 2" not earlier; "1 2" at 0; at most `tokens`
    assert guesser.guess([3], 8) == [4, 5, 6, 7]  # "1 2 3" (the context's end and a draft) at 0
    assert guesser.guess([3], 2) == [4, 5]  # at most n
    assert guesser.guess([9, 2, 3], 4) == [8, 1, 2]  # "9 2 3" at 7: to the context's end
    assert guesser.guess([42], 4) == [] and guesser.guess([3], 0) == []
    guesser.follow(context + [3, 4])  # the same text further on: indexed on from where it was
    assert guesser.guess([], 4) == [5, 6, 7, 9]  # "2 3 4" at 1
    guesser.follow([5, 6, 5])  # another text: indexed afresh
    assert guesser.guess([], 4) == [6, 5]

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


def test_a_guesser_carries_only_the_guesses_worth_their_rows():
    """With the draft's pass times by width, a pass carries the j-th guess only where the chance
    that the first j are kept, times the draft pass a kept guess saves, beats what its row adds.
    The places' kept shares are learned from the passes (observe)."""
    from specdec.spec.proposers.prompt_lookup import Guesser

    guesser = Guesser(ngram=3, tokens=4)
    guesser.follow([1, 2, 3, 4, 5, 6, 7, 1, 2])
    assert guesser.worth() == 4  # uncalibrated: every guess, as before
    # Zen 3's 4-bit 0.5B draft (ms): the 2nd and 3rd rows cheap, the 4th and 5th dear
    guesser.pass_seconds = {1: 9.0, 2: 9.4, 3: 9.7, 4: 12.9, 5: 15.6}
    assert guesser.worth() == 2  # kept shares of 0.5 (the prior): 0.125 x 9 ms < 3.2 ms for a third
    assert guesser.guess([], 8) == [3, 4]
    for _ in range(200):  # code that copies its prompt: every guess kept
        guesser.observe(4, 4)
    assert guesser.worth() == 4
    for i in range(200):  # the first guess kept one time in ten, never the second
        guesser.observe(2, 0)
        if i % 10 == 0:
            guesser.observe(2, 1)
    assert guesser.worth() == 1  # 0.1 x 9 ms > 0.4 ms; the second's chance ~0
    guesser.pass_seconds = {1: 9.0, 2: 12.0, 3: 15.0}  # a row costs a third of a pass: none pays
    assert guesser.worth() == 0 and guesser.guess([], 8) == []


def test_a_draft_models_guesses_are_sized_by_its_calibrated_pass_costs():
    """Calibration times the draft model's passes of 1 .. tokens + 1 rows and hands them to its
    guesser; the drafts are the same with any number of guesses (they only save passes)."""
    import specdec

    decoder = specdec.load(method="draft")
    guesser = decoder.engine.proposer.guesser
    assert sorted(guesser.pass_seconds) == list(range(1, guesser.tokens + 2))
    assert all(t > 0 for t in guesser.pass_seconds.values())
    prompt = "def fibonacci(n):\n    # fibonacci numbers: fibonacci(0) = 0, fibonacci(1) = 1\n"
    sized = decoder.generate(prompt, max_new_tokens=32).token_ids
    guesser.pass_seconds = None  # unsized: every guess
    assert decoder.generate(prompt, max_new_tokens=32).token_ids == sized
    plain = specdec.load(method="none").generate(prompt, max_new_tokens=32).token_ids
    assert sized == plain

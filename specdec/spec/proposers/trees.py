"""Candidate trees as data. A tree is a list of "choices": tuples of top-k ranks, one per
depth, e.g. (0, 1) = the best candidate at depth 1, then the second best at depth 2. Lists are
prefix-closed and ordered so that every choice comes after its prefix."""
from __future__ import annotations

import heapq

# Node budgets a tree drafter offers its controller, capped at its largest tree. The smallest is
# 1 node: where plain steps win (T=1), the controller's exploration and probes use the smallest
# tree, and at T=1 a lone drafted token can itself win (SmolLM2 + its EAGLE head, fixed trees of 1
# / 2 / 4 nodes: 1.17x / 1.07x / 0.95x plain decoding's tokens/s). With 2 nodes the smallest, eagle
# ran 0.92x / 1.00x plain at T=1 against 1.01x / 1.04x with 1, and 2.12x / 2.20x at T=0 against
# 2.11x / 2.06x (two runs, one process each; bench/results/README.md, stop 71). With 4 nodes the
# smallest, eagle and medusa one-shot calls at T=1 ran at 0.92-0.98x of plain decoding (stop 29).
TREE_BUDGETS = (1, 2, 4, 8, 16)


def node_budgets(max_nodes: int) -> list[int]:
    """The tree sizes (node budgets) of a drafter whose largest tree has max_nodes nodes."""
    return sorted({min(s, max_nodes) for s in (*TREE_BUDGETS, max_nodes)})


def graft_chain(tokens: list[int], parents: list[int], chain: list[int]) -> tuple[list[int], list[int], list[int]]:
    """A tree (tokens, parents: -1 = the root) with a chain of tokens from the root added: the
    chain follows the nodes that hold its tokens, and new nodes (appended, children after their
    parents) carry the rest. Returns the tokens, the parents and the chain's nodes in order."""
    tokens, parents = list(tokens), list(parents)
    child = {(parent, token): node for node, (token, parent) in reversed(list(enumerate(zip(tokens, parents))))}
    node, path = -1, []
    for token in chain:
        nxt = child.get((node, token))
        if nxt is None:
            nxt = child[node, token] = len(tokens)
            tokens.append(token)
            parents.append(node)
        node = nxt
        path.append(node)
    return tokens, parents, path


def chain_with_lookup(drafted: list[int], lookup: list[int], k: int) -> tuple[list[int], list[int] | None]:
    """A chain drafter's greedy proposal of budget k with the prompt-lookup chain grafted from
    the root and kept first, beside the drafted chain's first tokens: at most max(k, len(lookup)
    + 1) nodes. Returns the tokens and their parents (None where the two agree: a chain)."""
    tokens, parents, path = graft_chain(drafted, list(range(-1, len(drafted) - 1)), lookup)
    total, keep = max(k, len(path) + 1) if path else k, set(path)
    for node in range(len(drafted)):  # the drafted chain's prefix: ancestor-closed
        if len(keep) >= total:
            break
        keep.add(node)
    kept = sorted(keep)  # a parent comes before its children (graft_chain appends)
    index = {node: i for i, node in enumerate(kept)}
    kept_parents = [index[parents[node]] if parents[node] >= 0 else -1 for node in kept]
    chain = kept_parents == list(range(-1, len(kept) - 1))
    return [tokens[node] for node in kept], None if chain else kept_parents


def build_tree(rank_accuracy: list[list[float]], num_nodes: int) -> list[tuple[int, ...]]:
    """Greedy expected-acceptance construction (Medusa paper): repeatedly add the choice with
    the highest probability of being accepted, Π_d rank_accuracy[d][rank_d], among those whose
    prefix is already in the tree. rank_accuracy[d][r] = P(rank r at depth d+1 is correct)."""
    tree: list[tuple[int, ...]] = []
    heap: list[tuple[float, tuple[int, ...]]] = []

    def push_children(prefix: tuple[int, ...], value: float) -> None:
        depth = len(prefix)
        if depth < len(rank_accuracy):
            for r, acc in enumerate(rank_accuracy[depth]):
                heapq.heappush(heap, (-value * acc, prefix + (r,)))

    push_children((), 1.0)
    while heap and len(tree) < num_nodes:
        neg, choice = heapq.heappop(heap)
        if -neg <= 0:
            break
        tree.append(choice)
        push_children(choice, -neg)
    return tree


def tree_from_choices(choices: list[tuple[int, ...]], candidates: list[list[int]]) -> tuple[list[int], list[int]]:
    """Tokens and parent indices for choices, given ranked candidate tokens per depth. Choices
    ranked past the candidates there are (and their descendants) are left out."""
    index: dict[tuple[int, ...], int] = {}
    tokens, parents = [], []
    for choice in choices:
        if choice[-1] >= len(candidates[len(choice) - 1]) or (len(choice) > 1 and choice[:-1] not in index):
            continue
        index[choice] = len(tokens)
        tokens.append(candidates[len(choice) - 1][choice[-1]])
        parents.append(index[choice[:-1]] if len(choice) > 1 else -1)
    return tokens, parents


def expected_accepted_length(choices: list[tuple[int, ...]], rank_accuracy: list[list[float]]) -> float:
    """Expected drafted tokens accepted per step under independent per-depth accuracies."""
    total = 0.0
    for choice in choices:
        p = 1.0
        for d, r in enumerate(choice):
            p *= rank_accuracy[d][r]
        total += p
    return total

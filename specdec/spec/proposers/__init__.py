from specdec.spec.proposers.base import Proposal, Proposer
from specdec.spec.proposers.draft_model import DraftModelProposer
from specdec.spec.proposers.prompt_lookup import PromptLookupProposer

__all__ = ["DraftModelProposer", "PromptLookupProposer", "Proposal", "Proposer"]

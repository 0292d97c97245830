from specdec.proposers.base import Proposal, Proposer
from specdec.proposers.draft_model import DraftModelProposer
from specdec.proposers.prompt_lookup import PromptLookupProposer

__all__ = ["DraftModelProposer", "PromptLookupProposer", "Proposal", "Proposer"]

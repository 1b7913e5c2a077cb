"""Ask a person (SPEC §5.5a): the approval book, where held calls wait for a decision.

`book` is the contract and the in-process book; `shared` the book kept in Redis for several
replicas (`state` set); `hold` what a held call's client sees meanwhile (keep-alives, hang-ups).
"""

from proxy.approvals.book import (
    AlreadyDecided,
    Approval,
    ApprovalBook,
    Decided,
    LocalApprovalBook,
    UnknownApproval,
)

__all__ = ["AlreadyDecided", "Approval", "ApprovalBook", "Decided", "LocalApprovalBook", "UnknownApproval"]

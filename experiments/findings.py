"""Findings: the sentences the report states, generated from an experiment's saved tables.

Each experiment package may expose ``findings(out_dir: Path) -> list[Finding]``, reading only the tables it
wrote under ``out_dir`` (never the model), and ``CAPTIONS: dict[str, str]``, a caption per figure file stem.
The report puts the findings that answer one of the tutorials' three claims at the top of the page, and every
finding in its experiment's section.

A finding's text is formatted from the numbers it cites (``fmt_ci`` keeps the style uniform); no sentence is
typed in without the number that supports it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

#: The tutorials' three claims, by key: what the report's Findings section answers.
CLAIMS: dict[str, str] = {
    "same-token": "Plain dot-product attention (Q = K = V = the embeddings) puts very large weight on identical "
    "tokens, and learned heads escape it.",
    "specialisation": "Each head focuses on one aspect: one may capture subject-verb interaction, another nearby "
    "adjectives.",
    "position": "Attention alone is order-blind; the learned position embeddings give the hidden states position, "
    "which the layers keep.",
}


@dataclass(frozen=True)
class Finding:
    """One sentence of the report, with the numbers behind it.

    ``text``: the sentence, numbers formatted in. ``claim``: a key of ``CLAIMS`` when the sentence says whether
    that claim holds, else None. ``holds``: the verdict on that claim (True / False / None = mixed or
    undecided). ``numbers``: the values the sentence cites, by name (kept for tests and the JSON manifest).
    """

    text: str
    claim: str | None = None
    holds: bool | None = None
    numbers: dict[str, float] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.claim is not None and self.claim not in CLAIMS:
            raise ValueError(f"unknown claim {self.claim!r}; use one of {sorted(CLAIMS)}")
        if not self.text.strip():
            raise ValueError("a finding needs a sentence")


def fmt_ci(value: float, low: float | None = None, high: float | None = None, digits: int = 2) -> str:
    """``0.34 [0.29, 0.40]``: a value with its interval, or the value alone when there is none."""
    if low is None or high is None or low != low or high != high:  # NaN bounds: no interval
        return f"{value:.{digits}f}"
    return f"{value:.{digits}f} [{low:.{digits}f}, {high:.{digits}f}]"

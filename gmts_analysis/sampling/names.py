"""The sampling worlds' names and the one check of a domain list (no imports above the toy layer, so the option
checks can read them without importing the sampling code)."""

from __future__ import annotations

from typing import Any

from gmts_analysis.errors import GmtsError
from gmts_analysis.toy.domains import DOMAINS as TOY_DOMAINS

#: the toy domains sampled by default: every registered one (:data:`gmts_analysis.toy.domains.DOMAINS`)
DEFAULT_DOMAINS = tuple(TOY_DOMAINS)
#: the real-model world: grade-school word problems (:mod:`gmts_analysis.sampling.wordproblems`)
WORD_DOMAIN = "word"
ALL_DOMAINS = (*DEFAULT_DOMAINS, WORD_DOMAIN)


def domain_list(domains: str | Any, allowed: tuple[str, ...] = ALL_DOMAINS, flag: str = "domains") -> list[str]:
    """Domain names from a comma-separated string or a sequence of them; a name not in ``allowed``, or
    none at all, is refused with one line naming ``flag`` (the caller's name for the option)."""
    doms = [d.strip() for x in ([domains] if isinstance(domains, str) else domains) for d in str(x).split(",")
            if d.strip()]
    unknown = [d for d in doms if d not in allowed]
    if not doms or unknown:
        raise GmtsError(f"{flag}: unknown domain(s) {', '.join(unknown) or '(none given)'} "
                        f"(choose from {', '.join(allowed)})")
    return doms

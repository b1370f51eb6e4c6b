"""Sampling answers: generation with per-row seeds (generate), the toy domains and word problems
(domains, wordproblems). Nothing is imported here, so the package stays cheap to import."""

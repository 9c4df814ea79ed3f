"""Shared by the constrained-decoding tests: a regular expression for an e-mail address."""

EMAIL = r"[a-z]{2,8}\.[a-z]{2,8}@(example|test)\.(com|org)"

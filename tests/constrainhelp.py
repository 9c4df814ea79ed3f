"""Shared by the constrained-decoding tests: a regular expression for an e-mail address, a JSON
schema with every kind of field, and a cheap verify curve."""

EMAIL = r"[a-z]{2,8}\.[a-z]{2,8}@(example|test)\.(com|org)"

SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 12},
        "age": {"type": "integer", "minimum": 0, "maximum": 150},
        "role": {"enum": ["admin", "editor", "viewer"]},
        "tags": {"type": "array", "items": {"type": "string", "maxLength": 6}, "maxItems": 3},
    },
    "required": ["name", "age", "role", "tags"],
    "additionalProperties": False,
}
# a cheap verify curve (a block of k+1 tokens costs 1 + k/10 of one): the controller drafts
CHEAP_VERIFY = [1.0 + k / 10 for k in range(17)]

"""What configuration and model cards share in declaring their schema with pydantic.

Both are TOML tables validated into frozen dataclasses (`imaging_ai.config`,
`imaging_ai.modelcard`); each words its own errors for its own readers, from the same pieces.
"""

from __future__ import annotations

from pydantic import ConfigDict

# Every table refuses keys it does not declare: a misspelt key is an error, not a default.
TABLE = ConfigDict(extra="forbid")

# pydantic's bound errors as the comparison they failed.
BOUNDS = {
    "greater_than": ">",
    "greater_than_equal": ">=",
    "less_than": "<",
    "less_than_equal": "<=",
}

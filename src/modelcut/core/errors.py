"""Errors the core raises for bad input; faces turn them into one-line messages."""

#: What a refusal says of a JSON or TOML input nested past the recursion Python's parsers allow
#: (``json.loads`` and ``tomllib.loads`` raise RecursionError there).
NESTED_JSON = "objects or arrays nested more deeply than the parser reads"
NESTED_TOML = "tables or arrays nested more deeply than the parser reads"


class ModelcutError(ValueError):
    """A problem with the user's input, explained in one line."""


class DeadlockError(ModelcutError):
    """A schedule whose op lists cannot complete."""

    def __init__(self, message: str, blocked: list[str]):
        super().__init__(message)
        self.blocked = blocked

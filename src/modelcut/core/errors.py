"""Errors the core raises for bad input; faces turn them into one-line messages."""


class ModelcutError(ValueError):
    """A problem with the user's input, explained in one line."""


class DeadlockError(ModelcutError):
    """A schedule whose op lists cannot complete."""

    def __init__(self, message: str, blocked: list[str]):
        super().__init__(message)
        self.blocked = blocked

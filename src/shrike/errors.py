"""Errors a user can cause and fix."""


class ConfigError(ValueError):
    """A flag, environment variable or machine limit that stops Shrike from running as asked.

    The message is one line meant for the user: what is wrong and what to change.
    """

"""One root for agentrl's exceptions, so callers (the CLI above all) tell kinds apart by class.

``UserError``: a mistake in what the user gave (a config key, an environment spec, a model path, a
dataset): the CLI prints its message as one line and exits 2. Every other ``AgentrlError`` is
agentrl failing at its own work: the CLI names the class and points at ``--debug``.
"""

from __future__ import annotations


class AgentrlError(Exception):
    """The root of every exception agentrl raises on purpose."""


class UserError(AgentrlError):
    """Bad input, phrased for the person who gave it (one line that names the problem)."""


class ConfigError(UserError, ValueError):
    """A configuration problem, phrased for the command line (one line, names the key)."""

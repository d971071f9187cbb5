"""Requests and stages declared after the fact (`tailscope map`): the rule language, the saved mapping, suggestions.

`expr` parses and compiles one rule; `rules` holds a store's `Mapping` and the SQL projection every
reader applies to the spans; `suggest` proposes a mapping from a store's span trees.
"""

from analysis.mapping.expr import ExpressionError, parse
from analysis.mapping.rules import Mapping, MappingError, load, project, reset, save

__all__ = ["ExpressionError", "Mapping", "MappingError", "load", "parse", "project", "reset", "save"]

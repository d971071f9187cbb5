"""Every exception class tailscope defines sits under TailscopeError, and the tree in tracing/errors.py names it."""

from __future__ import annotations

import importlib
import inspect
import pkgutil

import tracing.errors
from tracing.errors import TailscopeError

PACKAGES = ("tracing", "intake", "analysis", "dashboard", "tailscope", "sample_traces")
#: modules that run an app when imported (Streamlit pages), not libraries
SCRIPTS = ("dashboard.app", "dashboard.app_pages")
#: not errors of tailscope: the serving code's client going away (a ConnectionError the host raises or gets)
NOT_OURS = frozenset({"tracing.instrument.ClientDisconnected"})


def our_exceptions() -> dict[str, type[BaseException]]:
    found: dict[str, type[BaseException]] = {}
    for package in PACKAGES:
        root = importlib.import_module(package)
        names = [package] + [m.name for m in pkgutil.walk_packages(root.__path__, f"{package}.")]
        for name in names:
            if name.startswith(SCRIPTS) or name.endswith("__main__"):
                continue
            module = importlib.import_module(name)
            for _, obj in inspect.getmembers(module, inspect.isclass):
                qualified = f"{name}.{obj.__name__}"
                # private classes (_HttpError) are control flow inside one module and never escape it
                if issubclass(obj, BaseException) and obj.__module__ == name and not obj.__name__.startswith("_") \
                        and qualified not in NOT_OURS:
                    found[qualified] = obj
    return found


def test_every_exception_is_under_tailscope_error() -> None:
    found = our_exceptions()
    assert "intake.collect.commit.QueueFull" in found and "dashboard.data.RefusedQuery" in found
    outside = sorted(name for name, cls in found.items() if not issubclass(cls, TailscopeError))
    assert outside == []


def test_the_drawn_tree_names_every_exception() -> None:
    tree = tracing.errors.__doc__ or ""
    missing = sorted(name for name, cls in our_exceptions().items() if f" {cls.__name__} " not in tree)
    assert missing == []

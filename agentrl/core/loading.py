"""Import an object named by a spec: ``"package.module:attr"`` or ``"path/to/file.py:attr"``.

One loader for every user-supplied spec (environments, reward functions, losses), in the lowest
layer so that any module may use it; callers turn ``SpecError`` into their own error type.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
from pathlib import Path
from typing import Any

from agentrl.core.errors import UserError


class SpecError(UserError, LookupError):
    """The spec is malformed, its file or module is missing, or it lacks the attribute."""


def load_spec(target: str) -> Any:
    """The object ``target`` names; a file is imported once per path (cached in ``sys.modules``)."""
    where, _, attr = target.rpartition(":")
    if not where or not attr:
        raise SpecError(f"bad spec {target!r}: expected 'module:Class' or 'file.py:Class'")
    if where.endswith(".py"):
        path = Path(where).expanduser().resolve()
        if not path.is_file():
            raise SpecError(f"file not found: {path}")
        mod_name = f"agentrl_user_env_{abs(hash(str(path)))}"
        module = sys.modules.get(mod_name)
        if module is None:
            module_spec = importlib.util.spec_from_file_location(mod_name, path)
            assert module_spec and module_spec.loader
            module = importlib.util.module_from_spec(module_spec)
            sys.modules[mod_name] = module
            if str(path.parent) not in sys.path:  # a module beside the file imports, as under `python file.py`
                sys.path.append(str(path.parent))  # appended: never shadows an installed package
            try:
                module_spec.loader.exec_module(module)
            except BaseException:
                sys.modules.pop(mod_name, None)  # a fixed file is imported afresh next time
                raise
    else:
        try:
            module = importlib.import_module(where)
        except ImportError as exc:
            raise SpecError(f"cannot import {where!r} for spec {target!r}: {exc}") from exc
    try:
        return getattr(module, attr)
    except AttributeError:
        raise SpecError(f"{where!r} has no attribute {attr!r} (spec {target!r})") from None

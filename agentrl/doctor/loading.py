"""Loading what the doctor checks: a local folder, ``default``, or a hub id, offline-first.

A hub id is read from the Hugging Face cache first, so a cached model works with no network; only
when it is not cached is the hub tried, and only after a one-second reachability check, because
an offline ``from_pretrained`` retries for about a minute before failing.
"""

from __future__ import annotations

import socket
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from agentrl.core.strict import ConfigError


class DoctorError(ConfigError):
    """Bad input to the doctor (no such model, unreadable template): one line, exit status 2."""


def load_tokenizer(spec: str) -> Any:
    """The tokenizer of ``default``, a local folder or a hub id; DoctorError with one clear line otherwise."""
    from transformers import AutoTokenizer

    return load_offline_first(spec, AutoTokenizer.from_pretrained, "tokenizer")


def load_offline_first(spec: str, load: Callable[..., Any], what: str) -> Any:
    """``load(path_or_id, **kwargs)`` for a folder, else from the cache, else from a reachable hub."""
    from agentrl.compute.models import resolve_model

    path = Path(resolve_model(spec)).expanduser()
    if path.exists():
        if not path.is_dir():
            raise DoctorError(f"model={spec}: {path} is a file; pass the folder that holds the {what} files")
        try:
            return load(str(path))
        except Exception as exc:
            raise DoctorError(f"model={spec}: no {what} could be loaded from {path}: {first_line(exc)}") from None
    if spec.startswith((".", "/", "~")) or spec.count("/") > 1:
        raise DoctorError(f"model={spec}: no such folder")
    from huggingface_hub import constants

    try:
        with hub_offline():
            return load(spec, local_files_only=True)
    except Exception as exc:
        cached_error = first_line(exc)

    why = hub_unreachable(constants.ENDPOINT, bool(constants.HF_HUB_OFFLINE))
    if why:
        raise DoctorError(
            f"model={spec}: not a local folder and no {what} in the Hugging Face cache ({constants.HF_HUB_CACHE}), "
            f"and the hub cannot be reached ({why}). Download it where there is network "
            f"(`hf download {spec}`) or pass a local folder."
        )
    try:
        return load(spec)
    except Exception as exc:
        raise DoctorError(f"model={spec}: no {what} in the cache ({cached_error}) nor on the hub: {first_line(exc)}") from None


@contextmanager
def hub_offline() -> Iterator[None]:
    """Offline mode for the cache attempt: ``local_files_only`` alone still lets transformers probe
    the hub for optional files (a PEFT adapter config), retrying for half a minute without network."""
    from huggingface_hub import constants

    before = constants.HF_HUB_OFFLINE
    constants.HF_HUB_OFFLINE = True
    try:
        yield
    finally:
        constants.HF_HUB_OFFLINE = before


def hub_unreachable(endpoint: str, offline_flag: bool) -> str | None:
    """Why the hub cannot be reached, or None."""
    if offline_flag:
        return "HF_HUB_OFFLINE is set"
    host = urlparse(endpoint).hostname or endpoint
    port = urlparse(endpoint).port or (80 if endpoint.startswith("http://") else 443)
    try:
        socket.create_connection((host, port), timeout=3).close()
    except OSError as exc:
        return f"{host}: {exc.strerror or exc}"
    return None


def first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{exc.__class__.__name__}: {text[0] if text else ''}"

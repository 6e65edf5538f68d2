"""Request bodies of the executor protocol decoded into their messages (minions/protocol.py), with
the API's own 422 wording: a field's tuned message where the route has one, msgspec's reason else."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any, TypeVar

from minions import protocol
from minions.services.api.http.errors import invalid

T = TypeVar("T")
_TOP = re.compile(r"[.\[]")


def decode_body(body: dict[str, Any], kind: type[T], messages: Mapping[str, str] = {}) -> T:
    """`body` (a JSON object) as a `kind`, or 422 `invalid` naming the field at fault."""
    try:
        return protocol.convert(body, kind)
    except protocol.ProtocolError as exc:
        path, reason = protocol.failed_field(exc)
        top = _TOP.split(path, maxsplit=1)[0]
        if top in messages:
            raise invalid({top: messages[top]}) from None
        raise invalid({path: reason}) from None

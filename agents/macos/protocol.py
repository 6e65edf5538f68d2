"""The executor protocol as the agent speaks it: the messages are minions/protocol.py's (API.md,
"Executor protocol"), one definition for the server, the agent and every other executor; here, the
names the agent's code uses for them and the decoding of the server's answers."""

from __future__ import annotations

from typing import Any

from minions import protocol
from minions.protocol import InputRef, OutputRef, ProtocolError

__all__ = ["Claim", "InputRef", "OutputRef", "ProtocolError", "Registration", "Subtask", "parse_claim",
           "parse_claims", "parse_registration"]

Registration = protocol.Registered
Claim = protocol.Lease  # a lease (its token) on one subtask
Subtask = protocol.LeasedSubtask


def parse_registration(body: Any) -> Registration:
    try:
        return protocol.convert(body, Registration)
    except ProtocolError as exc:
        raise ProtocolError(f"bad registration answer: {exc}") from exc


def parse_claim(body: Any) -> Claim:
    """The answer to a claim without `max` (one Lease)."""
    try:
        return _checked(protocol.convert(body, Claim))
    except ProtocolError as exc:
        raise ProtocolError(f"bad claim answer: {exc}") from exc


def parse_claims(body: Any) -> list[Claim]:
    """The answer to a claim with `max` (a LeaseBatch)."""
    try:
        return [_checked(lease) for lease in protocol.convert(body, protocol.LeaseBatch).with_params().leases]
    except ProtocolError as exc:
        raise ProtocolError(f"bad claim answer: {exc}") from exc


def _checked(claim: Claim) -> Claim:
    ref = claim.subtask.input
    if ref.url is None and ref.data is None:
        raise ProtocolError("an input with neither a URL nor inline data")
    if ref.data is not None and len(ref.data.encode()) != ref.end - ref.start:
        raise ProtocolError(f"inline input of {len(ref.data.encode())} bytes for a range of {ref.end - ref.start}")
    return claim

"""The one redaction function: what it removes, and what it leaves so a message still reads."""

from __future__ import annotations

from minions.redaction import REDACTED, redact, redact_event, redact_failure, redact_value

LEASE = "435192d2-9d8e-4e94-bc4d-9cd8db478fa3"


def test_signed_urls_keep_their_path_and_lose_their_signature() -> None:
    local = f"http://h:1/api/v1/store/outputs/1/0/1-x.jsonl?method=PUT&expires=17&sig={'ab' * 32}"
    s3 = ("https://b.s3.amazonaws.com/k?X-Amz-Algorithm=AWS4-HMAC-SHA256&X-Amz-Credential=AKIA%2F20261130"
          "&X-Amz-Date=20261130T000000Z&X-Amz-Expires=60&X-Amz-SignedHeaders=host&X-Amz-Signature=deadbeef")
    assert redact(local) == local.replace("ab" * 32, REDACTED)
    out = redact(s3)
    assert "deadbeef" not in out and "AKIA" not in out and "X-Amz-Expires=60" in out


def test_tokens_wherever_they_stand() -> None:
    text = (f"POST /api/v1/leases/{LEASE}/fail; lease token: {LEASE}; Authorization: Bearer mn_abcdefghijkl; "
            "key mn_0123456789abcdef; postgresql://minions:hunter2@db/minions")
    out = redact(text)
    for secret in (LEASE, "mn_abcdefghijkl", "mn_0123456789abcdef", "hunter2"):
        assert secret not in out, out
    assert "/api/v1/leases/[redacted]/fail" in out and "postgresql://minions:[redacted]@db/minions" in out


def test_a_known_secret_goes_in_any_spelling_and_other_ids_stay() -> None:
    executor = "1913cdfc-225d-4b04-a7ec-7109e9a7edaf"
    out = redact(f"lost {LEASE.upper()} on executor {executor}", known=[LEASE])
    assert LEASE.upper() not in out and executor in out


def test_values_under_secret_keys_and_nested_text() -> None:
    value = {"token": LEASE, "history": [{"error": "Bearer abc.def"}], "records": 3}
    assert redact_value(value) == {"token": REDACTED, "history": [{"error": f"Bearer {REDACTED}"}], "records": 3}
    event = redact_event(None, "info", {"event": "lease_failed", "admin_token": "mn_x", "n": 1})
    assert event == {"event": "lease_failed", "admin_token": REDACTED, "n": 1}


def test_failure_text_loses_every_uuid_in_any_spelling_and_keeps_other_hex() -> None:
    token = "0ee2a6a5-3636-492e-b2ff-01b1f0f84b7f"
    sha256 = "ab" * 32
    text = (f"lease {token}, {token.upper()}, {{{token.replace('-', '')}}}, urn:uuid:{token}; "
            f"subtask 12 of task 7; object {sha256}")
    assert redact_failure(text) == (f"lease {REDACTED}, {REDACTED}, {{{REDACTED}}}, urn:uuid:{REDACTED}; "
                                    f"subtask 12 of task 7; object {sha256}")
    # And everything redact itself removes.
    assert redact_failure("Authorization: Bearer abc.def mn_abcdefghijk") == (
        f"Authorization: Bearer {REDACTED} mn_{REDACTED}")

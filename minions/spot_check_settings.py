"""The session settings sql/schema/11_checks.sql reads (minion_trust_setting): each database session
that claims, votes or ends attempts carries them, the API's and the watchdog's alike, so that a rule
that depends on them (a volunteer's failures, the claim's share) reads the same in every process."""

from __future__ import annotations

from minions.config import Settings


def spot_check_session(settings: Settings) -> dict[str, str]:
    """The session settings the claim, the votes and the ends of attempts read."""
    return {"minions.spot_check_share": repr(float(settings.spot_check_share)),
            "minions.trust_agreements": str(int(settings.trust_agreements)),
            "minions.quarantine_after": str(int(settings.quarantine_after)),
            # 'team=share,...' without blanks ('' : none)
            "minions.spot_check_team_shares": ",".join(
                "=".join(part.strip() for part in item.split("=", 1))
                for item in settings.spot_check_team_shares.split(",") if item.strip())}

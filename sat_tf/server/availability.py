"""TF Serving's availability-preserving version policy
(core/availability_preserving_policy.cc): the next version to load or unload, such that a
model that has a version serving keeps one while its versions change.

An old version is unloaded only once an aspired one serves (or nothing is aspired, or two
old ones serve); a new aspired version is loaded newest first. So a new version loads
before the old one leaves, a broken new version leaves the old one serving, and when the
newest folder goes, the previous version loads before the removed one is unloaded.
"""

import dataclasses


@dataclasses.dataclass(frozen=True)
class Snapshot:
    """A version as the policy sees it: its number, its state ("START" for a version not
    yet tried, "LOADING", "AVAILABLE", "UNLOADING", "END") and whether it is aspired."""

    version: int
    state: str
    aspired: bool


def next_action(snapshots: list[Snapshot]) -> tuple[str, int] | None:
    """("unload", version), ("load", version) or None when nothing is to be done."""
    aspired = [s for s in snapshots if s.aspired]
    aspired_serving = any(s.state == "AVAILABLE" for s in aspired)
    old_serving = [s.version for s in snapshots if not s.aspired and s.state == "AVAILABLE"]
    if old_serving and (not aspired or aspired_serving or len(old_serving) > 1):
        return "unload", min(old_serving)
    new = [s.version for s in aspired if s.state == "START"]
    if new:
        return "load", max(new)
    return None

"""Subscribers share what they hold alike: the set of keys each was given and the zone and tenant
names. A subscriber list of 20,000 held 25 MiB of pydantic models, more than half of it one fresh
set of given keys per subscriber (728 bytes each), which planning's memory then carried for the
whole run. Sharing must not change what a subscriber says it was given, nor break copies with
updates."""

from __future__ import annotations

import copy

import pytest

from deadline_pipeline.config import load_config

ROWS = 300


def _config(tmp_path):
    config = (tmp_path / "deadlines.yaml").resolve()
    lines = ["sources:", "  - {name: conf, format: ics, location: a.ics, tenant: demo}", "subscribers:"]
    for i in range(ROWS):
        zone = ["Europe/Berlin", "Asia/Tokyo"][i % 2]
        quiet = ", quiet_hours: '22:00-07:00'" if i == 7 else ""
        lines.append(f"  - {{id: s{i}, tenant: demo, email: s{i}@example.org, timezone: {zone}{quiet}}}")
    config.write_text("\n".join(lines) + "\n")
    return load_config(config)[0]


def test_subscribers_given_the_same_keys_share_one_set_and_their_zone_and_tenant_names(tmp_path):
    subs = _config(tmp_path).subscribers
    assert len(subs) == ROWS
    sets = {id(s.model_fields_set) for s in subs}
    assert len(sets) <= 2, f"{len(sets)} sets of given keys for {ROWS} subscribers"
    assert len({id(s.timezone) for s in subs}) == 2
    assert len({id(s.tenant) for s in subs}) == 1
    # What each was given is still its own: only subscriber 7 has quiet hours.
    with_quiet = [s.id for s in subs if "quiet_hours" in s.model_fields_set]
    assert with_quiet == ["s7"]
    assert subs[7].quiet_hours == "22:00-07:00" and subs[8].quiet_hours is None
    assert subs[0].model_dump(exclude_unset=True)["timezone"] == "Europe/Berlin"


def test_a_copy_with_an_update_records_the_update_without_touching_the_others(tmp_path):
    subs = _config(tmp_path).subscribers
    given = set(subs[0].model_fields_set)
    for deep in (False, True):
        changed = subs[0].model_copy(update={"apprise_target": "chat-1"}, deep=deep)
        assert changed.apprise_target == "chat-1"
        assert "apprise_target" in changed.model_fields_set
        assert set(subs[0].model_fields_set) == given == set(subs[2].model_fields_set)
    assert copy.deepcopy(subs[1]).model_dump() == subs[1].model_dump()


def test_the_shared_set_of_given_keys_refuses_a_change(tmp_path):
    subs = _config(tmp_path).subscribers
    with pytest.raises(TypeError, match="shared by others"):
        subs[0].model_fields_set.add("quiet_hours")
    with pytest.raises(TypeError, match="shared by others"):
        subs[0].model_fields_set |= {"caldav_url"}
    assert "quiet_hours" not in subs[2].model_fields_set and "caldav_url" not in subs[2].model_fields_set

"""Result UIDs: the same job gives the same UIDs, another job or study gives others."""

from __future__ import annotations

import re

import pytest

from imaging_ai.outputs.uids import output_uids

STUDY = "1.2.826.0.1.3680043.8.498.1"
UID = re.compile(r"^(0|[1-9][0-9]*)(\.(0|[1-9][0-9]*))*$")


def all_uids(study: str, job: int) -> list[str]:
    uids = output_uids(study, job)
    return [
        uids.seg_series,
        uids.seg_instance,
        uids.sr_series,
        uids.sr_instance,
        uids.tracking_uid("nodule-1"),
        uids.tracking_uid("nodule-2"),
        uids.tracking_uid("right-lung"),
    ]


def test_same_job_same_uids() -> None:
    assert all_uids(STUDY, 7) == all_uids(STUDY, 7)
    assert output_uids(STUDY, 7) == output_uids(STUDY, "7")


def test_another_job_or_study_other_uids() -> None:
    first, again, other = all_uids(STUDY, 7), all_uids(STUDY, 8), all_uids(STUDY + ".2", 7)
    assert len(set(first)) == len(first)
    assert not set(first) & set(again)
    assert not set(first) & set(other)


def test_uids_are_valid_dicom_uids() -> None:
    for uid in all_uids(STUDY, 7):
        assert len(uid) <= 64 and UID.match(uid), uid


def test_organisation_root() -> None:
    assert output_uids(STUDY, 7, prefix="1.2.3.4.").seg_series.startswith("1.2.3.4.")


def test_message_control_id_per_job_and_receiver() -> None:
    uids = output_uids(STUDY, 7)
    control = uids.message_control_id("RIS|HOSPITAL")
    assert control == output_uids(STUDY, 7).message_control_id("RIS|HOSPITAL")
    assert len(control) == 20 and control.isalnum()
    assert control != uids.message_control_id("OTHER|HOSPITAL")
    assert control != output_uids(STUDY, 8).message_control_id("RIS|HOSPITAL")


def test_a_study_uid_is_needed() -> None:
    with pytest.raises(ValueError, match="Study Instance UID"):
        output_uids("", 7)

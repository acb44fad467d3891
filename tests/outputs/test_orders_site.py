"""Orders and sites (issue 20, findings 4, 6, 7): the request attributes reach ORC/OBR, the SR's
Referenced Request Sequence and the SEG; MSH names the configured parties; zone-less times are
read in the site's zone; InstitutionName, ContentCreatorName and the device serial number.
Every object is read back by an independent reader (hl7apy strict, dciodvfy, dsrdump)."""

from __future__ import annotations

import copy
import dataclasses
import io
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import hl7
import pydicom
import pytest
from hl7apy.consts import VALIDATION_LEVEL
from hl7apy.parser import parse_message
from pydicom.dataset import Dataset

from imaging_ai.config import (
    Config,
    Hl7Config,
    OutputsConfig,
    RisDestination,
    SiteConfig,
    StorageConfig,
)
from imaging_ai.outputs.common import Report, build_report, study_info
from imaging_ai.outputs.fhir import diagnostic_report_bundle
from imaging_ai.outputs.files import encode_results
from imaging_ai.outputs.hl7 import build_oru
from imaging_ai.outputs.messages import build_messages
from imaging_ai.outputs.seg import encode_segmentation
from imaging_ai.outputs.sr import build_measurement_report, device_uid
from imaging_ai.site import SERIAL_FILE, stored_serial_number, with_device_serial_number
from tests.outputs.conftest import ALGORITHM, CREATED, IMPRESSION, Study, dciodvfy

PLACER = "PLC-2026-000123"
FILLER = "FIL-77881"
PROCEDURE_ID = "RP-4711"


def ordered(headers: list[Dataset], **top_level: str) -> list[Dataset]:
    """Copies of the headers whose request item carries order numbers, as a RIS-fed modality
    writes them; ``top_level`` sets attributes on the data sets themselves."""
    out = []
    for ds in headers:
        ds = copy.deepcopy(ds)
        item = ds.RequestAttributesSequence[0]
        item.PlacerOrderNumberImagingServiceRequest = PLACER
        item.FillerOrderNumberImagingServiceRequest = FILLER
        item.RequestedProcedureID = PROCEDURE_ID
        for keyword, value in top_level.items():
            setattr(ds, keyword, value)
        out.append(ds)
    return out


def report_of(study: Study, headers: list[Dataset], time_zone: str = "") -> Report:
    algorithm = dataclasses.replace(ALGORITHM, time_zone=time_zone)
    return build_report(study.analysis, headers, algorithm, study.uids, IMPRESSION, CREATED)


def strict(text: str) -> None:
    parsed = parse_message(text, validation_level=VALIDATION_LEVEL.STRICT, find_groups=True)
    assert parsed.validate()


def test_order_numbers_come_from_the_request_attributes(study: Study) -> None:
    text = build_oru(report_of(study, ordered(study.headers)))
    strict(text)
    m = hl7.parse(text)
    accession = study.headers[0].AccessionNumber
    assert (m["ORC.F2"], m["ORC.F3"]) == (PLACER, FILLER)
    assert (m["OBR.F2"], m["OBR.F3"]) == (PLACER, FILLER)
    assert (m["OBR.F18"], m["OBR.F19"]) == (accession, PROCEDURE_ID)


def test_top_level_order_numbers_are_read_without_request_items(study: Study) -> None:
    headers = [copy.deepcopy(ds) for ds in study.headers]
    for ds in headers:
        del ds.RequestAttributesSequence
        ds.PlacerOrderNumberImagingServiceRequest = PLACER
    m = hl7.parse(build_oru(report_of(study, headers)))
    accession = study.headers[0].AccessionNumber
    # The filler order number is absent: the accession number stands in for it alone.
    assert (m["ORC.F2"], m["ORC.F3"], m["OBR.F2"], m["OBR.F3"]) == (
        PLACER,
        accession,
        PLACER,
        accession,
    )


def test_a_long_order_number_still_makes_a_valid_oru(study: Study) -> None:
    long = "P" * 64  # LO, the most DICOM holds
    headers = [copy.deepcopy(ds) for ds in study.headers]
    headers[0].RequestAttributesSequence[0].PlacerOrderNumberImagingServiceRequest = long
    text = build_oru(report_of(study, headers))
    strict(text)
    assert hl7.parse(text)["OBR.F2"] == long


def test_several_requests_are_all_read(study: Study) -> None:
    ds = copy.deepcopy(study.headers[0])
    second = Dataset()
    second.AccessionNumber = "ACC-2"
    second.PlacerOrderNumberImagingServiceRequest = "PLC-2"
    ds.RequestAttributesSequence.append(second)
    info = study_info(ds)
    assert [r.accession for r in info.requests] == [ds.AccessionNumber, "ACC-2"]
    assert [r.placer_order_number for r in info.requests] == ["", "PLC-2"]
    assert info.placer_order_number == ds.AccessionNumber  # the first request's, else accession


def test_msh_names_the_configured_sender_and_each_ris(study: Study) -> None:
    sender = Hl7Config(
        sending_application="AI_LUNG", sending_facility="RADIOLOGY", processing_id="T"
    )
    ris = RisDestination(
        host="127.0.0.1", port=2575, receiving_application="RADIS", receiving_facility="GENERAL"
    )
    (oru,) = build_messages(report_of(study, study.headers), (ris,), sender).orus
    text = oru.data.decode()
    strict(text)
    m = hl7.parse(text)
    assert (m["MSH.F3"], m["MSH.F4"], m["MSH.F5"], m["MSH.F6"]) == (
        "AI_LUNG",
        "RADIOLOGY",
        "RADIS",
        "GENERAL",
    )
    assert m["MSH.F11"] == "T"
    equipment = [str(r(18)) for r in m.segments("OBX") if len(r) > 18 and str(r(18))]
    assert equipment and all(e.endswith("^AI_LUNG") for e in equipment)


@pytest.fixture
def utc_host(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """This process as a UTC container sees the clock."""
    monkeypatch.setenv("TZ", "UTC")
    time.tzset()
    yield
    monkeypatch.undo()
    time.tzset()


def berlin_scan(study: Study, **extra: str) -> list[Dataset]:
    headers = [copy.deepcopy(ds) for ds in study.headers]
    for ds in headers:
        ds.StudyDate, ds.StudyTime = "20261207", "095100"
        for keyword, value in extra.items():
            setattr(ds, keyword, value)
    return headers


@pytest.mark.usefixtures("utc_host")
def test_a_zone_less_scan_is_read_in_the_site_zone(study: Study) -> None:
    report = report_of(study, berlin_scan(study), time_zone="Europe/Berlin")
    m = hl7.parse(build_oru(report))
    assert m["OBR.F7"] == "20261207095100+0100"  # December: CET, whatever the host's zone
    assert m["MSH.F7"].endswith("+0100") and m["OBR.F22"].endswith("+0100")
    bundle = diagnostic_report_bundle(report)
    (dr,) = [
        e["resource"]
        for e in bundle["entry"]
        if e["resource"]["resourceType"] == "DiagnosticReport"
    ]
    assert dr["effectiveDateTime"] == "2026-12-07T09:51:00+01:00"
    # Without a site zone, the host's: this UTC container's.
    assert hl7.parse(build_oru(report_of(study, berlin_scan(study))))["OBR.F7"].endswith("+0000")


@pytest.mark.usefixtures("utc_host")
def test_the_data_sets_own_offset_wins(study: Study) -> None:
    headers = berlin_scan(study, TimezoneOffsetFromUTC="+0530")
    report = report_of(study, headers, time_zone="Europe/Berlin")
    assert hl7.parse(build_oru(report))["OBR.F7"] == "20261207095100+0530"


@pytest.fixture(scope="module")
def ordered_results(study: Study, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    headers = ordered(study.headers)
    seg = encode_segmentation(study.analysis, headers, ALGORITHM, study.uids, created=CREATED)
    sr = build_measurement_report(
        study.analysis, headers, seg, ALGORITHM, study.uids, impression=IMPRESSION, created=CREATED
    )
    folder = tmp_path_factory.mktemp("ordered")
    seg.dataset.save_as(folder / "seg.dcm", enforce_file_format=True)
    sr.save_as(folder / "sr.dcm", enforce_file_format=True)
    return folder / "seg.dcm", folder / "sr.dcm"


def test_sr_references_the_request(study: Study, ordered_results: tuple[Path, Path]) -> None:
    sr = pydicom.dcmread(ordered_results[1])
    (item,) = sr.ReferencedRequestSequence
    header = study.headers[0]
    assert item.StudyInstanceUID == header.StudyInstanceUID
    assert item.AccessionNumber == header.AccessionNumber
    assert item.PlacerOrderNumberImagingServiceRequest == PLACER
    assert item.FillerOrderNumberImagingServiceRequest == FILLER
    assert item.RequestedProcedureID == PROCEDURE_ID
    assert item.RequestedProcedureDescription == "CT CHEST"
    assert dciodvfy(ordered_results[1]) == ([], [])


def test_dsrdump_reads_the_sr_with_its_request_and_values(
    study: Study, ordered_results: tuple[Path, Path]
) -> None:
    if shutil.which("dsrdump") is None:
        pytest.skip("needs DCMTK's dsrdump (make deps-system)")
    run = subprocess.run(
        ["dsrdump", str(ordered_results[1])], capture_output=True, text=True, timeout=60
    )
    assert run.returncode == 0 and run.stderr == "", run.stderr
    lesion = study.analysis.lesions[0]
    # Numbers as HL7 writes them, in UCUM's mL.
    assert f'"{lesion.long_axis_mm:.1f}" (mm' in run.stdout
    assert f'"{lesion.volume_ml:.3f}" (mL' in run.stdout
    assert "(ml" not in run.stdout


def test_seg_carries_the_request_creator_and_passes_dciodvfy(
    study: Study, ordered_results: tuple[Path, Path]
) -> None:
    seg = pydicom.dcmread(ordered_results[0], stop_before_pixels=True)
    (item,) = seg.RequestAttributesSequence
    assert item.AccessionNumber == study.headers[0].AccessionNumber
    assert (item.RequestedProcedureID, item.ScheduledProcedureStepID) == (
        PROCEDURE_ID,
        study.headers[0].RequestAttributesSequence[0].ScheduledProcedureStepID,
    )
    # Not in the Request Attributes Macro: the SR's Referenced Request Sequence has them.
    assert "PlacerOrderNumberImagingServiceRequest" not in item
    assert seg.ContentCreatorName.family_name == "imaging-ai"
    assert dciodvfy(ordered_results[0]) == ([], [])


def _encoded(study: Study, config: Config) -> tuple[Dataset, Dataset]:
    encoded = encode_results(study.analysis, study.headers, 41, CREATED, IMPRESSION, config)
    return (
        pydicom.dcmread(io.BytesIO(bytes(encoded.seg)), stop_before_pixels=True),
        pydicom.dcmread(io.BytesIO(bytes(encoded.sr))),
    )


def _config(tmp_path: Path, site: SiteConfig, outputs: OutputsConfig | None = None) -> Config:
    return Config(
        storage=StorageConfig(data_dir=str(tmp_path)), outputs=outputs or OutputsConfig(), site=site
    )


def test_institution_is_the_sites_or_else_the_sources(study: Study, tmp_path: Path) -> None:
    source = study.headers[0].InstitutionName
    seg, sr = _encoded(study, _config(tmp_path, SiteConfig()))
    assert seg.InstitutionName == sr.InstitutionName == source
    seg, sr = _encoded(study, _config(tmp_path, SiteConfig(institution="St. Elsewhere")))
    assert seg.InstitutionName == sr.InstitutionName == "St. Elsewhere"
    deprecated = OutputsConfig(institution="Old Key Hospital")
    seg, _ = _encoded(study, _config(tmp_path, SiteConfig(), deprecated))
    assert seg.InstitutionName == "Old Key Hospital"


@pytest.mark.usefixtures("utc_host")
def test_seg_and_sr_times_are_the_sites(study: Study, tmp_path: Path) -> None:
    seg, sr = _encoded(study, _config(tmp_path, SiteConfig(time_zone="Europe/Berlin")))
    # CREATED is 10:15 UTC on 30 November: 11:15 in Berlin.
    for ds in (seg, sr):
        assert (ds.ContentDate, ds.ContentTime) == ("20261130", "111500")
        assert ds.InstanceCreationTime == "111500"


def test_device_serial_number_is_the_installations(study: Study, tmp_path: Path) -> None:
    config = with_device_serial_number(_config(tmp_path / "data", SiteConfig()))
    serial = config.site.device_serial_number
    assert (tmp_path / "data" / SERIAL_FILE).read_text().strip() == serial
    again = with_device_serial_number(_config(tmp_path / "data", SiteConfig()))
    assert again.site.device_serial_number == serial  # kept, not made anew
    assert stored_serial_number(tmp_path / "other") != serial  # another installation's
    seg, sr = _encoded(study, config)
    assert seg.DeviceSerialNumber == serial
    observer = {i.ConceptNameCodeSequence[0].CodeMeaning: i for i in sr.ContentSequence}
    assert observer["Device Observer Serial Number"].TextValue == serial
    assert (
        device_uid(dataclasses.replace(ALGORITHM, device_serial_number=serial))
        == observer["Device Observer UID"].UID
    )


def test_a_configured_serial_number_wins(tmp_path: Path) -> None:
    config = _config(tmp_path, SiteConfig(device_serial_number="ASSET-0042"))
    assert with_device_serial_number(config).site.device_serial_number == "ASSET-0042"
    assert not (tmp_path / SERIAL_FILE).exists()

"""Each reported lesion's probability and the input's caveats reach every output (issue 17, items
3 and 6): written, read back (highdicom, hl7apy, JSON), and still valid (dciodvfy, fhirkit)."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import fhirkit
import highdicom as hd
import hl7
import pytest
from fhir.resources.R4B.bundle import Bundle
from hl7apy.consts import VALIDATION_LEVEL  # type: ignore[import-untyped]
from hl7apy.parser import parse_message  # type: ignore[import-untyped]

from imaging_ai.analyse import Analysis
from imaging_ai.outputs.common import Algorithm, ModelId, Report, build_report
from imaging_ai.outputs.fhir import diagnostic_report_bundle
from imaging_ai.outputs.hl7 import build_oru
from imaging_ai.outputs.seg import encode_segmentation
from imaging_ai.outputs.sr import build_measurement_report
from imaging_ai.process import impression
from tests.fhir_schema import assert_valid_fhir
from tests.outputs.conftest import ALGORITHM, CREATED, Study, dciodvfy

CAVEAT = (
    "Slices are 5.0 mm thick: lung volumes are measured, but nodule detection is limited on "
    "slices thicker than 2.5 mm; review the thin-slice series if one exists."
)
PROBABILITIES = {1: 0.9374, 2: 0.61}
CLASSIFIER = ModelId("nodule-fpr", "0.1.0", "ef" * 32)
JUDGED = dataclasses.replace(ALGORITHM, candidates=CLASSIFIER)


@pytest.fixture(scope="module")
def judged(study: Study) -> Analysis:
    """The phantom's analysis as if a classifier had judged each lesion, on thick slices."""
    lesions = tuple(
        dataclasses.replace(lesion, probability=PROBABILITIES[lesion.number], reported=True)
        for lesion in study.analysis.lesions
    )
    return dataclasses.replace(
        study.analysis, lesions=lesions, candidates=lesions, caveats=(CAVEAT,)
    )


@pytest.fixture(scope="module")
def report(study: Study, judged: Analysis) -> Report:
    return build_report(judged, study.headers, JUDGED, study.uids, impression(judged), CREATED)


def test_impression_names_reported_lesions_and_says_the_caveat(judged: Analysis) -> None:
    unreported = dataclasses.replace(judged.lesions[0], number=3, reported=False)
    with_candidate = dataclasses.replace(judged, candidates=(*judged.lesions, unreported))
    text = impression(with_candidate)
    assert text.startswith("2 lung nodule(s) detected")
    assert CAVEAT in text and text.index(CAVEAT) < text.index("AI-generated")
    assert CAVEAT not in impression(dataclasses.replace(judged, caveats=()))


def test_findings_json_carries_probability_and_caveat(judged: Analysis) -> None:
    findings = json.loads(json.dumps(judged.findings_json()))
    assert [f["probability"] for f in findings["lesions"]] == [0.937, 0.61]
    assert findings["caveats"] == [CAVEAT]


@pytest.fixture(scope="module")
def sr_path(study: Study, judged: Analysis, tmp_path_factory: pytest.TempPathFactory) -> Path:
    seg = encode_segmentation(judged, study.headers, JUDGED, study.uids, created=CREATED)
    sr = build_measurement_report(
        judged,
        study.headers,
        seg,
        JUDGED,
        study.uids,
        impression=impression(judged),
        created=CREATED,
    )
    path = tmp_path_factory.mktemp("sr") / "sr.dcm"
    sr.save_as(path, enforce_file_format=True)
    return path


def test_sr_reads_back_with_each_probability_and_the_caveat(sr_path: Path) -> None:
    sr = hd.sr.srread(sr_path)
    report = sr.content
    assert isinstance(report, hd.sr.MeasurementReport)
    for group in report.get_volumetric_roi_measurement_groups():
        label = str(group.tracking_identifier)
        found = group.get_measurements(name=hd.sr.CodedConcept("111012", "DCM", "x"))
        if not label.startswith("Nodule"):
            assert found == []
            continue
        [certainty] = found
        # 3 decimals, as HL7 and FHIR write it (Quantity.digits)
        assert certainty.value == round(PROBABILITIES[int(label.split()[1])], 3)
        assert (certainty.unit.value, certainty.unit.scheme_designator) == ("1", "UCUM")
        assert certainty.name.meaning == "Certainty of Finding"
        names = [
            item.TextValue
            for item in _walk(certainty[0].ContentSequence)
            if item.ConceptNameCodeSequence[0].CodeValue == "111001"  # Algorithm Name
        ]
        assert names == [CLASSIFIER.name]
    texts = [
        item.TextValue
        for item in _walk(sr.ContentSequence)
        if item.ValueType == "TEXT" and item.ConceptNameCodeSequence[0].CodeValue == "121106"
    ]
    assert CAVEAT in texts  # a Comment of its own, beside the AI statement


def test_sr_with_probability_and_caveat_passes_dciodvfy(sr_path: Path) -> None:
    errors, _ = dciodvfy(sr_path)
    assert errors == [], errors


def _walk(items: Any) -> Any:
    for item in items:
        yield item
        yield from _walk(item.get("ContentSequence", []))


def test_oru_carries_probability_and_caveat_and_stays_valid(report: Report) -> None:
    text = build_oru(report)  # validated strictly against v2.5.1 as it is built
    # hl7apy's parser reads OBX-5 as ST (199 characters at most) whatever OBX-2 says; the
    # impression with a caveat is longer, as FT (OBX-2) allows: parse it tolerantly here.
    parsed = parse_message(text, validation_level=VALIDATION_LEVEL.TOLERANT, find_groups=True)
    assert parsed.name == "ORU_R01" and len(parsed.to_er7()) + 1 == len(text)
    m = hl7.parse(text)
    notes = [m.unescape(str(nte(3))) for nte in m.segments("NTE")]
    assert notes[1:] == [CAVEAT]
    assert [str(nte(1)) for nte in m.segments("NTE")] == ["1", "2"]
    certainty = {
        str(r(4)): (float(str(r(5))), str(r(6)(0)(0)), str(r(18)(0)(0)))
        for r in m.segments("OBX")
        if str(r(3)(0)(0)) == "111012"
    }
    assert certainty == {
        "nodule-1": (0.937, "1", "nodule-fpr 0.1.0"),
        "nodule-2": (0.61, "1", "nodule-fpr 0.1.0"),
    }
    assert CAVEAT in m.unescape(str(next(iter(m.segments("OBX")))(5)))  # the impression


def test_fhir_observation_component_and_conclusion(report: Report) -> None:
    bundle = json.loads(json.dumps(diagnostic_report_bundle(report)))
    Bundle.model_validate(bundle)
    assert [str(issue) for issue in fhirkit.validate(bundle)] == []
    assert_valid_fhir(bundle)
    resources = [e["resource"] for e in bundle["entry"]]
    [diagnostic] = [r for r in resources if r["resourceType"] == "DiagnosticReport"]
    assert diagnostic["conclusion"].count(CAVEAT) == 1
    groups = {
        r["code"]["text"]: r
        for r in resources
        if r["resourceType"] == "Observation" and "hasMember" in r
    }
    for number, probability in PROBABILITIES.items():
        [component] = groups[f"Nodule {number}"]["component"]
        assert component["code"]["coding"][0]["code"] == "111012"
        quantity = component["valueQuantity"]
        assert quantity == {
            "value": round(probability, 3),
            "unit": "1",
            "system": "http://unitsofmeasure.org",
            "code": "1",
        }
    assert "component" not in groups["Right lung"]


def test_conclusion_adds_a_caveat_the_impression_lacks(report: Report) -> None:
    bare = dataclasses.replace(report, impression="No lung nodule detected.")
    assert bare.conclusion == f"No lung nodule detected. {CAVEAT}"
    assert dataclasses.replace(bare, caveats=()).conclusion == "No lung nodule detected."


def test_without_a_classifier_nothing_is_claimed(study: Study) -> None:
    plain = build_report(study.analysis, study.headers, ALGORITHM, study.uids, "x", CREATED)
    assert all(f.probability is None for f in plain.findings)
    assert "111012" not in build_oru(plain)
    assert "111012" not in json.dumps(diagnostic_report_bundle(plain))


def test_algorithm_keeps_the_classifier_from_the_analysis(judged: Analysis) -> None:
    models = {**judged.models, CLASSIFIER.name: dataclasses.asdict(CLASSIFIER)}
    algorithm = Algorithm.from_analysis(dataclasses.replace(judged, models=models))
    assert algorithm.candidates == CLASSIFIER

"""Configuration: TOML, environment overrides, validation messages, masked secrets."""

from __future__ import annotations

from pathlib import Path

import pytest

from imaging_ai.config import AllowedCaller, deprecations, load_config
from imaging_ai.errors import ConfigError

EXAMPLE = Path(__file__).parent.parent / "deploy" / "imaging-ai.example.toml"


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "c.toml"
    path.write_text(text)
    return path


def test_defaults_listen_on_loopback() -> None:
    config = load_config(None, environ={})
    assert config.dicom.bind == "127.0.0.1"
    assert config.http.bind == "127.0.0.1"
    assert config.dicom.allowed_callers == ()
    assert config.priority.sla_s("urgent") == 60
    assert config.priority.sla_s("inpatient") == 300
    assert config.priority.sla_s("outpatient") == 1800


def test_example_documents_every_key_and_loads() -> None:
    config = load_config(EXAMPLE, environ={})
    text = EXAMPLE.read_text()
    for section in (
        "dicom",
        "assemble",
        "priority",
        "storage",
        "http",
        "engines",
        "outputs",
        "logging",
        "fhir",
        "site",
        "hl7",
    ):
        for name in type(getattr(config, section)).__dataclass_fields__:
            assert f"{name} =" in text or f"{name}=" in text, f"{section}.{name} undocumented"


def test_toml_and_env_override(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        '[dicom]\nport = 104\nallowed_callers = [{ae_title = "PACS", host = "10.0.0.5"}]\n',
    )
    env = {"IMAGING_AI_DICOM__PORT": "4242", "IMAGING_AI_STORAGE__DATA_DIR": "/srv/x"}
    config = load_config(path, environ=env)
    assert config.dicom.port == 4242
    assert config.storage.data_dir == "/srv/x"
    assert config.dicom.allowed_callers == (AllowedCaller("PACS", "10.0.0.5"),)


def test_log_format_is_text_unless_json_is_asked_for(tmp_path: Path) -> None:
    assert load_config(None, environ={}).logging.format == "text"
    path = write(tmp_path, '[logging]\nformat = "json"\n')
    assert load_config(path, environ={}).logging.format == "json"
    env = {"IMAGING_AI_LOGGING__FORMAT": "json"}
    assert load_config(None, environ=env).logging.format == "json"


def test_env_override_of_a_table_array() -> None:
    env = {"IMAGING_AI_DICOM__ALLOWED_CALLERS": '[{ae_title = "CT1", host = "127.0.0.1"}]'}
    assert load_config(None, environ=env).dicom.allowed_callers[0].ae_title == "CT1"


@pytest.mark.parametrize(
    ("text", "env", "message"),
    [
        ("[dicom]\nport = 70000\n", {}, "dicom.port"),
        ("[dicom]\nport = 'x'\n", {}, "dicom.port must be an integer, got 'x'"),
        ("", {"IMAGING_AI_DICOM__PORT": "abc"}, "dicom.port must be an integer, got 'abc'"),
        ("[dicom]\nae_title = 'WAY_TOO_LONG_AE_TITLE'\n", {}, "dicom.ae_title"),
        ("[dicom]\nbind = 'not-an-ip'\n", {}, "dicom.bind"),
        ("[dicom]\nfoo = 1\n", {}, "unknown key dicom.foo"),
        ("[nosuch]\n", {}, "unknown config section"),
        ("[http]\ntokens = [{name='a', token='short', role='ris'}]\n", {}, "at least 16"),
        (
            "[http]\ntokens = [{name='a', token='0123456789abcdef', role='root'}]\n",
            {},
            "http.tokens[0].role",
        ),
        ("[assemble]\nseries_idle_s = -1\n", {}, "assemble.series_idle_s"),
        ("[assemble]\nrelease_grace_s = -0.5\n", {}, "assemble.release_grace_s"),
        ("[assemble]\ncomplete_on_release = 'yes'\n", {}, "assemble.complete_on_release"),
        ("[storage]\ndatabase_url = 'mysql://x'\n", {}, "storage.database_url"),
        ("[priority]\nrules = [{priority = 'vip', tag = 'X', present = true}]\n", {}, "vip"),
        ("[dicom\n", {}, "not valid TOML"),
        ("[logging]\nformat = 'xml'\n", {}, 'logging.format must be "text" or "json", got \'xml\''),
        ("", {"IMAGING_AI_LOGGING__FORMAT": "JSON"}, "logging.format"),
        ("[fhir]\nbase_url = 'imaging-ai/fhir'\n", {}, "fhir.base_url must be an absolute"),
        ("[fhir]\nbase_url = 'https://h/fhir?x=1'\n", {}, "fhir.base_url must be an absolute"),
        ("[fhir]\npatient_identifier_system = 'MRN'\n", {}, "fhir.patient_identifier_system"),
        ("[fhir]\naccession_identifier_system = 'urn:oid:1.02'\n", {}, "followed by an OID"),
        ("[fhir]\nbase_url = 1\n", {}, "fhir.base_url must be a string, got 1"),
        (
            "[site]\ntime_zone = 'Mars/Olympus_Mons'\n",
            {},
            "site.time_zone must be an IANA time zone name such as 'Europe/Berlin', got 'Mars",
        ),
        ("[site]\ntime_zone = '../../etc/passwd'\n", {}, "site.time_zone"),
        ("[site]\ninstitution = 'A\\\\B'\n", {}, "site.institution must be at most 64"),
        ("[site]\ninstitution = '" + "x" * 65 + "'\n", {}, "site.institution"),
        ("[site]\ndevice_serial_number = 'a\\\\b'\n", {}, "site.device_serial_number"),
        (
            "[site]\ninstitution = 'A'\n[outputs]\ninstitution = 'B'\n",
            {},
            "site.institution and the deprecated outputs.institution differ",
        ),
        ("[hl7]\nsending_application = 'AI^LUNG'\n", {}, "hl7.sending_application must be 1-20"),
        ("[hl7]\nsending_application = ''\n", {}, "hl7.sending_application"),
        ("[hl7]\nsending_facility = '" + "F" * 21 + "'\n", {}, "hl7.sending_facility"),
        ("[hl7]\nprocessing_id = 'X'\n", {}, "hl7.processing_id must be one of"),
        (
            "[outputs]\nris = [{host = '127.0.0.1', port = 2575, receiving_application = 'R|S'}]\n",
            {},
            "outputs.ris[0].receiving_application",
        ),
        (
            "[outputs]\nris = [{host = '127.0.0.1', port = 2575, receiving_facility = 'A&B'}]\n",
            {},
            "outputs.ris[0].receiving_facility",
        ),
    ],
)
def test_bad_values_name_the_key(
    tmp_path: Path, text: str, env: dict[str, str], message: str
) -> None:
    with pytest.raises(ConfigError, match=message.replace("[", r"\[").replace("]", r"\]")):
        load_config(write(tmp_path, text), environ=env)


def test_secrets_are_masked(tmp_path: Path) -> None:
    token = "s3cret-token-value-123"
    path = write(tmp_path, f"[http]\ntokens = [{{name='ris', token='{token}', role='ris'}}]\n")
    config = load_config(path, environ={})
    assert token not in repr(config)
    assert config.http.tokens[0].token == token


def test_fhir_base_url_and_identifier_systems(tmp_path: Path) -> None:
    assert load_config(None, environ={}).fhir.base_url == ""
    text = (
        "[fhir]\nbase_url = 'https://ai.hospital.example/fhir/'\n"
        "patient_identifier_system = 'urn:oid:1.2.840.99.1'\n"
        "accession_identifier_system = 'https://ris.hospital.example/accession'\n"
    )
    fhir = load_config(write(tmp_path, text), environ={}).fhir
    assert fhir.base_url == "https://ai.hospital.example/fhir"  # the trailing slash dropped
    assert fhir.patient_identifier_system == "urn:oid:1.2.840.99.1"
    assert fhir.accession_identifier_system == "https://ris.hospital.example/accession"


def test_config_is_frozen() -> None:
    config = load_config(None, environ={})
    with pytest.raises(AttributeError):
        config.dicom.port = 1  # type: ignore[misc]


def test_retention_days_defaults_to_30_and_refuses_negatives(tmp_path: Path) -> None:
    assert load_config(None, environ={}).storage.retention_days == 30
    off = load_config(write(tmp_path, "[storage]\nretention_days = 0\n"), environ={})
    assert off.storage.retention_days == 0
    for bad in ("-1", "1.5", "'30'"):
        with pytest.raises(ConfigError, match=r"storage\.retention_days"):
            load_config(write(tmp_path, f"[storage]\nretention_days = {bad}\n"), environ={})


PACS = 'ae_title = "PACS", host = "127.0.0.1", port = 104'


def test_pacs_results_and_sr_class_default_and_load(tmp_path: Path) -> None:
    default = load_config(write(tmp_path, f"[outputs]\npacs = [{{{PACS}}}]\n"), environ={})
    assert default.outputs.pacs[0].results == ("seg", "sr")
    assert default.outputs.pacs[0].sr == "comprehensive3d"
    text = f'[outputs]\npacs = [{{{PACS}, results = ["sr"], sr = "comprehensive"}}]\n'
    pacs = load_config(write(tmp_path, text), environ={}).outputs.pacs[0]
    assert (pacs.results, pacs.sr) == (("sr",), "comprehensive")


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (
            'results = ["seg", "keyimages"]',
            "outputs.pacs[0].results[1] must be one of 'seg' or 'sr', got 'keyimages'",
        ),
        ("results = []", "outputs.pacs[0].results must name at least one of seg, sr"),
        ('results = "seg"', "outputs.pacs[0].results must be an array"),
        (
            'sr = "enhanced"',
            "outputs.pacs[0].sr must be one of 'comprehensive3d' or 'comprehensive', "
            "got 'enhanced'",
        ),
    ],
)
def test_bad_pacs_results_and_sr_class_name_the_key(
    tmp_path: Path, extra: str, message: str
) -> None:
    path = write(tmp_path, f"[outputs]\npacs = [{{{PACS}, {extra}}}]\n")
    with pytest.raises(ConfigError, match=message.replace("[", r"\[").replace("]", r"\]")):
        load_config(path, environ={})


def test_site_and_hl7_keys(tmp_path: Path) -> None:
    text = (
        '[site]\ninstitution = "St. Elsewhere"\ntime_zone = "Europe/Berlin"\n'
        'device_serial_number = "ASSET-42"\n'
        '[hl7]\nsending_application = "AI_LUNG"\nsending_facility = "RAD"\nprocessing_id = "T"\n'
    )
    config = load_config(write(tmp_path, text), environ={"IMAGING_AI_SITE__TIME_ZONE": "UTC"})
    assert (config.site.institution, config.site.time_zone) == ("St. Elsewhere", "UTC")
    assert config.site.device_serial_number == "ASSET-42"
    assert (config.hl7.sending_application, config.hl7.sending_facility) == ("AI_LUNG", "RAD")
    assert config.hl7.processing_id == "T"
    assert config.institution == "St. Elsewhere" and deprecations(config) == ()
    defaults = load_config(None, environ={})
    assert (defaults.site.time_zone, defaults.hl7.sending_application) == ("", "IMAGING_AI")


def test_outputs_institution_is_a_deprecated_alias(tmp_path: Path) -> None:
    config = load_config(write(tmp_path, '[outputs]\ninstitution = "Old"\n'), environ={})
    assert config.institution == "Old"
    (note,) = deprecations(config)
    assert "outputs.institution is deprecated" in note and "[site] institution" in note


def test_storage_sop_classes_default_to_all_and_resolve(tmp_path: Path) -> None:
    from imaging_ai.receive_contexts import ALL_STORAGE_SOP_CLASSES, storage_sop_classes

    default = load_config(write(tmp_path, ""), environ={}).dicom.storage_sop_classes
    assert default == ("all",)
    assert storage_sop_classes(default) == tuple(ALL_STORAGE_SOP_CLASSES.values())
    text = "[dicom]\nstorage_sop_classes = ['CTImageStorage', 'all', '1.3.12.2.1107.5.9.1']\n"
    listed = load_config(write(tmp_path, text), environ={}).dicom.storage_sop_classes
    resolved = storage_sop_classes(listed)
    assert resolved[0] == "1.2.840.10008.5.1.4.1.1.2" and resolved[-1] == "1.3.12.2.1107.5.9.1"
    assert len(resolved) == len(ALL_STORAGE_SOP_CLASSES) + 1  # CT once, the private one added
    env = {"IMAGING_AI_DICOM__STORAGE_SOP_CLASSES": "CTImageStorage,EnhancedCTImageStorage"}
    only_ct = load_config(write(tmp_path, ""), environ=env).dicom.storage_sop_classes
    assert only_ct == ("CTImageStorage", "EnhancedCTImageStorage")


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("['CTImageStorage', 'CTImage']", "dicom.storage_sop_classes has 'CTImage': not \"all\""),
        ("['1.2.840.10008.5.1.4.1.1.2', '1.2.03']", "dicom.storage_sop_classes has '1.2.03'"),
        ("['MRImageStorage']", "dicom.storage_sop_classes must include CTImageStorage"),
        ("[]", "dicom.storage_sop_classes must include CTImageStorage"),
        ("1", "dicom.storage_sop_classes"),
    ],
)
def test_bad_storage_sop_classes_name_the_key(tmp_path: Path, value: str, message: str) -> None:
    path = write(tmp_path, f"[dicom]\nstorage_sop_classes = {value}\n")
    with pytest.raises(ConfigError, match=message.replace("[", r"\[").replace("]", r"\]")):
        load_config(path, environ={})

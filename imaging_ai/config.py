"""Reads a TOML file plus IMAGING_AI_* overrides once and gives a frozen, validated Config.

The schema is the dataclasses below: their types and ranges are checked by pydantic (a TOML
table becomes its dataclass; unknown keys, wrong types and values out of range are refused
with the key's dotted name). Checks that are the daemon's own (AE titles, addresses, DICOM
keywords, settings that go together) are coded by hand in ``_validate``. The dataclasses stay
plain frozen dataclasses, so code and tests build and ``replace`` them as before.
"""

from __future__ import annotations

import ipaddress
import os
import re
import socket
import tomllib
import zoneinfo
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    BeforeValidator,
    Field,
    PlainValidator,
    StrictBool,
    StrictFloat,
    StrictInt,
    StrictStr,
    TypeAdapter,
    ValidationError,
)
from pydantic_core import ErrorDetails
from pydicom.datadict import keyword_dict

from imaging_ai.errors import ConfigError
from imaging_ai.receive_contexts import ANALYSED_SOP_CLASSES, storage_sop_classes
from imaging_ai.schema import BOUNDS, TABLE

ENV_PREFIX = "IMAGING_AI_"
PRIORITY_CLASSES = ("urgent", "inpatient", "outpatient")
ROLES = ("ris", "admin", "metrics")
BACKENDS = ("auto", "tensorrt", "onnxruntime-cuda", "onnxruntime-cpu")
LOG_FORMATS = ("text", "json")
# What a PACS destination may take (``results``) and the SR classes it may be sent (``sr``).
PacsResult = Literal["seg", "sr"]
PACS_RESULTS: tuple[PacsResult, ...] = ("seg", "sr")
SR_CLASSES = ("comprehensive3d", "comprehensive")
# Every table of the file: unknown keys are refused, not ignored.


class Secret(str):
    """A string whose repr never shows its value (tokens, passwords)."""

    def __repr__(self) -> str:
        return "Secret('**********')"


def _secret(value: Any) -> Secret:
    if not isinstance(value, str):
        raise ValueError("must be a string")
    return Secret(value)


def _array(value: Any) -> Any:
    """A TOML array as the tuple the dataclass holds."""
    return tuple(value) if isinstance(value, list) else value


def _comma_separated(value: Any) -> Any:
    """An array of strings; a single string (an environment override) is split at commas."""
    if isinstance(value, str):
        return tuple(part.strip() for part in value.split(",") if part.strip())
    return _array(value)


def _one_or_more(value: Any) -> Any:
    """A string or an array of strings."""
    return (value,) if isinstance(value, str) else _array(value)


def _time_zone(name: str) -> str:
    """An IANA time zone name that this host's zone database knows; "" is the host's zone."""
    if not name:
        return name
    try:
        zoneinfo.ZoneInfo(name)
    except (zoneinfo.ZoneInfoNotFoundError, ValueError):
        raise ValueError("must be an IANA time zone name such as 'Europe/Berlin'") from None
    return name


Strings = Annotated[tuple[StrictStr, ...], BeforeValidator(_comma_separated)]
SecretStr = Annotated[Secret, PlainValidator(_secret)]
Port = Annotated[StrictInt, Field(ge=0, le=65535)]
Seconds = Annotated[StrictFloat, Field(gt=0)]


@dataclass(frozen=True)
class AllowedCaller:
    """One peer allowed to associate: its AE title and the host it connects from."""

    __pydantic_config__ = TABLE

    ae_title: StrictStr
    host: StrictStr = "127.0.0.1"


@dataclass(frozen=True)
class DicomConfig:
    """The DICOM receiver (storage SCP)."""

    __pydantic_config__ = TABLE

    ae_title: StrictStr = "IMAGING_AI"
    bind: StrictStr = "127.0.0.1"
    port: Port = 11112
    allowed_callers: Annotated[tuple[AllowedCaller, ...], BeforeValidator(_array)] = ()
    max_pdu: StrictInt = 131072
    max_associations: Annotated[StrictInt, Field(ge=1)] = 16
    max_pending_connections: Annotated[StrictInt, Field(ge=1)] = 32
    negotiation_timeout_s: Seconds = 10.0
    receiver_processes: Annotated[StrictInt, Field(ge=0)] = 0
    network_timeout_s: Seconds = 60.0
    tls_cert: StrictStr = ""
    tls_key: StrictStr = ""
    tls_ca: StrictStr = ""
    # The Storage SOP classes offered: "all" (pynetdicom's list), keywords or UIDs.
    storage_sop_classes: Strings = ("all",)


@dataclass(frozen=True)
class AssembleConfig:
    """When a series and a study count as complete."""

    __pydantic_config__ = TABLE

    series_idle_s: Seconds = 10.0
    study_idle_s: Seconds = 20.0
    force_complete_s: Seconds = 600.0
    poll_s: Seconds = 1.0
    # Release rule: once every association that delivered a study's instances has released
    # (A-RELEASE, not an abort), the study completes this long after the last release.
    complete_on_release: StrictBool = True
    release_grace_s: Annotated[StrictFloat, Field(ge=0)] = 0.5


@dataclass(frozen=True)
class PriorityRule:
    """One classification rule: a tag with given values (or merely present), or a calling AE."""

    __pydantic_config__ = TABLE

    priority: Literal["urgent", "inpatient", "outpatient"]
    tag: StrictStr = ""
    values: Annotated[tuple[StrictStr, ...], BeforeValidator(_one_or_more)] = ()
    present: StrictBool = False
    calling_ae: Annotated[tuple[StrictStr, ...], BeforeValidator(_one_or_more)] = ()


DEFAULT_RULES = (
    PriorityRule("urgent", tag="RequestedProcedurePriority", values=("STAT", "HIGH")),
    PriorityRule("inpatient", tag="AdmissionID", present=True),
    PriorityRule("inpatient", tag="CurrentPatientLocation", present=True),
)


@dataclass(frozen=True)
class PriorityConfig:
    """Priority classes: their SLAs (seconds from completion to results) and the rules."""

    __pydantic_config__ = TABLE

    urgent_sla_s: Seconds = 60.0
    inpatient_sla_s: Seconds = 300.0
    outpatient_sla_s: Seconds = 1800.0
    rules: Annotated[tuple[PriorityRule, ...], BeforeValidator(_array)] = DEFAULT_RULES

    def sla_s(self, priority: str) -> float:
        """Return the SLA in seconds of a priority class."""
        return float(getattr(self, f"{priority}_sla_s"))


@dataclass(frozen=True)
class StorageConfig:
    """Where instances and the database live, the disk low-water mark, and retention."""

    __pydantic_config__ = TABLE

    data_dir: StrictStr = "var"
    database_url: StrictStr = ""
    min_free_mb: Annotated[StrictInt, Field(ge=0)] = 1024
    node_name: StrictStr = ""
    job_lease_s: Annotated[StrictFloat, Field(ge=5)] = 120.0
    # Instance files of studies done, or failed and not retried, for this many days are
    # deleted from this node's spool (records and results kept); 0 keeps them forever.
    retention_days: Annotated[StrictInt, Field(ge=0, le=36500)] = 30

    @property
    def node(self) -> str:
        """This node's name (the host name unless configured): leases and temporary files."""
        return self.node_name or socket.gethostname()

    @property
    def spool_dir(self) -> Path:
        """Directory holding received instances."""
        return Path(self.data_dir) / "spool"

    @property
    def resolved_database_url(self) -> str:
        """The database URL, defaulting to SQLite under data_dir."""
        if self.database_url:
            return self.database_url
        return f"sqlite:///{Path(self.data_dir).resolve() / 'imaging-ai.sqlite3'}"


@dataclass(frozen=True)
class Token:
    """An HTTP bearer token and the role it grants."""

    __pydantic_config__ = TABLE

    name: StrictStr
    token: SecretStr
    role: Literal["ris", "admin", "metrics"]


@dataclass(frozen=True)
class HttpConfig:
    """The HTTP server: RIS API, admin pages, metrics."""

    __pydantic_config__ = TABLE

    bind: StrictStr = "127.0.0.1"
    port: Port = 8080
    tokens: Annotated[tuple[Token, ...], BeforeValidator(_array)] = ()
    tls_cert: StrictStr = ""
    tls_key: StrictStr = ""
    session_secret: SecretStr = field(default_factory=lambda: Secret(""))
    cookie_secure: StrictBool = True
    session_max_age_s: Seconds = 28800.0
    # Past this many open connections a request is answered 503; past twice as many a new
    # connection is closed unread. A connection that sends no request head within
    # header_timeout_s is closed. Both keep a flood from taking the daemon's descriptors.
    limit_concurrency: Annotated[StrictInt, Field(ge=1)] = 256
    header_timeout_s: Seconds = 10.0
    # Addresses or networks of reverse proxies whose X-Forwarded-For/-Proto are believed (the
    # sign-in throttle and the audit log then see the forwarded client). Empty: none, from any.
    trusted_proxies: Strings = ()
    # /metrics needs a bearer token of role "metrics" or "admin" (Prometheus: authorization
    # credentials); false keeps it open to whoever reaches the port, as Prometheus expects.
    metrics_require_token: StrictBool = False


@dataclass(frozen=True)
class PacsDestination:
    """A PACS (DICOM storage SCP) that receives our SEG and SR."""

    __pydantic_config__ = TABLE

    ae_title: StrictStr
    host: StrictStr
    port: Port
    tls: StrictBool = False
    # Which results it takes: a PACS that stores no SEG (or no SR) is not sent one.
    results: Annotated[tuple[PacsResult, ...], BeforeValidator(_array)] = PACS_RESULTS
    # The SR's IOD: Comprehensive 3D SR, or Comprehensive SR (the same TID 1500 tree, which
    # has no 3-D coordinates) for a PACS that does not take Comprehensive 3D SR.
    sr: Literal["comprehensive3d", "comprehensive"] = "comprehensive3d"

    @property
    def key(self) -> str:
        """The destination column of its deliveries."""
        return f"pacs:{self.ae_title}@{self.host}:{self.port}"


@dataclass(frozen=True)
class RisDestination:
    """A RIS that receives HL7 v2 ORU^R01 over MLLP."""

    __pydantic_config__ = TABLE

    host: StrictStr
    port: Port
    receiving_application: StrictStr = "RIS"
    receiving_facility: StrictStr = "HOSPITAL"

    @property
    def key(self) -> str:
        """The destination column of its deliveries."""
        return f"ris:{self.host}:{self.port}"


@dataclass(frozen=True)
class SiteConfig:
    """The hospital the daemon serves: its name in the results, its clock, this device."""

    __pydantic_config__ = TABLE

    # InstitutionName (0008,0080) of the SEG and SR; "" copies the source images' own.
    institution: StrictStr = ""
    # The zone of the scanners' clocks: DICOM dates and times without TimezoneOffsetFromUTC
    # are read in it (HL7, FHIR, the status page). "" is this host's zone.
    time_zone: Annotated[StrictStr, AfterValidator(_time_zone)] = ""
    # DeviceSerialNumber of our SEG and SR (and the SR's device observer); "" is an
    # identifier made once and kept in <data_dir>/device-serial-number.
    device_serial_number: StrictStr = ""


@dataclass(frozen=True)
class Hl7Config:
    """How our HL7 v2 messages name their sender (MSH-3, MSH-4) and their purpose (MSH-11).

    The same for every RIS: we are one sending application. What each RIS is called
    (MSH-5, MSH-6) is set on its ``[[outputs.ris]]`` entry.
    """

    __pydantic_config__ = TABLE

    sending_application: StrictStr = "IMAGING_AI"
    sending_facility: StrictStr = ""
    # P production, T training (a test RIS), D debugging: HL7 table 0103.
    processing_id: Literal["P", "T", "D"] = "P"


@dataclass(frozen=True)
class OutputsConfig:
    """Where results go; every delivery is retried with backoff until it succeeds."""

    __pydantic_config__ = TABLE

    pacs: Annotated[tuple[PacsDestination, ...], BeforeValidator(_array)] = ()
    ris: Annotated[tuple[RisDestination, ...], BeforeValidator(_array)] = ()
    retry_min_s: Seconds = 5.0
    retry_max_s: Seconds = 3600.0
    # Deprecated: [site] institution. Still read (with a warning at start) where that is unset.
    institution: StrictStr = ""
    tls_ca: StrictStr = ""
    tls_cert: StrictStr = ""
    tls_key: StrictStr = ""


def _fhir_base_url(value: str) -> str:
    """An absolute http(s) URL without query or fragment, its trailing slash dropped; or ""."""
    if value and not re.fullmatch(r"https?://[^\s/?#]+(/[^\s?#]*)?", value):
        raise ValueError("must be an absolute http:// or https:// URL without ? or #")
    return value.rstrip("/")


def _identifier_system(value: str) -> str:
    """An absolute URI (FHIR Identifier.system), urn:oid: followed by a valid OID; or ""."""
    if value and not re.fullmatch(r"[A-Za-z][A-Za-z0-9+.-]*:\S+", value):
        raise ValueError('must be an absolute URI such as "urn:oid:1.2.3" or "https://..."')
    oid = value.removeprefix("urn:oid:")
    if oid != value and not re.fullmatch(r"[0-2](\.(0|[1-9][0-9]*))+", oid):
        raise ValueError("must be urn:oid: followed by an OID (digits and dots, as 1.2.840.1)")
    return value


IdentifierSystem = Annotated[StrictStr, AfterValidator(_identifier_system)]


@dataclass(frozen=True)
class FhirConfig:
    """The FHIR R4 API (``/fhir``): the address it gives its resources, the identifier systems."""

    __pydantic_config__ = TABLE

    # The FHIR base URL as RIS reaches it (a proxy's address where there is one), e.g.
    # "https://imaging-ai.hospital.example/fhir": fullUrl = base_url/Type/id. Empty: taken from
    # each request (scheme, host and port as the request names them, then /fhir).
    base_url: Annotated[StrictStr, AfterValidator(_fhir_base_url)] = ""
    # Identifier.system of the patient identifier (DICOM Patient ID) and of the accession number.
    # Empty: the identifier is published without a system.
    patient_identifier_system: IdentifierSystem = ""
    accession_identifier_system: IdentifierSystem = ""


@dataclass(frozen=True)
class EnginesConfig:
    """Models and how to run them."""

    __pydantic_config__ = TABLE

    dir: StrictStr = "engines"
    backend: StrictStr = "auto"
    cpu_threads: Annotated[StrictInt, Field(ge=0)] = 0
    max_batch_size: Annotated[StrictInt, Field(ge=1, le=1024)] = 32
    precision: Literal["fp32", "fp16"] = "fp16"
    lung_model: StrictStr = "lung-seg"
    nodule_model: StrictStr = "nodule-det"
    # The candidate classifier (card task "classification"); "" runs without one.
    candidate_model: StrictStr = "nodule-fpr"
    preferred_batch_sizes: Annotated[tuple[StrictInt, ...], BeforeValidator(_array)] = ()
    max_queue_delay_ms: StrictFloat = 5.0
    max_pending_slices: StrictInt = 1024
    gpus: Annotated[StrictInt, Field(ge=-1)] = -1
    cpu_workers: Annotated[StrictInt, Field(ge=1)] = 1
    worker_depth: Annotated[StrictInt, Field(ge=1)] = 2


@dataclass(frozen=True)
class LoggingConfig:
    """Log level and format."""

    __pydantic_config__ = TABLE

    level: StrictStr = "INFO"
    # "text" (one readable line per record) or "json" (one JSON object per line).
    format: StrictStr = "text"


@dataclass(frozen=True)
class Config:
    """The whole configuration, read once at start and passed down explicitly."""

    __pydantic_config__ = TABLE

    dicom: DicomConfig = field(default_factory=DicomConfig)
    assemble: AssembleConfig = field(default_factory=AssembleConfig)
    priority: PriorityConfig = field(default_factory=PriorityConfig)
    storage: StorageConfig = field(default_factory=StorageConfig)
    http: HttpConfig = field(default_factory=HttpConfig)
    engines: EnginesConfig = field(default_factory=EnginesConfig)
    outputs: OutputsConfig = field(default_factory=OutputsConfig)
    logging: LoggingConfig = field(default_factory=LoggingConfig)
    fhir: FhirConfig = field(default_factory=FhirConfig)
    site: SiteConfig = field(default_factory=SiteConfig)
    hl7: Hl7Config = field(default_factory=Hl7Config)

    @property
    def institution(self) -> str:
        """The configured InstitutionName: ``[site] institution``, else the deprecated
        ``[outputs] institution``; "" copies the source images' own."""
        return self.site.institution or self.outputs.institution


_SCHEMA = TypeAdapter(Config)


def load_config(path: Path | None, environ: Mapping[str, str] | None = None) -> Config:
    """Read the TOML file (if any), apply IMAGING_AI_<SECTION>__<KEY> overrides, validate.

    Parameters
    ----------
    path
        The TOML file; ``None`` means defaults only.
    environ
        The environment to read overrides from (``os.environ`` when ``None``).

    Raises
    ------
    ConfigError
        Naming the key and the bad value.
    """
    raw: dict[str, Any] = {}
    if path is not None:
        try:
            raw = tomllib.loads(Path(path).read_text(encoding="utf-8"))
        except OSError as exc:
            raise ConfigError(f"cannot read config file {path}: {exc.strerror}") from exc
        except tomllib.TOMLDecodeError as exc:
            raise ConfigError(f"config file {path} is not valid TOML: {exc}") from exc
    _apply_env(raw, os.environ if environ is None else environ)
    try:
        config = _SCHEMA.validate_python(raw)
    except ValidationError as exc:
        raise ConfigError("; ".join(_describe(e) for e in exc.errors())) from None
    _validate(config)
    return config


def _apply_env(raw: dict[str, Any], environ: Mapping[str, str]) -> None:
    for name, text in environ.items():
        if not name.startswith(ENV_PREFIX) or "__" not in name:
            continue
        section, _, key = name[len(ENV_PREFIX) :].lower().partition("__")
        table = raw.setdefault(section, {})
        if isinstance(table, dict):  # else the section itself is refused as not a table
            table[key] = _parse_env_value(text)


def _parse_env_value(text: str) -> Any:
    """Parse an override as a TOML value (number, bool, array, table) or else a plain string."""
    try:
        return tomllib.loads(f"v = {text}")["v"]
    except tomllib.TOMLDecodeError:
        return text


# What a value must be, by pydantic's error type, in the words of a TOML file.
_EXPECTED = {
    "int_type": "an integer",
    "int_parsing": "an integer",
    "float_type": "a number",
    "float_parsing": "a number",
    "bool_type": "true or false",
    "bool_parsing": "true or false",
    "string_type": "a string",
    "tuple_type": "an array",
    "list_type": "an array",
    "dataclass_type": "a table",
}


def _describe(error: ErrorDetails) -> str:
    """One refused value in words that name its key: ``dicom.port must be an integer, got 'x'``."""
    loc = error["loc"]
    key = "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in loc).lstrip(".")
    kind, value, ctx = error["type"], error.get("input"), error.get("ctx", {})
    if kind == "unexpected_keyword_argument":
        return f"unknown config section {key}" if len(loc) == 1 else f"unknown key {key}"
    if kind == "missing":
        return f"{key} is required"
    if kind == "dataclass_type" and len(loc) == 1:
        return f"[{key}] must be a table, got {value!r}"
    if kind in _EXPECTED:
        return f"{key} must be {_EXPECTED[kind]}, got {value!r}"
    if kind in BOUNDS:
        bound = next(iter(ctx.values()))
        return f"{key} must be {BOUNDS[kind]} {bound:g}, got {value!r}"
    if kind == "value_error":  # a validator of ours: its message says what the value must be
        return f"{key} {ctx['error']}, got {value!r}"
    if kind == "literal_error":
        return f"{key} must be one of {ctx['expected']}, got {value!r}"
    return f"{key}: {error['msg'].lower()}, got {value!r}"


def _validate(config: Config) -> None:
    """The checks a schema cannot state: DICOM's own rules, addresses, settings that pair."""
    _validate_dicom(config.dicom)
    _validate_http(config.http)
    _validate_priority(config.priority)
    _validate_engines(config.engines)
    _validate_outputs(config.outputs)
    _validate_site(config)
    _validate_hl7(config.hl7)
    node = config.storage.node_name
    if (node and not all(c.isalnum() or c in "._-" for c in node)) or node in (".", ".."):
        raise ConfigError(
            f"storage.node_name must be letters, digits, '.', '_' or '-', got {node!r}"
        )
    url = config.storage.database_url
    if url and not url.startswith(("sqlite://", "postgresql+psycopg://")):
        raise ConfigError(
            f"storage.database_url must start with sqlite:// or postgresql+psycopg://, got {url!r}"
        )
    if config.logging.level.upper() not in ("DEBUG", "INFO", "WARNING", "ERROR"):
        raise ConfigError(
            f"logging.level must be DEBUG, INFO, WARNING or ERROR, got {config.logging.level!r}"
        )
    if config.logging.format not in LOG_FORMATS:
        raise ConfigError(f'logging.format must be "text" or "json", got {config.logging.format!r}')


def _validate_ae_title(key: str, ae: str) -> None:
    if not ae.strip() or len(ae) > 16 or "\\" in ae or not ae.isascii():
        raise ConfigError(f"{key} must be 1-16 ASCII characters without backslash, got {ae!r}")


def _validate_address(key: str, host: str) -> None:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        if host != "localhost":
            raise ConfigError(f"{key} must be an IP address, got {host!r}") from None


def _validate_dicom(d: DicomConfig) -> None:
    _validate_ae_title("dicom.ae_title", d.ae_title)
    _validate_address("dicom.bind", d.bind)
    for i, caller in enumerate(d.allowed_callers):
        _validate_ae_title(f"dicom.allowed_callers[{i}].ae_title", caller.ae_title)
        _validate_address(f"dicom.allowed_callers[{i}].host", caller.host)
    if d.max_pdu != 0 and not 4096 <= d.max_pdu <= 2**31:
        raise ConfigError(f"dicom.max_pdu must be 0 (unlimited) or >= 4096, got {d.max_pdu}")
    if bool(d.tls_cert) != bool(d.tls_key):
        raise ConfigError("dicom.tls_cert and dicom.tls_key must be given together")
    try:
        classes = storage_sop_classes(d.storage_sop_classes)
    except ValueError as exc:
        raise ConfigError(f"dicom.storage_sop_classes {exc}") from None
    if not set(classes) & set(ANALYSED_SOP_CLASSES):
        raise ConfigError(
            "dicom.storage_sop_classes must include CTImageStorage (or Enhanced CT), "
            f"the images analysed, got {list(d.storage_sop_classes)!r}"
        )


def _validate_http(h: HttpConfig) -> None:
    _validate_address("http.bind", h.bind)
    if bool(h.tls_cert) != bool(h.tls_key):
        raise ConfigError("http.tls_cert and http.tls_key must be given together")
    if h.session_secret and len(h.session_secret) < 32:
        raise ConfigError("http.session_secret must be at least 32 characters when set")
    for i, proxy in enumerate(h.trusted_proxies):
        try:
            ipaddress.ip_network(proxy)  # strict, as uvicorn reads it (else a literal)
        except ValueError:
            raise ConfigError(
                f"http.trusted_proxies[{i}] must be an IP address or network, got {proxy!r}"
            ) from None
    names = set()
    for i, token in enumerate(h.tokens):
        if len(token.token) < 16:
            raise ConfigError(f"http.tokens[{i}].token must be at least 16 characters")
        if token.name in names:
            raise ConfigError(f"http.tokens[{i}].name {token.name!r} is used twice")
        names.add(token.name)


def _validate_outputs(o: OutputsConfig) -> None:
    if bool(o.tls_cert) != bool(o.tls_key):
        raise ConfigError("outputs.tls_cert and outputs.tls_key must be given together")
    for i, pacs in enumerate(o.pacs):
        _validate_ae_title(f"outputs.pacs[{i}].ae_title", pacs.ae_title)
        if not pacs.results:
            raise ConfigError(
                f"outputs.pacs[{i}].results must name at least one of "
                f"{', '.join(PACS_RESULTS)} (remove the destination to send it nothing)"
            )
    for i, ris in enumerate(o.ris):
        key = f"outputs.ris[{i}]"
        _validate_hd(f"{key}.receiving_application", ris.receiving_application, required=True)
        _validate_hd(f"{key}.receiving_facility", ris.receiving_facility, required=False)
    if o.retry_min_s > o.retry_max_s:
        raise ConfigError(
            f"outputs.retry_min_s must be <= outputs.retry_max_s, got {o.retry_min_s}"
        )


def deprecations(config: Config) -> tuple[str, ...]:
    """What the configuration uses that is deprecated, in words to log at start."""
    if config.outputs.institution and not config.site.institution:
        return ("outputs.institution is deprecated: set [site] institution instead",)
    return ()


def _validate_long_string(key: str, value: str) -> None:
    """A DICOM LO value: at most 64 characters, no backslash (it separates values)."""
    if len(value) > 64 or "\\" in value or any(c in value for c in "\r\n\f\x1b"):
        raise ConfigError(
            f"{key} must be at most 64 characters without backslash or control characters "
            f"(DICOM LO), got {value!r}"
        )


def _validate_site(config: Config) -> None:
    site, old = config.site, config.outputs.institution
    _validate_long_string("site.institution", site.institution)
    _validate_long_string("outputs.institution", old)
    _validate_long_string("site.device_serial_number", site.device_serial_number)
    if site.institution and old and site.institution != old:
        raise ConfigError(
            "site.institution and the deprecated outputs.institution differ; "
            f"remove outputs.institution (got {site.institution!r} and {old!r})"
        )


# The HL7 v2 delimiters of MSH-1/MSH-2 as this daemon writes them (|^~\&).
_HL7_DELIMITERS = frozenset("|^~\\&")


def _validate_hd(key: str, value: str, required: bool) -> None:
    """An HL7 HD namespace ID (IS, at most 20 characters in v2.5.1): printable ASCII
    without the message's delimiters, which would split the field."""
    ok = len(value) <= 20 and value.isascii() and value.isprintable()
    if not ok or _HL7_DELIMITERS & set(value) or (required and not value.strip()):
        need = "1-20" if required else "at most 20"
        raise ConfigError(
            f"{key} must be {need} printable ASCII characters without | ^ ~ \\ &, got {value!r}"
        )


def _validate_hl7(h: Hl7Config) -> None:
    _validate_hd("hl7.sending_application", h.sending_application, required=True)
    _validate_hd("hl7.sending_facility", h.sending_facility, required=False)


def _validate_engines(e: EnginesConfig) -> None:
    if e.backend not in BACKENDS:
        raise ConfigError(
            f"engines.backend must be one of {', '.join(BACKENDS)}, got {e.backend!r}"
        )


def _validate_priority(p: PriorityConfig) -> None:
    for i, rule in enumerate(p.rules):
        if not rule.tag and not rule.calling_ae:
            raise ConfigError(f"priority.rules[{i}] needs a tag or a calling_ae")
        if rule.tag and keyword_dict.get(rule.tag) is None:
            raise ConfigError(f"priority.rules[{i}].tag {rule.tag!r} is not a DICOM keyword")
        if rule.tag and not rule.values and not rule.present:
            raise ConfigError(f"priority.rules[{i}] with a tag needs values or present = true")

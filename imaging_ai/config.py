"""Reads a TOML file plus IMAGING_AI_* overrides once and gives a frozen, validated Config."""

from __future__ import annotations

import ipaddress
import os
import socket
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from pydicom.datadict import keyword_dict

from imaging_ai.errors import ConfigError

ENV_PREFIX = "IMAGING_AI_"
PRIORITY_CLASSES = ("urgent", "inpatient", "outpatient")
ROLES = ("ris", "admin", "metrics")


class Secret(str):
    """A string whose repr never shows its value (tokens, passwords)."""

    def __repr__(self) -> str:
        return "Secret('**********')"


@dataclass(frozen=True)
class AllowedCaller:
    """One peer allowed to associate: its AE title and the host it connects from."""

    ae_title: str
    host: str


@dataclass(frozen=True)
class DicomConfig:
    """The DICOM receiver (storage SCP)."""

    ae_title: str = "IMAGING_AI"
    bind: str = "127.0.0.1"
    port: int = 11112
    allowed_callers: tuple[AllowedCaller, ...] = ()
    max_pdu: int = 131072
    max_associations: int = 16
    max_pending_connections: int = 32
    negotiation_timeout_s: float = 10.0
    receiver_processes: int = 0
    network_timeout_s: float = 60.0
    tls_cert: str = ""
    tls_key: str = ""
    tls_ca: str = ""


@dataclass(frozen=True)
class AssembleConfig:
    """When a series and a study count as complete."""

    series_idle_s: float = 10.0
    study_idle_s: float = 20.0
    force_complete_s: float = 600.0
    poll_s: float = 1.0
    # Release rule: once every association that delivered a study's instances has released
    # (A-RELEASE, not an abort), the study completes this long after the last release.
    complete_on_release: bool = True
    release_grace_s: float = 0.5


@dataclass(frozen=True)
class PriorityRule:
    """One classification rule: a tag with given values (or merely present), or a calling AE."""

    priority: str
    tag: str = ""
    values: tuple[str, ...] = ()
    present: bool = False
    calling_ae: tuple[str, ...] = ()


DEFAULT_RULES = (
    PriorityRule("urgent", tag="RequestedProcedurePriority", values=("STAT", "HIGH")),
    PriorityRule("inpatient", tag="AdmissionID", present=True),
    PriorityRule("inpatient", tag="CurrentPatientLocation", present=True),
)


@dataclass(frozen=True)
class PriorityConfig:
    """Priority classes: their SLAs (seconds from completion to results) and the rules."""

    urgent_sla_s: float = 60.0
    inpatient_sla_s: float = 300.0
    outpatient_sla_s: float = 1800.0
    rules: tuple[PriorityRule, ...] = DEFAULT_RULES

    def sla_s(self, priority: str) -> float:
        """Return the SLA in seconds of a priority class."""
        return float(getattr(self, f"{priority}_sla_s"))


@dataclass(frozen=True)
class StorageConfig:
    """Where instances and the database live, and the disk low-water mark."""

    data_dir: str = "var"
    database_url: str = ""
    min_free_mb: int = 1024
    node_name: str = ""
    job_lease_s: float = 120.0

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

    name: str
    token: Secret
    role: str


@dataclass(frozen=True)
class HttpConfig:
    """The HTTP server: RIS API, admin pages, metrics."""

    bind: str = "127.0.0.1"
    port: int = 8080
    tokens: tuple[Token, ...] = ()
    tls_cert: str = ""
    tls_key: str = ""
    session_secret: Secret = field(default_factory=lambda: Secret(""))
    cookie_secure: bool = True
    session_max_age_s: float = 28800.0
    # Past this many open connections a request is answered 503; past twice as many a new
    # connection is closed unread. A connection that sends no request head within
    # header_timeout_s is closed. Both keep a flood from taking the daemon's descriptors.
    limit_concurrency: int = 256
    header_timeout_s: float = 10.0
    # Addresses or networks of reverse proxies whose X-Forwarded-For/-Proto are believed (the
    # sign-in throttle and the audit log then see the forwarded client). Empty: none, from any.
    trusted_proxies: tuple[str, ...] = ()
    # /metrics needs a bearer token of role "metrics" or "admin" (Prometheus: authorization
    # credentials); false keeps it open to whoever reaches the port, as Prometheus expects.
    metrics_require_token: bool = False


@dataclass(frozen=True)
class PacsDestination:
    """A PACS (DICOM storage SCP) that receives our SEG and SR."""

    ae_title: str
    host: str
    port: int
    tls: bool = False

    @property
    def key(self) -> str:
        """The destination column of its deliveries."""
        return f"pacs:{self.ae_title}@{self.host}:{self.port}"


@dataclass(frozen=True)
class RisDestination:
    """A RIS that receives HL7 v2 ORU^R01 over MLLP."""

    host: str
    port: int
    receiving_application: str = "RIS"
    receiving_facility: str = "HOSPITAL"

    @property
    def key(self) -> str:
        """The destination column of its deliveries."""
        return f"ris:{self.host}:{self.port}"


@dataclass(frozen=True)
class OutputsConfig:
    """Where results go; every delivery is retried with backoff until it succeeds."""

    pacs: tuple[PacsDestination, ...] = ()
    ris: tuple[RisDestination, ...] = ()
    retry_min_s: float = 5.0
    retry_max_s: float = 3600.0
    institution: str = ""
    tls_ca: str = ""
    tls_cert: str = ""
    tls_key: str = ""


BACKENDS = ("auto", "tensorrt", "onnxruntime-cuda", "onnxruntime-cpu")
LOG_FORMATS = ("text", "json")


@dataclass(frozen=True)
class EnginesConfig:
    """Models and how to run them."""

    dir: str = "engines"
    backend: str = "auto"
    cpu_threads: int = 0
    max_batch_size: int = 32
    precision: str = "fp16"
    lung_model: str = "lung-seg"
    nodule_model: str = "nodule-det"
    # The candidate classifier (card task "classification"); "" runs without one.
    candidate_model: str = "nodule-fpr"
    preferred_batch_sizes: tuple[int, ...] = ()
    max_queue_delay_ms: float = 5.0
    max_pending_slices: int = 1024
    gpus: int = -1
    cpu_workers: int = 1
    worker_depth: int = 2


@dataclass(frozen=True)
class LoggingConfig:
    """Log level and format."""

    level: str = "INFO"
    # "text" (one readable line per record) or "json" (one JSON object per line).
    format: str = "text"


@dataclass(frozen=True)
class Config:
    """The whole configuration, read once at start and passed down explicitly."""

    dicom: DicomConfig = field(default_factory=DicomConfig)
    assemble: AssembleConfig = field(default_factory=AssembleConfig)
    priority: PriorityConfig = field(default_factory=PriorityConfig)
    storage: StorageConfig = field(default_factory=StorageConfig)
    http: HttpConfig = field(default_factory=HttpConfig)
    engines: EnginesConfig = field(default_factory=EnginesConfig)
    outputs: OutputsConfig = field(default_factory=OutputsConfig)
    logging: LoggingConfig = field(default_factory=LoggingConfig)


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
    config = _build(raw)
    _validate(config)
    return config


def _apply_env(raw: dict[str, Any], environ: Mapping[str, str]) -> None:
    for name, text in environ.items():
        if not name.startswith(ENV_PREFIX) or "__" not in name:
            continue
        section, _, key = name[len(ENV_PREFIX) :].lower().partition("__")
        raw.setdefault(section, {})[key] = _parse_env_value(text)


def _parse_env_value(text: str) -> Any:
    """Parse an override as a TOML value (number, bool, array, table) or else a plain string."""
    try:
        return tomllib.loads(f"v = {text}")["v"]
    except tomllib.TOMLDecodeError:
        return text


_SECTIONS: dict[str, type] = {
    "dicom": DicomConfig,
    "assemble": AssembleConfig,
    "priority": PriorityConfig,
    "storage": StorageConfig,
    "http": HttpConfig,
    "engines": EnginesConfig,
    "outputs": OutputsConfig,
    "logging": LoggingConfig,
}


def _build(raw: dict[str, Any]) -> Config:
    unknown = set(raw) - set(_SECTIONS)
    if unknown:
        raise ConfigError(f"unknown config section(s): {', '.join(sorted(unknown))}")
    sections: dict[str, Any] = {}
    for name, cls in _SECTIONS.items():
        table = raw.get(name, {})
        if not isinstance(table, dict):
            raise ConfigError(f"[{name}] must be a table, got {table!r}")
        sections[name] = _build_section(name, cls, table)
    return Config(**sections)


def _build_section(section: str, cls: type, table: dict[str, Any]) -> Any:
    known = {f.name: f for f in fields(cls)}
    values: dict[str, Any] = {}
    for key, value in table.items():
        if key not in known:
            raise ConfigError(f"unknown key {section}.{key}")
        values[key] = _convert(f"{section}.{key}", known[key].type, value)
    return cls(**values)


def _convert(key: str, type_name: Any, value: Any) -> Any:
    converters = {
        "str": _as_str,
        "int": _as_int,
        "float": _as_float,
        "bool": _as_bool,
        "tuple[AllowedCaller, ...]": _as_callers,
        "tuple[PriorityRule, ...]": _as_rules,
        "tuple[Token, ...]": _as_tokens,
        "Secret": lambda key, value: Secret(_as_str(key, value)),
        "tuple[int, ...]": _as_ints,
        "tuple[str, ...]": _as_strs,
        "tuple[PacsDestination, ...]": _as_pacs,
        "tuple[RisDestination, ...]": _as_ris,
    }
    return converters[str(type_name)](key, value)


def _as_str(key: str, value: Any) -> str:
    if not isinstance(value, str):
        raise ConfigError(f"{key} must be a string, got {value!r}")
    return value


def _as_int(key: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ConfigError(f"{key} must be an integer, got {value!r}")
    return value


def _as_float(key: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ConfigError(f"{key} must be a number, got {value!r}")
    return float(value)


def _as_bool(key: str, value: Any) -> bool:
    if not isinstance(value, bool):
        raise ConfigError(f"{key} must be true or false, got {value!r}")
    return value


def _as_ints(key: str, value: Any) -> tuple[int, ...]:
    if not isinstance(value, list) or not all(
        isinstance(v, int) and not isinstance(v, bool) for v in value
    ):
        raise ConfigError(f"{key} must be an array of integers, got {value!r}")
    return tuple(value)


def _as_strs(key: str, value: Any) -> tuple[str, ...]:
    """An array of strings; a single string (an environment override) is split at commas."""
    if isinstance(value, str):
        return tuple(part.strip() for part in value.split(",") if part.strip())
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise ConfigError(f"{key} must be an array of strings, got {value!r}")
    return tuple(value)


def _tables(key: str, value: Any) -> list[dict[str, Any]]:
    if not isinstance(value, list) or not all(isinstance(v, dict) for v in value):
        raise ConfigError(f"{key} must be an array of tables, got {value!r}")
    return value


def _strings(key: str, value: Any) -> tuple[str, ...]:
    if isinstance(value, str):
        return (value,)
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise ConfigError(f"{key} must be a string or an array of strings, got {value!r}")
    return tuple(value)


def _only(key: str, item: dict[str, Any], allowed: set[str]) -> None:
    extra = set(item) - allowed
    if extra:
        raise ConfigError(f"{key}: unknown key(s) {', '.join(sorted(extra))}")


def _as_callers(key: str, value: Any) -> tuple[AllowedCaller, ...]:
    callers = []
    for i, item in enumerate(_tables(key, value)):
        _only(f"{key}[{i}]", item, {"ae_title", "host"})
        ae = _as_str(f"{key}[{i}].ae_title", item.get("ae_title"))
        host = _as_str(f"{key}[{i}].host", item.get("host", "127.0.0.1"))
        callers.append(AllowedCaller(ae_title=ae, host=host))
    return tuple(callers)


def _as_rules(key: str, value: Any) -> tuple[PriorityRule, ...]:
    rules = []
    for i, item in enumerate(_tables(key, value)):
        where = f"{key}[{i}]"
        _only(where, item, {"priority", "tag", "values", "present", "calling_ae"})
        rules.append(
            PriorityRule(
                priority=_as_str(f"{where}.priority", item.get("priority")),
                tag=_as_str(f"{where}.tag", item.get("tag", "")),
                values=_strings(f"{where}.values", item.get("values", [])),
                present=_as_bool(f"{where}.present", item.get("present", False)),
                calling_ae=_strings(f"{where}.calling_ae", item.get("calling_ae", [])),
            )
        )
    return tuple(rules)


def _as_tokens(key: str, value: Any) -> tuple[Token, ...]:
    tokens = []
    for i, item in enumerate(_tables(key, value)):
        where = f"{key}[{i}]"
        _only(where, item, {"name", "token", "role"})
        tokens.append(
            Token(
                name=_as_str(f"{where}.name", item.get("name")),
                token=Secret(_as_str(f"{where}.token", item.get("token"))),
                role=_as_str(f"{where}.role", item.get("role")),
            )
        )
    return tuple(tokens)


def _as_pacs(key: str, value: Any) -> tuple[PacsDestination, ...]:
    out = []
    for i, item in enumerate(_tables(key, value)):
        where = f"{key}[{i}]"
        _only(where, item, {"ae_title", "host", "port", "tls"})
        out.append(
            PacsDestination(
                ae_title=_as_str(f"{where}.ae_title", item.get("ae_title")),
                host=_as_str(f"{where}.host", item.get("host")),
                port=_as_int(f"{where}.port", item.get("port")),
                tls=_as_bool(f"{where}.tls", item.get("tls", False)),
            )
        )
    return tuple(out)


def _as_ris(key: str, value: Any) -> tuple[RisDestination, ...]:
    out = []
    for i, item in enumerate(_tables(key, value)):
        where = f"{key}[{i}]"
        _only(where, item, {"host", "port", "receiving_application", "receiving_facility"})
        out.append(
            RisDestination(
                host=_as_str(f"{where}.host", item.get("host")),
                port=_as_int(f"{where}.port", item.get("port")),
                receiving_application=_as_str(
                    f"{where}.receiving_application", item.get("receiving_application", "RIS")
                ),
                receiving_facility=_as_str(
                    f"{where}.receiving_facility", item.get("receiving_facility", "HOSPITAL")
                ),
            )
        )
    return tuple(out)


def _validate(config: Config) -> None:
    _validate_dicom(config.dicom)
    _validate_http(config.http)
    _validate_priority(config.priority)
    _validate_engines(config.engines)
    _validate_outputs(config.outputs)
    a = config.assemble
    for name in ("series_idle_s", "study_idle_s", "force_complete_s", "poll_s"):
        if getattr(a, name) <= 0:
            raise ConfigError(f"assemble.{name} must be > 0, got {getattr(a, name)!r}")
    if a.release_grace_s < 0:
        raise ConfigError(f"assemble.release_grace_s must be >= 0, got {a.release_grace_s!r}")
    node = config.storage.node_name
    if (node and not all(c.isalnum() or c in "._-" for c in node)) or node in (".", ".."):
        raise ConfigError(
            f"storage.node_name must be letters, digits, '.', '_' or '-', got {node!r}"
        )
    if config.storage.job_lease_s < 5:
        raise ConfigError(f"storage.job_lease_s must be >= 5, got {config.storage.job_lease_s}")
    if config.storage.min_free_mb < 0:
        raise ConfigError(f"storage.min_free_mb must be >= 0, got {config.storage.min_free_mb}")
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


def _validate_port(key: str, port: int) -> None:
    if not 0 <= port <= 65535:
        raise ConfigError(f"{key} must be a port number 0-65535, got {port}")


def _validate_dicom(d: DicomConfig) -> None:
    _validate_ae_title("dicom.ae_title", d.ae_title)
    _validate_address("dicom.bind", d.bind)
    _validate_port("dicom.port", d.port)
    for i, caller in enumerate(d.allowed_callers):
        _validate_ae_title(f"dicom.allowed_callers[{i}].ae_title", caller.ae_title)
        _validate_address(f"dicom.allowed_callers[{i}].host", caller.host)
    if d.max_pdu != 0 and not 4096 <= d.max_pdu <= 2**31:
        raise ConfigError(f"dicom.max_pdu must be 0 (unlimited) or >= 4096, got {d.max_pdu}")
    if d.receiver_processes < 0:
        raise ConfigError(f"dicom.receiver_processes must be >= 0, got {d.receiver_processes}")
    if d.max_associations < 1:
        raise ConfigError(f"dicom.max_associations must be >= 1, got {d.max_associations}")
    if d.max_pending_connections < 1:
        raise ConfigError(
            f"dicom.max_pending_connections must be >= 1, got {d.max_pending_connections}"
        )
    if d.negotiation_timeout_s <= 0:
        raise ConfigError(f"dicom.negotiation_timeout_s must be > 0, got {d.negotiation_timeout_s}")
    if bool(d.tls_cert) != bool(d.tls_key):
        raise ConfigError("dicom.tls_cert and dicom.tls_key must be given together")


def _validate_http(h: HttpConfig) -> None:
    _validate_address("http.bind", h.bind)
    _validate_port("http.port", h.port)
    if bool(h.tls_cert) != bool(h.tls_key):
        raise ConfigError("http.tls_cert and http.tls_key must be given together")
    if h.session_secret and len(h.session_secret) < 32:
        raise ConfigError("http.session_secret must be at least 32 characters when set")
    if h.session_max_age_s <= 0:
        raise ConfigError(f"http.session_max_age_s must be > 0, got {h.session_max_age_s}")
    if h.limit_concurrency < 1:
        raise ConfigError(f"http.limit_concurrency must be >= 1, got {h.limit_concurrency}")
    if h.header_timeout_s <= 0:
        raise ConfigError(f"http.header_timeout_s must be > 0, got {h.header_timeout_s}")
    for i, proxy in enumerate(h.trusted_proxies):
        try:
            ipaddress.ip_network(proxy)  # strict, as uvicorn reads it (else a literal)
        except ValueError:
            raise ConfigError(
                f"http.trusted_proxies[{i}] must be an IP address or network, got {proxy!r}"
            ) from None
    names = set()
    for i, token in enumerate(h.tokens):
        if token.role not in ROLES:
            raise ConfigError(
                f"http.tokens[{i}].role must be one of {', '.join(ROLES)}, got {token.role!r}"
            )
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
        _validate_port(f"outputs.pacs[{i}].port", pacs.port)
    for i, ris in enumerate(o.ris):
        _validate_port(f"outputs.ris[{i}].port", ris.port)
    if not 0 < o.retry_min_s <= o.retry_max_s:
        raise ConfigError(
            f"outputs.retry_min_s must be > 0 and <= outputs.retry_max_s, got {o.retry_min_s}"
        )


def _validate_engines(e: EnginesConfig) -> None:
    if e.backend not in BACKENDS:
        raise ConfigError(
            f"engines.backend must be one of {', '.join(BACKENDS)}, got {e.backend!r}"
        )
    if e.precision not in ("fp32", "fp16"):
        raise ConfigError(f"engines.precision must be fp32 or fp16, got {e.precision!r}")
    if e.cpu_threads < 0:
        raise ConfigError(f"engines.cpu_threads must be >= 0, got {e.cpu_threads}")
    if e.cpu_workers < 1 or e.worker_depth < 1:
        raise ConfigError("engines.cpu_workers and engines.worker_depth must be >= 1")
    if e.gpus < -1:
        raise ConfigError(f"engines.gpus must be -1 (all visible), 0 or more, got {e.gpus}")
    if not 1 <= e.max_batch_size <= 1024:
        raise ConfigError(f"engines.max_batch_size must be 1-1024, got {e.max_batch_size}")


def _validate_priority(p: PriorityConfig) -> None:
    for cls in PRIORITY_CLASSES:
        if p.sla_s(cls) <= 0:
            raise ConfigError(f"priority.{cls}_sla_s must be > 0, got {p.sla_s(cls)}")
    for i, rule in enumerate(p.rules):
        if rule.priority not in PRIORITY_CLASSES:
            raise ConfigError(
                f"priority.rules[{i}].priority must be one of {', '.join(PRIORITY_CLASSES)}, "
                f"got {rule.priority!r}"
            )
        if not rule.tag and not rule.calling_ae:
            raise ConfigError(f"priority.rules[{i}] needs a tag or a calling_ae")
        if rule.tag and keyword_dict.get(rule.tag) is None:
            raise ConfigError(f"priority.rules[{i}].tag {rule.tag!r} is not a DICOM keyword")
        if rule.tag and not rule.values and not rule.present:
            raise ConfigError(f"priority.rules[{i}] with a tag needs values or present = true")

"""DICOM over TLS: the storage SCP with a certificate, DCMTK storescu +tls as the peer."""

from __future__ import annotations

import shutil
import subprocess
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest
from imaging_ai_devkit.bench.harness import free_port
from sqlalchemy import Engine, select
from sqlalchemy.orm import Session

from imaging_ai.catalog import Catalog
from imaging_ai.config import AllowedCaller, DicomConfig
from imaging_ai.db.models import Instance
from imaging_ai.db.session import make_engine, upgrade
from imaging_ai.receive import Receiver
from imaging_ai.spool import Spool
from tests.dicom_factory import ct_series

pytestmark = pytest.mark.skipif(shutil.which("openssl") is None, reason="needs openssl")


def make_ca_and_cert(d: Path, name: str, ca: tuple[Path, Path] | None = None) -> tuple[Path, Path]:
    key, crt = d / f"{name}.key", d / f"{name}.crt"
    if ca is None:
        subprocess.run(
            [
                "openssl",
                "req",
                "-x509",
                "-newkey",
                "rsa:2048",
                "-nodes",
                "-days",
                "2",
                "-subj",
                f"/CN={name}",
                "-keyout",
                str(key),
                "-out",
                str(crt),
            ],
            check=True,
            capture_output=True,
        )
        return key, crt
    csr, san = d / f"{name}.csr", d / "san.ext"
    san.write_text("subjectAltName=IP:127.0.0.1\n")
    subprocess.run(
        [
            "openssl",
            "req",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-subj",
            f"/CN={name}",
            "-keyout",
            str(key),
            "-out",
            str(csr),
        ],
        check=True,
        capture_output=True,
    )
    subprocess.run(
        [
            "openssl",
            "x509",
            "-req",
            "-in",
            str(csr),
            "-CA",
            str(ca[1]),
            "-CAkey",
            str(ca[0]),
            "-CAcreateserial",
            "-days",
            "2",
            "-extfile",
            str(san),
            "-out",
            str(crt),
        ],
        check=True,
        capture_output=True,
    )
    return key, crt


@pytest.fixture
def pki(tmp_path: Path) -> dict[str, tuple[Path, Path]]:
    ca = make_ca_and_cert(tmp_path, "ca")
    return {
        "ca": ca,
        "server": make_ca_and_cert(tmp_path, "server", ca),
        "client": make_ca_and_cert(tmp_path, "client", ca),
    }


@pytest.fixture
def tls_receiver(tmp_path: Path, pki: dict[str, tuple[Path, Path]]) -> Iterator[Receiver]:
    engine = make_engine(f"sqlite:///{tmp_path / 'db.sqlite3'}")
    upgrade(engine)
    config = DicomConfig(
        port=free_port(),
        allowed_callers=(AllowedCaller("STORESCU", "127.0.0.1"),),
        tls_cert=str(pki["server"][1]),
        tls_key=str(pki["server"][0]),
        tls_ca=str(pki["ca"][1]),
    )
    spool = Spool(tmp_path / "spool", 0)
    spool.prepare()
    receiver = Receiver(config, spool, Catalog(engine, spool), ())
    receiver.start()
    yield receiver
    receiver.stop()
    engine.dispose()


def storescu(port: int, files: list[Path], *tls: str) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(
        ["storescu", *tls, "-aec", "IMAGING_AI", "127.0.0.1", str(port), *map(str, files)],
        capture_output=True,
        timeout=60,
    )


def stored(receiver: Receiver) -> int:
    with Session(receiver.catalog.engine) as s:
        return len(s.scalars(select(Instance)).all())


def test_storescu_over_tls_with_client_certificate(
    tls_receiver: Receiver, pki: dict[str, tuple[Path, Path]], tmp_path: Path
) -> None:
    files = ct_series(tmp_path / "src", slices=3)
    key, crt = pki["client"]
    result = storescu(
        tls_receiver.port, files, "+tls", str(key), str(crt), "+cf", str(pki["ca"][1])
    )
    assert result.returncode == 0, result.stderr.decode()
    assert stored(tls_receiver) == 3


def test_plain_tcp_and_unknown_certificates_are_refused(
    tls_receiver: Receiver, pki: dict[str, tuple[Path, Path]], tmp_path: Path
) -> None:
    files = ct_series(tmp_path / "src", slices=1)
    assert storescu(tls_receiver.port, files).returncode != 0
    stranger = make_ca_and_cert(tmp_path, "stranger")
    refused = storescu(
        tls_receiver.port,
        files,
        "+tls",
        str(stranger[0]),
        str(stranger[1]),
        "+cf",
        str(pki["ca"][1]),
    )
    assert refused.returncode != 0
    assert stored(tls_receiver) == 0


def test_tls_key_without_certificate_is_a_config_error() -> None:
    from imaging_ai.config import Config, _validate
    from imaging_ai.errors import ConfigError

    with pytest.raises(ConfigError, match=r"tls_cert and dicom\.tls_key"):
        _validate(replace(Config(), dicom=DicomConfig(tls_key="/x.key")))


def test_outbox_sends_to_a_tls_pacs(
    tmp_path: Path, pki: dict[str, tuple[Path, Path]], engine_for_outbox: Engine
) -> None:
    """The C-STORE SCU over TLS to DCMTK storescp +tls, which requires our certificate."""
    from datetime import UTC, datetime

    from imaging_ai.config import Config, OutputsConfig, PacsDestination
    from imaging_ai.db.models import Delivery, Study
    from imaging_ai.db.session import session_factory
    from imaging_ai.outbox import Outbox, Payload

    port, received = free_port(), tmp_path / "pacs"
    received.mkdir()
    key, crt = pki["server"]
    pacs = subprocess.Popen(
        [
            "storescp",
            "+tls",
            str(key),
            str(crt),
            "+cf",
            str(pki["ca"][1]),
            "-aet",
            "PACS",
            "-od",
            str(received),
            "-dhl",
            str(port),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        time.sleep(0.5)
        data = tmp_path / "data"
        files = ct_series(data / "results", slices=2)
        outputs = OutputsConfig(
            pacs=(PacsDestination("PACS", "127.0.0.1", port, tls=True),),
            tls_ca=str(pki["ca"][1]),
            tls_cert=str(pki["client"][1]),
            tls_key=str(pki["client"][0]),
        )
        outbox = Outbox(session_factory(engine_for_outbox), Config(outputs=outputs), data)
        now = datetime.now(UTC)
        with Session(engine_for_outbox) as s, s.begin():
            study = Study(
                study_instance_uid="1.2.3",
                state="processing",
                received_at=now,
                last_instance_at=now,
            )
            s.add(study)
            s.flush()
            outbox.enqueue(s, study, [Payload("seg", f, str(i)) for i, f in enumerate(files)], now)
        assert outbox.deliver_due() == 2
        with Session(engine_for_outbox) as s:
            assert [d.state for d in s.scalars(select(Delivery))] == ["done", "done"]
        assert len(list(received.iterdir())) == 2
    finally:
        pacs.terminate()
        pacs.wait(10)


@pytest.fixture
def engine_for_outbox(tmp_path: Path) -> Iterator[Engine]:
    engine = make_engine(f"sqlite:///{tmp_path / 'outbox.sqlite3'}")
    upgrade(engine)
    yield engine
    engine.dispose()


def test_https_for_the_web_server(tmp_path: Path, pki: dict[str, tuple[Path, Path]]) -> None:
    """[http] tls_cert/tls_key: the API answers over HTTPS, verified against our CA."""
    import urllib.error
    import urllib.request

    from imaging_ai_devkit.bench.harness import DaemonProcess

    key, crt = pki["server"]
    daemon = DaemonProcess(
        tmp_path / "d",
        http_extra=f'tls_cert = "{crt}"\ntls_key = "{key}"',
        https_ca=pki["ca"][1],
    )
    daemon.start()
    try:
        assert daemon.get("/healthz") == {"status": "alive"}
        with pytest.raises((urllib.error.URLError, ConnectionError)):
            urllib.request.urlopen(f"http://127.0.0.1:{daemon.http_port}/healthz", timeout=5)
    finally:
        assert daemon.stop() == 0

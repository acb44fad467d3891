"""Takes a folder and gives the hospital around the daemon, on loopback: Orthanc as the PACS that
pushes studies and stores the results, a stand-in RIS taking HL7 over MLLP, and the daemon
configured for both; with what arrived where for each study.

Used by `make demo` (scripts/demo.py), the end-to-end test that drives it, and the turnaround
and sustained benchmarks.
"""

from __future__ import annotations

import io
import json
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any

import pydicom

from imaging_ai_devkit.bench.harness import ADMIN_TOKEN, CALLED_AE, DaemonProcess, free_port
from imaging_ai_devkit.bench.orthanc import ORTHANC_AE, OrthancPacs

if TYPE_CHECKING:
    from imaging_ai_devkit.mllp_listener import RisListener

PRIORITY_ORDER = ("urgent", "inpatient", "outpatient")


@dataclass(frozen=True)
class HospitalOptions:
    """How the daemon is set up: its assembly idle times and extra ``[engines]`` keys."""

    series_idle_s: float = 1.0
    study_idle_s: float = 1.0
    poll_s: float = 0.2
    engines: str = ""
    log_level: str = "INFO"
    release_grace_s: float | None = None  # None: the daemon's default

    def daemon_toml(self, orthanc_port: int, ris_port: int) -> str:
        """The daemon's configuration after its ``[engines]`` header (see DaemonProcess)."""
        grace = self.release_grace_s
        return (
            f"{self.engines}\n"
            f"[assemble]\nseries_idle_s = {self.series_idle_s}\n"
            f"study_idle_s = {self.study_idle_s}\npoll_s = {self.poll_s}\n"
            f"{f'release_grace_s = {grace}' if grace is not None else ''}\n"
            "[outputs]\nretry_min_s = 1.0\nretry_max_s = 5.0\n"
            f'pacs = [{{ae_title = "{ORTHANC_AE}", host = "127.0.0.1", port = {orthanc_port}}}]\n'
            f'ris = [{{host = "127.0.0.1", port = {ris_port}}}]\n'
            f'[logging]\nlevel = "{self.log_level}"\n'
        )


@dataclass
class StudyResults:
    """What one study produced, read back from where each result went."""

    study_uid: str
    accession: str
    state: str = ""
    seg_labels: list[list[str]] = field(default_factory=list)
    sr_study_uids: list[str] = field(default_factory=list)
    oru_messages: int = 0
    api_reports: list[dict[str, Any]] = field(default_factory=list)
    fhir_matches: int = 0
    admin_state: str = ""
    on_status_page: bool = False

    def problems(self) -> list[str]:
        """What is missing, in words; empty when every result arrived."""
        out = []
        if self.state != "done":
            out.append(f"daemon state is {self.state!r}, not 'done'")
        if len(self.seg_labels) != 1:
            out.append(f"{len(self.seg_labels)} SEG in Orthanc, expected 1")
        if self.sr_study_uids != [self.study_uid]:
            out.append(f"SR in Orthanc for studies {self.sr_study_uids}, expected one for this")
        if self.oru_messages != 1:
            out.append(f"{self.oru_messages} ORU^R01 at the RIS, expected 1")
        if len(self.api_reports) != 1:
            out.append(f"{len(self.api_reports)} reports on /api/v1/reports, expected 1")
        if self.fhir_matches != 1:
            out.append(f"{self.fhir_matches} DiagnosticReports on /fhir, expected 1")
        if self.admin_state != "done" or not self.on_status_page:
            out.append(f"status page: state {self.admin_state!r}, listed {self.on_status_page}")
        return out


class Hospital:
    """Orthanc, a stand-in RIS and the daemon, started together and stopped together.

    ``pacs`` makes the PACS: `OrthancPacs`, or anything with its methods that this class uses
    (the device script brings a pynetdicom one where no Orthanc is installed).
    """

    def __init__(
        self,
        root: Path,
        options: HospitalOptions | None = None,
        pacs: Callable[[Path, str, int], OrthancPacs] = OrthancPacs,
    ) -> None:
        self.options = options or HospitalOptions()
        daemon_port = free_port()
        self.ris_port = free_port()
        self.orthanc = pacs(root / "orthanc", CALLED_AE, daemon_port)
        self.daemon = DaemonProcess(
            root / "daemon",
            self.options.daemon_toml(self.orthanc.dicom_port, self.ris_port),
            calling_aes=("STORESCU", ORTHANC_AE),
            dicom_port=daemon_port,
        )
        self.ris: RisListener | None = None
        self.daemon_exit: int | None = None

    def start(self) -> Hospital:
        """Start the RIS, Orthanc, then the daemon; return when the daemon is ready."""
        # Imported here: the benchmarks' command line should not depend on the RIS stand-in.
        from imaging_ai_devkit.mllp_listener import RisListener

        self.ris = RisListener(port=self.ris_port).start()
        self.orthanc.start()
        self.daemon.start(timeout_s=120)
        return self

    def stop(self) -> None:
        """Stop the daemon (its exit code is kept), Orthanc and the RIS."""
        try:
            if self.daemon.proc is not None:
                self.daemon_exit = self.daemon.stop()
        finally:
            self.orthanc.stop()
            if self.ris is not None:
                self.ris.stop()

    def __enter__(self) -> Hospital:
        return self.start()

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    @property
    def database_url(self) -> str:
        """The daemon's SQLite database (the benchmarks read stage times from it)."""
        return f"sqlite:///{(self.daemon.data_dir / 'imaging-ai.sqlite3').resolve()}"

    @property
    def urls(self) -> dict[str, str]:
        """Where a person looks: the daemon's pages and API, Orthanc's explorer."""
        base = f"http://127.0.0.1:{self.daemon.http_port}"
        return {
            "status page": f"{base}/admin",
            "RIS API": f"{base}/api/v1/reports?accession=ACCESSION",
            "FHIR": f"{base}/fhir/DiagnosticReport?identifier=ACCESSION",
            "metrics": f"{base}/metrics",
            "Orthanc (PACS)": f"http://127.0.0.1:{self.orthanc.http_port}/app/explorer.html",
        }

    def upload(self, files: list[Path]) -> str:
        """Store a study in Orthanc over REST; return its Orthanc id."""
        return self.orthanc.upload(files)

    def push(self, orthanc_study: str) -> int:
        """Have Orthanc C-STORE a study to the daemon; return the instances sent."""
        answer = self.orthanc.push_to_daemon(orthanc_study)
        if answer.get("FailedInstancesCount"):
            raise RuntimeError(f"Orthanc failed to push {answer['FailedInstancesCount']} instances")
        return int(answer.get("InstancesCount", 0))

    def set_paused(self, priority: str, paused: bool) -> None:
        """Pause or resume a class through the admin action endpoint (audited as ``it``)."""
        form = {"action": "pause_class" if paused else "resume_class", "target": priority}
        self.request("POST", "/admin/actions", {**form, "confirm": "yes"})

    def request(self, method: str, path: str, form: dict[str, str] | None = None) -> bytes:
        """An HTTP request to the daemon with the admin token; the body."""
        data = urllib.parse.urlencode(form).encode() if form is not None else None
        request = urllib.request.Request(
            f"http://127.0.0.1:{self.daemon.http_port}{path}",
            data=data,
            method=method,
            headers={"Authorization": f"Bearer {ADMIN_TOKEN}"},
        )
        with urllib.request.urlopen(request, timeout=30) as response:
            return bytes(response.read())

    def state(self, study_uid: str) -> str:
        """The daemon's state of a study, or "" before it knows the study."""
        try:
            return str(self.daemon.study(study_uid)["state"])
        except urllib.error.HTTPError:
            return ""

    def results(self, study_uid: str, accession: str, orthanc_study: str) -> StudyResults:
        """Read back every result of a study from Orthanc, the RIS, the API and the pages."""
        out = StudyResults(study_uid, accession, state=self.state(study_uid))
        for series in self.orthanc.get(f"/studies/{orthanc_study}/series"):
            modality = series["MainDicomTags"].get("Modality")
            for instance in series["Instances"] if modality in ("SEG", "SR") else ():
                data = self.orthanc.file(instance)
                if modality == "SEG":
                    out.seg_labels.append(segment_labels(data))
                else:
                    out.sr_study_uids.append(sr_study_uid(data))
        received = list(self.ris.received) if self.ris is not None else []
        out.oru_messages = sum(1 for m in received if "ORU^R01" in m and accession in m)
        query = urllib.parse.quote(accession)
        out.api_reports = self.daemon.get(f"/api/v1/reports?accession={query}")["reports"]
        bundle = self.daemon.get(f"/fhir/DiagnosticReport?identifier={query}")
        out.fhir_matches = int(bundle.get("total", 0))
        page = self.request("GET", f"/admin/studies/{urllib.parse.quote(study_uid)}").decode()
        out.admin_state = "done" if 'class="state state-done"' in page else "not done"
        out.on_status_page = study_uid in self.request("GET", "/admin").decode()
        return out


def segment_labels(data: bytes) -> list[str]:
    """The segment labels of a DICOM SEG, read back with highdicom."""
    import highdicom as hd

    seg = hd.seg.segread(io.BytesIO(data))
    return [str(item.SegmentLabel) for item in seg.SegmentSequence]


def sr_study_uid(data: bytes) -> str:
    """The Study Instance UID of a Comprehensive 3D SR, read back with highdicom."""
    import highdicom as hd

    return str(hd.sr.srread(io.BytesIO(data)).StudyInstanceUID)


def study_identity(files: list[Path]) -> tuple[str, str]:
    """(Study Instance UID, Accession Number) of a study's files."""
    ds = pydicom.dcmread(files[0], stop_before_pixels=True)
    return str(ds.StudyInstanceUID), str(ds.get("AccessionNumber", ""))


def dumps(value: Any) -> str:
    """JSON for summaries: sorted keys, two-space indent."""
    return json.dumps(value, indent=2, sort_keys=True, default=str)

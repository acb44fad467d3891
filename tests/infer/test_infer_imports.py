"""imaging_ai.infer and the device scripts must import on the GPU machine (no pydicom, no DB)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ABSENT_ON_GPU_MACHINE = ("pydicom", "pynetdicom", "highdicom", "SimpleITK", "sqlalchemy")
SCRIPTS = Path(__file__).parents[2] / "benchmarks" / "device"


def help_without_dicom_or_database(script: Path, *modules: str) -> str:
    """Import ``modules`` and run ``script --help`` as on the GPU machine; return the help text.

    The packages that machine lacks are blocked, so an import of one of them fails the run.
    """
    code = "\n".join(
        [
            "import runpy, sys",
            f"for name in {ABSENT_ON_GPU_MACHINE!r}: sys.modules[name] = None",
            *(f"import {module}" for module in modules),
            f"sys.argv = [{str(script)!r}, '--help']",
            "try:",
            f"    runpy.run_path({str(script)!r}, run_name='__main__')",
            "except SystemExit as exc:",
            "    sys.exit(exc.code)",
        ]
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    return result.stdout


def test_infer_modules_and_the_device_script_import_without_dicom_or_database() -> None:
    modules = (
        "imaging_ai.infer.select",
        "imaging_ai.infer.cli",
        "imaging_ai_devkit.fake_engines",
        "tests.fakes.trt_fake",
        "tests.fakes.cudart_fake",
    )
    assert "--onnx" in help_without_dicom_or_database(SCRIPTS / "engine_check.py", *modules)


def test_the_issue3_device_script_imports_without_dicom_or_database() -> None:
    modules = ("imaging_ai.infer.agreement", "imaging_ai.infer.tensorrt")
    assert "--make-slices" in help_without_dicom_or_database(
        SCRIPTS / "engines_vs_pytorch.py", *modules
    )

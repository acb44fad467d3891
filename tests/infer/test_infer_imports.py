"""imaging_ai.infer and the device script must import on the GPU machine (no pydicom, no DB)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ABSENT_ON_GPU_MACHINE = ("pydicom", "pynetdicom", "highdicom", "SimpleITK", "sqlalchemy")


def test_infer_modules_and_the_device_script_import_without_dicom_or_database() -> None:
    script = Path(__file__).parents[2] / "scripts" / "device_engine_check.py"
    code = "\n".join(
        [
            "import runpy, sys",
            f"for name in {ABSENT_ON_GPU_MACHINE!r}: sys.modules[name] = None",
            "import imaging_ai.infer.select, imaging_ai.infer.cli, imaging_ai.infer.fake",
            "import imaging_ai.infer.trt_fake, imaging_ai.infer.cudart_fake",
            f"sys.argv = [{str(script)!r}, '--help']",
            "try:",
            f"    runpy.run_path({str(script)!r}, run_name='__main__')",
            "except SystemExit as exc:",
            "    sys.exit(exc.code)",
        ]
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert "--onnx" in result.stdout


def test_the_issue3_device_script_imports_without_dicom_or_database() -> None:
    script = Path(__file__).parents[2] / "scripts" / "device_issue3.py"
    code = "\n".join(
        [
            "import runpy, sys",
            f"for name in {ABSENT_ON_GPU_MACHINE!r}: sys.modules[name] = None",
            "import imaging_ai.infer.agreement, imaging_ai.infer.tensorrt",
            f"sys.argv = [{str(script)!r}, '--help']",
            "try:",
            f"    runpy.run_path({str(script)!r}, run_name='__main__')",
            "except SystemExit as exc:",
            "    sys.exit(exc.code)",
        ]
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert "--make-slices" in result.stdout

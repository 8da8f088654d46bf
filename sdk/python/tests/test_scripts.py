"""The admission scripts exist once: the package reads sdk/go/admission/scripts."""

from sluice_metering.admission import script

from conftest import ROOT


def test_package_scripts_are_the_go_sdks_files() -> None:
    for name in ("admit.lua", "adjust.lua"):
        go = (ROOT / "sdk" / "go" / "admission" / "scripts" / name).read_text(encoding="utf-8")
        assert script(name) == go, f"{name}: the Python package's copy differs from sdk/go/admission/scripts/{name}"

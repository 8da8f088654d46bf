"""sluice_metering.litellm's configuration: SLUICE_POLICY_FILE gives the hook the
policy file's admission rules, the ones Go gateways enforce."""

from __future__ import annotations

import os
import pathlib

import pytest

# LiteLLM reads its model cost map from the network at import unless told
# to use the copy it ships (as the e2e tests start the proxy).
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
os.environ.setdefault("LITELLM_TELEMETRY", "False")

from sluice_metering import policy  # noqa: E402
from sluice_metering.litellm import Settings  # noqa: E402

from conftest import ROOT

POLICY = str(ROOT / "policy" / "testdata" / "admission.yaml")


def test_policy_file_gives_its_admission_rules() -> None:
    s = Settings.from_env({"SLUICE_INGEST_URL": "http://127.0.0.1:1", "SLUICE_POLICY_FILE": POLICY})
    assert s.rules is not None
    assert s.rules.to_dict() == policy.load(POLICY).admission_rules().to_dict()
    assert [r.name for r in s.rules.tenants["acme"].rules] == ["rpm", "quota:tokens_per_minute", "quota:requests_per_minute:gpt-4o"]


def test_policy_file_and_rules_file_conflict() -> None:
    with pytest.raises(ValueError, match="SLUICE_POLICY_FILE or SLUICE_ADMISSION_RULES_FILE, not both"):
        Settings.from_env({"SLUICE_INGEST_URL": "http://127.0.0.1:1", "SLUICE_POLICY_FILE": POLICY,
                           "SLUICE_ADMISSION_RULES_FILE": POLICY})


def test_bad_policy_file_names_the_field(tmp_path: pathlib.Path) -> None:
    bad = ROOT / "policy" / "testdata" / "admission.yaml"
    text = bad.read_text().replace("fail_mode: closed", "fail_mode: shut")
    f = tmp_path / "policy.yaml"
    f.write_text(text)
    with pytest.raises(policy.PolicyError, match=r"tenants\.acme\.fail_mode: 'shut' is not one of open, closed"):
        Settings.from_env({"SLUICE_INGEST_URL": "http://127.0.0.1:1", "SLUICE_POLICY_FILE": str(f)})

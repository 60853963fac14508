"""nemo_gym.sandbox.providers.openshell.provider: upstream's openshell configs, their defaults and checks."""

from __future__ import annotations

import pytest

from nemo_gym.sandbox.providers.openshell import OpenShellConnectionConfig, OpenShellProbeConfig, OpenShellProviderOptions


def test_configs_have_upstreams_defaults_and_checks():
    assert OpenShellProbeConfig().deadline_s == 60
    assert OpenShellProviderOptions.from_mapping({"providers": "github"}).providers == ["github"]
    with pytest.raises(ValueError, match="tls_cert_path and connection.tls_key_path must be set together"):
        OpenShellConnectionConfig(tls_cert_path="/cert.pem")
    with pytest.raises(ValueError, match="Unknown openshell provider_options keys"):
        OpenShellProviderOptions.from_mapping({"provider": "github"})

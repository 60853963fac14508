import os

import pytest

E2E_SWITCH = "NEMO_GYM_MULTIWORKER_E2E"


def pytest_collection_modifyitems(config, items):
    if os.environ.get(E2E_SWITCH) == "1":
        return
    skip = pytest.mark.skip(reason=f"multi-process end-to-end tests run with {E2E_SWITCH}=1")
    for item in items:
        if "tests/e2e/" in str(item.fspath):
            item.add_marker(skip)

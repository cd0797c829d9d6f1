"""The xdist groups (tests/scheduling.py): the tests sharing a module's servers go together per
server shape; everything else is scheduled one test at a time."""

from __future__ import annotations

from tests.live import ROOT
from tests.scheduling import keeps_servers, server_group

SHARED = 'import pytest\n@pytest.fixture(scope="module")\ndef server():\n    return DaphneServer().start()\n'
PER_TEST = "def test_x():\n    DaphneServer().start()\n"


def test_a_module_with_shared_servers_is_one_group_per_shape() -> None:
    one = server_group("tests/test_x.py::test_a[one-worker]", SHARED)
    three = server_group("tests/test_x.py::test_b[three-workers-deep]", SHARED)
    assert one == "tests/test_x.py-one-worker"
    assert three == "tests/test_x.py-three-workers"
    assert server_group("tests/test_x.py::test_c[one-worker]", SHARED) == one
    assert server_group("tests/test_x.py::TestY::test_d", SHARED) == "tests/test_x.py"


def test_other_tests_are_not_grouped() -> None:
    assert server_group("tests/test_x.py::test_a[one-worker]", PER_TEST) is None
    assert server_group("tests/test_x.py::test_a", "def test_a():\n    pass\n") is None


def test_the_suites_modules_with_shared_servers_are_found() -> None:
    """A live module known to keep its servers per module is recognised from its source."""
    assert keeps_servers((ROOT / "tests" / "test_resume_ws_live.py").read_text())
    assert not keeps_servers((ROOT / "tests" / "test_protocol.py").read_text())

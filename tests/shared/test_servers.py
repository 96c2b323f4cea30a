"""The test servers fail loudly: a missing binary names the package to install, and a
process that may not start servers (a test's child) is told where the URL comes from."""

from __future__ import annotations

import os
import subprocess

import pytest

from tests import servers
from tests.kill import ROOT, python


def test_a_missing_server_binary_names_the_install_line() -> None:
    with pytest.raises(RuntimeError, match=r"apt-get install -y some-server"):
        servers._find("no-such-binary-botmesh", "/nonexistent/*/bin/x", "some-server")


def test_a_child_process_never_starts_a_server_of_its_own() -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("BOTMESH_TEST_")}
    env["PYTHONPATH"] = str(ROOT)
    out = subprocess.run(
        python("-c", "from tests import servers; servers.postgres_url()"),
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    assert out.returncode != 0
    assert f"set {servers.ENV_POSTGRES}" in out.stderr

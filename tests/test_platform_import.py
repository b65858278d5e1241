"""`platform/` must never shadow the standard library's `platform`
(docs/cluster.md#platform-must-not-shadow-the-standard-library)."""
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def test_platform_folder_has_no_init_so_it_cannot_become_a_package():
    assert not (REPO / "platform" / "__init__.py").exists()
    assert not (REPO / "objectives" / "__init__.py").exists()
    assert not (REPO / "tasks" / "__init__.py").exists()


def test_import_platform_is_the_stdlib_with_the_repo_root_on_pythonpath():
    code = "import platform, alignlab.platform.config as c; print(platform.__file__); print(platform.system()); print(c.__file__)"
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"},
                         capture_output=True, text=True, check=True).stdout.splitlines()
    assert not out[0].startswith(str(REPO)), f"'import platform' loaded {out[0]}"
    assert out[1] in ("Linux", "Darwin", "Windows")
    assert out[2] == str(REPO / "platform" / "config.py")


def test_import_platform_is_the_stdlib_under_python_dash_m_pytest():
    # `python -m pytest` puts the current directory (the repo root) first on sys.path.
    import platform

    assert sys.path[0] in ("", str(REPO)) or str(REPO) in sys.path
    assert not platform.__file__.startswith(str(REPO / "platform"))
    assert callable(platform.system)


@pytest.mark.ray
def test_ray_tasks_see_the_stdlib_platform_with_the_repo_as_working_dir(ray_session):
    @ray_session.remote
    def where():
        import platform

        return platform.__file__, platform.system()

    f, system = ray_session.get(where.remote())
    assert not f.startswith(str(REPO / "platform")) and system

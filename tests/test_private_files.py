"""Secrets on disk (issue 14, findings 5 and 9): created 0600 from the start, whole."""

from __future__ import annotations

import threading

from automechanica.private_files import create_private_file, replace_private_file


def test_a_private_file_is_its_owners_only_and_the_first_one_written_stays(tmp_path):
    path = tmp_path / "var" / "secret_key"
    assert create_private_file(path, "first")
    assert not create_private_file(path, "second")
    assert path.read_text() == "first" and path.stat().st_mode & 0o777 == 0o600
    assert [p.name for p in path.parent.iterdir()] == ["secret_key"]  # no temporary left


def test_processes_starting_at_once_agree_on_one_key(tmp_path):
    path = tmp_path / "secret_key"
    won = []
    threads = [
        threading.Thread(target=lambda n=n: won.append(create_private_file(path, f"key {n}")))
        for n in range(16)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert won.count(True) == 1
    assert path.read_text() in {f"key {n}" for n in range(16)}


def test_replacing_a_private_file_keeps_it_private(tmp_path):
    path = tmp_path / "admin-password"
    path.write_text("old")
    path.chmod(0o644)
    replace_private_file(path, "new\n")
    assert path.read_text() == "new\n" and path.stat().st_mode & 0o777 == 0o600

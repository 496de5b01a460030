"""`quantgate migrate`: legacy env to server_args, comments and order kept, idempotent."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import pytest

from quantgate.harness.cli import main
from quantgate.harness.commands.migrate import migrate_text
from quantgate.harness.config import inspect_config, load_config

FIXTURES = Path(__file__).parent / "fixtures" / "vllm" / "gsm8k" / "moe-refactor"

COMMENTED = """\
# Qwen3 MoE, channel FP8, marlin
model_name: "RedHatAI/Qwen3-30B-A3B-FP8-dynamic"  # the checkpoint
accuracy_threshold: 0.85
server_args: "--enforce-eager --max-model-len 8192"
env:
  VLLM_TEST_FORCE_FP8_MARLIN: "1"
  HF_HUB_OFFLINE: "1"  # stays
tags: [nightly]  # last
"""


def test_string_server_args_get_the_flags_and_comments_stay(tmp_path: Path) -> None:
    result = migrate_text(COMMENTED, tmp_path / "c.yaml")
    assert result.unresolved == []
    assert result.text == COMMENTED.replace(
        '--max-model-len 8192"', '--max-model-len 8192 --linear-backend marlin --moe-backend marlin"'
    ).replace('  VLLM_TEST_FORCE_FP8_MARLIN: "1"\n', "")


def test_list_server_args_and_empty_env_removed(tmp_path: Path) -> None:
    text = "model_name: m\naccuracy_threshold: 0.5\nserver_args:\n  - --enforce-eager\nenv:\n  VLLM_USE_DEEP_GEMM: '1'\n"
    result = migrate_text(text, tmp_path / "c.yaml")
    assert result.text == ("model_name: m\naccuracy_threshold: 0.5\nserver_args:\n  - --enforce-eager\n"
                           "  - --linear-backend\n  - deep_gemm\n  - --moe-backend\n  - deep_gemm\n")


def test_no_server_args_inserts_them_where_env_was(tmp_path: Path) -> None:
    text = "model_name: m\nenv:\n  VLLM_TEST_FORCE_FP8_MARLIN: 1\naccuracy_threshold: 0.5\n"
    result = migrate_text(text, tmp_path / "c.yaml")
    assert result.text == ("model_name: m\nserver_args: --linear-backend marlin --moe-backend marlin\n"
                           "accuracy_threshold: 0.5\n")


def test_real_legacy_configs_migrate_to_valid_configs(tmp_path: Path) -> None:
    for name in ("Qwen3-30B-A3B-Fp8-CT-Channel-marlin.yaml", "Qwen3-30B-A3B-Fp8-CT-Block-deepgemm.yaml"):
        path = tmp_path / name
        shutil.copy(FIXTURES / name, path)
        assert inspect_config(path, "vllm").errors
        assert main(["migrate", "--write", str(path)]) == 0
        config = load_config(path, "vllm")
        assert config.env == {}
        assert set(config.backend_flags().values()) <= {"marlin", "deep_gemm"}
    marlin = load_config(tmp_path / "Qwen3-30B-A3B-Fp8-CT-Channel-marlin.yaml", "vllm")
    assert marlin.server_args[-4:] == ["--linear-backend", "marlin", "--moe-backend", "marlin"]


def test_diff_by_default_then_write_then_idempotent(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "c.yaml"
    path.write_text(COMMENTED)
    assert main(["migrate", str(path)]) == 0
    diff, err = capsys.readouterr()
    assert path.read_text() == COMMENTED  # a dry run by default
    assert err.endswith("1 config(s): would change 1\n")  # not "migrated": nothing was written
    assert '-  VLLM_TEST_FORCE_FP8_MARLIN: "1"' in diff and "+server_args:" in diff
    assert main(["migrate", "--write", str(path)]) == 0
    once = path.read_text()
    assert capsys.readouterr().err.endswith(f"migrated {path}\n1 config(s): migrated 1\n")  # each file written
    assert main(["migrate", "--write", str(path)]) == 0 and main(["migrate", str(path)]) == 0
    assert path.read_text() == once and capsys.readouterr().out == ""


def test_what_cannot_be_migrated_is_reported_exit_3(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "fi.yaml"
    shutil.copy(FIXTURES / "Qwen3-30B-A3B-Fp8-AutoFp8-fi-cutlass.yaml", path)
    assert main(["migrate", "--write", str(path)]) == 3
    err = capsys.readouterr().err
    assert f"{path}:7: env.VLLM_USE_DEEP_GEMM: cannot migrate automatically" in err
    migrated = path.read_text()
    assert "--moe-backend flashinfer_cutlass" in migrated and 'VLLM_USE_DEEP_GEMM: "0"' in migrated
    assert "VLLM_USE_FLASHINFER_MOE_FP8" not in migrated
    assert "1 config(s): migrated 1; 1 legacy switch(es) need manual migration (see above)" in err
    only_manual = tmp_path / "e8m0.yaml"
    only_manual.write_text('model_name: m\naccuracy_threshold: 0.5\nenv:\n  VLLM_USE_DEEP_GEMM_E8M0: "1"\n')
    assert main(["migrate", str(only_manual)]) == 3
    err = capsys.readouterr().err
    assert "1 config(s): 1 legacy switch(es) need manual migration" in err and "nothing to migrate" not in err
    broken = tmp_path / "broken.yaml"
    broken.write_text("model_name: m\naccuracy_threshold: [\n")
    assert main(["migrate", str(broken)]) == 3
    err = capsys.readouterr().err
    assert "1 config(s): 1 could not be read (see above)" in err and "nothing to migrate" not in err


def test_indentation_style_is_kept(tmp_path: Path) -> None:
    text = ("model_name: m\ntasks:\n    - name: gsm8k\n      metrics:\n          - name: exact_match,strict-match\n"
            "            value: 0.5\nenv_vars:\n    VLLM_TEST_FORCE_FP8_MARLIN: '1'\n")
    result = migrate_text(text, tmp_path / "c.yaml")
    assert result.text.startswith(text.split("env_vars")[0])


def test_missing_path_exit_3(tmp_path: Path) -> None:
    assert main(["migrate", str(tmp_path / "absent.yaml")]) == 3


def test_it_says_when_there_is_nothing_to_migrate_and_what_a_migrated_file_still_needs(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    clean = tmp_path / "clean.yaml"
    clean.write_text("model_name: m\naccuracy_threshold: 0.5\n")
    assert main(["migrate", str(clean)]) == 0
    assert "1 config(s): nothing to migrate" in capsys.readouterr().err
    deep = tmp_path / "deep.yaml"
    deep.write_text('model_name: m\naccuracy_threshold: 0.5\nenv:\n  VLLM_USE_DEEP_GEMM: "1"\n')
    assert main(["migrate", str(deep), str(clean), "--write"]) == 0
    err = capsys.readouterr().err
    assert "note: the migrated --linear-backend deep_gemm" in err and "set `engine: vllm`" in err
    assert "2 config(s): migrated 1" in err


def test_line_endings_and_bom_are_kept(tmp_path: Path) -> None:
    path = tmp_path / "c.yaml"
    path.write_bytes(("\ufeff" + COMMENTED.replace("\n", "\r\n")).encode())
    assert main(["migrate", "--write", str(path)]) == 0
    written = path.read_bytes().decode()
    assert written.startswith("\ufeff# Qwen3") and "\r\n" in written and "\n" not in written.replace("\r\n", "")
    assert "--linear-backend marlin" in written and "VLLM_TEST_FORCE_FP8_MARLIN" not in written


@pytest.mark.parametrize("content, message", [
    (b"model_name: \xff\n", "not UTF-8 text (invalid start byte at byte 12)"),  # where, for an editor
    (b"- a\n- b\n", "a config must be a mapping of keys to values, got a list"),
])
def test_what_lint_refuses_migrate_refuses(tmp_path: Path, capsys: pytest.CaptureFixture[str], content: bytes,
                                           message: str) -> None:
    path = tmp_path / "c.yaml"
    path.write_bytes(content)
    assert main(["migrate", str(path)]) == 3
    assert message in capsys.readouterr().err


def test_a_folder_without_configs_is_a_usage_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["migrate", str(tmp_path)]) == 3
    assert "no config files" in capsys.readouterr().err


def _refused_migration(tmp_path: Path, capsys: pytest.CaptureFixture[str], text: str) -> tuple[Path, str]:
    """`migrate --write` of a config holding `text`: refused (exit 3), the file unchanged; its stderr."""
    path = tmp_path / "c.yaml"
    path.write_text(text)
    assert main(["migrate", "--write", str(path)]) == 3
    assert path.read_text() == text
    return path, capsys.readouterr().err


def test_the_flashinfer_flavour_stays_while_its_switch_cannot_be_migrated(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Deleting the flavour would turn the switch, once the conflict is settled, into vLLM's default
    flavour (flashinfer_trtllm) at the next migrate, not the throughput (flashinfer_cutlass) it ran."""
    text = ('model_name: m\naccuracy_threshold: 0.5\nserver_args: --moe-backend triton\nenv:\n'
            '  VLLM_USE_FLASHINFER_MOE_FP4: "1"\n  VLLM_FLASHINFER_MOE_BACKEND: throughput\n')
    path, err = _refused_migration(tmp_path, capsys, text)
    assert f"{path}:5: env.VLLM_USE_FLASHINFER_MOE_FP4: cannot migrate automatically" in err
    assert f"{path}:6: env.VLLM_FLASHINFER_MOE_BACKEND: cannot migrate automatically" in err
    path.write_text(text.replace("server_args: --moe-backend triton\n", ""))  # the author drops the conflict
    assert main(["migrate", "--write", str(path)]) == 0
    assert "server_args: --moe-backend flashinfer_cutlass\n" in path.read_text() and "VLLM_" not in path.read_text()


def test_an_unknown_flashinfer_flavour_is_reported_and_the_file_left_as_it_is(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """An unknown VLLM_FLASHINFER_MOE_BACKEND became --moe-backend flashinfer_trtllm, silently."""
    path, err = _refused_migration(tmp_path, capsys, 'model_name: m\naccuracy_threshold: 0.5\nenv:\n'
                                   '  VLLM_USE_FLASHINFER_MOE_FP8: "1"\n  VLLM_FLASHINFER_MOE_BACKEND: thruput\n')
    assert (f"{path}:4: env.VLLM_USE_FLASHINFER_MOE_FP8: cannot migrate automatically: its flavour "
            "VLLM_FLASHINFER_MOE_BACKEND='thruput' is not one vLLM knows") in err
    assert f"{path}:5: env.VLLM_FLASHINFER_MOE_BACKEND: cannot migrate automatically: 'thruput' is not a flavour" in err
    assert "2 legacy switch(es) need manual migration" in err
    assert main(["migrate", str(path)]) == 3
    assert capsys.readouterr().out == ""  # no diff: nothing is guessed
    # lint gives the same cause instead of a replacement
    [error, *_] = inspect_config(path).errors
    assert error.field == "env.VLLM_USE_FLASHINFER_MOE_FP8" and "'thruput' is not one vLLM knows" in error.message
    assert "use `--moe-backend" not in error.message


@pytest.mark.parametrize("text, migrated", [
    # ruamel hangs the comment lines below a value on the key above them: they went with the
    # removed variable, though they introduce the next key (here, the parent's next key too).
    ('model_name: m\nenv:\n  VLLM_TEST_FORCE_FP8_MARLIN: "1"  # goes with it\n  # keep NCCL quiet\n'
     "  NCCL_DEBUG: WARN\n# gate tuned 2025-10\naccuracy_threshold: 0.5\n",
     "model_name: m\nserver_args: --linear-backend marlin --moe-backend marlin\nenv:\n  # keep NCCL quiet\n"
     "  NCCL_DEBUG: WARN\n# gate tuned 2025-10\naccuracy_threshold: 0.5\n"),
    ('model_name: m\nenv:\n  NCCL_DEBUG: WARN  # quiet\n  VLLM_TEST_FORCE_FP8_MARLIN: "1"\n\n'
     "# measured on H100, 2025-10-01\naccuracy_threshold: 0.5  # do not lower\n",
     "model_name: m\nserver_args: --linear-backend marlin --moe-backend marlin\nenv:\n  NCCL_DEBUG: WARN  # quiet\n\n"
     "# measured on H100, 2025-10-01\naccuracy_threshold: 0.5  # do not lower\n"),
    # The block empties and goes: its comments stay, one level up, where they stood.
    ('# header\nmodel_name: m\nenv:\n  # the Marlin path on Hopper\n  VLLM_TEST_FORCE_FP8_MARLIN: "1"\n'
     "# measured on H100, 2025-10-01\naccuracy_threshold: 0.5\n",
     "# header\nmodel_name: m\nserver_args: --linear-backend marlin --moe-backend marlin\n"
     "# the Marlin path on Hopper\n# measured on H100, 2025-10-01\naccuracy_threshold: 0.5\n"),
    ('model_name: m\naccuracy_threshold: 0.5\nenv:  # legacy\n  VLLM_TEST_FORCE_FP8_MARLIN: "1"\n# the end\n',
     "model_name: m\naccuracy_threshold: 0.5\nserver_args: --linear-backend marlin --moe-backend marlin\n# the end\n"),
    ('model_name: m\naccuracy_threshold: 0.5\nenv:\n  VLLM_USE_DEEP_GEMM: "1"\n  # one\n  HF_HUB_OFFLINE: "1"\n'
     '  # two\n  VLLM_MXFP4_USE_MARLIN: "0"\n  # three\ntags: [nightly]\n',
     "model_name: m\naccuracy_threshold: 0.5\nserver_args: --linear-backend deep_gemm --moe-backend deep_gemm\nenv:\n"
     '  # one\n  HF_HUB_OFFLINE: "1"\n  # two\n  # three\ntags: [nightly]\n'),
    # Below a block list's last item: the flags go before the comment, not between it and its key.
    ('model_name: m\naccuracy_threshold: 0.5\nserver_args:\n  - --max-model-len\n  - "4096"  # ctx\n'
     '# nightly only: too slow for PRs\ntags: [nightly]\nenv:\n  VLLM_TEST_FORCE_FP8_MARLIN: "1"\n',
     'model_name: m\naccuracy_threshold: 0.5\nserver_args:\n  - --max-model-len\n  - "4096"  # ctx\n'
     "  - --linear-backend\n  - marlin\n  - --moe-backend\n  - marlin\n# nightly only: too slow for PRs\n"
     "tags: [nightly]\n"),
    # Below a block scalar, which has ended its line already: no blank line before the comment.
    ('model_name: m\nserver_args: |\n  --enforce-eager\nenv:\n  # the Marlin path on Hopper\n'
     '  VLLM_TEST_FORCE_FP8_MARLIN: "1"\n',
     "model_name: m\nserver_args: |\n  --enforce-eager\n  --linear-backend marlin --moe-backend marlin\n"
     "# the Marlin path on Hopper\n"),
], ids=["below-a-removed-key", "below-the-last-key", "emptied-block", "emptied-block-last", "several-removed",
        "below-a-block-list", "below-a-block-scalar"])
def test_comments_of_the_keys_that_stay_are_kept(tmp_path: Path, text: str, migrated: str) -> None:
    result = migrate_text(text, tmp_path / "c.yaml")
    assert result.text == migrated
    assert migrate_text(result.text, tmp_path / "c.yaml").text == migrated


@pytest.mark.parametrize("style", [">-", ">", "|"])
def test_a_block_server_args_gets_the_flags_on_a_line_of_its_own(tmp_path: Path, style: str) -> None:
    """A folded scalar keeps its line breaks only as ruamel's fold positions: rebuilt from the
    joined text, every flag of the block went onto one line."""
    lines = "  --enforce-eager\n  --max-model-len 4096\n  --speculative-config '{\"method\":\"mtp\"}'\n"
    text = f'model_name: m\naccuracy_threshold: 0.5\nserver_args: {style}\n{lines}env:\n  VLLM_TEST_FORCE_FP8_MARLIN: "1"\n'
    path = tmp_path / "c.yaml"
    path.write_text(text)
    assert main(["migrate", "--write", str(path)]) == 0
    assert path.read_text() == (f"model_name: m\naccuracy_threshold: 0.5\nserver_args: {style}\n{lines}"
                                "  --linear-backend marlin --moe-backend marlin\n")
    config = load_config(path, "vllm")
    assert config.server_args == ["--enforce-eager", "--max-model-len", "4096", "--speculative-config",
                                  '{"method":"mtp"}', "--linear-backend", "marlin", "--moe-backend", "marlin"]


@pytest.mark.parametrize("server_args, words", [
    ("\"--max-model-len 4096 --chat-template '{{ x }}\"", "cannot split it into arguments"),  # an open quote
    ("8192", "neither a string of arguments nor a list"),
    ("{max_model_len: 8192}", "neither a string of arguments nor a list"),
])
def test_server_args_it_cannot_read_are_left_to_the_author(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                           server_args: str, words: str) -> None:
    # Appending to an open quote would hide the flags inside it; a number or mapping would be replaced.
    text = f"model_name: m\naccuracy_threshold: 0.5\nserver_args: {server_args}\nenv:\n  VLLM_TEST_FORCE_FP8_MARLIN: '1'\n"
    path, err = _refused_migration(tmp_path, capsys, text)
    assert f"{path}:3: server_args: cannot migrate automatically: " in err and words in err
    assert "Traceback" not in err


@pytest.mark.parametrize("text, line, field, words", [
    # the anchored mapping is also `x-defaults`: removing the switch from env would remove it there too
    ("x-defaults: &e {VLLM_TEST_FORCE_FP8_MARLIN: '1'}\nenv: *e\n", 4, "env", "YAML anchor (&e)"),
    # a merged key is not env's own: deleting it leaves it in place while the flags are added
    ("x-defaults: &e {VLLM_TEST_FORCE_FP8_MARLIN: '1'}\nenv:\n  <<: *e\n  HF_HUB_OFFLINE: '1'\n", 4,
     "env.VLLM_TEST_FORCE_FP8_MARLIN", "from a YAML merge key"),
    ("x-defaults: &d {env: {VLLM_TEST_FORCE_FP8_MARLIN: '1'}}\n<<: *d\n", 3, "env", "from a YAML merge key"),
    ("x-args: &a [--enforce-eager]\nserver_args: *a\nenv:\n  VLLM_TEST_FORCE_FP8_MARLIN: '1'\n", 4, "server_args",
     "YAML anchor (&a)"),
    # merged server_args are x-defaults' list: extending it would add the flags to every config merging it
    ("x-defaults: &d {server_args: [--enforce-eager]}\n<<: *d\nenv:\n  VLLM_TEST_FORCE_FP8_MARLIN: '1'\n", 3,
     "server_args", "server_args comes from a YAML merge key (`<<:`)"),
])
def test_env_and_server_args_shared_through_anchors_are_left_to_the_author(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], text: str, line: int, field: str, words: str) -> None:
    path, err = _refused_migration(tmp_path, capsys, "model_name: m\naccuracy_threshold: 0.5\n" + text)
    assert f"{path}:{line}: {field}: cannot migrate automatically: " in err and words in err


@pytest.mark.skipif(sys.platform != "linux", reason="RLIMIT_FSIZE and SIGXFSZ as on Linux")
def test_a_write_that_fails_leaves_the_file_whole(tmp_path: Path) -> None:
    import resource
    import signal
    import subprocess

    # A config larger than the file size limit the writer runs under: the write fails part way,
    # as on a full disk. The file must stay as it was, and the failure be reported (exit 3).
    comments = "".join(f"# line {i} of a long comment that documents this config\n" for i in range(40))
    text = f"model_name: m\naccuracy_threshold: 0.5\n{comments}env:\n  VLLM_TEST_FORCE_FP8_MARLIN: '1'\n"
    path = tmp_path / "c.yaml"
    path.write_text(text)
    assert len(text) > 1024

    def limit() -> None:
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (1024, 1024))

    done = subprocess.run([sys.executable, "-m", "quantgate.harness.cli", "migrate", "--write", str(path)],
                          capture_output=True, text=True, preexec_fn=limit, timeout=120)
    assert path.read_text() == text
    assert done.returncode == 3, done.stderr
    assert f"{path}: cannot be written, left unchanged" in done.stderr and "Traceback" not in done.stderr
    assert [p.name for p in tmp_path.iterdir()] == ["c.yaml"]  # no temporary file left behind


@pytest.mark.parametrize("blocked", ["folder", "mount"])
def test_a_config_in_a_folder_it_cannot_write_or_bind_mounted_is_rewritten_in_place(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], blocked: str) -> None:
    """The safe write (a new file renamed over the old) needs the folder: a folder this user cannot
    write, or a file bind-mounted into a container (rename: EBUSY), is rewritten in place."""
    import errno
    import os

    path = tmp_path / "c.yaml"
    path.write_text("model_name: m\naccuracy_threshold: 0.5\nenv:\n  VLLM_TEST_FORCE_FP8_MARLIN: '1'\n")
    if blocked == "folder":  # no new file can be made there (root ignores a folder's mode)
        write_bytes = Path.write_bytes

        def refuse_new_files(self: Path, data: bytes) -> int:
            if not self.exists():
                raise PermissionError(errno.EACCES, "Permission denied", str(self))
            return write_bytes(self, data)
        monkeypatch.setattr(Path, "write_bytes", refuse_new_files)
    else:
        def busy(*args, **kwargs):
            raise OSError(errno.EBUSY, "Device or resource busy")
        monkeypatch.setattr(os, "replace", busy)
    assert main(["migrate", "--write", str(path)]) == 0, capsys.readouterr().err
    assert "--linear-backend marlin" in path.read_text() and "VLLM_TEST_FORCE_FP8_MARLIN" not in path.read_text()
    assert [p.name for p in tmp_path.iterdir()] == ["c.yaml"]


def test_flavour_values_yaml_reads_as_numbers_are_reported_not_a_traceback(tmp_path: Path) -> None:
    # migrate passes env values as YAML read them (1, not "1"); a flavour is compared as text.
    text = "model_name: m\naccuracy_threshold: 0.5\nenv:\n  VLLM_USE_FLASHINFER_MOE_FP8: 1\n  VLLM_FLASHINFER_MOE_BACKEND: 1\n"
    result = migrate_text(text, tmp_path / "c.yaml")
    assert result.text == text
    assert [e.field for e in result.unresolved] == ["env.VLLM_USE_FLASHINFER_MOE_FP8", "env.VLLM_FLASHINFER_MOE_BACKEND"]
    assert "'1' is not a flavour vLLM knows" in result.unresolved[1].message


def test_deep_gemm_off_is_never_migrated_to_a_deep_gemm_moe_backend(tmp_path: Path) -> None:
    # VLLM_USE_DEEP_GEMM=0 rules DeepGEMM out for MoE too, whatever VLLM_MOE_USE_DEEP_GEMM says.
    text = ("model_name: m\naccuracy_threshold: 0.5\nserver_args: --linear-backend cutlass\nenv:\n"
            "  VLLM_USE_DEEP_GEMM: '0'\n  VLLM_MOE_USE_DEEP_GEMM: '1'\n")
    result = migrate_text(text, tmp_path / "c.yaml")
    assert "deep_gemm" not in result.text and "VLLM_USE_DEEP_GEMM: '0'" in result.text
    assert [e.field for e in result.unresolved] == ["env.VLLM_USE_DEEP_GEMM"]


def test_a_config_it_cannot_read_is_reported_exit_3(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    """As a user without read permission on the file (root reads any file, so the read is refused here)."""
    import errno

    path = tmp_path / "c.yaml"
    path.write_text('model_name: m\naccuracy_threshold: 0.5\nenv:\n  VLLM_TEST_FORCE_FP8_MARLIN: "1"\n')

    def refuse(self: Path) -> bytes:
        raise PermissionError(errno.EACCES, "Permission denied", str(self))
    monkeypatch.setattr(Path, "read_bytes", refuse)
    assert main(["migrate", "--write", str(path)]) == 3
    assert capsys.readouterr().err == (f"{path}: cannot be read: Permission denied\n"
                                       "1 config(s): 1 could not be read (see above)\n")


def test_a_write_that_fails_is_not_counted_as_migrated(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    import errno

    from quantgate.harness.commands import migrate

    def full_disk(path: Path, data: bytes) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")
    monkeypatch.setattr(migrate, "write_atomic", full_disk)
    path = tmp_path / "c.yaml"
    path.write_text(COMMENTED)
    assert main(["migrate", "--write", str(path)]) == 3
    assert path.read_text() == COMMENTED
    assert capsys.readouterr().err == (f"{path}: cannot be written, left unchanged: No space left on device\n"
                                       "1 config(s): 1 could not be written (see above)\n")


def test_the_diff_names_the_file_as_git_apply_reads_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "c.yaml"
    path.write_text(COMMENTED)
    monkeypatch.chdir(tmp_path)
    assert main(["migrate", "c.yaml"]) == 0
    assert capsys.readouterr().out.startswith("--- a/c.yaml\n+++ b/c.yaml\n@@ ")
    assert main(["migrate", str(path)]) == 0  # an absolute path has no a/ b/ side to strip
    assert capsys.readouterr().out.startswith(f"--- {path}\n+++ {path}\n@@ ")


@pytest.mark.parametrize("engine, notes", [
    ("", ["--linear-backend deep_gemm: unknown --linear-backend value 'deep_gemm' for engine builtin",
          "--moe-backend deep_gemm: unknown --moe-backend value 'deep_gemm' for engine builtin"]),
    ("engine: builtin\n", ["--linear-backend deep_gemm: unknown --linear-backend value 'deep_gemm' for engine builtin",
                           "--moe-backend deep_gemm: unknown --moe-backend value 'deep_gemm' for engine builtin"]),
    ("engine: vllm\n", []),  # vLLM has DeepGEMM: nothing left to do
])
def test_the_notes_name_each_flag_the_configs_engine_lacks(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                           engine: str, notes: list[str]) -> None:
    path = tmp_path / "c.yaml"
    path.write_text(f'model_name: m\naccuracy_threshold: 0.5\n{engine}env:\n  VLLM_USE_DEEP_GEMM: "1"\n')
    assert main(["migrate", str(path)]) == 0
    shown = [line.split(": note: the migrated ", 1)[1] for line in capsys.readouterr().err.splitlines()
             if ": note: " in line]
    assert [note.split(" (known: ")[0] for note in shown] == notes
    assert all(note.endswith("set `engine: vllm` or pass --engine vllm") for note in shown)


def test_an_env_shared_through_an_anchor_without_legacy_switches_is_nothing_to_migrate(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "c.yaml"
    path.write_text("x-env: &e {HF_HUB_OFFLINE: '1'}\nmodel_name: m\naccuracy_threshold: 0.5\nenv: *e\n")
    assert main(["migrate", str(path)]) == 0
    assert capsys.readouterr().err == "1 config(s): nothing to migrate (no legacy kernel switches in env)\n"


@pytest.mark.parametrize("text, migrated", [
    # a switch that is off turned nothing on: it goes, and no flag comes in its place
    ('model_name: m\nenv:\n  VLLM_TEST_FORCE_FP8_MARLIN: "0"\n  HF_HUB_OFFLINE: "1"\n',
     'model_name: m\nenv:\n  HF_HUB_OFFLINE: "1"\n'),
    ('model_name: m\nenv:\n  VLLM_TEST_FORCE_FP8_MARLIN: "0"\naccuracy_threshold: 0.5\n',
     "model_name: m\naccuracy_threshold: 0.5\n"),
])
def test_switches_that_are_off_are_removed_without_flags(tmp_path: Path, text: str, migrated: str) -> None:
    result = migrate_text(text, tmp_path / "c.yaml")
    assert result.unresolved == [] and result.text == migrated


@pytest.mark.parametrize("chosen", [
    "moe_backend: triton\n",  # gen-1's key
    "server_args: [--moe-backend, triton]\n",
    "server_args: --moe-backend=triton\n",
])
def test_a_backend_the_config_already_chooses_is_a_conflict_not_overwritten(tmp_path: Path, chosen: str) -> None:
    text = f"model_name: m\n{chosen}env:\n  VLLM_TEST_FORCE_FP8_MARLIN: '1'\n"
    result = migrate_text(text, tmp_path / "c.yaml")
    assert result.text == text
    assert [str(e) for e in result.unresolved] == [
        f"{tmp_path / 'c.yaml'}:4: env.VLLM_TEST_FORCE_FP8_MARLIN: cannot migrate automatically: it means "
        "`--moe-backend marlin` but the config already chooses `--moe-backend triton`; keep one --moe-backend and "
        "remove the variable"]


@pytest.mark.parametrize("chosen, server_args", [
    ("server_args: --moe-backend 'marlin'\n", "--moe-backend 'marlin' --linear-backend marlin"),
    # server_args win over gen-1's moe_backend (lint warns that the key is unused): marlin is chosen
    ("moe_backend: triton\nserver_args: --moe-backend marlin\n", "--moe-backend marlin --linear-backend marlin"),
])
def test_a_backend_the_config_already_chooses_alike_is_not_repeated(tmp_path: Path, chosen: str,
                                                                    server_args: str) -> None:
    result = migrate_text(f"model_name: m\n{chosen}env:\n  VLLM_TEST_FORCE_FP8_MARLIN: '1'\n", tmp_path / "c.yaml")
    assert result.unresolved == []
    assert result.text == f"model_name: m\n{chosen.split('server_args')[0]}server_args: {server_args}\n"


@pytest.mark.parametrize("empty, migrated", [
    ('""', '"--linear-backend marlin --moe-backend marlin"'),
    ("", "--linear-backend marlin --moe-backend marlin"),
    (">-", ">-\n  --linear-backend marlin --moe-backend marlin"),
    ("|", "|-\n  --linear-backend marlin --moe-backend marlin"),
])
def test_empty_server_args_get_just_the_flags(tmp_path: Path, empty: str, migrated: str) -> None:
    text = f"model_name: m\nserver_args: {empty}\nenv:\n  VLLM_TEST_FORCE_FP8_MARLIN: '1'\n"
    assert migrate_text(text, tmp_path / "c.yaml").text == f"model_name: m\nserver_args: {migrated}\n"


def test_gen_1_env_vars_are_migrated_like_env(tmp_path: Path) -> None:
    text = "model_name: m\nenv_vars:\n  VLLM_TEST_FORCE_FP8_MARLIN: '1'\n  HF_HUB_OFFLINE: '1'\n"
    assert migrate_text(text, tmp_path / "c.yaml").text == (
        "model_name: m\nserver_args: --linear-backend marlin --moe-backend marlin\nenv_vars:\n  HF_HUB_OFFLINE: '1'\n")

"""`quantgate repro` and `quantgate calibrate` on configs that launch the fake server."""

from __future__ import annotations

import json
import shlex
import socket
import subprocess
from pathlib import Path

import httpx
import pytest
import yaml

from quantgate.harness.cli import main as cli
from quantgate.harness.runner import LOCK_FILE
from quantgate.harness.server import quantgate_executable
from tests.harness import runner_fixtures
from tests.harness.runner_fixtures import expected_accuracy, load_json, pid_alive, write_config

gsm8k_dir = runner_fixtures.gsm8k_dir  # the shared pytest fixture
# The printed `quantgate run` is this installation's, as the printed server and lm-eval commands are:
# a bare `quantgate` ran whichever one PATH found, or none outside the venv.
RUN = shlex.join([*quantgate_executable(), "run"]) + " "


def _lines_after(output: str, marker: str) -> str:
    lines = output.splitlines()
    return next(lines[i + 1] for i, line in enumerate(lines) if line.startswith(marker))


def test_repro_prints_the_exact_server_and_lm_eval_commands(tmp_path: Path, gsm8k_dir: Path,
                                                            capsys: pytest.CaptureFixture[str]) -> None:
    config = write_config(tmp_path, "rep", gsm8k_dir, {"port": 8123, "linear_backend": "marlin"},
                          env={"QG_MODE": "debug"}, seed=7, temperature=0.0)
    out_dir = tmp_path / "repro"
    assert cli(["repro", str(config), "--output-dir", str(out_dir), "--limit", "5"]) == 0
    output = capsys.readouterr().out
    server = shlex.split(_lines_after(output, "# 1. start the server"))
    assert server[0] == "QG_MODE=debug"
    assert server[-4:] == ["--host", "127.0.0.1", "--port", "8123"] and "marlin" in server
    evaluation = shlex.split(_lines_after(output, "#    with the config's local dataset"))
    assert evaluation[:2] == ["HF_DATASETS_OFFLINE=1", "HF_HUB_OFFLINE=1"]
    argv = evaluation[2:]
    assert Path(argv[0]).name == "lm_eval" and argv[1] == "run"
    model_args = dict(kv.split("=", 1) for kv in argv[argv.index("--model_args") + 1].split(","))
    assert model_args["base_url"] == "http://127.0.0.1:8123/v1/completions"
    assert model_args["tokenizer_backend"] == "None" and model_args["seed"] == "7"
    assert argv[argv.index("--limit") + 1] == "5" and argv[argv.index("--num_fewshot") + 1] == "2"
    task_file = Path(argv[argv.index("--include_path") + 1]) / "gsm8k.yaml"
    data_files = yaml.safe_load(task_file.read_text())["dataset_kwargs"]["data_files"]
    assert data_files["test"] == str((gsm8k_dir / "test.jsonl").resolve())
    # lm-eval's own argument parser accepts the command (its CLI class is the only public parser).
    from lm_eval._cli.harness import HarnessCLI

    parsed = HarnessCLI()._parser.parse_args(argv[1:])
    assert parsed.model == "local-completions" and parsed.log_samples
    # vLLM, given a backend, may select automatically for some layers: only the log of a server
    # quantgate starts proves it, so the printed run launches one.
    assert "--server-url" not in output and output.rstrip().splitlines()[-1].startswith(RUN)


def test_repro_of_a_vllm_kernel_check_prints_the_launched_run_not_server_url(tmp_path: Path, gsm8k_dir: Path,
                                                                            capsys: pytest.CaptureFixture[str]) -> None:
    # A running vLLM server offers no kernel report: only a server quantgate launches has a log to read.
    config = write_config(tmp_path, "vk", gsm8k_dir, {"linear_backend": "marlin"}, expect={"linear_kernel": "marlin"})
    assert cli(["repro", str(config), "--output-dir", str(tmp_path / "r")]) == 0
    output = capsys.readouterr().out
    assert "--server-url" not in output and "the kernel check (expect:, or the" in output
    assert output.rstrip().splitlines()[-1] == f"{RUN}{shlex.quote(str(config))}"


def test_repro_passes_limit_and_engine_to_the_printed_quantgate_run(tmp_path: Path, gsm8k_dir: Path,
                                                                   capsys: pytest.CaptureFixture[str]) -> None:
    """Without them "the same evaluation through quantgate" evaluated every question, or started
    the config's own engine."""
    plain = write_config(tmp_path, "plain", gsm8k_dir)
    checked = write_config(tmp_path, "checked", gsm8k_dir, {"linear_backend": "marlin"},
                           expect={"linear_kernel": "marlin"})
    for config, tail in ((plain, " --server-url http://127.0.0.1:8000"), (checked, "")):
        assert cli(["repro", str(config), "--engine", "vllm", "--limit", "5", "--output-dir", str(tmp_path / "r")]) == 0
        run = [line for line in capsys.readouterr().out.splitlines() if line.startswith(RUN)]
        assert run == [f"{RUN}{shlex.quote(str(config))} --engine vllm --limit 5{tail}"]


def test_repro_prints_commands_for_a_machine_this_one_is_not(tmp_path: Path, gsm8k_dir: Path,
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    # The developer reproducing a nightly GPU config wants the commands to paste on the GPU box.
    config = write_config(tmp_path, "big", gsm8k_dir, requires={"gpus": 64}, vllm_command="not-on-this-path serve")
    assert cli(["repro", str(config), "--output-dir", str(tmp_path / "r")]) == 0
    output = capsys.readouterr().out
    assert "# note: this machine does not meet the config's requires: (requires 64 GPU(s)" in output
    assert _lines_after(output, "# 1. start the server").startswith("not-on-this-path serve fake-model")
    assert cli(["repro", str(config), "--run", "--output-dir", str(tmp_path / "r")]) == 3
    assert "requires 64 GPU(s)" in capsys.readouterr().err


def test_repro_never_prints_the_configs_secrets(tmp_path: Path, gsm8k_dir: Path,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    config = write_config(tmp_path, "sec", gsm8k_dir, {"api_key": "s3cret-key"}, env={"HF_TOKEN": "hf-s3cret"})
    assert cli(["repro", str(config), "--output-dir", str(tmp_path / "r")]) == 0
    output = capsys.readouterr().out
    assert "s3cret" not in output and "OPENAI_API_KEY='<redacted>'" in output
    assert "# secrets are shown as <redacted>" in output


def test_repro_of_an_invalid_config_exits_3(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("model_name: m\naccuracy_threshold: 2.5\n")
    assert cli(["repro", str(bad)]) == 3
    assert "bad.yaml:2" in capsys.readouterr().err


def test_repro_of_a_paired_config_measures_its_baseline_first(tmp_path: Path, gsm8k_dir: Path,
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    """The candidate runs on the baseline's result in the output directory. It was printed with
    --server-url, and a run against --server-url does not reuse a launched run's baseline: the
    printed commands, run as printed, exited 3."""
    base = write_config(tmp_path, "base", gsm8k_dir)
    cand = write_config(tmp_path, "cand", gsm8k_dir, baseline="base", gate="paired")
    out = tmp_path / "r"
    assert cli(["repro", str(cand), "--limit", "4", "--output-dir", str(out)]) == 0
    runs = [line for line in capsys.readouterr().out.splitlines() if line.startswith(RUN)]
    tail = f"--limit 4 --output-dir {shlex.quote(str(out.resolve()))}"
    assert runs == [f"{RUN}{shlex.quote(str(base))} {tail}", f"{RUN}{shlex.quote(str(cand))} {tail}"]
    for line in runs:
        assert cli(shlex.split(line)[len(quantgate_executable()):]) == 0, capsys.readouterr().err
    assert load_json(out / "cand" / "result.json")["gate"]["baseline"]["reused"] is True


def test_repro_of_a_runs_result_reproduces_its_config(tmp_path: Path, gsm8k_dir: Path,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    """The artifacts CI keeps are result.json and the run folder, not the config's path."""
    config = write_config(tmp_path, "ran", gsm8k_dir, num_questions=4)
    assert cli(["run", str(config), "--output-dir", str(tmp_path / "out")]) == 0
    capsys.readouterr()
    assert cli(["run", str(config), "--limit", "3", "--output-dir", str(tmp_path / "limited")]) == 0
    capsys.readouterr()
    for given in (tmp_path / "out" / "ran" / "result.json", tmp_path / "out" / "ran"):
        assert cli(["repro", str(given), "--output-dir", str(tmp_path / "r")]) == 0
        output = capsys.readouterr().out
        assert output.startswith(f"# reproducing {config}, the config of the run in {tmp_path / 'out' / 'ran'}, "
                                 "as that run ran it: engine vllm, 4 questions")
        assert "# 1. start the server" in output
    # The run's own command-line choices (here --limit 3) are the reproduction's.
    assert cli(["repro", str(tmp_path / "limited" / "ran"), "--output-dir", str(tmp_path / "r")]) == 0
    evaluation = shlex.split(_lines_after(capsys.readouterr().out, "#    with the config's local dataset"))
    assert evaluation[evaluation.index("--limit") + 1] == "3"
    # --limit given to repro replaces the run's, and the output says so under the run's header.
    assert cli(["repro", str(tmp_path / "limited" / "ran"), "--limit", "2", "--output-dir", str(tmp_path / "r")]) == 0
    output = capsys.readouterr().out
    assert "as that run ran it: engine vllm, 3 questions\n# given here instead: --limit 2 (that run: 3 questions)" \
        in output
    evaluation = shlex.split(_lines_after(output, "#    with the config's local dataset"))
    assert evaluation[evaluation.index("--limit") + 1] == "2" and "--limit 2 " in _quantgate_runs(output)[0]
    config.unlink()
    assert cli(["repro", str(tmp_path / "out" / "ran" / "result.json")]) == 3
    err = capsys.readouterr().err
    assert "which is not on this machine" in err and "--engine vllm --limit 4" in err


def test_repro_takes_one_config(tmp_path: Path, gsm8k_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A list's earlier configs were taken for the last one's baseline."""
    write_config(tmp_path, "a", gsm8k_dir)
    write_config(tmp_path, "b", gsm8k_dir)
    (tmp_path / "list.txt").write_text("a.yaml\nb.yaml\n")
    for given, kind in ((tmp_path / "list.txt", "list file"), (tmp_path, "folder")):
        assert cli(["repro", str(given)]) == 3
        assert f"repro takes one config file (or a run's result.json or run folder); {given} is a {kind}" \
            in capsys.readouterr().err


def test_repro_of_a_runs_result_with_engine_given_reproduces_on_that_engine(tmp_path: Path, gsm8k_dir: Path,
                                                                          capsys: pytest.CaptureFixture[str]) -> None:
    """--engine given to repro replaces the engine the run recorded, and the output says so."""
    config = write_config(tmp_path, "ran", gsm8k_dir, num_questions=4)
    assert cli(["run", str(config), "--output-dir", str(tmp_path / "out")]) == 0
    result = tmp_path / "out" / "ran" / "result.json"
    data = load_json(result)
    data["config"]["engine"] = "builtin"  # as a run on the builtin engine records it
    result.write_text(json.dumps(data))
    capsys.readouterr()
    assert cli(["repro", str(result), "--engine", "vllm", "--output-dir", str(tmp_path / "r")]) == 0
    output = capsys.readouterr().out
    assert ("as that run ran it: engine builtin, 4 questions\n"
            "# given here instead: --engine vllm (that run: builtin)\n") in output
    assert _quantgate_runs(output) == [f"{RUN}{shlex.quote(str(config))} --engine vllm "
                                       "--server-url http://127.0.0.1:8000"]


def test_repro_quotes_paths_with_spaces_in_the_printed_commands(tmp_path: Path, gsm8k_dir: Path,
                                                                capsys: pytest.CaptureFixture[str]) -> None:
    folder = tmp_path / "my configs"
    folder.mkdir()
    config = write_config(folder, "spaced", gsm8k_dir)
    out = tmp_path / "repro out"
    assert cli(["repro", str(config), "--output-dir", str(out)]) == 0
    output = capsys.readouterr().out
    argv = shlex.split(_lines_after(output, "#    with the config's local dataset"))[2:]
    assert argv[argv.index("--output_path") + 1] == str((out / "spaced" / "lm_eval").resolve())
    assert (Path(argv[argv.index("--include_path") + 1]) / "gsm8k.yaml").is_file()
    [run] = _quantgate_runs(output)
    assert shlex.split(run)[len(quantgate_executable()) + 1:] == [str(config), "--server-url", "http://127.0.0.1:8000"]


def test_calibrate_proposes_a_reference_with_provenance(tmp_path: Path, gsm8k_dir: Path,
                                                        capsys: pytest.CaptureFixture[str]) -> None:
    config = write_config(tmp_path, "cal", gsm8k_dir, {"accuracy": 0.7})
    out_dir = tmp_path / "cal-out"
    assert cli(["calibrate", str(config), "--runs", "2", "--limit", "8", "--output-dir", str(out_dir)]) == 0
    output = capsys.readouterr().out
    reference = json.loads(output.split("reference: ", 1)[1].splitlines()[0])
    expected = expected_accuracy(gsm8k_dir, 0.7, 8)
    assert reference["value"] == pytest.approx(expected, abs=1e-4)
    assert reference["runs"] == 2 and reference["n"] == 8 and reference["stdev"] == 0.0
    assert reference["date"] and "engine vllm" in reference["measured_on"]
    assert f"relative (rtol 0.08): {expected * 0.92:.4f}" in output
    saved = json.loads((out_dir / "calibration.json").read_text())
    assert saved["values"] == [pytest.approx(expected)] * 2
    assert (out_dir / "run-1" / "cal" / "result.json").is_file() and (out_dir / "run-2" / "cal").is_dir()
    assert cli(["calibrate", str(config), "--runs", "1"]) == 3  # one run has no spread
    # 8 of the config's 12 questions: a reference not to paste as it is.
    assert "# WARNING: measured on 8 of the 12 questions the config's gate evaluates (--limit)" in output


def test_calibrate_takes_one_config_and_only_runs_that_ran_the_kernels_under_test(
        tmp_path: Path, gsm8k_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    write_config(tmp_path, "cal", gsm8k_dir)
    listing = tmp_path / "list.txt"
    listing.write_text("cal.yaml\n")
    for given, kind in ((listing, "list file"), (tmp_path, "folder")):  # a folder's configs were all run
        assert cli(["calibrate", str(given), "--runs", "2", "--output-dir", str(tmp_path / "refused")]) == 3
        assert f"calibrate takes one config file; {given} is a {kind}" in capsys.readouterr().err
    assert not (tmp_path / "refused").exists()
    wrong = write_config(tmp_path, "wrong", gsm8k_dir, {"linear_backend": "emulation"}, expect={"linear_kernel": "marlin"})
    assert cli(["calibrate", str(wrong), "--runs", "2", "--limit", "4", "--output-dir", str(tmp_path / "o")]) == 1
    assert "did not run the kernels `expect:` names" in capsys.readouterr().err
    assert not (tmp_path / "o" / "calibration.json").exists()


def test_calibrate_errors_when_a_run_measures_nothing(tmp_path: Path, gsm8k_dir: Path) -> None:
    config = write_config(tmp_path, "calbad", gsm8k_dir, {"exit_during_startup": 0.1})
    assert cli(["calibrate", str(config), "--runs", "2", "--output-dir", str(tmp_path / "o")]) == 2
    assert not (tmp_path / "o" / "calibration.json").exists()


def test_calibrate_holds_its_output_directory_like_run(tmp_path: Path, gsm8k_dir: Path,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    """Two calibrations into one directory deleted each other's live server logs and results."""
    import fcntl

    config = write_config(tmp_path, "cal", gsm8k_dir)
    out_dir = tmp_path / "o"
    out_dir.mkdir()
    with open(out_dir / LOCK_FILE, "a+") as held:
        fcntl.flock(held, fcntl.LOCK_EX | fcntl.LOCK_NB)
        assert cli(["calibrate", str(config), "--runs", "2", "--output-dir", str(out_dir)]) == 3
    assert "another quantgate run" in capsys.readouterr().err
    assert not (out_dir / "run-1").exists()
    # Only a run writes (and so clears) the directory's junit.xml and summary.md.
    (out_dir / "junit.xml").write_text("<testsuites/>")
    assert cli(["calibrate", str(config), "--runs", "2", "--limit", "4", "--output-dir", str(out_dir)]) == 0
    assert (out_dir / "junit.xml").read_text() == "<testsuites/>"


def test_repro_of_a_run_that_never_evaluated_keeps_its_limit(tmp_path: Path, gsm8k_dir: Path,
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    """The question count was recorded only once the server was up: a server that did not start
    (the failure most worth reproducing) lost it."""
    config = write_config(tmp_path, "nostart", gsm8k_dir, {"exit_during_startup": 0.1}, num_questions=6)
    assert cli(["run", str(config), "--limit", "3", "--output-dir", str(tmp_path / "o")]) == 2
    capsys.readouterr()
    assert cli(["repro", str(tmp_path / "o" / "nostart"), "--output-dir", str(tmp_path / "r")]) == 0
    output = capsys.readouterr().out
    assert "as that run ran it: engine vllm, 3 questions" in output
    evaluation = shlex.split(_lines_after(output, "#    with the config's local dataset"))
    assert evaluation[evaluation.index("--limit") + 1] == "3"
    (tmp_path / "o" / "nostart" / "result.json").unlink()  # as for a skipped config's folder
    assert cli(["repro", str(tmp_path / "o" / "nostart")]) == 3
    assert "a run folder without its result.json" in capsys.readouterr().err


def _quantgate_runs(output: str) -> list[str]:
    return [line for line in output.splitlines() if line.startswith(RUN)]


def test_repro_of_a_run_leaves_out_a_limit_that_is_the_configs_own(tmp_path: Path, gsm8k_dir: Path,
                                                                    capsys: pytest.CaptureFixture[str]) -> None:
    """result.json records num_questions as the limit of a run given no --limit: repro printed
    `--limit 4` for a config of num_questions 4, as if that run had been cut short."""
    config = write_config(tmp_path, "own", gsm8k_dir, num_questions=4)
    assert cli(["run", str(config), "--output-dir", str(tmp_path / "out")]) == 0
    capsys.readouterr()
    assert cli(["repro", str(tmp_path / "out" / "own"), "--output-dir", str(tmp_path / "r")]) == 0
    output = capsys.readouterr().out
    assert _quantgate_runs(output) == [f"{RUN}{shlex.quote(str(config))} --engine vllm "
                                       "--server-url http://127.0.0.1:8000"]
    evaluation = shlex.split(_lines_after(output, "#    with the config's local dataset"))
    assert evaluation[evaluation.index("--limit") + 1] == "4"  # the config's own, as `quantgate run` sends it
    # A count the config would not use stays: the config changed since, or --limit asks for it.
    config.write_text(config.read_text().replace("num_questions: 4", "num_questions: 6"))
    assert cli(["repro", str(tmp_path / "out" / "own"), "--output-dir", str(tmp_path / "r")]) == 0
    assert "--limit 4" in _quantgate_runs(capsys.readouterr().out)[0]
    assert cli(["repro", str(config), "--limit", "6", "--output-dir", str(tmp_path / "r")]) == 0
    assert "--limit 6" in _quantgate_runs(capsys.readouterr().out)[0]


def test_repro_of_a_paired_run_keeps_a_limit_its_baseline_would_not_use(tmp_path: Path, gsm8k_dir: Path,
                                                                        capsys: pytest.CaptureFixture[str]) -> None:
    """The printed runs pass --limit to the baseline too: it is left out only when every config
    would evaluate that many questions without it."""
    base = write_config(tmp_path, "base", gsm8k_dir, num_questions=4)
    cand = write_config(tmp_path, "cand", gsm8k_dir, baseline="base", gate="paired", num_questions=4)
    out = tmp_path / "out"
    assert cli(["run", str(cand), "--output-dir", str(out)]) in (0, 1)
    capsys.readouterr()
    assert cli(["repro", str(out / "cand"), "--output-dir", str(tmp_path / "r")]) == 0
    assert all("--limit" not in line for line in _quantgate_runs(capsys.readouterr().out))
    base.write_text(base.read_text().replace("num_questions: 4", "num_questions: 6"))
    assert cli(["repro", str(out / "cand"), "--output-dir", str(tmp_path / "r")]) == 0
    runs = _quantgate_runs(capsys.readouterr().out)
    assert len(runs) == 2 and all("--limit 4" in line for line in runs)
    # A baseline whose result in the output directory is reused: --limit decides that reuse.
    cand.write_text(cand.read_text().replace("baseline: base", "baseline: other"))
    write_config(tmp_path, "other", gsm8k_dir, num_questions=6)
    assert cli(["run", str(cand), "--limit", "4", "--output-dir", str(out)]) in (0, 1)
    capsys.readouterr()
    assert cli(["repro", str(out / "cand"), "--output-dir", str(out)]) == 0
    assert _quantgate_runs(capsys.readouterr().out) == [f"{RUN}{shlex.quote(str(cand))} --engine vllm "
                                                        "--limit 4 --server-url http://127.0.0.1:8000"]


def test_repro_help_names_every_input_it_takes(capsys: pytest.CaptureFixture[str]) -> None:
    """repro reproduces a run from its result.json or run folder too: its --help says so."""
    assert cli(["repro", "--help"]) == 0
    usage = " ".join(capsys.readouterr().out.split())
    assert "an eval config file, or a run's result.json or run folder" in usage


@pytest.mark.parametrize("port_taken, eval_status, code", [(True, 0, 0), (False, 1, 2)],
                         ids=["printed-port-taken", "lm-eval-fails"])
def test_repro_run_evaluates_the_server_it_started_and_stops_it(tmp_path: Path, gsm8k_dir: Path,
                                                                 capsys: pytest.CaptureFixture[str],
                                                                 monkeypatch: pytest.MonkeyPatch, port_taken: bool,
                                                                 eval_status: int, code: int) -> None:
    """lm-eval (stood in for here) is sent to the port the server got, with the key and offline
    settings printed; the server is stopped after; lm-eval's failure is the exit status."""
    real_run = subprocess.run
    evaluated = {}

    def lm_eval(argv: list[str], **kwargs):
        if Path(argv[0]).name != "lm_eval":
            return real_run(argv, **kwargs)
        url = dict(kv.split("=", 1) for kv in argv[argv.index("--model_args") + 1].split(","))["base_url"]
        evaluated.update(url=url, env=kwargs["env"],
                         health=httpx.get(url.removesuffix("/v1/completions") + "/health", timeout=5).status_code)
        return subprocess.CompletedProcess(argv, eval_status)

    monkeypatch.setattr(subprocess, "run", lm_eval)
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        flags = {"api_key": "s3cret-key", **({"port": busy.getsockname()[1]} if port_taken else {})}
        config = write_config(tmp_path, "rr", gsm8k_dir, flags)
        assert cli(["repro", str(config), "--run", "--output-dir", str(tmp_path / "r")]) == code
    port = capsys.readouterr().out.split("# server ready on port ")[1].split(";")[0]
    assert evaluated["url"] == f"http://127.0.0.1:{port}/v1/completions" and evaluated["health"] == 200
    assert evaluated["env"]["OPENAI_API_KEY"] == "s3cret-key" and evaluated["env"]["HF_HUB_OFFLINE"] == "1"
    pid = int((tmp_path / "r" / "rr" / "server.log").read_text().split("# quantgate: pid ")[1].split()[0])
    assert not pid_alive(pid)


def test_repro_run_of_a_server_that_does_not_start_exits_2_with_its_logs_tail(
        tmp_path: Path, gsm8k_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = write_config(tmp_path, "nostart", gsm8k_dir, {"exit_during_startup": 0.1})
    assert cli(["repro", str(config), "--run", "--output-dir", str(tmp_path / "r")]) == 2
    err = capsys.readouterr().err
    assert "error: server did not start: server exited with status 1 during start-up" in err
    assert "fake server failed to load the model" in err


def test_repro_run_into_an_output_directory_another_run_holds_is_a_usage_error(
        tmp_path: Path, gsm8k_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    import fcntl

    config = write_config(tmp_path, "held", gsm8k_dir)
    out_dir = tmp_path / "o"
    out_dir.mkdir()
    with open(out_dir / LOCK_FILE, "a+") as held:
        fcntl.flock(held, fcntl.LOCK_EX | fcntl.LOCK_NB)
        assert cli(["repro", str(config), "--run", "--output-dir", str(out_dir)]) == 3
    assert "another quantgate run" in capsys.readouterr().err
    assert not (out_dir / "held" / "server.log").exists()


def test_repro_says_an_api_key_from_the_environment_is_shown_as_redacted(
        tmp_path: Path, gsm8k_dir: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """vLLM reads VLLM_API_KEY from the environment it inherits: lm-eval is printed with the key
    redacted, though the server's command line holds no secret."""
    monkeypatch.setenv("VLLM_API_KEY", "env-s3cret")
    config = write_config(tmp_path, "envkey", gsm8k_dir)
    assert cli(["repro", str(config), "--output-dir", str(tmp_path / "r")]) == 0
    output = capsys.readouterr().out
    assert "env-s3cret" not in output and "OPENAI_API_KEY='<redacted>'" in output
    assert "# secrets are shown as <redacted>: put the real values there (the config's, or your environment's" in output


def test_repro_says_a_secret_of_the_configs_env_alone_is_shown_as_redacted(tmp_path: Path, gsm8k_dir: Path,
                                                                         capsys: pytest.CaptureFixture[str]) -> None:
    config = write_config(tmp_path, "tok", gsm8k_dir, env={"HF_TOKEN": "hf-s3cret"})
    assert cli(["repro", str(config), "--output-dir", str(tmp_path / "r")]) == 0
    output = capsys.readouterr().out
    assert "hf-s3cret" not in output and "# secrets are shown as <redacted>" in output

"""`quantgate kernels`: registry decisions for this machine or a described GPU (SPEC sections 4, 5)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from quantgate.harness.cli import main
from quantgate.kernels.registry import DISABLED_ENV


@pytest.fixture(autouse=True)
def _no_disabled_kernels(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(DISABLED_ENV, raising=False)


def _json(capsys, *argv: str) -> tuple[int, dict]:
    code = main(["kernels", "--json", *argv])
    return code, json.loads(capsys.readouterr().out)


def test_json_report_for_an_a100_block_checkpoint(capsys):
    code, report = _json(capsys, "--device", "cuda", "--capability", "8.0", "--scheme", "fp8-block")
    assert code == 0
    assert report["platform"]["device"] == "cuda" and report["platform"]["capability"] == "8.0"
    assert report["error"] is None
    linear, moe = report["layers"]
    assert set(linear) == {"layer", "scheme", "requested", "selected", "candidates", "error"}
    assert (linear["layer"], linear["scheme"], linear["requested"]) == ("linear", "fp8-block", "auto")
    assert linear["selected"] == {"kernel": "MarlinFp8LinearKernel", "backend": "marlin"}
    assert moe["layer"] == "moe" and moe["scheme"] == "fp8-block" and moe["selected"] is not None
    for candidate in linear["candidates"]:
        assert set(candidate) == {"kernel", "backend", "supported", "reason"}
        assert candidate["supported"] == (candidate["reason"] is None)
    # SPEC 4/5: every linear kernel of the scheme is shown, the ones an A100 cannot run with why.
    by_kernel = {c["kernel"]: c for c in linear["candidates"]}
    assert [c["kernel"] for c in linear["candidates"]][:2] == ["MarlinFp8LinearKernel", "EmulationLinearKernel"]
    assert set(by_kernel) == {"MarlinFp8LinearKernel", "EmulationLinearKernel", "TorchBlockScaledMMLinearKernel",
                              "TritonBlockFp8LinearKernel"}
    torch_block, triton = by_kernel["TorchBlockScaledMMLinearKernel"], by_kernel["TritonBlockFp8LinearKernel"]
    assert torch_block["backend"] == "torch" and torch_block["supported"] is False
    assert "compute capability >= 9.0" in torch_block["reason"] and "this GPU is 8.0" in torch_block["reason"]
    assert triton["supported"] is False and "compute capability >= 8.9" in triton["reason"]


def test_cpu_report_shows_the_gpu_kernels_and_why_they_cannot_run(capsys):
    assert main(["kernels", "--device", "cpu", "--scheme", "fp8-block"]) == 0
    out = capsys.readouterr().out
    assert "MarlinFp8LinearKernel           marlin     requires CUDA (compute capability >= 8.0" in out
    assert ("MarlinMoEKernel       marlin     requires CUDA (compute capability >= 8.0, bf16 tensor cores); "
            "this is cpu") in out
    assert "TRITON_INTERPRET" not in out


def test_default_covers_every_fp8_scheme_and_unquantized_layers(capsys):
    code, report = _json(capsys, "--capability", "9.0")
    assert code == 0
    shown = [(layer["layer"], layer["scheme"]) for layer in report["layers"]]
    for scheme in ("fp8-block", "fp8-channel", "fp8-tensor"):
        assert ("linear", scheme) in shown and ("moe", scheme) in shown
    assert ("linear", "unquantized") in shown


def test_explicit_backend_that_cannot_serve_lists_every_reason_and_exits_1(capsys):
    code = main(["kernels", "--capability", "8.0", "--scheme", "fp8-block", "--linear-backend", "triton"])
    out, err = capsys.readouterr()
    assert code == 1
    assert "NO KERNEL" in out
    assert "TritonBlockFp8LinearKernel: requires CUDA compute capability >= 8.9 (FP8 tensor cores); this GPU is 8.0" in err

    code, report = _json(capsys, "--capability", "8.0", "--scheme", "fp8-block", "--linear-backend", "triton")
    linear = report["layers"][0]
    assert code == 1 and linear["selected"] is None and linear["requested"] == "triton"
    assert report["error"] == linear["error"] and "this GPU is 8.0" in report["error"]


def test_requested_backend_applies_to_the_checkpoint_scheme_only(capsys):
    # marlin cannot serve unquantized layers, but those (lm_head) always select with auto.
    code, report = _json(capsys, "--capability", "9.0", "--linear-backend", "marlin")
    assert code == 0
    by_scheme = {(l["layer"], l["scheme"]): l for l in report["layers"]}
    assert by_scheme[("linear", "fp8-block")]["selected"]["backend"] == "marlin"
    assert by_scheme[("linear", "unquantized")]["requested"] == "auto"
    # A bf16 checkpoint (--scheme unquantized) with marlin is a strict error.
    code, report = _json(capsys, "--capability", "9.0", "--scheme", "unquantized", "--linear-backend", "marlin")
    assert code == 1 and "MarlinFp8LinearKernel: scheme unquantized not handled" in report["error"]


def test_text_report_marks_the_selected_kernel(capsys):
    assert main(["kernels", "--device", "cpu", "--scheme", "fp8-channel"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("platform: cpu")
    assert "linear fp8-channel (requested auto): EmulationLinearKernel [emulation]" in out
    assert "  * EmulationLinearKernel" in out


def test_disabled_kernels_show_up_as_reasons(capsys, monkeypatch):
    monkeypatch.setenv(DISABLED_ENV, "MarlinFp8LinearKernel")
    code, report = _json(capsys, "--capability", "8.0", "--scheme", "fp8-tensor")
    linear = report["layers"][0]
    assert code == 0 and linear["selected"]["kernel"] == "EmulationLinearKernel"
    assert linear["candidates"][0]["reason"] == f"disabled by {DISABLED_ENV}"


@pytest.mark.parametrize("argv, words", [
    (["--linear-backend", "marlinn"], "did you mean 'marlin'"),
    (["--moe-backend", "trition"], "did you mean 'triton'"),
    (["--capability", "nine"], "X.Y"),
    (["--capability", ""], "capability '' is not of the form X.Y (e.g. 9.0)"),  # not this machine's, silently
    (["--capability", "-1.0"], "'-1.0' is not a CUDA compute capability"),
    (["--capability", "0.0"], "'0.0' is not a CUDA compute capability"),
    (["--capability", "21.0"], "X from 1 to 20"),
    (["--capability", "9.10"], "Y from 0 to 9"),
    (["--device", "cpu", "--capability", "9.0"],
     "error: --capability describes a CUDA GPU; it cannot be combined with --device cpu\n"),
    (["--device", "tpu"], "auto, cpu or cuda"),
    (["--scheme", "fp4"], "known schemes"),
])
def test_usage_errors_exit_3_with_the_fix(capsys, argv, words):
    assert main(["kernels", *argv]) == 3
    assert words in capsys.readouterr().err


@pytest.mark.parametrize("capability", ["1.0", "7.5", "8.6", "10.0", "12.1"])
def test_real_compute_capabilities_are_accepted(capsys, capability):
    code, report = _json(capsys, "--capability", capability, "--scheme", "fp8-channel")
    assert code == 0 and report["platform"]["capability"] == capability


@pytest.mark.parametrize("buffered", [True, False])
def test_a_reader_that_leaves_early_ends_the_command_quietly(buffered: bool) -> None:
    # `quantgate kernels --json | head -1`: no traceback, the shell's SIGPIPE status. A pipe is
    # block-buffered unless PYTHONUNBUFFERED is set (as CI shells often do): the whole report then
    # reaches the pipe only when stdout is flushed, which must still be where the error is handled.
    import os
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"} | ({} if buffered else
                                                                              {"PYTHONUNBUFFERED": "1"})
    proc = subprocess.Popen([sys.executable, "-m", "quantgate.harness.cli", "kernels", "--json"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
    proc.stdout.close()  # before the command has imported anything, so its first write fails
    stderr = proc.stderr.read().decode()
    assert proc.wait(timeout=120) == 141 and "Traceback" not in stderr and "BrokenPipe" not in stderr, stderr


def test_a_gpu_index_the_machine_does_not_have_is_a_usage_error(capsys, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    assert main(["kernels", "--device", "cuda:3"]) == 3
    err = capsys.readouterr().err
    assert "--device cuda:3: this machine has 1 CUDA device(s), cuda:0" in err and "Traceback" not in err


REPO = Path(__file__).resolve().parents[2]
BLOCK_MODEL = REPO / "models" / "tiny-qwen3-fp8-block-native"


def test_model_selects_for_the_checkpoints_own_layers(capsys):
    """The representative 4096x4096 layer takes cuBLAS block scaling on 9.0; the tiny model's
    K=256 layers cannot, and `serve` picks triton for them: --model says what serve would."""
    code, report = _json(capsys, "--capability", "9.0", "--scheme", "fp8-block")
    assert code == 0 and report["layers"][0]["selected"]["kernel"] == "TorchBlockScaledMMLinearKernel"
    code, report = _json(capsys, "--capability", "9.0", "--model", str(BLOCK_MODEL))
    assert code == 0 and report["model"] == str(BLOCK_MODEL) and report["error"] is None
    quantized = [layer for layer in report["layers"] if layer["scheme"] == "fp8-block"]
    assert {layer["selected"]["kernel"] for layer in quantized} == {"TritonBlockFp8LinearKernel"}
    modules = [m for layer in report["layers"] for m in layer["modules"]]
    assert len(modules) == len(set(modules)) == 4 * 4 + 1  # 4 layers x (qkv, o, gate_up, down) + lm_head
    torch_block = next(c for c in quantized[0]["candidates"] if c["kernel"] == "TorchBlockScaledMMLinearKernel")
    assert "this layer is K=256" in torch_block["reason"]


def test_model_with_a_backend_that_cannot_serve_its_layers_exits_1_naming_them(capsys):
    assert main(["kernels", "--capability", "9.0", "--model", str(BLOCK_MODEL), "--linear-backend", "torch"]) == 1
    out, err = capsys.readouterr()
    assert "NO KERNEL" in out and "model.layers.0.mlp.down_proj" in out
    assert "with --linear-backend torch" in err and "this layer is K=768, N=256" in err


def test_dtype_changes_the_selection_as_it_does_in_serve(capsys):
    # float32 activations: marlin (W8A16 in bf16/fp16) cannot serve, emulation can.
    code, report = _json(capsys, "--capability", "8.0", "--scheme", "fp8-block", "--dtype", "float32")
    assert code == 0 and report["layers"][0]["selected"]["kernel"] == "EmulationLinearKernel"
    code, report = _json(capsys, "--capability", "8.0", "--model", str(BLOCK_MODEL), "--dtype", "float32")
    assert {layer["selected"]["kernel"] for layer in report["layers"] if layer["scheme"] == "fp8-block"} == \
        {"EmulationLinearKernel"}


@pytest.mark.parametrize("argv, says", [
    (["--model", str(BLOCK_MODEL), "--scheme", "fp8-block"], "with --model the checkpoint's config.json says"),
    (["--model", "/nonexistent-model"], "--model /nonexistent-model: /nonexistent-model has no config.json"),
])
def test_model_usage_errors(capsys, argv, says):
    assert main(["kernels", "--capability", "9.0", *argv]) == 3
    assert says in capsys.readouterr().err


@pytest.mark.parametrize("model", ["tiny-qwen3-fp8-block-native", "tiny-qwen3-moe-fp8-channel-ct", "tiny-qwen3"])
def test_model_plan_is_what_loading_the_model_selects(model):
    """On this machine (CPU): plan_kernels from config.json alone equals the kernels a load binds."""
    from quantgate.engine import load_model
    from quantgate.engine.loader import plan_kernels
    from quantgate.kernels import Platform

    loaded = load_model(REPO / "models" / model, device="cpu")
    bound = {name: m["kernel"] for name, m in loaded.kernel_report()["modules"].items()}
    planned = {name: sel.kernel.kernel_name() for name, sel in plan_kernels(REPO / "models" / model,
                                                                            Platform.detect("cpu"))}
    assert planned == bound


def test_model_text_groups_the_modules_and_marks_the_selected_kernel_ok(capsys):
    assert main(["kernels", "--capability", "9.0", "--model", str(BLOCK_MODEL)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[:2] == ["platform: cuda 9.0 (cuda sm_90)", f"layers: {BLOCK_MODEL}'s modules"]
    assert ("  4 module(s): model.layers.0.mlp.down_proj, model.layers.1.mlp.down_proj, "
            "model.layers.2.mlp.down_proj and 1 more") in lines
    selected = [line.split() for line in lines if line.startswith("  * ")]
    assert selected == 4 * [["*", "TritonBlockFp8LinearKernel", "triton", "ok"]] + [
        ["*", "UnquantizedLinearKernel", "torch", "ok"]]


@pytest.mark.parametrize("device", ["auto", "cuda", "cuda:1"])
def test_a_described_gpu_combines_with_any_cuda_device(capsys, device):
    code, report = _json(capsys, "--device", device, "--capability", "8.0", "--scheme", "fp8-block")
    assert code == 0 and report["platform"]["capability"] == "8.0"


def test_cuda_without_a_gpu_is_a_usage_error_naming_both_fixes(capsys, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert main(["kernels", "--device", "cuda"]) == 3
    err = capsys.readouterr().err
    assert "use --device cpu or install a CUDA build of torch; or describe a GPU with --capability X.Y" in err


def test_a_model_folder_the_user_cannot_read_is_a_usage_error(capsys, monkeypatch, tmp_path):
    """As a user without search permission on the folder: Path.is_file raises EACCES (root never sees it)."""
    def is_file(path: Path) -> bool:
        raise PermissionError(13, "Permission denied", str(path))

    monkeypatch.setattr(Path, "is_file", is_file)
    assert main(["kernels", "--capability", "9.0", "--model", str(tmp_path)]) == 3
    err = capsys.readouterr().err
    assert err.startswith(f"error: --model {tmp_path}: ") and "Permission denied" in err and "Traceback" not in err


def test_text_report_names_the_described_gpu(capsys):
    assert main(["kernels", "--capability", "8.0", "--scheme", "fp8-block"]) == 0
    assert capsys.readouterr().out.splitlines()[:2] == [
        "platform: cuda 8.0 (cuda sm_80)",
        "layers: representative (a 4096x4096 linear, a Qwen3-30B-A3B-shaped MoE); --model FOLDER for a checkpoint's "
        "own"]


def test_representative_layers_are_bf16_unless_dtype_says_otherwise(capsys):
    # Row-wise _scaled_mm writes bf16 only: on 9.0 it serves a bf16 channel-FP8 layer, not an fp16 one.
    for argv, kernel in [((), "TorchScaledMMLinearKernel"), (("--dtype", "bfloat16"), "TorchScaledMMLinearKernel"),
                         (("--dtype", "float16"), "TritonBlockFp8LinearKernel")]:
        code, report = _json(capsys, "--capability", "9.0", "--scheme", "fp8-channel", *argv)
        assert code == 0 and report["layers"][0]["selected"]["kernel"] == kernel, argv


def test_requested_moe_backend_selects_the_representative_moe(capsys):
    # auto picks triton on 9.0: marlin must be the request's doing
    code, report = _json(capsys, "--capability", "9.0", "--scheme", "fp8-block", "--moe-backend", "marlin")
    linear, moe = report["layers"]
    assert code == 0 and linear["requested"] == "auto"
    assert moe["requested"] == "marlin" and moe["selected"] == {"kernel": "MarlinMoEKernel", "backend": "marlin"}


def test_json_error_holds_every_layer_without_a_kernel(capsys):
    code, report = _json(capsys, "--capability", "8.0", "--linear-backend", "triton")
    failed = [layer["error"] for layer in report["layers"] if layer["selected"] is None]
    assert code == 1 and len(failed) == 3  # triton's block-FP8 kernel needs 8.9 for every FP8 scheme
    assert report["error"] == "\n".join(failed)


def test_model_text_names_a_group_of_three_without_and_more(capsys, monkeypatch):
    from quantgate.engine import loader

    plan = loader.plan_kernels
    monkeypatch.setattr(loader, "plan_kernels", lambda *args, **kwargs: [
        (module, sel) for module, sel in plan(*args, **kwargs) if module.endswith("down_proj")][:3])
    assert main(["kernels", "--capability", "9.0", "--model", str(BLOCK_MODEL)]) == 0
    assert ("  3 module(s): model.layers.0.mlp.down_proj, model.layers.1.mlp.down_proj, model.layers.2.mlp.down_proj"
            in capsys.readouterr().out.splitlines())


def test_model_applies_the_requested_moe_backend_to_its_experts(capsys):
    """auto takes triton for the MoE checkpoint's experts on 9.0; --moe-backend marlin must reach them."""
    moe_model = str(REPO / "models" / "tiny-qwen3-moe-fp8-block-native")
    code, report = _json(capsys, "--capability", "9.0", "--model", moe_model, "--moe-backend", "marlin")
    experts = [layer for layer in report["layers"] if layer["layer"] == "moe"]
    assert code == 0 and experts and all(layer["requested"] == "marlin" for layer in experts)
    assert {layer["selected"]["kernel"] for layer in experts} == {"MarlinMoEKernel"}
    assert sum(len(layer["modules"]) for layer in experts) == 4
    linear = [layer for layer in report["layers"] if layer["layer"] == "linear"]
    assert linear and all(layer["requested"] == "auto" for layer in linear)

"""The legacy env table: each variable's public replacement."""

from __future__ import annotations

import pytest

from quantgate.harness.legacy import LEGACY_VARS, translate


@pytest.mark.parametrize("env, flags", [
    ({"VLLM_TEST_FORCE_FP8_MARLIN": "1"}, ["--linear-backend", "marlin", "--moe-backend", "marlin"]),
    ({"VLLM_USE_DEEP_GEMM": "1", "VLLM_USE_DEEP_GEMM_MOE": "1"},
     ["--linear-backend", "deep_gemm", "--moe-backend", "deep_gemm"]),
    # vLLM's default flavour is latency (env_with_choices("VLLM_FLASHINFER_MOE_BACKEND", "latency", ...)).
    ({"VLLM_USE_FLASHINFER_MOE_FP8": "1"}, ["--moe-backend", "flashinfer_trtllm"]),
    ({"VLLM_USE_FLASHINFER_MOE_FP8": "1", "VLLM_FLASHINFER_MOE_BACKEND": "throughput"},
     ["--moe-backend", "flashinfer_cutlass"]),
    ({"VLLM_USE_FLASHINFER_MOE_FP8": "true", "VLLM_FLASHINFER_MOE_BACKEND": "latency"},
     ["--moe-backend", "flashinfer_trtllm"]),
    ({"VLLM_USE_FLASHINFER_MOE_FP4": "1", "VLLM_FLASHINFER_MOE_BACKEND": "masked_gemm"},
     ["--moe-backend", "flashinfer_cutedsl"]),
    ({"VLLM_NVFP4_GEMM_BACKEND": "flashinfer-cutlass"}, ["--linear-backend", "flashinfer_cutlass"]),
    ({"VLLM_MXFP4_USE_MARLIN": "1"}, ["--moe-backend", "marlin"]),
    ({"VLLM_MOE_USE_DEEP_GEMM": "1"}, ["--moe-backend", "deep_gemm"]),  # vLLM's own name of the MoE switch
    ({"VLLM_USE_DEEP_GEMM_MOE": "1"}, ["--moe-backend", "deep_gemm"]),
])
def test_translation(env: dict[str, str], flags: list[str]) -> None:
    result = translate(env)
    assert result.flags == flags
    assert sorted(result.replaced) == sorted(env) and result.unresolved == {}


def test_switch_off_is_dropped_without_flags() -> None:
    result = translate({"VLLM_TEST_FORCE_FP8_MARLIN": "0"})
    assert result.flags == [] and result.replaced == ["VLLM_TEST_FORCE_FP8_MARLIN"]


def test_ruling_a_backend_out_needs_an_explicit_choice() -> None:
    result = translate({"VLLM_USE_DEEP_GEMM": "0", "VLLM_USE_DEEP_GEMM_MOE": "0", "VLLM_USE_FLASHINFER_MOE_FP8": "1"})
    assert result.flags == ["--moe-backend", "flashinfer_trtllm"]
    assert "VLLM_USE_DEEP_GEMM_MOE" in result.replaced  # satisfied by the explicit --moe-backend
    assert "--linear-backend" in result.unresolved["VLLM_USE_DEEP_GEMM"]
    # It turns DeepGEMM off for vLLM's MoE as well: both layers must name what runs instead.
    assert "--moe-backend" in translate({"VLLM_USE_DEEP_GEMM": "0"}, {"--linear-backend": "cutlass"}).unresolved[
        "VLLM_USE_DEEP_GEMM"]
    assert translate({"VLLM_USE_DEEP_GEMM": "0"}, {"--linear-backend": "cutlass", "--moe-backend": "triton"}
                     ).unresolved == {}
    linear_only = translate({"VLLM_USE_DEEP_GEMM": "1", "VLLM_USE_DEEP_GEMM_MOE": "0"})
    assert linear_only.flags == ["--linear-backend", "deep_gemm"]
    assert list(linear_only.unresolved) == ["VLLM_USE_DEEP_GEMM_MOE"]


def test_flags_already_chosen_are_not_repeated_and_conflicts_reported() -> None:
    same = translate({"VLLM_TEST_FORCE_FP8_MARLIN": "1"}, {"--moe-backend": "marlin"})
    assert same.flags == ["--linear-backend", "marlin"] and same.replaced == ["VLLM_TEST_FORCE_FP8_MARLIN"]
    clash = translate({"VLLM_TEST_FORCE_FP8_MARLIN": "1"}, {"--moe-backend": "triton"})
    assert clash.flags == [] and "--moe-backend triton" in clash.unresolved["VLLM_TEST_FORCE_FP8_MARLIN"]


def test_variables_without_public_flag_are_unresolved_with_advice() -> None:
    result = translate({"VLLM_USE_DEEP_GEMM_E8M0": "1", "QUANTGATE_DISABLED_KERNELS": "TritonFusedMoEKernel",
                        "UNRELATED": "x"})
    assert set(result.unresolved) == {"VLLM_USE_DEEP_GEMM_E8M0", "QUANTGATE_DISABLED_KERNELS"}
    assert all(advice for advice in result.unresolved.values())


def test_every_variable_says_what_it_did() -> None:
    for name, var in LEGACY_VARS.items():
        assert var.name == name and var.meaning


def test_the_flashinfer_flavour_goes_only_with_a_switch_that_was_migrated() -> None:
    """VLLM_FLASHINFER_MOE_BACKEND qualifies the switch that reads it: removed while that switch
    stays (a conflict, here), the next migrate would turn the switch into the default flavour."""
    env = {"VLLM_USE_FLASHINFER_MOE_FP4": "1", "VLLM_FLASHINFER_MOE_BACKEND": "throughput"}
    clash = translate(env, {"--moe-backend": "triton"})
    assert clash.replaced == [] and set(clash.unresolved) == set(env)
    assert "flashinfer_cutlass" in clash.unresolved["VLLM_FLASHINFER_MOE_BACKEND"]
    assert sorted(translate(env).replaced) == sorted(env)
    same = translate(env, {"--moe-backend": "flashinfer_cutlass"})  # the switch is replaced by what the file says
    assert same.flags == [] and sorted(same.replaced) == sorted(env)
    alone = translate({"VLLM_FLASHINFER_MOE_BACKEND": "latency"})
    assert alone.replaced == [] and list(alone.unresolved) == ["VLLM_FLASHINFER_MOE_BACKEND"]
    off = translate({"VLLM_USE_FLASHINFER_MOE_FP8": "0", "VLLM_FLASHINFER_MOE_BACKEND": "latency"},
                    {"--moe-backend": "triton"})
    assert off.replaced == ["VLLM_USE_FLASHINFER_MOE_FP8"] and list(off.unresolved) == ["VLLM_FLASHINFER_MOE_BACKEND"]


@pytest.mark.parametrize("switch, suggested, never", [
    # vLLM's NVFP4 MoE (NvFp4MoeBackend) has no triton or deep_gemm; DeepGEMM is block-FP8 only.
    ("VLLM_USE_FLASHINFER_MOE_FP4", "cutlass, marlin", ("triton", "deep_gemm")),
    ("VLLM_USE_FLASHINFER_MOE_FP8", "triton, deep_gemm, cutlass", ()),
    ("VLLM_USE_FLASHINFER_MOE_FP16", "(e.g. triton)", ("deep_gemm", "cutlass", "marlin")),
])
def test_ruling_flashinfer_out_suggests_backends_that_serve_that_layer_type(switch: str, suggested: str,
                                                                          never: tuple[str, ...]) -> None:
    advice = translate({switch: "0"}).unresolved[switch]
    assert suggested in advice and not any(name in advice for name in never), advice


@pytest.mark.parametrize("flavour", ["fast", "cutlass", "", "latncy"])
def test_an_unknown_flashinfer_flavour_is_never_read_as_the_default(flavour: str) -> None:
    """vLLM accepts only throughput, latency and masked_gemm; any other value was translated to
    --moe-backend flashinfer_trtllm, a backend the config may never have run."""
    env = {"VLLM_USE_FLASHINFER_MOE_FP8": "1", "VLLM_FLASHINFER_MOE_BACKEND": flavour}
    result = translate(env)
    assert result.flags == [] and result.replaced == [] and set(result.unresolved) == set(env)
    switch, mode = result.unresolved["VLLM_USE_FLASHINFER_MOE_FP8"], result.unresolved["VLLM_FLASHINFER_MOE_BACKEND"]
    assert f"VLLM_FLASHINFER_MOE_BACKEND={flavour!r} is not one vLLM knows" in switch
    assert f"{flavour!r} is not a flavour vLLM knows" in mode
    for advice in (switch, mode):
        assert "one of throughput, latency, masked_gemm" in advice
        assert "--moe-backend (throughput: flashinfer_cutlass, latency: flashinfer_trtllm" in advice
    alone = translate({"VLLM_FLASHINFER_MOE_BACKEND": flavour})  # no switch reads it: still its value's problem
    assert "is not a flavour vLLM knows" in alone.unresolved["VLLM_FLASHINFER_MOE_BACKEND"]


def test_a_known_flavour_in_another_case_still_translates() -> None:
    result = translate({"VLLM_USE_FLASHINFER_MOE_FP8": "1", "VLLM_FLASHINFER_MOE_BACKEND": " Throughput "})
    assert result.flags == ["--moe-backend", "flashinfer_cutlass"] and result.unresolved == {}


def test_a_chosen_backend_in_another_spelling_is_no_conflict() -> None:
    # Backend names are case-insensitive, `-` and `_` alike (SPEC 2): `Marlin` is marlin.
    result = translate({"VLLM_TEST_FORCE_FP8_MARLIN": "1"}, {"--moe-backend": "Marlin"})
    assert result.flags == ["--linear-backend", "marlin"] and result.unresolved == {}
    result = translate({"VLLM_USE_FLASHINFER_MOE_FP8": "1"}, {"--moe-backend": "FlashInfer-TRTLLM"})
    assert result.flags == [] and result.replaced == ["VLLM_USE_FLASHINFER_MOE_FP8"] and result.unresolved == {}


@pytest.mark.parametrize("moe_switch", ["VLLM_MOE_USE_DEEP_GEMM", "VLLM_USE_DEEP_GEMM_MOE"])
def test_the_deep_gemm_moe_switch_turns_nothing_on_while_deep_gemm_is_off(moe_switch: str) -> None:
    """vLLM runs DeepGEMM MoE only when VLLM_USE_DEEP_GEMM is on as well: with =0 nothing ran
    DeepGEMM, and `--moe-backend deep_gemm` (what migrate wrote) would run it."""
    env = {"VLLM_USE_DEEP_GEMM": "0", moe_switch: "1"}
    result = translate(env, {"--linear-backend": "cutlass"})
    assert result.flags == [] and result.replaced == [moe_switch]
    assert "--moe-backend" in result.unresolved["VLLM_USE_DEEP_GEMM"]  # still rules DeepGEMM out for MoE
    assert translate(env, {"--linear-backend": "cutlass", "--moe-backend": "triton"}).unresolved == {}
    assert translate({"VLLM_USE_DEEP_GEMM": "1", moe_switch: "1"}).flags == [
        "--linear-backend", "deep_gemm", "--moe-backend", "deep_gemm"]


def test_two_variables_that_contradict_each_other_are_named_as_such() -> None:
    # The second one's conflict is with the first variable, not with a choice of the config.
    result = translate({"VLLM_TEST_FORCE_FP8_MARLIN": "1", "VLLM_USE_DEEP_GEMM": "1"})
    assert result.flags == ["--linear-backend", "marlin", "--moe-backend", "marlin"]
    advice = result.unresolved["VLLM_USE_DEEP_GEMM"]
    assert "but VLLM_TEST_FORCE_FP8_MARLIN here means `--linear-backend marlin`" in advice, advice
    assert "the config already chooses" not in advice

"""The shipped eval-config catalog: it lints, its tiny configs point at buildable models, each
`expect:` names the backend its server_args choose (one the kernel registry can serve on the
platform its `requires:` asks for), the tier list files agree with the tags, a change to one
kernel selects the configs that use it, and negative checks run in CI expecting FAIL.

No evaluation runs here: the configs' own runs are `quantgate run eval_configs/tiny/<tier>.txt`.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from quantgate.engine.config import ModelConfig
from quantgate.harness.backends import canonical
from quantgate.harness.cli import main
from quantgate.harness.config import EvalConfig, expand_paths, list_file_entries, load_config
from quantgate.harness.pipeline import build_pipeline, collect, select_for_changes
from quantgate.harness.config import resolve_model
from quantgate.kernels import (
    LinearLayerConfig,
    MoELayerConfig,
    Platform,
    Scheme,
    select_linear_kernel,
    select_moe_kernel,
)

from .test_pipeline import fake_tool, run_script

REPO = Path(__file__).resolve().parents[2]
EVAL_CONFIGS = REPO / "eval_configs"
TINY = EVAL_CONFIGS / "tiny"
TIERS = ("pr", "nightly", "release")
NEGATIVE_TAG = "negative-check"  # configs that must fail; never in a tier list
# The capabilities a GPU requirement can name, in order; a requirement is tight when the
# backend cannot serve one step below it.
CAPABILITIES = ("8.0", "8.9", "9.0")


def _tiny_configs() -> list[EvalConfig]:
    return [load_config(path) for path in sorted(TINY.glob("*.yaml"))]


TINY_CONFIGS = _tiny_configs()
BY_NAME = {config.name: config for config in TINY_CONFIGS}
# The configs that must pass; a negative check contradicts itself on purpose.
RUNNABLE = sorted(c.name for c in TINY_CONFIGS if NEGATIVE_TAG not in c.tags)
MANIFEST = json.loads((REPO / "models" / "MANIFEST.json").read_text())


def _tier_entries(tier: str) -> list[Path]:
    entries, errors = list_file_entries(TINY / f"{tier}.txt")
    assert not errors, [str(e) for e in errors]
    return [p.resolve() for p in entries]


def test_every_config_and_list_file_lints(capsys: pytest.CaptureFixture[str]) -> None:
    status = main(["lint", str(EVAL_CONFIGS)])
    out = capsys.readouterr()
    assert status == 0, out.out + out.err
    for list_file in sorted(EVAL_CONFIGS.rglob("*.txt")):
        assert main(["lint", str(list_file)]) == 0, capsys.readouterr().out


@pytest.mark.parametrize("name", sorted(BY_NAME))
def test_model_is_a_manifest_model_and_exists_after_make_models(name: str) -> None:
    config = BY_NAME[name]
    folder = Path(resolve_model(config))
    known = set(MANIFEST["models"]) | {v for m in MANIFEST["models"].values() for v in m.get("variants", {})}
    assert folder.name in known, f"{config.source}: model {config.model_name} is neither a shipped model nor a " \
                                 f"variant in models/MANIFEST.json (known: {sorted(known)})"
    assert (folder / "config.json").is_file(), f"{folder} is missing: run `make models`"


@pytest.mark.parametrize("name", RUNNABLE)
def test_expect_names_the_backends_server_args_choose(name: str) -> None:
    config = BY_NAME[name]
    flags = config.backend_flags()
    is_moe = ModelConfig.from_pretrained(resolve_model(config)).is_moe
    assert config.expect.linear_kernel is not None, f"{config.source}: expect.linear_kernel is missing"
    assert canonical(config.expect.linear_kernel) == canonical(flags.get("--linear-backend", "auto"))
    if is_moe:
        assert config.expect.moe_kernel is not None, f"{config.source}: an MoE model needs expect.moe_kernel"
        assert canonical(config.expect.moe_kernel) == canonical(flags.get("--moe-backend", "auto"))
    else:
        assert config.expect.moe_kernel is None and "--moe-backend" not in flags


def _layer_configs(config: EvalConfig) -> tuple[list[LinearLayerConfig], MoELayerConfig | None]:
    """The checkpoint's quantized linear shapes and its MoE layer, as the engine describes them."""
    model = ModelConfig.from_pretrained(resolve_model(config))
    quant = model.quant
    scheme = quant.scheme if quant else Scheme.UNQUANTIZED
    fields = dict(block_size=quant.block_size, scale_name=quant.scale_name,
                  static_input_scale=quant.static_input_scale) if quant else {}
    attention = model.num_heads * model.head_dim
    kv = model.num_kv_heads * model.head_dim
    shapes = {(model.hidden_size, attention), (model.hidden_size, kv), (attention, model.hidden_size)}
    if not model.is_moe:
        shapes |= {(model.hidden_size, model.intermediate_size), (model.intermediate_size, model.hidden_size)}
    linears = [LinearLayerConfig(k, n, scheme, model.dtype, **fields) for k, n in sorted(shapes)]
    moe = MoELayerConfig(model.num_experts, model.num_experts_per_tok, model.hidden_size,
                         model.moe_intermediate_size, scheme, model.dtype, renormalize=model.norm_topk_prob,
                         **fields) if model.is_moe else None
    return linears, moe


def _serves(config: EvalConfig, platform: Platform) -> bool:
    """Whether the backends named in server_args serve every layer of the checkpoint on `platform`."""
    flags = config.backend_flags()
    linears, moe = _layer_configs(config)
    ok = all(select_linear_kernel(platform, layer, flags.get("--linear-backend", "auto")).kernel is not None
             for layer in linears)
    if moe is not None:
        ok = ok and select_moe_kernel(platform, moe, flags.get("--moe-backend", "auto")).kernel is not None
    return ok


@pytest.mark.parametrize("name", RUNNABLE)
def test_requires_is_what_the_backends_need(name: str) -> None:
    """CPU configs run on CPU; a GPU config's min_compute_capability is the lowest one its
    backends serve, so the pipeline neither starves it nor hides it from older GPUs."""
    config = BY_NAME[name]
    needed = config.requires.min_compute_capability
    if config.requires.gpus == 0:
        assert needed is None, f"{config.source}: min_compute_capability without gpus"
        assert _serves(config, Platform.hypothetical("cpu")), f"{config.source}: its backends cannot run on CPU"
        return
    assert needed in CAPABILITIES, f"{config.source}: requires {needed}, expected one of {CAPABILITIES}"
    assert _serves(config, Platform.hypothetical("cuda", needed)), f"{config.source}: not served on {needed}"
    below = CAPABILITIES[: CAPABILITIES.index(needed)]
    if below:
        assert not _serves(config, Platform.hypothetical("cuda", below[-1])), \
            f"{config.source}: {below[-1]} serves it too; lower min_compute_capability"
    assert not _serves(config, Platform.hypothetical("cpu")), f"{config.source}: runs on CPU; drop `requires:`"


@pytest.mark.parametrize("name", RUNNABLE)
def test_reference_has_calibration_provenance_for_its_questions(name: str) -> None:
    config = BY_NAME[name]
    ref = config.reference
    assert ref is not None, f"{config.source}: a catalog config needs a measured reference"
    assert ref.n == config.num_questions, f"{config.source}: reference measured on {ref.n} questions, " \
                                          f"the config asks {config.num_questions}"
    assert ref.runs is not None and ref.runs >= 2 and ref.stdev is not None, \
        f"{config.source}: reference without `quantgate calibrate` runs and stdev"
    assert ref.measured_on and ref.date and ref.commit, f"{config.source}: reference without provenance"


@pytest.mark.parametrize("tier", TIERS)
def test_tier_list_holds_exactly_the_configs_tagged_for_it(tier: str) -> None:
    listed = _tier_entries(tier)
    assert len(listed) == len(set(listed)), f"{tier}.txt names a config twice"
    tagged = {c.source for c in TINY_CONFIGS if tier in c.tags}
    assert set(listed) == tagged, (f"{tier}.txt lacks {sorted(p.name for p in tagged - set(listed))}, "
                                   f"has untagged {sorted(p.name for p in set(listed) - tagged)}")


def test_every_tiny_config_is_in_a_tier_or_a_negative_check() -> None:
    for config in TINY_CONFIGS:
        assert (NEGATIVE_TAG in config.tags) != bool(set(config.tags) & set(TIERS)), \
            f"{config.source}: tags {config.tags}: a config runs in a tier or is a negative check, not both or neither"


def test_negative_checks_are_in_no_list_file() -> None:
    negative = {c.source for c in TINY_CONFIGS if NEGATIVE_TAG in c.tags}
    assert negative, "the catalog lost its negative check (expect: names a backend that does not run)"
    for list_file in sorted(EVAL_CONFIGS.rglob("*.txt")):
        listed = {p.resolve() for p in expand_paths([list_file])}
        assert not negative & listed, f"{list_file} lists a negative check: {sorted(p.name for p in negative & listed)}"


def _fault_variants() -> dict[str, str]:
    """The deliberately broken variants of the manifest (models/recipes/faults.py): name -> fault."""
    return {name: v["fault"] for entry in MANIFEST["models"].values()
            for name, v in entry.get("variants", {}).items() if "fault" in v}


def test_every_negative_check_fails_for_one_stated_reason() -> None:
    """Either `expect:` names a backend other than the one served (the kernel check must fail), or
    the model is a fault variant judged by a paired gate against a passing config that serves its
    good source variant the same way (the accuracy gate must fail)."""
    faults = _fault_variants()
    kinds = set()
    for config in (c for c in TINY_CONFIGS if NEGATIVE_TAG in c.tags):
        assert _serves(config, Platform.hypothetical("cpu")), f"{config.source}: must run (and fail) on CPU"
        served = canonical(config.backend_flags()["--linear-backend"])
        model = Path(config.model_name).name
        if model in faults:
            kinds.add("accuracy")
            assert served == canonical(config.expect.linear_kernel or served), config.source
            assert config.gate.mode == "paired" and config.baseline_path is not None, config.source
            base = load_config(config.baseline_path)
            assert NEGATIVE_TAG not in base.tags and set(base.tags) & set(TIERS), base.source
            assert model.startswith(Path(base.model_name).name + "-"), (model, base.model_name)
            assert (base.server_args, base.num_questions, base.dataset) == \
                (config.server_args, config.num_questions, config.dataset), config.source
        else:
            kinds.add("kernel")
            assert served != canonical(config.expect.linear_kernel or served), config.source
    assert kinds == {"accuracy", "kernel"}, f"the catalog lost a kind of negative check: has {kinds}"


def test_every_fault_variant_has_a_negative_check() -> None:
    served = {Path(c.model_name).name for c in TINY_CONFIGS if NEGATIVE_TAG in c.tags}
    assert set(_fault_variants()) <= served


def _catalog_pipeline(tier: str, monkeypatch: pytest.MonkeyPatch) -> dict:
    monkeypatch.chdir(REPO)  # pipeline paths are repository-relative, as on a Buildkite agent
    groups, loose = collect([EVAL_CONFIGS.relative_to(REPO)])
    return build_pipeline(groups, loose, tier)  # type: ignore[arg-type]


def _steps(pipeline: dict) -> list[dict]:
    return [s for step in pipeline["steps"] for s in (step["steps"] if "group" in step else [step])]


def _names_marlin(config: EvalConfig) -> bool:
    """Read from the config itself, not from the pipeline's dependency analysis."""
    named = [*config.server_args, config.expect.linear_kernel or "", config.expect.moe_kernel or ""]
    return any("marlin" in value.lower() for value in named)


def test_marlin_kernel_change_runs_the_marlin_configs_and_the_pr_tagged(monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 8: a PR touching only the Marlin linear kernel runs exactly the builtin configs whose
    server_args or expect: name marlin, plus those tagged pr; nothing else."""
    pipeline = _catalog_pipeline("pr", monkeypatch)
    catalog = [load_config(REPO / s["command"].split()[-1]) for s in _steps(pipeline)]
    marlin = {c.name for c in catalog if c.engine == "builtin" and _names_marlin(c)}
    tagged = {c.name for c in catalog if "pr" in c.tags}
    assert len(marlin) >= 10 and {"tiny-qwen3-fp8-block-ct-marlin", "tiny-qwen3-moe-fp8-block-ct-marlin"} <= marlin
    assert tagged == {"tiny-qwen3-fp8-block-native-emulation-demo", "tiny-qwen3-moe-fp8-block-ct-emulation-pr"}
    assert set(select_for_changes(pipeline, ["kernels/linear/marlin.py"])) == marlin | tagged


def test_negative_checks_run_in_nightly_expecting_fail(monkeypatch: pytest.MonkeyPatch) -> None:
    steps = {s["label"]: s["command"] for s in _steps(_catalog_pipeline("nightly", monkeypatch))}
    for config in TINY_CONFIGS:
        expects_fail = "--expect-fail" in steps[config.name].split()
        assert expects_fail == (NEGATIVE_TAG in config.tags), (config.source, steps[config.name])


_KERNELS_FAILED = {"gate": {"passed": True}, "expect": {"expected": {"linear": "marlin"}, "passed": False,
                                                        "mismatches": [{"module": "m", "expected": "marlin"}]}}


@pytest.mark.parametrize("quantgate_status, verdict, step_status", [
    (1, "FAIL", 0), (0, "PASS", 1), (2, "ERROR", 2), (3, "", 3),
    (1, "PASS", 1),  # the run failed on another config (a baseline run with it), not on the check
    (1, "", 1),  # no result.json to tell whose failure it was
    (1, "FAIL-accuracy", 1),  # an expect: check that FAILed on accuracy, its kernel check passing
])
def test_negative_check_step_passes_only_on_fail(tmp_path: Path, quantgate_status: int, verdict: str,
                                                 step_status: int) -> None:
    # A stand-in quantgate: the exit-status mapping of run-eval.sh --expect-fail is under test
    # (through run-local.sh, which must hand the step's arguments on); a vLLM config skips `make models`.
    name = load_config(EVAL_CONFIGS / "vllm" / "Qwen3-0.6B-FP8-block-auto.yaml").name
    record = {"verdict": verdict, **_KERNELS_FAILED} if verdict == "FAIL" else \
        {"verdict": "FAIL", "gate": {"passed": False}, "expect": {"expected": {"linear": "marlin"}, "passed": True}} \
        if verdict == "FAIL-accuracy" else {"verdict": verdict}
    write = f"""echo '{json.dumps(record)}' > "$4/{name}/result.json"; """ if verdict else ""
    fake_tool(tmp_path / "bin", "quantgate",
              f'mkdir -p "$4/{name}"; {write}echo verdict > "$4/summary.md"; exit {quantgate_status}\n')
    proc = run_script([".buildkite/scripts/run-local.sh", "--expect-fail", "eval_configs/vllm/Qwen3-0.6B-FP8-block-auto.yaml"],
                      tmp_path / "bin", QUANTGATE_RESULTS=str(tmp_path / "results"),
                      PATH=f"{tmp_path / 'bin'}:/usr/bin:/bin")
    assert proc.returncode == step_status, proc.stdout + proc.stderr
    if quantgate_status == 0:
        assert "must FAIL" in proc.stderr
    if (quantgate_status, verdict) == (1, ""):
        assert "result.json could not be read, so whether this check failed is unknown" in proc.stderr
    if verdict == "FAIL-accuracy":
        assert "FAIL on accuracy, not on kernels: the check it exercises did not catch" in proc.stderr


@pytest.mark.parametrize("name, failed_on, shown", [
    # A faulty checkpoint served by the backend its server_args name, `expect:` confirming that
    # backend: the check is the accuracy gate (its kernel check passes, as it must).
    ("negative-check-paired-scale-480", "accuracy", "FAIL"),
    ("negative-check-paired-scale-480", "kernels", "FAIL on kernels, not on accuracy"),
    # `expect:` names another kernel than server_args run: the check is the kernel check.
    ("negative-check-expect-marlin-ran-emulation", "kernels", "FAIL"),
    ("negative-check-expect-marlin-ran-emulation", "accuracy",
     "FAIL on exact_match,strict-match, not on kernels"),
])
def test_each_negative_check_is_caught_by_the_check_it_exercises(name: str, failed_on: str, shown: str) -> None:
    """result.json as the runner writes it for each shipped negative check: the paired scale-480
    check's FAIL on its accuracy gate read as 'FAIL on exact_match,strict-match, not on kernels',
    and its CI step failed, because its `expect:` restates the backend its server_args choose."""
    from quantgate.harness.expect import implied_by_server_args
    from quantgate.harness.results import negative_check_verdict

    config = BY_NAME[name]
    implied = implied_by_server_args(config.expect, config.backend_flags())
    explicit = {layer: kernel for layer, kernel in (("linear", config.expect.linear_kernel),
                                                     ("moe", config.expect.moe_kernel)) if kernel}
    result = {"verdict": "FAIL", "config": {"server_args": list(config.server_args)},
              "gate": {"passed": failed_on != "accuracy", "metric": "exact_match,strict-match"},
              "expect": {"passed": failed_on != "kernels", "expected": {**explicit, **implied},
                         "from_server_args": list(implied),
                         "mismatches": [{"module": "m", "expected": "marlin"}] if failed_on == "kernels" else []}}
    assert negative_check_verdict(result) == shown

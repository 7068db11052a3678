"""Plugin discovery and selection, the registry's priority order, and the built-in rmsnorm op.

The example plugin under examples/ is pip-installed into a temporary directory that is put on
sys.path for this module only: discovery goes through the same entry-point metadata a user's plugin
would, and the project's environment never sees it (installed there, its rmsnorm would outrank the
built-in kernel everywhere, and an interrupted run would leave it so).
"""

import importlib
import subprocess
import sys
from importlib.metadata import EntryPoint
from pathlib import Path

import pytest
import torch

from shrike import _C
from shrike.errors import ConfigError
from shrike.ops import register_builtin_ops, rmsnorm_reference
from shrike.plugins import PluginRegistrar, build_registry, installed_plugins, load_plugins
from shrike.registry import Registry

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "shrike-plugin-example"


def pip(*args: str) -> None:
    subprocess.run([sys.executable, "-m", "pip", "--disable-pip-version-check", "--quiet", *args], check=True)


@pytest.fixture(scope="module")
def example_plugin(tmp_path_factory):
    target = tmp_path_factory.mktemp("plugin-site")
    pip("install", "--no-deps", "--no-build-isolation", "--target", str(target), str(EXAMPLE))
    sys.path.insert(0, str(target))
    importlib.invalidate_caches()
    try:
        yield importlib.import_module("shrike_plugin_example")
    finally:
        sys.path.remove(str(target))
        for name in [m for m in sys.modules if m.split(".")[0] == "shrike_plugin_example"]:
            del sys.modules[name]
        importlib.invalidate_caches()
    assert "example" not in installed_plugins()


def test_the_example_plugin_is_not_installed_in_the_environment():
    """Guards the fixture's promise: outside this module's temporary sys.path entry, no plugin is visible."""
    leftover = "shrike-plugin-example is installed in this environment (left by an older test run?): " \
               "pip uninstall shrike-plugin-example"
    assert "example" not in installed_plugins(), leftover
    result = subprocess.run([sys.executable, "-m", "pip", "--disable-pip-version-check", "show", "--quiet",
                             "shrike-plugin-example"], capture_output=True)
    assert result.returncode != 0, leftover


def rmsnorm_inputs(dtype=torch.float32):
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(3, 96, generator=generator).to(dtype)
    weight = torch.randn(96, generator=generator).to(dtype)
    return x, weight, torch.empty_like(x)


def test_example_plugin_is_discovered(example_plugin):
    entry_point = installed_plugins()["example"]
    assert entry_point.value == "shrike_plugin_example:register"
    assert entry_point.dist.name == "shrike-plugin-example"


def test_all_installed_plugins_load_when_unset(example_plugin):
    registry = build_registry(environ={})
    assert "example" in registry.plugins
    assert registry.architecture("ToyForCausalLM").target is example_plugin.ToyForCausalLM
    assert registry.quantization("toy-absmax-int8").target is example_plugin.ToyAbsmaxInt8


def test_empty_selection_loads_no_plugin(example_plugin):
    registry = build_registry(environ={"SHRIKE_PLUGINS": ""})
    assert registry.plugins == []
    assert registry.op_table().chosen["rmsnorm"].source == f"builtin:{_C.active_isa()}"
    with pytest.raises(ConfigError, match="model architecture 'ToyForCausalLM' is not supported"):
        registry.architecture("ToyForCausalLM")


@pytest.mark.parametrize("selection", ["example", " example , ", "example,example"])
def test_named_selection(example_plugin, selection):
    assert build_registry(environ={"SHRIKE_PLUGINS": selection}).plugins == ["example"]


def test_unknown_plugin_name_lists_the_installed_ones(example_plugin):
    with pytest.raises(ConfigError, match=r"SHRIKE_PLUGINS names nope, which is not installed \(installed plugins: .*example"):
        build_registry(environ={"SHRIKE_PLUGINS": "example,nope"})


def test_plugin_op_takes_priority_and_is_the_one_called(example_plugin):
    registry = build_registry(environ={"SHRIKE_PLUGINS": "example"})
    chosen = registry.op_table().chosen["rmsnorm"]
    assert (chosen.source, chosen.provider) == ("plugin", "example")
    assert [c["source"] for c in registry.describe()["op"]["rmsnorm"]["candidates"]] == [
        "plugin", f"builtin:{_C.active_isa()}", "reference"
    ]
    x, weight, out = rmsnorm_inputs()
    calls = example_plugin.rmsnorm.calls
    chosen.target(x, weight, out, 1e-6)
    assert example_plugin.rmsnorm.calls == calls + 1
    expected = torch.empty_like(x)
    _C.rmsnorm(x, weight, expected, 1e-6)
    torch.testing.assert_close(out, expected)


def test_describe_names_what_each_op_resolved_to(example_plugin):
    description = build_registry(environ={"SHRIKE_PLUGINS": "example"}).describe()
    assert description["plugins"] == ["example"]
    assert description["op"]["rmsnorm"]["source"] == "plugin"
    assert description["architecture"]["ToyForCausalLM"] == {
        "source": "plugin", "provider": "example", "candidates": [{"source": "plugin", "provider": "example"}]
    }


def test_reference_is_the_last_resort():
    registry = Registry()
    registry.register_op("rmsnorm", rmsnorm_reference, source="reference")
    assert registry.op_table().chosen["rmsnorm"].source == "reference"
    builtins = Registry()
    register_builtin_ops(builtins)
    assert builtins.op_table().chosen["rmsnorm"].target is _C.rmsnorm


def test_two_plugins_providing_one_op_must_be_told_apart():
    registry = Registry()
    PluginRegistrar(registry, "first").register_op("rmsnorm", rmsnorm_reference)
    with pytest.raises(ConfigError, match="op 'rmsnorm' is registered by both first and second; choose one with SHRIKE_PLUGINS"):
        PluginRegistrar(registry, "second").register_op("rmsnorm", rmsnorm_reference)


def test_a_plugin_that_fails_to_load_is_named():
    broken = EntryPoint(name="broken", value="shrike_no_such_module:register", group="shrike.plugins")
    with pytest.raises(ConfigError, match="plugin 'broken' .* failed to load: ModuleNotFoundError.*leave it out of SHRIKE_PLUGINS"):
        load_plugins(Registry(), environ={}, installed={"broken": broken})


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_reference_rmsnorm_matches_the_kernel(dtype):
    x, weight, out = rmsnorm_inputs(dtype)
    rmsnorm_reference(x, weight, out, 1e-5)
    kernel_out = torch.empty_like(x)
    _C.rmsnorm(x, weight, kernel_out, 1e-5)
    torch.testing.assert_close(out, kernel_out)
    rms = x.float().pow(2).mean(-1, keepdim=True).add(1e-5).sqrt()
    torch.testing.assert_close(out.float(), (x.float() / rms).to(dtype).float() * weight.float(), rtol=1e-2, atol=1e-2)


def test_plugin_hooks_run_a_real_model(example_plugin, tmp_path, default_model_dir):
    """A checkpoint naming the plugin's architecture and quantization scheme loads and generates,
    and the plugin's rmsnorm is what the model calls."""
    import json
    import shutil

    import transformers

    from shrike.engine.llm_engine import EngineConfig, LLMEngine
    from shrike.sampling.params import SamplingParams

    torch.manual_seed(0)
    config = transformers.LlamaConfig(vocab_size=49152, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256)
    transformers.LlamaForCausalLM(config).save_pretrained(tmp_path)
    for name in ("tokenizer.json", "tokenizer_config.json", "generation_config.json"):
        shutil.copy(default_model_dir / name, tmp_path / name)
    raw = json.loads((tmp_path / "config.json").read_text())
    raw.update(architectures=["ToyForCausalLM"], quantization_config={"quant_method": "toy-absmax-int8"})
    (tmp_path / "config.json").write_text(json.dumps(raw))

    calls_before = example_plugin.rmsnorm.calls, example_plugin.dense_linear.calls
    engine = LLMEngine(EngineConfig(model=str(tmp_path), dtype="float32", max_model_len=64, progress=False))
    model = engine.runner.model
    assert isinstance(model, example_plugin.ToyForCausalLM)
    assert isinstance(model.layers[0].qkv_proj, example_plugin.AbsmaxInt8Linear)
    # The plugin's architecture and scheme run on the executor; its Python rmsnorm and dense_linear split the tape.
    assert engine.runner.compiled is not None
    assert set(engine.runner.compiled.describe()["python_ops"]) == {"rmsnorm", "dense_linear"}
    (out,) = engine.generate([[1, 2, 3]], SamplingParams(max_tokens=4, temperature=0, ignore_eos=True))[0]
    assert len(out.token_ids) == 4
    assert example_plugin.rmsnorm.calls > calls_before[0]
    assert example_plugin.dense_linear.calls >= calls_before[1] + 4  # the lm_head of every step


def test_plugin_ops_split_the_tape_of_a_quantized_model(example_plugin, tmp_path):
    """The example plugin replaces rmsnorm too: the executor hands each norm to the plugin's Python
    function, and the plugin's dense_linear computes every step's logits."""
    from shrike.engine.llm_engine import EngineConfig, LLMEngine
    from shrike.sampling.params import SamplingParams
    from shrike.synth import synthesize

    synthesize(tmp_path / "tiny", "tiny", "w4a8-g128", progress=False)
    calls_before = example_plugin.dense_linear.calls
    engine = LLMEngine(EngineConfig(model=str(tmp_path / "tiny"), max_model_len=64, progress=False))
    assert engine.runner.model.ops.chosen["dense_linear"].provider == "example"
    assert engine.runner.compiled is not None
    # The first layer's input norm is the one plain rmsnorm; the other norms add the residual first.
    assert engine.runner.compiled.describe()["python_ops"] == ["rmsnorm", "dense_linear"]
    (out,) = engine.generate([[1, 2, 3]], SamplingParams(max_tokens=3, temperature=0, ignore_eos=True))[0]
    assert len(out.token_ids) == 3
    assert example_plugin.dense_linear.calls == calls_before + 3


def test_a_plugin_dense_linear_alone_is_called_back_by_the_compiled_forward(tmp_path, monkeypatch):
    """Every other op built in: the layers stay compiled and the plugin's op computes the logits."""
    from shrike.engine.llm_engine import EngineConfig, LLMEngine
    from shrike.model import loader
    from shrike.ops import dense_linear_reference
    from shrike.sampling.params import SamplingParams
    from shrike.synth import synthesize

    calls = []

    def counting_dense_linear(x, weight, bias, out):
        calls.append(x.shape[0])
        dense_linear_reference(x, weight, bias, out)

    def registry_with_the_plugin_op():
        registry = build_registry(environ={"SHRIKE_PLUGINS": ""})
        PluginRegistrar(registry, "dense-only").register_op("dense_linear", counting_dense_linear)
        return registry

    monkeypatch.setattr(loader, "build_registry", registry_with_the_plugin_op)
    synthesize(tmp_path / "tiny", "tiny", "w4a8-g128", progress=False)
    engine = LLMEngine(EngineConfig(model=str(tmp_path / "tiny"), max_model_len=64, progress=False))
    assert engine.runner.compiled is not None and engine.runner.compiled.describe()["python_ops"] == ["dense_linear"]
    (out,) = engine.generate([[1, 2, 3]], SamplingParams(max_tokens=3, temperature=0, ignore_eos=True))[0]
    assert len(out.token_ids) == 3
    assert calls == [1, 1, 1]  # the lm_head of each step, on the one row that needs logits


def test_a_plugin_op_that_does_not_exist_names_the_known_ops():
    registry = Registry()
    register_builtin_ops(registry)
    PluginRegistrar(registry, "typo").register_op("rms_norm", rmsnorm_reference)
    with pytest.raises(ConfigError, match=r"plugin typo registers op 'rms_norm', which does not exist; "
                                          r"known ops: add_rmsnorm, dense_linear, div_scalar, embedding, gelu_tanh_mul, grouped_linear, head_rmsnorm"):
        registry.op_table()


def test_unknown_quantization_method_names_the_supported_ones():
    registry = build_registry(environ={"SHRIKE_PLUGINS": ""})
    with pytest.raises(ConfigError, match="quantization scheme 'fp8' is not supported.*compressed-tensors"):
        registry.quantization("fp8")

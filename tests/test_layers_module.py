"""The Module system: registration, traversal, state dicts, structure versions, save/load,
train/eval, device and dtype moves, containers, initialisation and LoRA."""

from __future__ import annotations

import copy
import math
import os
import threading

import numpy as np
import pytest
import safetensors.numpy as safetensors_numpy

import layers
import tensorcore as tc
from layers import init
from layers import serialization


def mlp() -> layers.Sequential:
    return layers.Sequential(layers.Linear(4, 8), layers.ReLU(), layers.Linear(8, 3))


class WithBuffers(layers.Module):
    def __init__(self) -> None:
        super().__init__()
        self.body = mlp()
        self.norm = layers.BatchNorm2d(2)
        self.scale = layers.Parameter(tc.ones(3))
        self.register_buffer("steps", tc.zeros(1))
        self.register_buffer("scratch", tc.zeros(2), persistent=False)

    def forward(self, x: tc.Tensor) -> tc.Tensor:
        return self.body(x) * self.scale


# ----- registration and traversal --------------------------------------------------------
def test_named_parameters_buffers_modules() -> None:
    m = WithBuffers()
    assert [n for n, _ in m.named_parameters()] == [
        "scale", "body.0.weight", "body.0.bias", "body.2.weight", "body.2.bias", "norm.weight", "norm.bias"]
    assert [n for n, _ in m.named_buffers()] == [
        "steps", "scratch", "norm.running_mean", "norm.running_var", "norm.num_batches_tracked"]
    assert [n for n, _ in m.named_modules()] == ["", "body", "body.0", "body.1", "body.2", "norm"]
    assert [type(c).__name__ for c in m.children()] == ["Sequential", "BatchNorm2d"]
    assert "scratch" not in m.state_dict() and "steps" in m.state_dict()


def test_shared_parameters_and_modules_are_listed_once() -> None:
    shared = layers.Linear(3, 3)
    m = layers.Sequential(shared, layers.ReLU(), shared)
    assert len(list(m.parameters())) == 2
    assert len(list(m.modules())) == 3


def test_assigning_a_tensor_to_a_parameter_name_is_a_type_error() -> None:
    lin = layers.Linear(2, 2)
    with pytest.raises(TypeError, match="weight is a parameter"):
        lin.weight = tc.zeros(2, 2)


# ----- structure version -----------------------------------------------------------------
def test_structure_version_tracks_every_structural_change_in_the_tree() -> None:
    m = WithBuffers()
    seen = {m.structure_version}

    def changed() -> None:
        assert m.structure_version not in seen
        seen.add(m.structure_version)

    m.body[0].weight = layers.Parameter(tc.zeros(8, 4))  # replace a parameter two levels down
    changed()
    m.body.append(layers.Tanh())  # add a submodule to a child
    changed()
    m.extra = layers.Linear(1, 1)
    changed()
    del m.extra
    changed()
    m.steps = tc.ones(1)  # replace a buffer
    changed()
    m.norm = layers.GroupNorm(1, 2)  # swap a layer
    changed()
    m.body[0].bias = None  # remove a parameter
    changed()
    before = m.structure_version
    with tc.no_grad():
        m.scale.fill_(3.0)  # values changing is not structural
    m(tc.randn(2, 4))
    m.train(False)
    assert m.structure_version == before


def test_structure_version_of_a_detached_child_no_longer_moves_its_old_parent() -> None:
    child = layers.Linear(2, 2)
    parent = layers.Sequential(child)
    parent[0] = layers.Linear(2, 2)
    version = parent.structure_version
    child.weight = layers.Parameter(tc.zeros(2, 2))
    assert parent.structure_version == version


def test_deepcopy_keeps_versions_working() -> None:
    m = mlp()
    clone = copy.deepcopy(m)
    assert list(clone.state_dict()) == list(m.state_dict())
    version = clone.structure_version
    clone[0].weight = layers.Parameter(tc.zeros(8, 4))
    assert clone.structure_version != version
    np.testing.assert_array_equal(m[2].weight.numpy(), clone[2].weight.numpy())


# ----- state dicts -----------------------------------------------------------------------
def test_state_dict_round_trip_and_non_strict_report() -> None:
    a, b = WithBuffers(), WithBuffers()
    b.load_state_dict(a.state_dict())
    for (name, x), (_, y) in zip(a.state_dict().items(), b.state_dict().items()):
        np.testing.assert_array_equal(x.numpy(), y.numpy(), err_msg=name)
    state = a.state_dict()
    del state["scale"]
    state["unknown"] = tc.zeros(1)
    result = b.load_state_dict(state, strict=False)
    assert result.missing_keys == ["scale"] and result.unexpected_keys == ["unknown"]


def test_strict_load_names_every_problem_and_loads_nothing() -> None:
    target = mlp()
    before = {k: v.numpy().copy() for k, v in target.state_dict().items()}
    state = {k: v.numpy() + 1.0 for k, v in mlp().state_dict().items()}
    del state["2.bias"]
    state["0.extra"] = np.zeros(1)
    state["2.weight"] = np.zeros((3, 9))
    with pytest.raises(ValueError) as info:
        target.load_state_dict(state)
    message = str(info.value)
    assert "missing keys: 2.bias" in message and "unexpected keys: 0.extra" in message
    assert "2.weight (expected (3, 8), got (3, 9))" in message
    for k, v in target.state_dict().items():
        np.testing.assert_array_equal(v.numpy(), before[k])


def test_wrong_shape_raises_even_when_not_strict() -> None:
    with pytest.raises(ValueError, match="0.weight"):
        mlp().load_state_dict({"0.weight": np.zeros((2, 2))}, strict=False)


def test_load_copies_in_place_and_casts() -> None:
    m = mlp()
    weight = m[0].weight
    m.load_state_dict({k: v.numpy().astype(np.float64) for k, v in mlp().state_dict().items()})
    assert m[0].weight is weight and weight.dtype == np.float32


# ----- save / load -----------------------------------------------------------------------
@pytest.mark.parametrize("dtype", [tc.float32, tc.bfloat16])
def test_save_load_is_bit_exact(tmp_path, dtype) -> None:
    a = WithBuffers().to(dtype=dtype)
    a.norm(tc.randn(4, 2, 3, 3).to(dtype))  # move the running stats off their initial values
    path = tmp_path / "model.safetensors"
    a.save(path)
    b = WithBuffers().to(dtype=dtype)
    b.load(path)
    for (name, x), (_, y) in zip(a.state_dict().items(), b.state_dict().items()):
        assert x.dtype == y.dtype
        assert x.numpy().tobytes() == y.numpy().tobytes(), name
    assert [p.name for p in tmp_path.iterdir()] == ["model.safetensors"]  # no temp files left


def test_failed_save_leaves_the_previous_file_intact(tmp_path, monkeypatch) -> None:
    path = tmp_path / "model.safetensors"
    mlp().save(path)
    original = path.read_bytes()

    def broken_fsync(fd: int) -> None:
        raise OSError("disk full")
    monkeypatch.setattr(os, "fsync", broken_fsync)
    with pytest.raises(OSError, match="disk full"):
        mlp().save(path)
    assert path.read_bytes() == original
    assert [p.name for p in tmp_path.iterdir()] == ["model.safetensors"]


@pytest.mark.skipif(os.name != "posix" or os.geteuid() == 0, reason="needs a non-root POSIX user for permissions")
def test_save_into_an_unwritable_directory_keeps_the_old_file(tmp_path) -> None:
    path = tmp_path / "model.safetensors"
    mlp().save(path)
    original = path.read_bytes()
    tmp_path.chmod(0o500)
    try:
        with pytest.raises(PermissionError):
            mlp().save(path)
    finally:
        tmp_path.chmod(0o700)
    assert path.read_bytes() == original


def test_save_into_a_missing_directory_raises(tmp_path) -> None:
    with pytest.raises(FileNotFoundError):
        mlp().save(tmp_path / "missing" / "model.safetensors")


def test_loading_a_corrupt_file_raises_a_clear_error(tmp_path) -> None:
    path = tmp_path / "model.safetensors"
    mlp().save(path)
    path.write_bytes(path.read_bytes()[:-7])
    with pytest.raises(ValueError, match="not a valid safetensors file"):
        mlp().load(path)
    path.write_bytes(b"not a model at all")
    with pytest.raises(ValueError, match="not a valid safetensors file"):
        mlp().load(path)


def test_loading_another_models_file_names_the_keys(tmp_path) -> None:
    path = tmp_path / "other.safetensors"
    layers.Sequential(layers.Conv2d(1, 2, 3)).save(path)
    model = mlp()
    before = model[0].weight.numpy().copy()
    with pytest.raises(ValueError, match="missing keys: 0.weight|wrong shapes: 0.weight"):
        model.load(path)
    np.testing.assert_array_equal(model[0].weight.numpy(), before)


def test_safetensors_files_are_readable_by_the_reference_library(tmp_path) -> None:
    m = mlp()
    m.save(tmp_path / "m.safetensors")
    loaded = safetensors_numpy.load_file(str(tmp_path / "m.safetensors"))
    np.testing.assert_array_equal(loaded["0.weight"], m[0].weight.numpy())
    assert serialization.load_file(tmp_path / "m.safetensors").keys() == loaded.keys()


# ----- modes, gradients, devices -----------------------------------------------------------
def test_train_eval_switch_every_module_and_change_dropout_and_batch_norm() -> None:
    m = layers.Sequential(layers.Dropout(0.5), layers.BatchNorm2d(2))
    assert all(x.training for x in m.modules())
    m.eval()
    assert not any(x.training for x in m.modules())
    x = tc.randn(3, 2, 4, 4)
    np.testing.assert_allclose(m(x).numpy(), x.numpy() / math.sqrt(1 + 1e-5), rtol=1e-6)
    m.train()
    assert (m[0](tc.ones(1000)).numpy() == 0).mean() > 0.3


def test_zero_grad_and_requires_grad() -> None:
    m = mlp()
    m(tc.randn(2, 4)).sum().backward()
    assert all(p.grad is not None for p in m.parameters())
    m.zero_grad(set_to_none=False)
    assert all(np.all(p.grad.numpy() == 0) for p in m.parameters())
    m.zero_grad()
    assert all(p.grad is None for p in m.parameters())
    m.requires_grad_(False)
    assert not any(p.requires_grad for p in m.parameters())


def test_to_dtype_keeps_parameter_identity_and_integer_buffers() -> None:
    m = layers.Sequential(layers.Linear(2, 2), layers.BatchNorm2d(2))
    weight, version = m[0].weight, m.structure_version
    m.double()
    assert m[0].weight is weight and weight.dtype == np.float64
    assert m[1].running_mean.dtype == np.float64 and m[1].num_batches_tracked.dtype == np.int64
    assert m.structure_version != version
    version = m.structure_version
    m.to(tc.float64)
    assert m.structure_version == version  # nothing moved


# ----- containers --------------------------------------------------------------------------
def test_module_list_and_dict() -> None:
    items = layers.ModuleList([layers.Linear(1, 1) for _ in range(3)])
    first = items[0]
    items.insert(0, layers.Identity())
    assert [n for n, _ in items.named_children()] == ["0", "1", "2", "3"] and items[1] is first
    del items[0]
    assert items[0] is first and len(items) == 3
    assert len(items[1:]) == 2
    with pytest.raises(IndexError):
        items[5]
    table = layers.ModuleDict({"a": layers.Linear(1, 2)})
    table["b"] = layers.ReLU()
    assert list(table) == ["a", "b"] and "a" in table
    assert [n for n, _ in table.named_parameters()] == ["a.weight", "a.bias"]
    table.pop("a")
    assert list(table.keys()) == ["b"]


def test_sequential_slicing_and_named_construction() -> None:
    from collections import OrderedDict
    m = layers.Sequential(OrderedDict(fc=layers.Linear(2, 2), act=layers.ReLU()))
    assert list(m.state_dict()) == ["fc.weight", "fc.bias"]
    assert isinstance(m[:1], layers.Sequential) and len(m[:1]) == 1


# ----- initialisation ----------------------------------------------------------------------
def test_default_initialisations_follow_pytorch_bounds() -> None:
    lin = layers.Linear(400, 50)
    bound = 1 / math.sqrt(400)
    for t in (lin.weight, lin.bias):
        values = t.numpy()
        assert values.min() >= -bound and values.max() <= bound and np.abs(values).max() > 0.8 * bound
    conv = layers.Conv2d(8, 4, 3, groups=2)
    assert np.abs(conv.weight.numpy()).max() <= 1 / math.sqrt(4 * 9)
    emb = layers.Embedding(2000, 10).weight.numpy()
    assert abs(emb.std() - 1) < 0.05
    lstm = layers.LSTM(3, 25)
    assert all(np.abs(p.numpy()).max() <= 1 / 5 for p in lstm.parameters())
    w = tc.empty(300, 200)
    init.xavier_uniform_(w)
    assert np.abs(w.numpy()).max() <= math.sqrt(6 / 500)
    assert init.calculate_gain("leaky_relu", math.sqrt(5)) == pytest.approx(math.sqrt(1 / 3))


# ----- LoRA --------------------------------------------------------------------------------
def test_lora_starts_as_the_base_trains_only_a_and_b_and_merges_exactly() -> None:
    base = layers.Linear(6, 4).double()
    lora = layers.LoRALinear(base, rank=2, alpha=4.0)
    x = tc.randn(5, 6, dtype=tc.float64)
    np.testing.assert_array_equal(lora(x).numpy(), base(x).numpy())
    assert [n for n, p in lora.named_parameters() if p.requires_grad] == ["lora_A", "lora_B"]
    assert np.std(lora.lora_A.numpy()) == pytest.approx(1 / math.sqrt(2), rel=0.5)
    with tc.no_grad():
        lora.lora_B.copy_(tc.randn(2, 4, dtype=tc.float64))
    lora(x).sum().backward()
    assert lora.lora_B.grad is not None and base.weight.grad is None
    expected = base(x).numpy() + (x.numpy() @ lora.lora_A.numpy() @ lora.lora_B.numpy()) * 2.0
    unmerged = lora(x).numpy()
    np.testing.assert_allclose(unmerged, expected, rtol=1e-12)
    version = lora.structure_version
    lora.merge()
    assert lora.structure_version != version
    np.testing.assert_allclose(lora(x).numpy(), unmerged, rtol=1e-12)
    lora.unmerge()
    np.testing.assert_allclose(lora(x).numpy(), unmerged, rtol=1e-12)


# ----- thread safety of the version counter ------------------------------------------------
def test_versions_stay_unique_across_threads() -> None:
    modules = [layers.Identity() for _ in range(8)]
    versions: list[int] = []
    lock = threading.Lock()

    def work(m: layers.Module) -> None:
        for _ in range(200):
            m._structure_changed()
            with lock:
                versions.append(m.structure_version)
    threads = [threading.Thread(target=work, args=(m,)) for m in modules]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(set(versions)) == len(versions)


# ----- assigning Parameter.data ----------------------------------------------------------------
def test_assigning_data_of_the_right_shape_replaces_the_values():
    m = layers.Linear(4, 2)
    m.weight.data = tc.ones(2, 4)
    assert isinstance(m.weight, layers.Parameter) and m.weight.requires_grad
    np.testing.assert_array_equal(m(tc.ones(3, 4)).numpy(), 4 + np.broadcast_to(m.bias.numpy(), (3, 2)))
    m.bias.data = np.zeros(2, np.float32)  # a backend array of the same kind works too
    np.testing.assert_array_equal(m(tc.ones(1, 4)).numpy(), [[4.0, 4.0]])


@pytest.mark.parametrize("value, error, text", [
    (lambda: tc.ones(4, 2), ValueError, r"shape \(2, 4\).*\(4, 2\)"),
    (lambda: tc.ones(2, 4, dtype=tc.float64), TypeError, "float32.*float64"),
    (lambda: tc.Tensor(tc.ones(2, 4).data, device="cuda"), ValueError, "'cpu'.*'cuda'"),
    (lambda: [[1.0] * 4] * 2, TypeError, r"Tensor of shape \(2, 4\)"),
])
def test_assigning_data_of_another_shape_dtype_or_device_raises_and_changes_nothing(value, error, text):
    m = layers.Linear(4, 2)
    before = m.weight.numpy().copy()
    with pytest.raises(error, match=text):
        m.weight.data = value()
    np.testing.assert_array_equal(m.weight.numpy(), before)
    assert m(tc.ones(1, 4)).shape == (1, 2)


@pytest.mark.parametrize("state, error, text", [
    ([1, 2, 3], TypeError, "expected a mapping of names to tensors .* got list"),
    ({0: np.zeros((4, 3))}, TypeError, "keys must be .* names .* got 0 of type int"),
    (lambda m: {**m.state_dict(), "0.bias": None}, TypeError, r"'0.bias' is None; expected .* shape \(8,\)"),
])
def test_load_state_dict_says_what_it_expected(state, error, text):
    model = mlp()
    before = {k: v.numpy().copy() for k, v in model.state_dict().items()}
    with pytest.raises(error, match=text):
        model.load_state_dict(state(model) if callable(state) else state)
    for key, value in model.state_dict().items():
        np.testing.assert_array_equal(value.numpy(), before[key])

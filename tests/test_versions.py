"""Write versions (``Tensor._version``, ``tensorcore/versions.py``): every kind of write
through the engine moves the written tensor's version and its views', and no other
tensor's; a snapshot of versions goes stale exactly when one of its sources moves."""

from __future__ import annotations

import gc

import numpy as np
import pytest

import layers
import optim
import tensorcore as tc
import tensorcore.functional as F
from tensorcore import versions


def _moved(before: dict[str, int], tensors: dict[str, tc.Tensor]) -> set[str]:
    """The names whose tensor's version differs from ``before``."""
    return {name for name, t in tensors.items() if t._version != before[name]}


def _versions(tensors: dict[str, tc.Tensor]) -> dict[str, int]:
    return {name: t._version for name, t in tensors.items()}


IN_PLACE = {
    "copy_": lambda t: t.copy_(tc.ones(4, 3)),
    "fill_": lambda t: t.fill_(2.0),
    "zero_": lambda t: t.zero_(),
    "add_": lambda t: t.add_(tc.ones(3), alpha=2.0),
    "mul_": lambda t: t.mul_(3.0),
    "clamp_": lambda t: t.clamp_(0.0, 0.5),
    "uniform_": lambda t: t.uniform_(),
    "normal_": lambda t: t.normal_(),
    "iadd": lambda t: t.__iadd__(1.0),
    "setitem": lambda t: t.__setitem__((1, slice(None)), 5.0),
    "setitem of a view": lambda t: t[2].__setitem__(0, 7.0),
}


@pytest.mark.parametrize("write", list(IN_PLACE), ids=list(IN_PLACE))
def test_an_in_place_write_moves_the_tensor_and_its_views_only(write):
    base = tc.zeros(4, 3)
    tensors = {"base": base, "row": base[1], "flat": base.reshape(12), "detached": base.detach(),
               "transposed": base.T, "other": tc.zeros(4, 3), "copy": base.clone()}
    before = _versions(tensors)
    IN_PLACE[write](base)
    assert _moved(before, tensors) == {"base", "row", "flat", "detached", "transposed"}
    assert base._version == before["base"] + 1


def test_a_write_through_a_view_moves_its_base():
    base = tc.zeros(4, 3)
    row, other = base[0], tc.zeros(3)
    row.add_(1.0)
    assert base._version == row._version == 1 and other._version == 0


def test_a_recorded_setitem_keeps_counting_the_tensors_history():
    x = tc.zeros(3, requires_grad=True) * 1.0  # a non-leaf: the write is recorded, x gets new memory
    old = x.data
    x[0] = 1.0
    assert x.data is not old and x._version == 1
    x[1] = 2.0
    assert x._version == 2


def test_version_is_read_only():
    with pytest.raises(AttributeError):
        tc.zeros(2)._version = 3  # type: ignore[misc]


def test_gradient_accumulation_moves_the_gradient_not_the_parameter():
    w = tc.ones(3, requires_grad=True)
    (w * 2.0).sum().backward()
    grad = w.grad
    tensors = {"w": w, "grad": grad}
    before = _versions(tensors)
    (w * 3.0).sum().backward()  # added into the existing .grad in place
    assert w.grad is grad and _moved(before, tensors) == {"grad"}


def test_batch_norm_moves_its_running_statistics_only_in_training():
    norm = layers.BatchNorm2d(3)
    x = tc.randn(2, 3, 4, 4)
    tensors = dict(norm.named_buffers()) | dict(norm.named_parameters())
    before = _versions(tensors)
    norm(x)
    assert _moved(before, tensors) == {"running_mean", "running_var", "num_batches_tracked"}
    before = _versions(tensors)
    norm.eval()(x)
    assert not _moved(before, tensors)


def _trained_pair() -> tuple[layers.Linear, layers.Linear, optim.Optimizer]:
    """A trained layer with an optimizer that has packed it, and a frozen layer beside it."""
    tc.manual_seed(0)
    trained, frozen = layers.Linear(3, 2), layers.Linear(3, 3)
    frozen.requires_grad_(False)
    optimizer = optim.AdamW(trained.parameters(), lr=0.1)
    (trained(frozen(tc.randn(4, 3))) ** 2).mean().backward()
    optimizer.step()  # the parameters become views of the optimizer's flat buffer
    return trained, frozen, optimizer


def test_an_optimizer_step_moves_its_flat_buffer_and_nothing_else():
    trained, frozen, optimizer = _trained_pair()
    tensors = {"weight": trained.weight, "bias": trained.bias, "grad": trained.weight.grad,
               "frozen": frozen.weight, "frozen bias": frozen.bias}
    before = _versions(tensors)
    optimizer.step()
    assert _moved(before, tensors) == {"weight", "bias", "grad"}  # all views of one flat buffer
    before = _versions(tensors)
    optimizer.zero_grad(set_to_none=False)
    assert _moved(before, tensors) == {"weight", "bias", "grad"}


def test_a_learning_rate_schedule_writes_no_tensor():
    trained, frozen, optimizer = _trained_pair()
    schedule = optim.CosineAnnealingLR(optimizer, T_max=10)
    tensors = {"weight": trained.weight, "frozen": frozen.weight}
    before = _versions(tensors)
    for _ in range(3):
        schedule.step()
    assert not _moved(before, tensors) and optimizer.param_groups[0]["lr"] < 0.1


@pytest.mark.parametrize("clip", [lambda ps: optim.clip_grad_norm_(ps, 1e-3),
                                  lambda ps: optim.clip_grad_value_(ps, 1e-3)], ids=["norm", "value"])
def test_gradient_clipping_moves_the_gradients_it_scales(clip):
    a, b = tc.ones(3, requires_grad=True), tc.ones(2, requires_grad=True)
    ((a * 5.0).sum() + (b * 5.0).sum()).backward()
    tensors = {"a": a, "a.grad": a.grad, "b.grad": b.grad}
    before = _versions(tensors)
    clip([a])
    assert _moved(before, tensors) == {"a.grad"}


def test_load_state_dict_moves_the_parameters_it_writes():
    model, other = layers.Linear(3, 2), layers.Linear(3, 2)
    tensors = {"weight": model.weight, "bias": model.bias, "other": other.weight}
    before = _versions(tensors)
    model.load_state_dict(layers.Linear(3, 2).state_dict())
    assert _moved(before, tensors) == {"weight", "bias"}


def test_a_compiled_replay_moves_the_module_state_and_arguments_it_writes():
    trained, frozen, optimizer = _trained_pair()

    def step(x: tc.Tensor, seen: tc.Tensor) -> tc.Tensor:
        optimizer.zero_grad(set_to_none=False)
        loss = (trained(frozen(x)) ** 2).mean()
        loss.backward()
        optimizer.step()
        seen.add_(1.0)  # an argument written in place
        return loss

    compiled = tc.compile(step, cache_dir=False)
    x, seen, unseen = tc.randn(4, 3), tc.zeros(1), tc.zeros(1)
    for _ in range(2):
        compiled(x, seen)
    tensors = {"weight": trained.weight, "seen": seen, "frozen": frozen.weight, "x": x, "unseen": unseen}
    before = _versions(tensors)
    compiled(x, seen)
    assert compiled.cache_info().hits >= 1
    assert _moved(before, tensors) == {"weight", "seen"} and seen.item() == 3.0


def test_dlpack_imports_count_the_engines_writes_and_exports_are_never_trusted():
    imported = tc.from_dlpack(np.zeros(3))
    other = tc.zeros(3)
    before = imported._version
    imported.add_(1.0)
    assert imported._version == before + 1 and other._version == 0
    exported = tc.zeros(3)
    made_from = versions.Snapshot()
    made_from.track(versions.counter(exported.data))
    made_from.take()
    assert not made_from.stale()
    np.from_dlpack(exported)[...] += 1.0  # a write the engine cannot see
    assert np.array_equal(exported.numpy(), [1.0] * 3)
    assert made_from.stale() and made_from.take() == [0]
    assert made_from.stale() and made_from.take() == [0]  # shared memory: never current
    assert versions.counter(imported.data).shared and not versions.counter(other.data).shared


def test_a_snapshot_names_the_versions_that_moved_and_only_those():
    w, b, unrelated = tc.zeros(3), tc.zeros(2), tc.zeros(3)
    made_from = versions.Snapshot()
    assert [made_from.track(versions.counter(t.data)) for t in (w, b)] == [0, 1]
    assert made_from.stale() and made_from.take() == [0, 1]  # never taken: all moved
    assert not made_from.stale()
    unrelated.add_(1.0)
    assert not made_from.stale()
    b[0] = 1.0
    assert made_from.stale() and made_from.take() == [1]
    w[1:].fill_(2.0)  # through a view
    assert made_from.take() == [0] and made_from.take() == []
    assert made_from.track(versions.counter(w[:2].data)) == 0  # known: made again at the next take
    assert made_from.take() == [0]


def test_versions_of_dropped_storages_are_forgotten():
    gc.collect()
    held = len(versions._versions)
    for _ in range(50):
        t = tc.zeros(3)
        t[0] = 1.0
        F.relu(t).add_(1.0)
    del t
    gc.collect()
    assert len(versions._versions) == held

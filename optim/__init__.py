"""Optimizers whose parameters, gradients and state live in flat device buffers,
updated by one fused kernel per (param group, dtype); LR schedules and gradient
clipping that stay on the device.

    from optim import AdamW, CosineAnnealingLR, clip_grad_norm_
    opt = AdamW(model.parameters(), lr=1e-3)
"""

from .adagrad import Adagrad
from .adam import Adam, AdamW
from .clip import clip_grad_norm_, clip_grad_value_
from .lamb import LAMB
from .lars import LARS
from .lion import Lion
from .optimizer import Optimizer
from .rmsprop import RMSprop
from .schedulers import ChainedScheduler, CosineAnnealingLR, LinearWarmup, LRScheduler, SequentialLR, StepLR
from .sgd import SGD

RMSProp = RMSprop

__all__ = ["Adagrad", "Adam", "AdamW", "ChainedScheduler", "CosineAnnealingLR", "LAMB", "LARS", "LRScheduler",
           "LinearWarmup", "Lion", "Optimizer", "RMSProp", "RMSprop", "SGD", "SequentialLR", "StepLR",
           "clip_grad_norm_", "clip_grad_value_"]

"""layers: the Module system and neural-network layers built on tensorcore.

    from layers import Linear, Sequential, ReLU
    model = Sequential(Linear(64, 128), ReLU(), Linear(128, 10))
"""

from . import init
from .activation import GELU, LeakyReLU, ReLU, Sigmoid, SiLU, Softmax, Tanh
from .attention import MultiHeadAttention
from .basic import Dropout, Flatten, Identity
from .containers import ModuleDict, ModuleList, Sequential
from .conv import Conv2d, ConvTranspose2d
from .conv_lstm import ConvLSTM2d
from .diffusion_conv import DiffusionConv
from .embedding import Embedding
from .linear import Linear
from .lora import LoRALinear
from .module import IncompatibleKeys, Module
from .norm import BatchNorm2d, GroupNorm, LayerNorm
from .parameter import Parameter
from .pooling import AvgPool2d, MaxPool2d, Upsample
from .recurrent import GRU, LSTM

__all__ = [
    "init", "Module", "IncompatibleKeys", "Parameter", "Sequential", "ModuleList", "ModuleDict",
    "Linear", "Conv2d", "ConvTranspose2d", "Upsample", "MaxPool2d", "AvgPool2d",
    "BatchNorm2d", "LayerNorm", "GroupNorm", "Dropout", "Identity", "Flatten",
    "ReLU", "LeakyReLU", "GELU", "SiLU", "Tanh", "Sigmoid", "Softmax", "Embedding",
    "MultiHeadAttention", "LSTM", "GRU", "ConvLSTM2d", "DiffusionConv", "LoRALinear",
]

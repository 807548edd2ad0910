"""LoRA adapters for the UNet and the CLIP text encoders, from diffusers/PEFT and kohya files.

    class MyPipeline(LoraLoaderMixin): ...      # holds unet, text_encoder(, text_encoder_2)

    pipe.load_lora_weights("lora_folder", adapter_name="style")
    pipe.set_adapters(["style"], [0.8])
    pipe.unload_lora_weights()
"""

from .adapters import LoraConv2d, LoraLayer, LoraLinear
from .loader import LoraLoaderMixin
from .weights import LoraWeights

__all__ = ["LoraLoaderMixin", "LoraLayer", "LoraLinear", "LoraConv2d", "LoraWeights"]

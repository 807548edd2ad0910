"""Stable Diffusion pipelines from diffusers folders: text to image, image to image, SDXL."""

from .image_to_image import StableDiffusionImg2ImgPipeline
from .text_to_image import StableDiffusionPipeline
from .xl import StableDiffusionXLPipeline

__all__ = ["StableDiffusionPipeline", "StableDiffusionImg2ImgPipeline", "StableDiffusionXLPipeline"]

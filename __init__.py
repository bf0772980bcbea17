"""llmsuite: llama.cpp's tool suite over a hackable Python engine.

This file is the top-level package: pyproject.toml maps `llmsuite` to the repository root, so cli/,
core/ and cuda/ are its subpackages. What is named here is the public API (docs/python-api.md);
everything else is internal.

    import llmsuite
    model = llmsuite.load("smollm2-135m")
    print(llmsuite.generate(model, "The capital of France is", n_predict=8, temp=0))
"""

from .core.api import bench, generate, load, perplexity, sampler, stream_generate
from .core.context import Context
from .core.memory.factory import mask_producer, memory_kind
from .core.models.registry import register as architecture
from .core.plugins import PluginError, load_installed as load_installed_plugins, load_plugin
from .core.sampling import sampler_step

__all__ = ["load", "generate", "stream_generate", "perplexity", "bench", "sampler", "Context", "memory_kind",
           "mask_producer", "sampler_step", "architecture", "load_plugin", "load_installed_plugins", "PluginError"]

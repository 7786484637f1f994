"""What every runtime's loader shares (vLLM's plugin, SGLang's): how a mismatch between an artifact
and a live worker is named and refused (mismatch.py), and where a layer's kernel tensors are read
from (layer_source.py). Nothing here imports a runtime."""
